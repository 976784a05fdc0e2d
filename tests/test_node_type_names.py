"""Node types are data: no node type's name is written in the code.

The same scan as tests/test_engine_names.py (string constants in pipelines/, assets/, resources/
and onboarding/, docstrings and comments exempt) for the node types configs/nodes.yaml lists.
Adding a node type is entries in configs/ (docs/architecture.md); code that names one is a
second place to change, which this test refuses.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from onboarding.common.paths import PROJECT_ROOT
from tests.test_engine_names import engine_literals

# (file, the start of the constant): text for a person that names a node type as an example,
# and selects nothing. Keep this short; a new entry needs a reason as good.
ALLOWED = {
    ("pipelines/jobs.py", "Predict one model's serving performance per node type"),  # job text
    ("assets/predict.py", "AIConfigurator's predictions of the recorded H200"),  # description
    ("assets/predict.py", "Predicted TTFT, TPOT and tokens/s/GPU per node type"),  # description
    ("onboarding/predictions/predict.py", "Add it under systems (e.g. b300: b300_sxm)."),  # hint
    ("onboarding/runs/cluster.py", "List node types (b300, b200, h200, h100)"),  # error hint
}


def node_type_names(root: Path = PROJECT_ROOT) -> list[str]:
    nodes = yaml.safe_load((root / "configs" / "nodes.yaml").read_text())
    return sorted(nodes["node_types"])


def node_type_literals(root: Path, names: list[str]) -> list[str]:
    """`path:line: 'constant'` for every string constant naming a node type, less ALLOWED."""
    out = []
    for found in engine_literals(root, names):
        where, text = found.split(": ", 1)
        path = where.rsplit(":", 1)[0]
        if not any(path == f and text.strip("'\"").startswith(start) for f, start in ALLOWED):
            out.append(found)
    return out


def test_the_nodes_config_lists_the_node_types_the_scan_looks_for():
    assert {"h200", "b300"} <= set(node_type_names())


def test_no_node_type_name_is_written_in_code():
    found = node_type_literals(PROJECT_ROOT, node_type_names())
    assert not found, ("node type names written in code (make it data in configs/, e.g. "
                       "nodes.yaml or predict.yaml):\n" + "\n".join(found))


def test_the_scan_finds_a_node_type_and_spares_docstrings_and_the_allowed(tmp_path: Path):
    (tmp_path / "onboarding" / "runs").mkdir(parents=True)
    (tmp_path / "onboarding" / "m.py").write_text(
        '"""Measured on the H200."""\n'
        'CAL = "h200"\n'
        'KEY = "B300-SXM"\n'
        'OTHER = "h2000"\n')
    (tmp_path / "onboarding" / "runs" / "cluster.py").write_text(
        'HINT = "List node types (b300, b200, h200, h100) under node_types."\n')
    found = node_type_literals(tmp_path, ["b300", "h200"])
    assert [f.split(": ", 1)[1] for f in found] == ["'h200'", "'B300-SXM'"]
