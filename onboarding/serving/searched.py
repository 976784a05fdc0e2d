"""Search winners, recorded, and applied to the plan: the searched configuration is the one the
serving stage measures and `kserve_manifest` renders (one hash, as before the search).

A record (configs/searched_configs.json, written by bench/config_search.py from a search run)
names the model, the node type, the hash of the configuration the search started from (the
plan's, or the engine at hand's), and the winner: its searched numbers, its precision, TP and
engine where those were searched too, and its hash. It is
applied only where the plan still gives exactly that starting configuration, and only when
rebuilding the winner from it gives the recorded hash; anything else (the plan, the stack or the
spec changed since the search) keeps the plan's configuration and says why. Pure.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onboarding.common.errors import ConfigError
from onboarding.serving.config_search import SearchResult, with_batching
from onboarding.serving.engine_config import EngineConfig
from onboarding.serving.stack import EngineTemplate


@dataclass(frozen=True, kw_only=True)
class SearchRecord:
    model: str
    node_type: str
    base_hash: str  # the configuration the search started from
    winner_hash: str
    max_num_seqs: int | None  # None: the engine's default, as the plan left it
    max_num_batched_tokens: int | None
    api_server_count: int | None = None  # None: the engine's default (one)
    # the winner's precision and TP where the search started from others too ("" / 0: the
    # starting configuration's, as in records written before those axes)
    precision: str = ""
    tensor_parallel: int = 0
    engine: str = ""  # the winner's engine where the search started other engines too
    basis: str = ""  # the order's basis: "predicted" or the stated rule
    margin: str = ""  # how the winner won, with n
    candidates: int = 0  # measured
    crashed: int = 0
    table: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(cls, model: str, result: SearchResult) -> SearchRecord:
        w = result.winner
        return cls(model=model, node_type=result.node_type, base_hash=result.baseline.hash,
                   winner_hash=w.hash, max_num_seqs=w.max_num_seqs,
                   max_num_batched_tokens=w.param("max_num_batched_tokens"),
                   api_server_count=w.param("api_server_count"),
                   precision=w.precision, tensor_parallel=w.tensor_parallel,
                   engine=w.engine, basis=result.basis, margin=result.margin, candidates=result.measured,
                   crashed=result.crashed, table=tuple(result.table()))


@dataclass(frozen=True)
class CellSearch:
    """What a cell's `config_search` asset stores: the winner's record, or None and why the
    search did not run."""

    record: SearchRecord | None
    note: str = ""


def load_records(path: Path) -> list[SearchRecord]:
    """The recorded winners; none when the file is absent."""
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
        return [SearchRecord(**{**r, "table": tuple(r.get("table", ()))})
                for r in data["searches"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(str(path), f"not a search record file ({exc})",
                          "Write it with bench/config_search.py.") from None


def dump_records(records: list[SearchRecord]) -> str:
    return json.dumps({"about": "winners of the measured configuration search, applied by "
                       "serving_config where the plan still gives the searched-from "
                       "configuration (docs/serving.md)",
                       "searches": [dataclasses.asdict(r) for r in records]},
                      indent=1, default=str) + "\n"


Rebase = Callable[[str, int, str], tuple[EngineConfig | None, str]]


def apply(config: EngineConfig, template: EngineTemplate, records: list[SearchRecord],
          rebase: Rebase | None = None, templates: Mapping[str, EngineTemplate] | None = None
          ) -> tuple[EngineConfig, str]:
    """The winner for `config` (same model, node type and starting hash), else `config`; and
    what was done ("" when no record names this model and node type). A winner at another
    precision, TP or engine starts from `rebase(precision, tp, engine)`: the plan's
    configuration there, or None and why (then the plan's configuration is kept, and that is
    said); its numbers are rendered by its engine's template (`templates`; `template` is
    `config`'s engine's)."""
    mine = [r for r in records if r.model == config.model and r.node_type == config.node_type]
    if not mine:
        return config, ""
    for r in mine:
        if r.base_hash != config.hash:
            continue
        start = config
        precision = r.precision or config.precision
        tp = r.tensor_parallel or config.tensor_parallel
        engine = r.engine or config.engine
        if (precision, tp, engine) != (config.precision, config.tensor_parallel, config.engine):
            start, why = rebase(precision, tp, engine) if rebase is not None else (
                None, "another precision, TP or engine, and nothing to rebuild it from")
            if start is None:
                return config, (f"search record not applied: its winner is {engine} {precision}"
                                f" at TP {tp}: {why}")
        tmpl = template if start.engine == config.engine else (templates or {}).get(start.engine)
        if tmpl is None:
            return config, (f"search record not applied: no template for its winner's engine "
                            f"{start.engine}")
        won = with_batching(tmpl, start, r.max_num_seqs, r.max_num_batched_tokens,
                            r.api_server_count)
        if won.hash != r.winner_hash:
            return config, (f"search record not applied: rebuilding its winner gives {won.hash},"
                            f" not the recorded {r.winner_hash}")
        won = dataclasses.replace(won, notes=(*won.notes, f"measured search winner over "
                                              f"{r.candidates} candidates: {r.margin}"[:600]))
        return won, f"searched: {config.hash} -> {won.hash}"
    return config, (f"search record not applied: it started from "
                    f"{', '.join(r.base_hash for r in mine)}, the plan now gives {config.hash}")
