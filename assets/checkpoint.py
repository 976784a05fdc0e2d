"""Stage 1: fetch a model's checkpoint into the NVMe cache, verified, as the `checkpoint` asset.

The data version is the manifest's content hash, so a new revision at the source marks every
descendant stale, and re-materializing an unchanged checkpoint is a no-op on the wire.
"""

import dagster as dg

from assets.partitions import models_partitions
from assets.step_tags import cache_step_tags
from onboarding.common.errors import ConfigError, IncompleteCheckpointError, IntegrityError
from onboarding.common.refs import CheckpointRef
from onboarding.common.tables import md_table
from onboarding.fetch.checkpoint_manifest import read_safetensors_header
from onboarding.fetch.twins import NO_WEIGHTS
from resources.config_files import ConfigFiles
from resources.huggingface import HuggingFaceStore
from resources.nvme_cache import FetchResult, NvmeCache
from resources.s3 import S3ObjectStore

COMPLETE = "checkpoint_complete"
INTACT = "checkpoint_integrity"


@dg.asset(
    partitions_def=models_partitions,
    group_name="fetch",
    kinds={"s3", "huggingface"},
    op_tags=cache_step_tags("checkpoint"),  # in a cluster: on the GPU node that owns the cache
    check_specs=[
        dg.AssetCheckSpec(COMPLETE, asset="checkpoint", blocking=True,
                          partitions_def=models_partitions,
                          description="every file present at its size; the shard index "
                                      "satisfied; safetensors headers parse; weights present "
                                      "(none for a performance twin)"),
        dg.AssetCheckSpec(INTACT, asset="checkpoint", blocking=True,
                          partitions_def=models_partitions,
                          description="every file's sha256 on disk equals the manifest, which "
                                      "matched the source's recorded checksums at fetch time"),
    ],
)
def checkpoint(context: dg.AssetExecutionContext, configs: ConfigFiles, s3: S3ObjectStore,
               hf: HuggingFaceStore, nvme_cache: NvmeCache):
    """The model's checkpoint, fetched from S3 or the Hugging Face Hub into the NVMe cache."""
    spec = configs.spec(context.partition_key)
    if spec.plan_only:
        raise ConfigError(f"model {spec.id!r}", "is a plan-only catalog entry: it has no weights "
                          "to fetch", "Run the plan_model job for it, or remove plan_only.")
    source = spec.source_ref
    store = s3 if source.kind == "s3" else hf
    try:
        result = nvme_cache.fetch(spec.id, store, source, log=context.log.info,
                                  weights=not spec.is_twin)
    except (IntegrityError, IncompleteCheckpointError) as exc:
        failed = INTACT if isinstance(exc, IntegrityError) else COMPLETE
        yield dg.AssetCheckResult(check_name=failed, passed=False, metadata={
            "problem": exc.cause, "what_to_do": exc.fix})
        raise
    yield dg.Output(
        CheckpointRef(model=spec.id, source=source.uri, revision=result.manifest.revision,
                      path=str(result.path), content_hash=result.manifest.content_hash,
                      total_bytes=result.manifest.total_bytes,
                      files=tuple(f.path for f in result.manifest.files)),
        data_version=dg.DataVersion(result.manifest.content_hash),
        metadata={**_metadata(result), "weights": NO_WEIGHTS if spec.is_twin else "real"},
    )
    yield _completeness(nvme_cache, result, spec.is_twin)
    yield _integrity(nvme_cache, result)


def _metadata(result: FetchResult) -> dict:
    m = result.manifest
    return {
        "source": m.source,
        "revision": m.revision,
        "cache_path": dg.MetadataValue.path(str(result.path)),
        "files": len(m.files),
        "weight_bytes": sum(f.size for f in m.files if f.path.endswith(".safetensors")),
        "total_bytes": m.total_bytes,
        "fetch_seconds": round(result.seconds, 3),
        "fetch_mb_per_s": round(result.mb_per_s, 1),
        "bytes_fetched": result.bytes_fetched,
        "bytes_resumed": result.bytes_resumed,
        "warm_cache": result.warm,
        "content_hash": m.content_hash,
        **{f"version_pinned_by_{k}": v for k, v in result.version_pins.items()},
        "file_table": dg.MetadataValue.md(md_table(
            {"file": f.path, "bytes": f.size, "sha256": f"`{f.sha256[:16]}…`"} for f in m.files)),
    }


def _completeness(cache: NvmeCache, result: FetchResult, twin: bool) -> dg.AssetCheckResult:
    """A performance twin is complete without weights (it is started on random ones); any other
    checkpoint without a weight file has nothing to serve."""
    problems = cache.verify(result.path, full=False)
    weights = [f.path for f in result.manifest.files if f.path.endswith(".safetensors")]
    for path in weights:
        if not problems:
            try:
                read_safetensors_header(result.path / path)
            except IntegrityError as exc:
                problems.append(f"{path}: {exc.cause}")
    if not any(f.path == "config.json" for f in result.manifest.files):
        problems.append("config.json: missing (engines cannot load a checkpoint without it)")
    if not weights and not twin:
        problems.append("no *.safetensors weight file: nothing to serve (a performance twin "
                        "says `weights: random` in its catalog entry)")
    return dg.AssetCheckResult(check_name=COMPLETE, passed=not problems, metadata={
        "files_expected": len(result.manifest.files), "problems": "\n".join(problems) or "none",
        "weights": NO_WEIGHTS if twin else f"{len(weights)} *.safetensors file(s)"})


def _integrity(cache: NvmeCache, result: FetchResult) -> dg.AssetCheckResult:
    """Fresh fetch: the verdict of the fetch's own comparison (a mismatch raised and failed this
    check before any output). Warm cache: every byte re-hashed, so bit rot on the NVMe shows."""
    if not result.warm:
        return dg.AssetCheckResult(check_name=INTACT, passed=True, metadata={
            "verified": "while fetching: each file against the strongest evidence its source "
            "recorded (files_checked_by_*; size only is named as such)",
            **{f"files_checked_by_{k}": v for k, v in result.checked_by.items()}})
    problems = cache.verify(result.path, full=True)
    return dg.AssetCheckResult(check_name=INTACT, passed=not problems, metadata={
        "verified": "re-hashed on disk against the manifest",
        "files_hashed": len(result.manifest.files), "problems": "\n".join(problems) or "none",
        "what_to_do": "none" if not problems else
        "The cached bytes changed on disk: the entry was moved to quarantine (see problems); "
        "re-run to fetch it again."})


defs = dg.Definitions(assets=[checkpoint])
