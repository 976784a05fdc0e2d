"""Secrets in URLs: the one place that knows what they look like and hides them.

A user pastes `s3://KEY:SECRET@bucket/prefix/` or a presigned URL's query string
(`?X-Amz-Credential=…&X-Amz-Signature=…`) into a catalog entry, or an endpoint with
credentials into `S3_ENDPOINT_URL`. Whatever quotes such a URL (an error, a log line, a rendered
annotation) goes through `redact_urls`, so the raw string never reaches the run's logs, the
Dagster event store or a manifest. No other onboarding package is imported here.
"""

from __future__ import annotations

import re

# scheme://[user[:password]@]rest[?query]. The user part has no '/', ':' or '@'; a password may
# hold '/' and '+' (AWS secret keys do), never '@'. `hf://org/name@rev` has no user part: its
# '@' comes after a '/'. A query needs at least one character after '?' and ends before a ': '
# (the separator of our own messages).
_URL = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<userinfo>[^\s/:@'\"<>]+(?::[^\s@'\"<>]*)?@)?"
    r"(?P<rest>[^\s?#'\"<>]*)"
    r"(?P<query>\?(?:[^\s#'\"<>:]|:(?!\s|$))+)?"
)


def redact_urls(text: str) -> str:
    """`text` with every URL's userinfo shown as `***@` and its query string as `?***`."""
    if "://" not in text:
        return text

    def hide(m: re.Match) -> str:
        return (m["scheme"] + ("***@" if m["userinfo"] else "") + m["rest"]
                + ("?***" if m["query"] else ""))

    return _URL.sub(hide, text)


def url_secret(uri: str) -> str | None:
    """What in `uri` could be a secret ("credentials before '@'", "a query string"), or None."""
    m = _URL.search(uri)
    if m is None:
        return None
    if m["userinfo"]:
        return "credentials before '@'"
    if m["query"]:
        return "a query string"
    return None


def secret_urls(text: str) -> list[str]:
    """Every URL in `text` that carries a secret, redacted: for the gate that reads manifests."""
    return [redact_urls(m.group(0)) for m in _URL.finditer(text) if m["userinfo"] or m["query"]]
