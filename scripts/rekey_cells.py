"""Move results stored under the per-model partitioning onto (model, node type) cells.

Before the cells, the GPU-dependent stages were partitioned by model alone. Their values stay
in the instance after an upgrade, under keys the cell partitions do not have; the grid shows
those cells as never materialized. One command carries them over:

    DAGSTER_HOME=<your instance> .venv/bin/python scripts/rekey_cells.py           # dry run
    DAGSTER_HOME=<your instance> .venv/bin/python scripts/rekey_cells.py --apply

- Measured values (`served_accuracy`, `load_timing`, `serving_benchmark`) are re-keyed: each was
  measured on one node type, which its stored value names (`node_type`) or, for
  served_accuracy, the same run's load timing or benchmark does; the stored file moves to the
  cell's path and a materialization of the cell records where it came from (`rekeyed_from`,
  the original run). Nothing is measured again.
- Derived values (`kserve_manifest`, `operations`, `readiness`, `readiness_report`) judged
  every target node type at once, so no cell can inherit them: `--apply` re-renders them per
  cell with the `plan_cell` job (no GPU, no weights), from the re-keyed measurements.
- A value whose node type cannot be told is left where it is and listed; re-materialize that
  model's cells to replace it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEASURED = ("served_accuracy", "load_timing", "serving_benchmark")
DERIVED = ("kserve_manifest", "operations", "readiness", "readiness_report")


@dataclass(frozen=True, kw_only=True)
class Move:
    asset: str
    model: str
    node_type: str  # "" when it cannot be told
    run_id: str
    why: str = ""


def _latest(instance, asset: str, partition: str):
    import dagster as dg

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]),
        limit=1).records
    return records[0] if records else None


def _node_type_of(record) -> str:
    value = record.asset_materialization.metadata.get("node_type")
    return str(value.value) if value is not None else ""


def old_keys(instance, asset: str) -> list[str]:
    import dagster as dg

    return sorted(str(k) for k in instance.get_materialized_partitions(dg.AssetKey(asset))
                  if "|" not in str(k))


def plan(instance) -> list[Move]:
    """What would move: every per-model value of a measured stage, with its node type."""
    moves = []
    for asset in MEASURED:
        for model in old_keys(instance, asset):
            record = _latest(instance, asset, model)
            node_type = _node_type_of(record)
            if not node_type:  # served_accuracy: the node type of the same run's measurements
                for other in ("load_timing", "serving_benchmark"):
                    sibling = _latest(instance, other, model)
                    if sibling is not None and sibling.run_id == record.run_id:
                        node_type = _node_type_of(sibling)
                        break
            moves.append(Move(asset=asset, model=model, node_type=node_type,
                              run_id=record.run_id,
                              why="" if node_type else "no node type recorded by its run"))
    return moves


def storage_dir(instance) -> Path:
    """Where the FilesystemIOManager keeps values: the instance's storage directory."""
    return Path(instance.storage_directory())


def apply(instance, moves: list[Move]) -> list[str]:
    """Re-key every move with a node type; the cells it made, as partition keys."""
    import dagster as dg

    from assets.partitions import cell_key

    base = storage_dir(instance)
    done = []
    for m in moves:
        if not m.node_type:
            continue
        old = base / m.asset / m.model
        if not old.is_file():
            print(f"  {m.asset}[{m.model}]: no stored file at {old}; left as it is")
            continue
        for name, key in (("models", m.model), ("node_types", m.node_type)):
            if not instance.has_dynamic_partition(name, key):
                instance.add_dynamic_partitions(name, [key])
        parked = old.with_name(f".{m.model}.rekeying")
        old.rename(parked)  # the cell's path is a folder of the model's name
        new = base / m.asset / m.model / m.node_type
        new.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(parked), str(new))
        record = _latest(instance, m.asset, m.model)
        key = str(cell_key(m.model, m.node_type))
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=m.asset, partition=key,
            metadata={**record.asset_materialization.metadata,
                      "rekeyed_from": m.model, "rekeyed_from_run": m.run_id}))
        print(f"  {m.asset}[{m.model}] -> [{key}]")
        done.append(key)
    return sorted(set(done))


def rerender(instance, cells: list[str]) -> bool:
    """The derived stages of each re-keyed cell, rendered again by plan_cell."""
    from pipelines.definitions import defs

    job = defs.resolve_job_def("plan_cell")
    ok = True
    for key in cells:
        result = job.execute_in_process(partition_key=key, instance=instance,
                                        raise_on_error=False)
        print(f"  plan_cell[{key}]: {'SUCCESS' if result.success else 'FAILED'}")
        ok = ok and result.success
    return ok


def main(argv: list[str] | None = None) -> int:
    import dagster as dg

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apply", action="store_true", help="move them (default: dry run)")
    parser.add_argument("--no-render", action="store_true",
                        help="do not re-render the derived stages with plan_cell")
    args = parser.parse_args(argv)
    instance = dg.DagsterInstance.get()
    moves = plan(instance)
    derived = {a: old_keys(instance, a) for a in DERIVED}
    if not moves and not any(derived.values()):
        print("nothing stored under the per-model partitioning: nothing to do")
        return 0
    for m in moves:
        print(f"{m.asset}[{m.model}]: " + (f"-> cell {m.model}|{m.node_type} (run {m.run_id})"
                                           if m.node_type else f"left as it is: {m.why}"))
    for asset, models in derived.items():
        if models:
            print(f"{asset}[{', '.join(models)}]: per model, judged every node type at once; "
                  "re-rendered per cell by plan_cell")
    if not args.apply:
        print("dry run: --apply moves them")
        return 0
    cells = apply(instance, moves)
    ok = True if args.no_render else rerender(instance, cells)
    left = [m for m in moves if not m.node_type]
    if left:
        print(f"{len(left)} value(s) left under their model key: re-materialize those cells")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
