"""Secrets in URLs: a source never carries one, and no error or manifest ever repeats one."""

from __future__ import annotations

import pytest

from onboarding.common.errors import ConfigError, FetchError
from onboarding.common.redact import redact_urls, url_secret
from onboarding.deploy.kserve import inline_secret_findings
from onboarding.fetch.catalog import parse_source, read_catalog

USERINFO = "s3://AKIAPLANTED0USERINFO:Planted/Secret+Key@models/base/"
QUERY = ("s3://models/base/?X-Amz-Credential=AKIAPLANTED0QUERY%2F20261206&"
         "X-Amz-Signature=plantedsignature0123")
HF_TOKEN = "hf://user:hf_PlantedToken0123@org/name@main"
PLANTED = ("AKIAPLANTED0USERINFO", "Planted/Secret+Key", "AKIAPLANTED0QUERY",
           "plantedsignature0123", "hf_PlantedToken0123")


def _leaks(text: str) -> list[str]:
    return [p for p in PLANTED if p in text]


@pytest.mark.parametrize(("uri", "shown", "what"), [
    (USERINFO, "s3://***@models/base/", "credentials"),
    (QUERY, "s3://models/base/?***", "query string"),
    (HF_TOKEN, "hf://***@org/name@main", "credentials"),
])
def test_a_source_with_a_secret_is_refused_and_shown_redacted(uri, shown, what):
    with pytest.raises(ValueError) as info:
        parse_source(uri)
    message = str(info.value)
    assert shown in message and what in message
    assert not _leaks(message)


@pytest.mark.parametrize("uri", [USERINFO, QUERY, HF_TOKEN])
def test_a_catalog_entry_with_a_secret_names_the_field_and_never_the_secret(tmp_path, uri):
    (tmp_path / "leaky.yaml").write_text(f"id: leaky\nsource: '{uri}'\nserved_name: x\n")
    with pytest.raises(ConfigError, match=r"leaky.yaml.*field 'source'") as info:
        read_catalog(tmp_path).resolve("leaky")
    assert not _leaks(str(info.value))


@pytest.mark.parametrize(("text", "expected"), [
    ("at http://user:pa/ss@127.0.0.1:8333 now", "at http://***@127.0.0.1:8333 now"),
    (f"'{USERINFO}' failed", "'s3://***@models/base/' failed"),
    (f"{QUERY}: no objects", "s3://models/base/?***: no objects"),
    ("hf://org/name@main and s3://models/a/b@c/", "hf://org/name@main and s3://models/a/b@c/"),
    ("s3://models/base/? is odd", "s3://models/base/? is odd"),
])
def test_redaction_hides_userinfo_and_query_and_keeps_the_rest(text, expected):
    assert redact_urls(text) == expected


def test_every_onboarding_error_is_redacted_whatever_quotes_the_url():
    err = FetchError(USERINFO, f"cannot reach {QUERY}", f"Fix {HF_TOKEN}.")
    assert not _leaks(str(err)) and not _leaks(err.what + err.cause + err.fix)
    assert "s3://***@models/base/" in str(err)


@pytest.mark.parametrize(("uri", "found"), [
    (USERINFO, True), (QUERY, True), (HF_TOKEN, True),
    ("s3://models/base/", False), ("hf://org/name@main", False), ("s3://models/a@b/", False),
])
def test_url_secret_tells_which_urls_carry_one(uri, found):
    assert (url_secret(uri) is not None) is found


def test_a_manifest_that_carries_a_url_secret_fails_the_inline_secret_gate():
    docs = [{"metadata": {"annotations": {"model-onboarding.io/source": QUERY}}},
            {"spec": {"storageUri": USERINFO}}]
    found = inline_secret_findings(docs)
    assert len(found) == 2
    assert not _leaks(" ".join(found))
