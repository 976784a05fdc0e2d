"""`storage_read`: sequential direct-I/O write and read of the NVMe, and an S3 GET."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onboarding.nodes.acceptance.checks import Check, Checker
from onboarding.nodes.acceptance.schema import NodeSetting


@dataclass(frozen=True)
class StorageRead:
    node: str
    direct_read: dict[str, Any]  # path, bytes, seconds, gbps / or why_not
    s3_get: dict[str, Any]
    checks: tuple[Check, ...]


def storage_checks(s: NodeSetting, direct: Mapping[str, Any], s3: Mapping[str, Any],
                   c: Checker) -> None:
    lim = s.thresholds.storage
    if direct.get("why_not"):
        c.skip(1, "direct_io_read", direct["why_not"], f">= {lim.direct_read_min_gbps} GB/s")
    else:  # judged from the raw measurement, so a recorded set re-judges from what was read
        gbps = direct["bytes"] / direct["seconds"] / 1e9
        c.add(1, "direct_io_read", gbps >= lim.direct_read_min_gbps,
              f"{gbps:.2f} GB/s ({direct['bytes'] / 2**30:.1f} GiB, O_DIRECT)",
              f">= {lim.direct_read_min_gbps} GB/s", f"sequential direct-I/O read of "
              f"{direct['path']} is {gbps:.2f} GB/s")
    if direct.get("why_not"):
        c.skip(1, "direct_io_write", direct["why_not"], f">= {lim.direct_write_min_gbps} GB/s")
    elif not direct.get("write_seconds"):
        c.skip(1, "direct_io_write", "the measurement holds no direct-I/O write",
               f">= {lim.direct_write_min_gbps} GB/s")
    else:
        gbps = direct["write_bytes"] / direct["write_seconds"] / 1e9
        c.add(1, "direct_io_write", gbps >= lim.direct_write_min_gbps,
              f"{gbps:.2f} GB/s ({direct['write_bytes'] / 2**30:.1f} GiB, O_DIRECT)",
              f">= {lim.direct_write_min_gbps} GB/s", f"sequential direct-I/O write to "
              f"{direct['path']} is {gbps:.2f} GB/s")
    if s3.get("error"):
        c.add(4, "s3_get", False, "failed", f">= {lim.s3_get_min_gbps} GB/s", s3["error"])
    elif s3.get("why_not"):
        c.skip(4, "s3_get", s3["why_not"], f">= {lim.s3_get_min_gbps} GB/s")
    else:
        c.add(4, "s3_get", s3["gbps"] >= lim.s3_get_min_gbps, f"{s3['gbps']:.2f} GB/s",
              f">= {lim.s3_get_min_gbps} GB/s", f"S3 GET from {s3['uri']} is "
              f"{s3['gbps']:.2f} GB/s")


def build_storage(s: NodeSetting, direct: dict[str, Any], s3: dict[str, Any]) -> StorageRead:
    c = Checker(s.thresholds)
    storage_checks(s, direct, s3, c)
    return StorageRead(s.name, direct, s3, tuple(c.checks))
