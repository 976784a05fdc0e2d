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
