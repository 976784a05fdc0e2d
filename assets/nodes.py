"""Node acceptance, one partition per GPU node (`nodes`): node_inventory, gpu_health,
interconnect, memory_bandwidth and storage_read feed node_acceptance, the go/no-go verdict per
phase with its one-page report.

Thin: resolve the node (configs/acceptance.yaml `nodes`, thresholds per node type), call the
NodeProbe resource, hand its raw readings to onboarding.nodes.acceptance, which parses and judges.
Each asset stores a typed result (its checks included); node_acceptance reads them through the
optional-upstream input manager, so an upstream never run for the node is a check not made.
Raw outputs (XML, topology, samples) are kept under the reports directory:
`<reports>/nodes/<node>/raw/`, the report beside them. The serving assets read the verdict
(assets/node_gate.py). The GPU-bound steps share the `gpu` pool with the serving steps, so a
burn never runs beside a benchmark on the same instance.
"""

import base64
import json
import time
from pathlib import Path

import dagster as dg

from assets.partitions import nodes_partitions
from onboarding.common.tables import md_table, write_csv
from onboarding.nodes import acceptance as acc
from onboarding.nodes import telemetry as tm
from onboarding.nodes.acceptance_report import burn_png, report_markdown, report_sections
from resources.config_files import ConfigFiles, OutputDirs
from resources.node_probe import NodeProbe
from resources.nvme_cache import NvmeCache
from resources.s3 import S3ObjectStore

GROUP = "nodes"
NODE_QUALIFIED_CHECK = "node_qualified"
NODE_ASSETS = ("node_inventory", "gpu_health", "interconnect", "memory_bandwidth",
               "storage_read", "node_acceptance")


class GpuHealthConfig(dg.Config):
    """Unset fields take configs/acceptance.yaml `probe`."""

    burn_s: float | None = None
    dcgm_diag_level: int | None = None


def node_dir(outputs: OutputDirs, node: str) -> Path:
    return outputs.reports / "nodes" / node


def _keep(outputs: OutputDirs, node: str) -> Path:
    return node_dir(outputs, node) / "raw"


def _checks_metadata(checks: tuple[acc.Check, ...]) -> dict:
    n = {st: sum(c.status == st for c in checks) for st in (acc.PASS, acc.FAIL,
                                                           acc.NOT_CHECKED)}
    return {"checks": dg.MetadataValue.md(md_table([c.row() for c in checks])),
            "passed": n[acc.PASS], "failed": n[acc.FAIL], "not_checked": n[acc.NOT_CHECKED]}


def _gpus(inv: acc.NodeInventory) -> list[int]:
    return [g.index for g in inv.smi.gpus] if inv.smi and not inv.no_gpu else []


@dg.asset(partitions_def=nodes_partitions, group_name=GROUP,
          description="GPUs (model, memory, driver, VBIOS, ECC and row remapping, persistence, "
          "MIG, power limits, clocks), PCIe link per GPU and NIC (lspci LnkSta), topology and "
          "NUMA, Fabric Manager, NVLink state and errors, EDAC/AER/NVMe SMART, the kernel log, "
          "the BMC's events and sensors, the CPU/memory stress, container toolkit, nouveau and "
          "DKMS, NIC firmware and MTU: judged per node type.")
def node_inventory(context: dg.AssetExecutionContext, configs: ConfigFiles,
                   outputs: OutputDirs, node_probe: NodeProbe) -> dg.Output:
    s = configs.node_setting(context.partition_key)
    raw = node_probe.inventory(_keep(outputs, s.name), s.probe.stress_s, context.log.info)
    inv = acc.build_inventory(s, **vars(raw))
    if inv.no_gpu:
        context.log.warning(f"{s.name}: {inv.no_gpu}")
    return dg.Output(inv, metadata={
        **_checks_metadata(inv.checks), "node_type": s.node_type, "gpu_count": inv.gpu_count,
        "driver": (inv.smi.driver_version if inv.smi else None) or inv.no_gpu,
        "gpus": dg.MetadataValue.md(md_table([g.row for g in inv.smi.gpus]) if inv.smi
                                    else inv.no_gpu),
        "topology": dg.MetadataValue.md(md_table(inv.topology.matrix_rows()) if inv.topology
                                        else raw.topo_error or "not read"),
        "system": dg.MetadataValue.json(inv.system),
        "stack_facts": dg.MetadataValue.json(inv.stack_facts)})


@dg.asset(partitions_def=nodes_partitions, group_name=GROUP, pool="gpu",
          description="`dcgmi diag` where DCGM is installed, and a sustained matmul burn on "
          "every GPU with NVML sampling: compute errors, XIDs, ECC deltas, temperature plateau, "
          "clock collapse, power against the limit; every GPU's PCIe link read again under "
          "load (an idle GPU trains it down).")
def gpu_health(context: dg.AssetExecutionContext, config: GpuHealthConfig,
               configs: ConfigFiles, outputs: OutputDirs, node_probe: NodeProbe,
               node_inventory: acc.NodeInventory) -> dg.Output:
    s, keep = configs.node_setting(context.partition_key), _keep(outputs, context.partition_key)
    gpus, level = _gpus(node_inventory), config.dcgm_diag_level
    level = s.probe.dcgm_diag_level if level is None else level
    diag, why, run = None, "", None
    if gpus:
        diag, why = node_probe.dcgm_diag(level, keep, s.probe.gpu_job_timeout_s)
        run = node_probe.burn(gpus, s.probe, config.burn_s or s.probe.burn_s,
                              s.thresholds.burn.compare_tolerance, keep, context.log.info)
    health = acc.build_health(
        s, node_inventory, diag=diag, diag_why=why, level=level,
        burn=run.result if run else None, samples=run.samples if run else (),
        xids=run.xids if run else (), telemetry_why=run.telemetry_why if run else "",
        xid_why=run.xid_why if run else "", links=run.links if run else None)
    return dg.Output(health, metadata={
        **_checks_metadata(health.checks),
        "burn": dg.MetadataValue.md(md_table(health.burn.get("per_gpu") or [])),
        "steady_part": dg.MetadataValue.md(md_table(health.windows)),
        "samples": len(health.samples), "xids": dg.MetadataValue.json(list(health.xids))})


@dg.asset(partitions_def=nodes_partitions, group_name=GROUP, pool="gpu",
          description="NCCL all-reduce bus bandwidth (nccl-tests' formula) for every TP group "
          "size the node supports, and the P2P copy matrix; needs more than one GPU.")
def interconnect(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                 node_probe: NodeProbe, node_inventory: acc.NodeInventory) -> dg.Output:
    s, gpus = configs.node_setting(context.partition_key), _gpus(node_inventory)
    raw = None
    if len(gpus) > 1:
        raw = node_probe.interconnect(gpus, acc.tp_groups(s, len(gpus)), s.probe,
                                      _keep(outputs, s.name), context.log.info)
    result = acc.build_interconnect(s, node_inventory, raw, "")
    return dg.Output(result, metadata={
        **_checks_metadata(result.checks),
        "allreduce": dg.MetadataValue.md(md_table(result.allreduce)),
        "p2p": dg.MetadataValue.md(md_table(result.p2p))})


@dg.asset(partitions_def=nodes_partitions, group_name=GROUP, pool="gpu",
          description="Device-to-device copy GB/s per GPU (bytes read + written) against the "
          "node type's HBM figure.")
def memory_bandwidth(context: dg.AssetExecutionContext, configs: ConfigFiles,
                     outputs: OutputDirs, node_probe: NodeProbe,
                     node_inventory: acc.NodeInventory) -> dg.Output:
    s, gpus = configs.node_setting(context.partition_key), _gpus(node_inventory)
    raw = node_probe.copy_bandwidth(gpus, s.probe, _keep(outputs, s.name),
                                    context.log.info) if gpus else None
    result = acc.build_memory(s, node_inventory, raw, "")
    return dg.Output(result, metadata={**_checks_metadata(result.checks),
                                       "per_gpu": dg.MetadataValue.md(md_table(result.per_gpu))})


@dg.asset(partitions_def=nodes_partitions, group_name=GROUP,
          description="Sequential direct-I/O write and read GB/s of the NVMe cache path, and S3 "
          "GET GB/s from the configured endpoint, against the node type's expectation.")
def storage_read(context: dg.AssetExecutionContext, configs: ConfigFiles, outputs: OutputDirs,
                 node_probe: NodeProbe, nvme_cache: NvmeCache, s3: S3ObjectStore) -> dg.Output:
    s = configs.node_setting(context.partition_key)
    direct = node_probe.direct_read(nvme_cache.root_path(), s.probe, context.log.info)
    s3_get = node_probe.s3_get(s3, s.probe.s3_object, int(s.probe.s3_max_gib * 2**30))
    keep = _keep(outputs, s.name)  # kept like the GPU assets' raw files: a set can be re-judged
    keep.mkdir(parents=True, exist_ok=True)
    (keep / acc.RAW_STORAGE).write_text(json.dumps({"direct": direct, "s3": s3_get}, indent=1))
    result = acc.build_storage(s, direct, s3_get)
    return dg.Output(result, metadata={**_checks_metadata(result.checks),
                                       "direct_read": dg.MetadataValue.json(direct),
                                       "s3_get": dg.MetadataValue.json(s3_get)})


def _write_report(outputs: OutputDirs, result: acc.NodeAcceptance, parts: dict, limits: dict
                  ) -> tuple[str, bytes | None, Path]:
    """The page and the burn traces under <reports>/nodes/<node>/ (and the checks as CSV)."""
    out = node_dir(outputs, result.node)
    out.mkdir(parents=True, exist_ok=True)
    health = parts.get("gpu_health")
    png = burn_png(health.samples if health else (), f"{result.node}: burn",
                   limits, health.burn.get("window_s") if health else None)
    if png:
        (out / "burn.png").write_bytes(png)
    page = report_markdown(result, report_sections(parts), "burn.png" if png else None)
    (out / "acceptance.md").write_text(page)
    write_csv(out / "checks.csv", [c.row() for c in result.checks])
    return page, png, out / "acceptance.md"


@dg.asset(partitions_def=nodes_partitions, group_name=GROUP,
          ins={n: dg.AssetIn(input_manager_key="optional_upstream") for n in NODE_ASSETS[:-1]},
          check_specs=[dg.AssetCheckSpec(NODE_QUALIFIED_CHECK, asset="node_acceptance",
                                         partitions_def=nodes_partitions,
                                         description="every required check of every phase "
                                         "passed (docs/acceptance.md)")],
          description="Go/no-go per phase with reasons, in the seed runbook's table form, and "
          "a one-page report with the burn's power/temperature/clock traces. Benchmarks count "
          "only on a node whose acceptance passed on its current driver.")
def node_acceptance(context: dg.AssetExecutionContext, configs: ConfigFiles,
                    outputs: OutputDirs, node_inventory, gpu_health, interconnect,
                    memory_bandwidth, storage_read):
    s = configs.node_setting(context.partition_key)
    parts = {"node_inventory": node_inventory, "gpu_health": gpu_health,
             "interconnect": interconnect, "memory_bandwidth": memory_bandwidth,
             "storage_read": storage_read}
    result = acc.build_acceptance(s, parts, time.time())
    page, png, path = _write_report(outputs, result, parts, _limits(s, parts))
    plot = (f"![burn](data:image/png;base64,{base64.b64encode(png).decode()})" if png
            else "no burn samples")
    yield dg.Output(result, metadata={
        "qualified": result.qualified, "node_type": s.node_type,
        "reasons": dg.MetadataValue.md("\n".join(f"- {r}" for r in result.reasons) or "none"),
        "phases": dg.MetadataValue.md(md_table(result.phases)),
        "node_stack": dg.MetadataValue.json(result.stack_facts),
        "node_stack_fingerprint": result.stack_fingerprint,
        "accepted_at": dg.MetadataValue.timestamp(result.accepted_at),
        "report": dg.MetadataValue.md(page.replace("![burn traces](burn.png)", plot)),
        "report_path": dg.MetadataValue.path(str(path))})
    yield dg.AssetCheckResult(check_name=NODE_QUALIFIED_CHECK, passed=result.qualified,
                              severity=dg.AssetCheckSeverity.ERROR,
                              metadata={"reasons": dg.MetadataValue.json(list(result.reasons)),
                                        "phases": dg.MetadataValue.md(md_table(result.phases))})


def _limits(s: acc.NodeSetting, parts: dict) -> dict:
    """Dashed lines on the burn plot: the temperature limit and the lowest power limit."""
    inv = parts.get("node_inventory")
    powers = [g.power_limit_w for g in inv.smi.gpus if g.power_limit_w] if inv and inv.smi \
        else []
    return {tm.GPU_TEMP_C: s.thresholds.burn.temperature_max_c,
            tm.POWER_W: min(powers) if powers else None}


defs = dg.Definitions(assets=[node_inventory, gpu_health, interconnect, memory_bandwidth,
                              storage_read, node_acceptance])
