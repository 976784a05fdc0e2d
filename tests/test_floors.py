"""The house's floors, enforced: what may import what, public Dagster API only, one door for
configuration, and a broken config file never stops the code location from loading.

    pipelines/  (top: Definitions, jobs, sensors, schedules, executors, resource wiring)
        |  imports
    assets/     (what is produced; thin)
        |
    resources/  (how we talk to the world)
        |
    onboarding/ (pure logic: no Dagster, no I/O frameworks)
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onboarding.common.paths import PROJECT_ROOT

FLOORS = ("pipelines", "assets", "resources", "onboarding")
# floor -> top-level packages it must never import
FORBIDDEN = {
    "assets": {"pipelines"},
    "resources": {"pipelines", "assets"},
    "onboarding": {"pipelines", "assets", "resources", "dagster", "dagster_k8s"},
}


def _modules(floor: str) -> list[Path]:
    return sorted((PROJECT_ROOT / floor).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("floor", sorted(FORBIDDEN))
def test_floors_import_only_downward(floor):
    bad = [f"{p.relative_to(PROJECT_ROOT)}:{line}: imports {name}"
           for p in _modules(floor) for line, name in _imports(p)
           if name.split(".")[0] in FORBIDDEN[floor]]
    assert not bad, "\n".join(bad)


# assets/ modules a stage module may import: not stages themselves (no asset of their own), or
# the versioned inputs every stage names in its decorator (`deps=[...]`)
SHARED_ASSET_MODULES = {
    "assets.partitions",  # the partitions definitions
    "assets.step_tags",  # the GPU/cache op tags
    "assets.checks",  # asset-check helpers several stages yield
    "assets.node_gate",  # the qualified-node check of the serving stage
    "assets.stack",  # serving_stack: the versioned stack input
    "assets.model_spec",  # model_spec: the versioned per-partition catalog input
}


def sideways_imports(paths: list[Path]) -> list[str]:
    """`file:line: imports module` for each import of one assets/ module by another that is
    not in SHARED_ASSET_MODULES (a stage's helper belongs below, or in a shared module)."""
    bad = []
    for p in paths:
        me = f"assets.{p.stem}"
        bad += [f"{p.name}:{line}: imports {name}" for line, name in _imports(p)
                if name.startswith("assets.") and name != me
                and name not in SHARED_ASSET_MODULES]
    return bad


def test_stage_modules_do_not_import_each_other():
    bad = sideways_imports(_modules("assets"))
    assert not bad, "stage modules import each other:\n" + "\n".join(bad)


def test_the_sideways_check_catches_a_stage_importing_a_stage(tmp_path):
    """Not vacuous: the arrows this test was written for were of this form; a shared module
    is not one."""
    probe = tmp_path / "layout.py"
    probe.write_text("from assets.deploy import build_plan\nfrom assets.stack import X\n"
                     "import assets.quantize\n")
    assert sideways_imports([probe]) == ["layout.py:1: imports assets.deploy",
                                         "layout.py:3: imports assets.quantize"]


def test_production_code_imports_no_private_names():
    """A name with a leading underscore is its module's own: bench/ and scripts/ call public
    functions (gpu_serving used assets.serving's `_sweep` and `_server_side`)."""
    roots = [*FLOORS, "scripts", "bench"]
    bad = []
    for root in roots:
        for p in sorted((PROJECT_ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text(), str(p))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                        node.module.split(".")[0] in FLOORS:
                    bad += [f"{p.relative_to(PROJECT_ROOT)}:{node.lineno}: {node.module}."
                            f"{a.name}" for a in node.names if a.name.startswith("_")]
    assert not bad, "imports of private names:\n" + "\n".join(bad)


@pytest.mark.slow
def test_no_dagster_internals_outside_tests():
    roots = [*FLOORS, "scripts", "bench"]
    bad = [f"{p.relative_to(PROJECT_ROOT)}:{line}: {name}"
           for root in roots for p in sorted((PROJECT_ROOT / root).rglob("*.py"))
           for line, name in _imports(p) if name.startswith("dagster._")]
    assert not bad, "production code imports Dagster internals:\n" + "\n".join(bad)


def test_assets_read_no_environment():
    """Assets ask the ConfigFiles/OutputDirs resources; only pipelines/ wires env vars."""
    bad = []
    for p in _modules("assets"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                bad.append(f"{p.relative_to(PROJECT_ROOT)}:{node.lineno}: os.{node.attr}")
    assert not bad, "\n".join(bad)


def _grouping_violations(onboarding: Path) -> list[str]:
    """onboarding/ is packages by domain: no flat module beside them, and
    onboarding/common/ (the small shared helpers) imports no other onboarding package, so that
    every package may use it without a cycle."""
    bad = [f"onboarding/{p.name}: a flat module; move it into the package of its domain"
           for p in sorted(onboarding.glob("*.py")) if p.name != "__init__.py"]
    bad += [f"onboarding/{d.name}/: a package without __init__.py"
            for d in sorted(onboarding.iterdir())
            if d.is_dir() and any(d.rglob("*.py")) and not (d / "__init__.py").is_file()]
    for p in sorted((onboarding / "common").rglob("*.py")):
        bad += [f"{p.relative_to(onboarding.parent)}:{line}: imports {name}"
                for line, name in _imports(p)
                if name.split(".")[0] == "onboarding" and
                not (name + ".").startswith("onboarding.common.")]
    return bad


def test_onboarding_is_grouped_and_common_imports_no_other_package():
    bad = _grouping_violations(PROJECT_ROOT / "onboarding")
    assert not bad, "\n".join(bad)


def test_the_grouping_check_catches_a_violation(tmp_path):
    """A flat module, a folder without __init__.py and common importing a stage are found."""
    root = tmp_path / "onboarding"
    (root / "common").mkdir(parents=True)
    (root / "fetch").mkdir()
    (root / "__init__.py").write_text("")
    (root / "common" / "__init__.py").write_text("")
    (root / "common" / "ok.py").write_text("from onboarding.common.errors import ConfigError\n")
    (root / "common" / "bad.py").write_text("import os\nfrom onboarding.fetch.catalog import X\n")
    (root / "fetch" / "catalog.py").write_text("")
    (root / "loose.py").write_text("")
    assert _grouping_violations(root) == [
        "onboarding/loose.py: a flat module; move it into the package of its domain",
        "onboarding/fetch/: a package without __init__.py",
        "onboarding/common/bad.py:2: imports onboarding.fetch.catalog"]


def test_the_floor_check_catches_a_violation(tmp_path):
    """The check above is not vacuous: an upward import is found."""
    bad = tmp_path / "x.py"
    bad.write_text("import os\nfrom pipelines.jobs import onboard_model\n")
    assert (2, "pipelines.jobs") in _imports(bad)


@pytest.mark.slow
def test_broken_config_files_do_not_stop_the_code_location(tmp_path):
    """Every config file broken at once: the code location still loads (what the daemon and
    the webserver do), and the failures surface where the file is read."""
    broken = tmp_path / "configs"
    broken.mkdir()
    (broken / "models").mkdir()
    for name in ("automation.yaml", "cluster.yaml", "nodes.yaml", "stack.yaml", "deploy.yaml",
                 "gates.yaml", "scenarios.yaml", "quantization.yaml", "layouts.yaml",
                 "predict.yaml", "acceptance.yaml"):
        (broken / name).write_text("this: [is not: valid yaml\n")
    (broken / "models" / "typo.yaml").write_text("id: typo\nsorce: s3://models/x/\n")
    code = ("from pipelines.definitions import defs\n"
            "defs.resolve_asset_graph()\n"
            "job = defs.resolve_job_def('onboard_model')\n"
            "print('loaded', len(list(defs.resolve_asset_graph().get_all_asset_keys())),"
            " job.executor_def.name)\n")
    env = {**os.environ, "ONBOARDING_CONFIG_DIR": str(broken), "DAGSTER_DISABLE_TELEMETRY": "1"}
    env.pop("ONBOARDING_EXECUTOR", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = proc.stdout.strip().splitlines()[-1].split()
    assert loaded[0] == "loaded" and int(loaded[1]) >= 10
    # The executor kind comes from cluster.yaml, which is broken: runs say so when they start.
    assert loaded[2] == "onboarding_config_error"


FIXED_AT_NEXT_TICK = """
import shutil, sys
from pathlib import Path
import dagster as dg
import yaml
from pipelines.definitions import defs
from resources.config_files import ConfigFiles

broken, good = Path(sys.argv[1]), Path(sys.argv[2])
sensor = defs.resolve_sensor_def("serving_stack_sensor")
configs = ConfigFiles(config_dir=str(broken))
with dg.instance_for_test() as instance:
    def tick():
        with dg.build_sensor_context(instance=instance, definitions=defs,
                                     resources={"configs": configs}) as ctx:
            return sensor.evaluate_tick(ctx)
    try:
        tick()
        print("broken: no error")
    except Exception as exc:
        print("broken:", type(exc).__name__, str(exc).splitlines()[0])
    automation = yaml.safe_load((good / "automation.yaml").read_text())
    automation["stack"].update(observe_node=False, observe_interval_s=61)
    (broken / "automation.yaml").write_text(yaml.safe_dump(automation))
    shutil.copy(good / "stack.yaml", broken / "stack.yaml")
    data = tick()
    print("fixed:", len(data.asset_events or []), "observation(s)")
"""


@pytest.mark.slow
def test_a_fixed_automation_file_is_used_at_the_next_tick_without_a_reload(tmp_path):
    """The code location loads with automation.yaml broken; the file is then fixed (and its
    stack interval changed) in place. The next serving_stack_sensor tick of the same loaded
    code location reads the fixed file and records its observation, and warns that the new
    interval needs a reload. Before, every tick re-raised the error read at load."""
    broken = tmp_path / "configs"
    shutil.copytree(PROJECT_ROOT / "configs", broken)
    (broken / "automation.yaml").write_text("this: [is not: valid yaml\n")
    env = {**os.environ, "ONBOARDING_CONFIG_DIR": str(broken), "DAGSTER_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run([sys.executable, "-c", FIXED_AT_NEXT_TICK, str(broken),
                           str(PROJECT_ROOT / "configs")], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("broken: ConfigError") and "automation.yaml" in lines[0], lines
    assert lines[1] == "fixed: 1 observation(s)", proc.stderr[-3000:]
    assert "stack_interval_s is 61 (defined with 60)" in proc.stderr
    assert "reload the code location" in proc.stderr
