"""The KServe CRDs that kserve_manifest validates every rendered manifest against.

They are the real CRD files, kept outside the repository in ../shared/kserve (the
ManifestValidator's default; its SOURCE file names the KServe commit), not copies in tests/. A
checkout without them cannot judge a manifest valid, so the tests that render through the
validator skip and say so instead of failing on the missing file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.manifest_validator import DEFAULT_CRD_DIR, ManifestValidator

CRDS = ManifestValidator().resolved_crd_paths()
MISSING = [Path(p).name for p in CRDS if not Path(p).is_file()]

needs_kserve_crds = pytest.mark.skipif(
    bool(MISSING),
    reason=(
        f"needs the KServe CRDs in {DEFAULT_CRD_DIR} ({len(MISSING)} of {len(CRDS)} missing): "
        "kserve_manifest validates every rendered manifest against the real CRD schemas, which "
        "live beside the repository in ../shared/kserve, not in it"
    ),
)
