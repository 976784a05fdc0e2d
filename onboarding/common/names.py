"""DNS-1123 names: partition keys and Kubernetes object names derive from arbitrary model ids."""

from __future__ import annotations

import hashlib
import re

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # namespaces, partition keys, label-ish names
MAX_LABEL = 63
# Dot-separated labels, at most 253 characters: Kubernetes node names, most object names.
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_SUBDOMAIN = 253


def is_dns1123_label(name: str) -> bool:
    return len(name) <= MAX_LABEL and bool(re.match(DNS1123_LABEL, name))


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= MAX_SUBDOMAIN and bool(re.match(DNS1123_SUBDOMAIN, name))


def to_dns1123_label(name: str, max_len: int = MAX_LABEL) -> str:
    """`Meta-Llama/Llama-3.1-70B_Instruct` -> `meta-llama-llama-3-1-70b-instruct`.

    Lossy names are made unique with a short hash of the original when they had to be cut, so
    two long ids that share a prefix never collide.
    """
    label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not label:
        raise ValueError(f"model id {name!r} has no letters or digits to build a DNS-1123 name from")
    if len(label) > max_len:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        label = label[: max_len - 9].rstrip("-") + "-" + digest
    return label
