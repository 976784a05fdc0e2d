"""NVIDIA's AIConfigurator as a predictor of serving performance, offline, in this process.

`AIConfiguratorPredictor.predict` runs the library's own Python API (`cli_estimate`, aggregated
in-flight batching, the SILICON database mode: no formula stands in for missing measured data)
on a model's config.json written to a local directory, so nothing is fetched from a hub. What the
library refuses (an architecture it does not model, a quantization mode its data set lacks on
that GPU, a model that does not fit) comes back as a `Prediction` with status `not_covered` or
`oom` and the library's reason; any other exception is a bug and propagates.

The library is an optional extra (`pip install -e '.[predict]'`, which scripts/dev.sh installs):
without it, `predict` raises an OnboardingError that says how to install it.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from onboarding.common.errors import OnboardingError
from onboarding.common.files import write_atomic
from onboarding.predictions.predict import Prediction, PredictionRequest, classify_coverage

DISTRIBUTION = "aiconfigurator"
_QUIET = ("aiconfigurator", "aiconfigurator_core")
_PATH_IN_MESSAGE = re.compile(r"\S*/systems/data/")
_LANES_TRIED = re.compile(r": tried lane_order \[.*?\], then fell back through table lanes \[.*?\]")


def library_version() -> str | None:
    """The installed AIConfigurator's version, or None when it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def missing_reason() -> str | None:
    if library_version() is None:
        return ("AIConfigurator is not installed in this environment: run "
                "`.venv/bin/pip install -e '.[predict]'` (scripts/dev.sh setup does)")
    return None


@contextmanager
def _quiet_library() -> Iterator[None]:
    """The library logs a warning per fallback table it loads; coverage is reported instead."""
    loggers = [logging.getLogger(n) for n in _QUIET]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _short(message: str) -> str:
    """The library's message without this machine's install path or the kernel lanes tried."""
    text = _LANES_TRIED.sub("", " ".join(message.split()))
    text = text.split(". Try ")[0]  # the OOM message's generic advice
    return _PATH_IN_MESSAGE.sub("systems/data/", text)[:300]


@functools.cache
def _latest_data_version(system: str, backend: str) -> str | None:
    """The library's current data set version for `system` and `backend`, once per process:
    each `get_latest_database_version` call parses every system's YAML again (about 0.9 CPU s
    here), and `cli_estimate` left to resolve it calls it twice more per prediction. The
    installed data set does not change while a process runs."""
    from aiconfigurator.sdk.perf_database import get_latest_database_version

    return get_latest_database_version(system=system, backend=backend)


class AIConfiguratorPredictor(dg.ConfigurableResource):
    """TTFT, TPOT, tokens/s/GPU and coverage for one configuration, from AIConfigurator."""

    work_dir: str = Field(default="", description="where model config.json files are written "
                          "for the library to read; empty = a directory under the system temp")

    def version(self) -> str:
        v = library_version()
        if v is None:
            raise OnboardingError("the AIConfigurator predictor", missing_reason() or "",
                                  "Install the `predict` extra, then re-run the step.")
        return v

    def _model_dir(self, request: PredictionRequest) -> Path:
        root = Path(self.work_dir) if self.work_dir else Path(tempfile.gettempdir()) / \
            "onboarding-aiconfigurator"
        path = root / request.config_digest
        config = path / "config.json"
        if not config.is_file():
            write_atomic(config, json.dumps(request.model_config, indent=1))
        return path

    def _data_version(self, request: PredictionRequest) -> str | None:
        """The data set version a request resolves to (its own when set); None when the library
        has none for its system and backend."""
        return request.backend_version or _latest_data_version(request.system, request.backend)

    def predict(self, request: PredictionRequest) -> Prediction:
        version = self.version()
        from aiconfigurator.cli.api import cli_estimate
        from aiconfigurator_core.sdk.errors import PerfDataNotAvailableError

        model_dir = self._model_dir(request)
        data_version = self._data_version(request)
        kwargs: dict[str, Any] = {
            "mode": "agg", "backend_name": request.backend,
            # resolved here (None: the library's own "no database" error), so the library does
            # not resolve "latest" again, twice, per question
            "backend_version": data_version, "database_mode": "SILICON",
            "isl": request.input_tokens, "osl": request.output_tokens,
            "batch_size": request.batch_size, "tp_size": request.tensor_parallel,
            "gemm_quant_mode": request.gemm_mode, "kvcache_quant_mode": request.kv_cache_mode}
        if request.moe:
            kwargs.update(moe_quant_mode=request.moe_mode, moe_ep_size=request.expert_parallel,
                          moe_tp_size=request.tensor_parallel // request.expert_parallel)
        base = {"request": request, "aic_version": version}
        data_set = f"{request.system}/{request.backend}/{data_version or 'none'}"
        try:
            with _quiet_library():
                result = cli_estimate(str(model_dir), request.system, **kwargs)
        except PerfDataNotAvailableError as exc:
            return Prediction(status="not_covered", data_set=data_set,
                              notes=(f"no measured data: {_short(str(exc))}",), **base)
        except RuntimeError as exc:
            if str(exc).startswith("OOM"):
                return Prediction(status="oom", data_set=data_set,
                                  notes=("does not fit per AIConfigurator's memory model: "
                                         + _short(str(exc).replace(str(model_dir),
                                                                   request.model)),), **base)
            raise
        except ValueError as exc:
            if "not supported" not in str(exc) and "missing" not in str(exc):
                raise
            return Prediction(status="not_covered", data_set=data_set,
                              notes=(f"not modelled: {_short(str(exc))}",), **base)
        raw = result.raw
        data_set = f"{request.system}/{request.backend}/{result.backend_version}"
        executed = {k: str(raw.get(k)) for k in ("gemm", "kvcache", "moe") if raw.get(k)}
        latency = {ph: ops for ph, ops in (result.per_ops_data or {}).items()
                   if isinstance(ops, dict)}
        status, notes, share = classify_coverage(request, executed,
                                                 result.per_ops_source or {}, latency)
        if result.kv_cache_warning:
            notes += (_short(result.kv_cache_warning),)
        return Prediction(status=status, data_set=data_set, ttft_ms=float(result.ttft),
                          tpot_ms=float(result.tpot),
                          tokens_per_s_per_gpu=float(result.tokens_per_second_per_gpu),
                          memory_gib=float(raw.get("memory") or 0.0) or None,
                          silicon_share=share, executed_modes=executed, notes=notes, **base)
