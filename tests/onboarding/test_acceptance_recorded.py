"""Every recorded set under tests/data/acceptance/ (crafted ones, and the real H200 outputs once
they are dropped into h200/) parsed and judged against the shipped configs/acceptance.yaml.

A set is a directory holding at least `nvidia-smi-q.xml`; the other raw files the probe writes
are used where present. Invariants hold for every set; `expected.yaml` pins one set's verdicts.
A set the probe wrote on a real node also holds its own report (`probe-checks.csv`,
`probe-summary.json`): re-judged from the raw files alone, every check must come out as it did
there.
"""

import csv
import json
from pathlib import Path

import pytest
import yaml

from onboarding.common.paths import PROJECT_ROOT
from onboarding.nodes import acceptance as acc
from onboarding.nodes import telemetry as tm
from onboarding.nodes.acceptance_report import checks_csv_table
from onboarding.nodes.facts import parse_dcgm_diag, parse_smi_xml, parse_topo_matrix
from onboarding.nodes.host_tools import load_recordings
from resources.config_files import ConfigFiles

DATA = Path(__file__).parents[1] / "data" / "acceptance"
# a set the probe wrote (nvidia-smi-q.xml ...) or a recording of the node's tools
# (scripts/record_node_tools.sh: nvidia-smi-q-xml.txt ...)
SETS = sorted({p.parent for p in [*DATA.glob("*/nvidia-smi-q.xml"),
                                  *DATA.glob("*/nvidia-smi-q-xml.txt")]})
NOT_RECORDED = {"direct": {"why_not": "not recorded"}, "s3": {"why_not": "not recorded"}}
PASSING_STORAGE = {"direct": {"path": "/data/models", "bytes": 4 << 30, "seconds": 0.5,
                              "gbps": 8.6, "write_bytes": 4 << 30, "write_seconds": 0.7,
                              "write_gbps": 6.1},
                   "s3": {"uri": "s3://models/llama-70b/model-00001.safetensors",
                          "bytes": 4 << 30, "seconds": 0.6, "gbps": 7.2}}
PROBE_CHECKS = "probe-checks.csv"
PROBE_SUMMARY = "probe-summary.json"


def _json(d: Path, name: str):
    return json.loads((d / name).read_text()) if (d / name).is_file() else None


def _expected(d: Path) -> dict:
    return yaml.safe_load((d / "expected.yaml").read_text()) if (d / "expected.yaml").is_file() \
        else {}


def _storage(d: Path) -> dict:
    """The set's storage_read measurement: its `storage-read.json` (the bytes read and the
    seconds taken, what the verdict is judged from); a passing stand-in only for the crafted
    sets, which the probe did not write and which plant no storage fault."""
    raw = _json(d, acc.RAW_STORAGE)
    if raw is not None:
        return raw
    assert not (d / PROBE_CHECKS).is_file(), f"{d.name}: written by the probe without " \
        f"{acc.RAW_STORAGE}: its direct-I/O verdict cannot be re-judged"
    return PASSING_STORAGE if d.name.startswith("crafted-") else NOT_RECORDED


def _smi_xml(d: Path) -> str:
    raw = d / acc.RAW_SMI_XML
    return raw.read_text() if raw.is_file() else load_recordings(d)["nvidia-smi-q-xml"].output


def _topo(d: Path) -> str | None:
    """`nvidia-smi topo -m` as the probe keeps it, or its recording's output."""
    run = load_recordings(d).get("nvidia-smi-topo-m")
    if run is not None:
        return run.output
    return (d / acc.RAW_TOPO).read_text() if (d / acc.RAW_TOPO).is_file() else None


def _dcgm(d: Path) -> tuple[object, str]:
    """(parsed diag, "") from the probe's file or a recording that ran; else (None, why)."""
    if (d / acc.RAW_DCGM).is_file():
        return parse_dcgm_diag((d / acc.RAW_DCGM).read_text()), ""
    run = load_recordings(d).get("dcgmi-diag-r3")
    if run is not None and not run.unavailable():
        return parse_dcgm_diag(run.output), ""
    return None, run.unavailable() if run is not None else "DCGM is not installed"


def judge(d: Path) -> dict:
    """Each node asset's result built from the set's raw files, as the assets build them."""
    exp, configs = _expected(d), ConfigFiles()
    smi_xml = _smi_xml(d)
    node_type = exp.get("node_type") or d.name.split("-")[0]
    gpus = exp.get("gpus") or len(parse_smi_xml(smi_xml).gpus)
    cfg = configs.acceptance()
    t = cfg.node_types[node_type]
    t = t.model_copy(update={"waivers": {**t.waivers, **exp.get("waivers", {})}})
    cfg = cfg.model_copy(update={"nodes": {"recorded": acc.NodeRegistration(
        node_type=node_type, gpus=gpus)}, "node_types": {**cfg.node_types, node_type: t}})
    s = acc.node_setting(cfg, configs.nodes(), "recorded", "test")
    nvml = _json(d, acc.RAW_NVML) or {"nvlinks_active": {}, "error": "not recorded"}
    topo = _topo(d)
    inv = acc.build_inventory(
        s, smi_xml=smi_xml, smi_error="", topo_text=topo,
        topo_error="" if topo is not None else "not recorded",
        nvlinks={int(k): v for k, v in nvml["nvlinks_active"].items()},
        nvlink_error=nvml["error"], system=_json(d, acc.RAW_SYSTEM) or {},
        stack_facts={"nvidia_driver": "recorded"}, tools=load_recordings(d))
    burn, storage = _json(d, acc.RAW_BURN), _storage(d)
    diag, diag_why = _dcgm(d)
    health = acc.build_health(
        s, inv, diag=diag, diag_why=diag_why, level=3,
        burn=burn["result"] if burn else None, samples=burn["samples"] if burn else (),
        xids=burn["xids"] if burn else (),
        telemetry_why=burn["telemetry_unavailable"] if burn else "",
        xid_why=burn["xid_watch"] if burn else "", links=load_recordings(d))
    ic_raw, mem_raw = _json(d, acc.RAW_INTERCONNECT), _json(d, acc.RAW_MEMORY)
    parts = {"node_inventory": inv, "gpu_health": health,
             "interconnect": acc.build_interconnect(  # one GPU: the asset measures nothing
                 s, inv, ic_raw, "" if ic_raw or inv.gpu_count < 2 else "not recorded"),
             "memory_bandwidth": acc.build_memory(s, inv, mem_raw, "" if mem_raw else
                                                  "not recorded"),
             "storage_read": acc.build_storage(s, storage["direct"], storage["s3"])}
    return {"setting": s, "parts": parts, "burn": burn,
            "acceptance": acc.build_acceptance(s, parts, 0.0)}


@pytest.fixture(params=SETS, ids=[d.name for d in SETS])
def recorded(request) -> tuple[Path, dict, dict]:
    d = request.param
    return d, _expected(d), judge(d)


def test_every_set_parses_into_complete_gpu_facts(recorded):
    d, exp, _ = recorded
    smi = parse_smi_xml(_smi_xml(d))
    assert smi.gpus and smi.driver_version
    for g in smi.gpus:
        assert g.name and g.bus_id and g.memory_total_mib and g.uuid, g
        assert g.pcie_width_max and g.pcie_gen_max and g.sm_clock_max_mhz, g
    if _topo(d) is not None:
        topo = parse_topo_matrix(_topo(d))
        assert len(topo.gpus) == len(smi.gpus)
        if "nvlinks" in exp and len(topo.gpus) > 1:
            assert topo.nvlinks("GPU0", "GPU1") == exp["nvlinks"]
        if "numa_affinity" in exp:
            assert set(topo.numa_affinity.values()) == {exp["numa_affinity"]}
    if "gpus" in exp:
        assert len(smi.gpus) == exp["gpus"]
        assert {g.name for g in smi.gpus} == {exp["gpu_name"]}
        assert smi.driver_version == exp["driver"]
    if (d / acc.RAW_DCGM).is_file() and "dcgm_version" in exp:
        assert parse_dcgm_diag((d / acc.RAW_DCGM).read_text()).version == exp["dcgm_version"]


def test_every_check_is_judged_or_says_why_not(recorded):
    _, _, judged = recorded
    checks = judged["acceptance"].checks
    assert checks
    for c in checks:
        assert c.status in (acc.PASS, acc.FAIL, acc.NOT_CHECKED), c
        if c.status == acc.NOT_CHECKED:
            assert c.reason.startswith("not checked: "), c
        if c.status == acc.FAIL:
            assert c.reason and c.measured, c
        if c not in acc.OUTSIDE_NODE_ACCEPTANCE:  # every threshold says where it comes from
            assert c.source, c
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), "a check is reported twice"


def test_burn_samples_carry_dcgm_fields_per_gpu(recorded):
    _, _, judged = recorded
    burn = judged["burn"]
    if burn is None or burn["telemetry_unavailable"]:
        pytest.skip("no burn samples in this set")
    samples = burn["samples"]
    gpus = {int(g["gpu"]) for g in burn["result"]["per_gpu"]}
    assert set(tm.gpus_in(samples)) == gpus
    windows = tm.summarize(samples)
    for g in gpus:
        w = windows[g]
        assert w.power_mean_w and w.temp_max_c and w.sm_clock_median_mhz, w
        assert w.energy_j and w.energy_j > 0


def test_expected_verdicts(recorded):
    d, exp, judged = recorded
    if "checks" not in exp:
        pytest.skip(f"{d.name} has no expected.yaml")
    got = {c.name: c.status for c in judged["acceptance"].checks}
    wrong = {name: (got.get(name), want) for name, want in exp["checks"].items()
             if got.get(name) != want}
    assert not wrong, f"(got, expected): {wrong}"
    result = judged["acceptance"]
    assert result.qualified is exp["qualified"], result.reasons
    for phrase in exp.get("reasons_mention", []):
        assert any(phrase in r for r in result.reasons), (phrase, result.reasons)


def test_a_probed_node_is_judged_from_its_files_as_it_was_on_the_node(recorded):
    """The raw files carry the verdict: every check the probe made on the node is made again
    from its files, and where its threshold is the same it comes out the same. Checks whose
    threshold has been tightened since (the probe's `expected` column differs) are re-judged
    under the shipped one; the H200 set has several."""
    d, _, judged = recorded
    if not (d / PROBE_CHECKS).is_file():
        pytest.skip(f"{d.name} was not written by scripts/gpu_node_probe.py")
    with (d / PROBE_CHECKS).open() as f:
        on_node = {r["check"]: r for r in csv.DictReader(f)}
    got = {c.name: c for c in judged["acceptance"].checks}
    assert set(on_node) <= set(got)
    same = [n for n, r in on_node.items() if r["expected"] == got[n].expected]
    assert {n: got[n].status for n in same} == {n: on_node[n]["result"] for n in same}
    assert len(same) >= len(on_node) // 2  # most thresholds are still what the node saw
    summary = json.loads((d / PROBE_SUMMARY).read_text())
    assert summary["gate"]["passed"] is summary["qualified"]  # the node's gate


def test_a_probed_set_is_judged_from_the_storage_measurement_it_holds(recorded):
    """direct_io_read is re-judged from the bytes and seconds in the set's storage-read.json,
    not from a figure typed into expected.yaml (the H200 set's file was rebuilt from the probe's
    report and says how, in `reconstructed`)."""
    d, exp, judged = recorded
    if not (d / PROBE_CHECKS).is_file():
        pytest.skip(f"{d.name} was not written by scripts/gpu_node_probe.py")
    assert "storage_read" not in exp
    direct = _json(d, acc.RAW_STORAGE)["direct"]
    assert direct["bytes"] > 0 and direct["seconds"] > 0
    assert judged["parts"]["storage_read"].direct_read == direct
    with (d / PROBE_CHECKS).open() as f:
        on_node = next(r for r in csv.DictReader(f) if r["check"] == "direct_io_read")
    got = next(c for c in judged["acceptance"].checks if c.name == "direct_io_read")
    assert (got.status, got.measured, got.reason) == (on_node["result"], on_node["measured"],
                                                      on_node["reason"])


def test_docs_h200_table_is_the_probes_checks_file():
    """docs/acceptance.md's "H200 results" table is computed from the recorded files, not typed."""
    with (DATA / "h200" / PROBE_CHECKS).open() as f:
        table = checks_csv_table(list(csv.DictReader(f)))
    doc = (Path(__file__).parents[2] / "docs" / "acceptance.md").read_text()
    assert table in doc.split("## H200 results", 1)[1]
    assert "| 1 | direct_io_read | fail | 1.47 GB/s (2.0 GiB, O_DIRECT) | >= 3.0 GB/s | yes |" \
        in table
    assert "| 2 | nvlink | not checked | 1 GPU |  | no |" in table


def test_docs_acceptance_quotes_the_steady_part_power_of_the_recorded_burn():
    """docs/acceptance.md said 676 W "over the steady part"; that is the whole
    window's mean. The steady part (after warmup_s) is what burn_power judges."""
    import re

    burn = json.loads((PROJECT_ROOT / "tests/data/acceptance/h200/burn.json").read_text())
    start, end = burn["result"]["window_s"]
    warmup = yaml.safe_load((PROJECT_ROOT / "configs/acceptance.yaml").read_text())
    warmup_s = next(v for k, v in _walk(warmup) if k == "warmup_s")
    burning = tm.window(burn["samples"], start, end)
    steady = tm.summarize(burning, start_s=start + warmup_s)[0].power_mean_w
    whole = tm.summarize(burning)[0].power_mean_w
    text = (PROJECT_ROOT / "docs" / "acceptance.md").read_text()
    quoted = re.search(r"mean (\d+) W of 700 W over the steady part", text)
    assert quoted and int(quoted.group(1)) == round(steady) == 692
    assert f"{round(whole)} W\nis the whole" in text or f"{round(whole)} W is the whole" in text


def _walk(node, key=None):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, k)
    else:
        yield key, node
