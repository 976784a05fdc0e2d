"""The repository's own locations: the defaults behind the ConfigFiles/OutputDirs resources.

Nothing here reads the environment; pipelines/resources.py wires ONBOARDING_CONFIG_DIR and
friends into the resources, and everything else asks a resource.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG_DIR = PROJECT_ROOT / "configs"
DEFAULT_DISCOVERED_DIR = PROJECT_ROOT / ".data" / "discovered-specs"
