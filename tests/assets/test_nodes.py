"""The node assets in a real Dagster instance: on this machine (no GPU) every GPU check says
"no GPU: not checked" and the node is not qualified; a recorded node (nvidia-smi replayed by a
FAKE, since no GPU exists here, and the GPU assets' typed results built from the recorded
files) is qualified, with its report; the serving gate reads that verdict."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.node_gate import NODE_CHECK, acceptance_problem, node_acceptance_check
from assets.nodes import (
    NODE_QUALIFIED_CHECK,
    gpu_health,
    interconnect,
    memory_bandwidth,
    node_acceptance,
    node_inventory,
    storage_read,
)
from assets.partitions import nodes_partitions
from onboarding.nodes import acceptance as acc
from onboarding.nodes.facts import parse_dcgm_diag
from resources.config_files import ConfigFiles, OutputDirs
from resources.node_probe import NodeProbe
from resources.nvme_cache import NvmeCache
from resources.s3 import S3ObjectStore
from resources.upstream import optional_upstream
from tests.dagster_support import stand_in
from tests.resources.test_node_probe import crafted_sysfs, fake_tool, replay_smi

DATA = Path(__file__).parents[1] / "data" / "acceptance" / "crafted-h200x2-healthy"
NODE = "gpu-node-01"
ALL = [node_inventory, gpu_health, interconnect, memory_bandwidth, storage_read,
       node_acceptance]


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions(nodes_partitions.name, [NODE])
        yield inst


def register(config_dir: Path, gpus: int, **probe) -> None:
    path = config_dir / "acceptance.yaml"
    data = yaml.safe_load(path.read_text())
    data["nodes"] = {NODE: {"node_type": "h200", "gpus": gpus}}
    data["probe"].update({"direct_read_gib": 1 / 16, "direct_read_block_mib": 4,
                          "stress_s": 0, **probe})  # no CPU stress on the shared test machine
    data["defaults"]["storage"].update(direct_read_min_gbps=0.001,  # any disk here passes
                                       direct_write_min_gbps=0.001)
    data["defaults"]["waivers"] = {"s3_get": "no S3 object on the test machine",
                                   "numa_map": "a 2-GPU slice of the recorded node"}
    path.write_text(yaml.safe_dump(data))


def resources(configs: ConfigFiles, outputs: OutputDirs, probe: NodeProbe, tmp_path: Path
              ) -> dict:
    return {"configs": configs, "outputs": outputs, "node_probe": probe,
            "nvme_cache": NvmeCache(root=str(tmp_path / "nvme")),
            "s3": S3ObjectStore(endpoint_url="http://127.0.0.1:1", access_key_id="unused",
                                secret_access_key="unused"),
            "optional_upstream": optional_upstream}


def io_manager(instance: dg.DagsterInstance) -> dg.IOManager:
    """The IO manager `dg.materialize` stored the node assets' values with (instance storage)."""
    with dg.build_resources({"io_manager": dg.FilesystemIOManager()}, instance=instance) as r:
        return r.io_manager


def checks_of(result, asset: str) -> dict[str, acc.Check]:
    return {c.name: c for c in result.output_for_node(asset).checks}


@pytest.mark.slow
def test_on_this_machine_no_gpu_is_not_checked_and_the_node_not_qualified(
        instance, config_dir, configs, outputs, tmp_path):
    register(config_dir, gpus=8)
    probe = NodeProbe(nvidia_smi=str(tmp_path / "no" / "nvidia-smi"), sys_root=str(tmp_path))
    result = dg.materialize(ALL, instance=instance, partition_key=NODE, raise_on_error=False,
                            resources=resources(configs, outputs, probe, tmp_path))
    assert result.success
    inv = checks_of(result, "node_inventory")
    for name in ("gpu_count", "gpu_model", "ecc", "pcie_link"):
        assert inv[name].status == acc.NOT_CHECKED and inv[name].required
        assert inv[name].reason.startswith("not checked: no GPU: nvidia-smi not found")
    for asset in ("gpu_health", "memory_bandwidth"):
        assert all(c.status == acc.NOT_CHECKED and "no GPU" in c.reason
                   for c in checks_of(result, asset).values())
    direct_check = checks_of(result, "storage_read")["direct_io_read"]
    assert direct_check.status == acc.PASS
    kept = json.loads((outputs.reports / "nodes" / NODE / "raw" / acc.RAW_STORAGE).read_text())
    assert f"{kept['direct']['gbps']:.2f} GB/s" in direct_check.measured  # re-judgeable later
    assert kept["s3"]["why_not"].startswith("no s3_object configured")
    verdict = result.output_for_node("node_acceptance")
    assert not verdict.qualified
    assert any("gpu_count: not checked: no GPU" in r for r in verdict.reasons)
    [check] = [e for e in result.get_asset_check_evaluations()
               if e.check_name == NODE_QUALIFIED_CHECK]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    page = (outputs.reports / "nodes" / NODE / "acceptance.md").read_text()
    assert "**NOT QUALIFIED**" in page and "no GPU: nvidia-smi not found" in page
    assert not (outputs.reports / "nodes" / NODE / "burn.png").exists()
    mat = instance.fetch_materializations(dg.AssetKey("node_acceptance"), limit=1).records[0]
    assert mat.asset_materialization.metadata["qualified"].value is False
    # a model benchmarked on this node does not count where the profile requires acceptance
    problem, stored = acceptance_problem(io_manager(instance), instance, NODE, {})
    assert problem.startswith(f"node {NODE!r} is not qualified: ") and \
        "more in its report" in problem
    assert "phase 1 pcie_link: not checked: no GPU: nvidia-smi not found" in " ".join(
        stored.reasons)


def recorded_parts(s: acc.NodeSetting, inv: acc.NodeInventory) -> dict:
    """The GPU assets' typed results from the recorded set (what they stored on the node)."""
    burn = json.loads((DATA / acc.RAW_BURN).read_text())
    health = acc.build_health(
        s, inv, diag=parse_dcgm_diag((DATA / acc.RAW_DCGM).read_text()), diag_why="", level=3,
        burn=burn["result"], samples=burn["samples"], xids=burn["xids"], telemetry_why="",
        xid_why="", links=NodeProbe(tool_recordings=str(DATA)).links_under_load(None))
    return {"gpu_health": health,
            "interconnect": acc.build_interconnect(s, inv, json.loads(
                (DATA / acc.RAW_INTERCONNECT).read_text()), ""),
            "memory_bandwidth": acc.build_memory(s, inv, json.loads(
                (DATA / acc.RAW_MEMORY).read_text()), "")}


def accept_recorded_node(instance, config_dir, configs, outputs, tmp_path
                         ) -> dg.ExecuteInJobResult:
    register(config_dir, gpus=2)
    sysfs = crafted_sysfs(tmp_path / "sys")
    (sysfs / "devices/pci0000:17/0000:1a:00.0/current_link_width").write_text("16\n")
    (sysfs / "devices/system/edac/mc/mc1/ue_count").write_text("0\n")
    (sysfs / "devices/system/edac/mc/mc0/ce_count").write_text("0\n")
    (sysfs / "class/net/ib0/mtu").write_text("9000\n")
    (sysfs / "bus/pci/devices/0000:19:00.0/aer_dev_nonfatal").write_text("TOTAL_ERR_NONFATAL 0\n")
    nvme = fake_tool(tmp_path / "nvme-cli", 'echo \'{"critical_warning":0,"media_errors":0,'
                     '"percent_used":1,"avail_spare":100,"spare_thresh":10}\'\n')
    probe = NodeProbe(nvidia_smi=replay_smi(tmp_path), sys_root=str(sysfs), nvme=nvme,
                      tool_recordings=str(DATA))
    res = resources(configs, outputs, probe, tmp_path)
    first = dg.materialize([node_inventory, storage_read], instance=instance,
                           partition_key=NODE, resources=res)
    inv = first.output_for_node("node_inventory")
    assert {c.name: (c.status, c.required) for c in inv.checks if c.status != acc.PASS} == {
        "driver": (acc.NOT_CHECKED, False), "numa_map": (acc.NOT_CHECKED, False)}
    s = acc.node_setting(configs.acceptance(), configs.nodes(), NODE, "test")
    parts = recorded_parts(s, inv)
    assert dg.materialize([stand_in(n, v, nodes_partitions) for n, v in parts.items()],
                          instance=instance, partition_key=NODE).success
    upstream = [dg.AssetSpec(n, partitions_def=nodes_partitions) for n in
                ("node_inventory", "gpu_health", "interconnect", "memory_bandwidth",
                 "storage_read")]
    return dg.materialize([node_acceptance, *upstream], instance=instance, partition_key=NODE,
                          resources=res)


@pytest.mark.slow
def test_a_recorded_healthy_node_is_qualified_with_its_report(
        instance, config_dir, configs, outputs, tmp_path):
    result = accept_recorded_node(instance, config_dir, configs, outputs, tmp_path)
    verdict = result.output_for_node("node_acceptance")
    assert verdict.qualified, verdict.reasons
    assert verdict.stack_facts == {"nvidia_driver": "580.95.05", "cuda_driver_api": "13.0",
                                   "gpus": ["NVIDIA H200", "NVIDIA H200"]}
    assert [p["verdict"] for p in verdict.phases] == ["go", "go", "go", "go", "not checked"]
    rows = {c.name: c for c in verdict.checks}
    assert rows["pcie_lnksta"].status == acc.PASS  # the replayed lspci -vvv, judged
    assert rows["pcie_lnksta_load"].status == acc.PASS  # ... and its read under the burn
    assert "waived: no S3 object on the test machine" in rows["s3_get"].reason
    assert all(c.source for c in verdict.checks if c.status != acc.NOT_CHECKED or c.required)
    out = outputs.reports / "nodes" / NODE
    assert (out / "burn.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "acceptance.md").read_text()
    assert "**QUALIFIED**" in page and "![burn traces](burn.png)" in page
    assert "| GPU0 |" in page and "busbw" in page
    assert "| source |" in page and "procedure: stay below the throttle point" in page
    assert (out / "raw" / acc.RAW_SMI_XML).is_file()  # what the probe read, kept
    md = {e.asset_key.to_user_string(): e.materialization.metadata
          for e in result.get_asset_materialization_events()}["node_acceptance"]
    assert md["report"].value.count("data:image/png;base64,") == 1
    [check] = result.get_asset_check_evaluations()
    assert check.passed


@pytest.mark.slow
def test_the_serving_gate_reads_the_verdict_and_the_driver(
        instance, config_dir, configs, outputs, tmp_path):
    accept_recorded_node(instance, config_dir, configs, outputs, tmp_path)
    io = io_manager(instance)
    same = {"nvidia_driver": "580.95.05", "cuda_driver_api": "13.0",
            "gpus": ["NVIDIA H200", "NVIDIA H200"]}
    ok = node_acceptance_check(io, instance, NODE, True, "gpu", same)
    assert ok.passed and ok.check_name == NODE_CHECK
    assert ok.metadata["acceptance"].value == "qualified, current"
    upgraded = node_acceptance_check(io, instance, NODE, True, "gpu",
                                     {**same, "nvidia_driver": "590.44.01"})
    assert not upgraded.passed and upgraded.severity == dg.AssetCheckSeverity.ERROR
    assert "nvidia_driver: 580.95.05 -> 590.44.01" in upgraded.metadata["acceptance"].value
    unknown = node_acceptance_check(io, instance, "gpu-node-99", True, "gpu", same)
    assert not unknown.passed
    assert "has no node_acceptance" in unknown.metadata["acceptance"].value
    relaxed = node_acceptance_check(io, instance, "gpu-node-99", False, "cpu", same)
    assert relaxed.passed and relaxed.metadata["required"].value is False
    assert "has no node_acceptance" in relaxed.metadata["acceptance"].value


def _stored_acceptance(qualified: bool, reasons: tuple[str, ...], facts: dict
                       ) -> acc.NodeAcceptance:
    return acc.NodeAcceptance(node=NODE, node_type="h200", qualified=qualified, reasons=reasons,
                              phases=(), checks=(), stack_facts=facts, stack_fingerprint="fp",
                              accepted_at=1.0e9)


@pytest.mark.slow
def test_the_serving_gate_reads_the_stored_verdict_not_the_metadata(instance):
    """The gate reads the `NodeAcceptance` value node_acceptance stored. Before, it read the
    `qualified` and markdown `reasons` metadata: a verdict stored without that text was taken
    for "not qualified", and a reason spanning two lines came back as two reasons."""
    facts = {"nvidia_driver": "580.95.05", "cuda_driver_api": "13.0", "gpus": ["NVIDIA H200"]}
    qualified = stand_in("node_acceptance", _stored_acceptance(True, (), facts), nodes_partitions)
    assert dg.materialize([qualified], instance=instance, partition_key=NODE).success
    io = io_manager(instance)
    ok = node_acceptance_check(io, instance, NODE, True, "gpu", facts)
    assert ok.passed, ok.metadata["acceptance"].value
    assert ok.metadata["accepted_at"].value == 1.0e9
    reason = "phase 2 nvlink: 2 of 18 links down\n- link 3 and link 7 (nvidia-smi nvlink -s)"
    failed = stand_in("node_acceptance",
                      _stored_acceptance(False, (reason, "phase 3 hbm: 3.1 TB/s"), facts),
                      nodes_partitions)
    assert dg.materialize([failed], instance=instance, partition_key=NODE).success
    problem, value = acceptance_problem(io, instance, NODE, facts)
    assert value is not None and not value.qualified
    assert problem == f"node {NODE!r} is not qualified: {reason}; phase 3 hbm: 3.1 TB/s"
