"""Is the stack matrix installable? Each pinned engine release's own declared requirements
(its wheel's METADATA `Requires-Dist`) against the matrix's torch, CUDA and FlashInfer pins.

An engine wheel pins torch and FlashInfer exactly and names its CUDA build (`cuda-python`, a
`cu12`/`cu13` extra or distribution suffix); a matrix that pins other versions beside it
certifies a stack no one can install, and its fingerprint then marks every model stale for a
re-validation that means nothing. Each engine runs in its own image, so an engine may carry its
own torch and FlashInfer (configs/stack.yaml `engine_pins`); every other pin is the matrix's
`versions`. Pure: the text of METADATA in, the conflicts out (scripts/check_stack_matrix.py
reads or downloads the wheels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.parser import HeaderParser

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# The interpreter and platform the serving images run: markers are evaluated for it.
IMAGE_ENVIRONMENT = {"sys_platform": "linux", "platform_system": "Linux",
                     "platform_machine": "x86_64", "python_version": "3.12",
                     "python_full_version": "3.12.3", "implementation_name": "cpython",
                     "platform_python_implementation": "CPython", "os_name": "posix",
                     "extra": ""}
# matrix pin -> the distributions that carry it
PINNED_DISTRIBUTIONS = {"pytorch": ("torch",),
                        "flashinfer": ("flashinfer-python", "flashinfer-cubin")}
CUDA_PYTHON = "cuda-python"
_CUDA_TAG = re.compile(r"(?:^|[-_])cu(\d{2,3})$")


@dataclass(frozen=True)
class Conflict:
    engine: str
    version: str
    requirement: str  # as the wheel declares it
    pin: str  # e.g. "versions.pytorch 2.13.0"

    def __str__(self) -> str:
        return (f"{self.engine} {self.version} requires {self.requirement} (its wheel's "
                f"Requires-Dist), the matrix pins {self.pin}")


def pins_for(engine: str, versions: dict[str, str], engine_pins: dict[str, dict[str, str]]
             ) -> tuple[dict[str, str], dict[str, str]]:
    """The torch, CUDA and FlashInfer pins an engine's image must agree with, and where each
    is written in stack.yaml."""
    own = engine_pins.get(engine, {})
    pins, where = {}, {}
    for pin in (*PINNED_DISTRIBUTIONS, "cuda"):
        if pin in own:
            pins[pin], where[pin] = own[pin], f"engine_pins.{engine}.{pin}"
        elif pin in versions:
            pins[pin], where[pin] = versions[pin], f"versions.{pin}"
        else:
            raise ValueError(f"stack.yaml pins no {pin} (versions.{pin}) for {engine}")
    return pins, where


def requires_dist(metadata: str) -> list[str]:
    """The `Requires-Dist` values of a METADATA file (RFC 822 headers)."""
    return HeaderParser().parsestr(metadata).get_all("Requires-Dist") or []


def metadata_identity(metadata: str) -> tuple[str, str]:
    headers = HeaderParser().parsestr(metadata)
    return canonicalize_name(headers.get("Name", "")), headers.get("Version", "")


def _cuda_major_of(req: Requirement) -> int | None:
    """The CUDA major a requirement names: `[cu13]` or `-cu12` (CUDA 12.x -> 12)."""
    for tag in (*req.extras, req.name):
        if m := _CUDA_TAG.search(tag.lower()):
            return int(m.group(1)[:2])
    return None


def conflicts(engine: str, version: str, requires: list[str], pins: dict[str, str],
              where: dict[str, str]) -> list[Conflict]:
    """Every requirement of the engine's wheel (markers evaluated for the serving image, no
    extras) that the pins `pytorch`, `flashinfer` and `cuda` do not satisfy. `where` names
    each pin's place in stack.yaml (`versions.pytorch`, `engine_pins.sglang.flashinfer`)."""
    out: list[Conflict] = []
    cuda = Version(pins["cuda"])
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise ValueError(f"{engine} {version}: Requires-Dist {text!r} does not parse "
                             f"({exc})") from None
        if req.marker is not None and not req.marker.evaluate(IMAGE_ENVIRONMENT):
            continue
        name = canonicalize_name(req.name)
        for pin, dists in PINNED_DISTRIBUTIONS.items():
            if name in dists and not _satisfies(req, pins[pin]):
                out.append(Conflict(engine, version, text, f"{where[pin]} {pins[pin]}"))
        if name == CUDA_PYTHON and not _satisfies(req, pins["cuda"]):
            out.append(Conflict(engine, version, text, f"{where['cuda']} {pins['cuda']}"))
        major = _cuda_major_of(req)
        if major is not None and major != cuda.major:
            out.append(Conflict(engine, version, text,
                                f"{where['cuda']} {pins['cuda']} (CUDA {cuda.major})"))
    return out


def _satisfies(req: Requirement, pinned: str) -> bool:
    try:
        return req.specifier.contains(Version(pinned), prereleases=True)
    except InvalidVersion:
        return False
