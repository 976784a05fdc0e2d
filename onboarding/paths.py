"""Where the project's declarative inputs live; one place so tests and pods can point elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def config_dir() -> Path:
    """`ONBOARDING_CONFIG_DIR` (a ConfigMap mount in a cluster) or the repo's `configs/`."""
    return Path(os.environ.get("ONBOARDING_CONFIG_DIR", PROJECT_ROOT / "configs"))


def models_dir() -> Path:
    return config_dir() / "models"


def discovered_dir() -> Path:
    """Specs the new-checkpoint sensor wrote for models found in the bucket (a shared volume in a
    cluster): `ONBOARDING_DISCOVERED_DIR`, else `<repo>/.data/discovered-specs`."""
    return Path(os.environ.get("ONBOARDING_DISCOVERED_DIR") or
                PROJECT_ROOT / ".data" / "discovered-specs")
