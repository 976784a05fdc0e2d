"""Render the picture of every layout in configs/layouts.yaml into docs/ (plan-only: from the
catalog's architecture hints, nothing measured), as docs/layout.md shows them.

    .venv/bin/python scripts/layout_pictures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onboarding.common.paths import DEFAULT_CONFIG_DIR, PROJECT_ROOT
from onboarding.deploy.plan import Measured, load_nodes, plan_inputs, shape_from_hint
from onboarding.fetch.catalog import load_catalog
from onboarding.layouts.placement import layout_entries, load_layouts, plan_layout
from onboarding.layouts.plot import layout_png
from onboarding.serving.profiles import load_slo_section


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs",
                    help="where the PNGs go (default: docs/, where docs/layout.md shows them)")
    out = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    nodes = load_nodes(DEFAULT_CONFIG_DIR / "nodes.yaml")
    catalog = load_catalog(DEFAULT_CONFIG_DIR / "models")
    cfg = load_layouts(DEFAULT_CONFIG_DIR / "layouts.yaml")
    slos = load_slo_section(DEFAULT_CONFIG_DIR / "gates.yaml")
    inputs = {m: plan_inputs(s, nodes, shape_from_hint(s.architecture, m), Measured())
              for m, s in catalog.items() if s.architecture is not None}
    for name, layout in cfg.layouts.items():
        plan = plan_layout(name, layout, layout_entries(layout, catalog, inputs, slos, {}), cfg,
                           nodes)
        if not plan.feasible:
            print(f"{name}: infeasible: {plan.reason}")
            continue
        path = out / f"layout-{name}.png"
        path.write_bytes(layout_png(plan))
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
