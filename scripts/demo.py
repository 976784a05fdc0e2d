"""The embedded default, end to end: local S3 server, the small real model, the onboarding job.

`scripts/dev.sh demo` runs this after setup. It starts SeaweedFS on 127.0.0.1, uploads
SmolLM2-135M-Instruct and the performance twins' config and tokenizer (twins/) into the bucket
(once), registers every catalogued model as a partition, observes `serving_stack` (so the
run's results record the stack fingerprint they were measured on, and the re-validation
schedule sees them as current), materializes the model's own stages (onboard_model), then its
cells: the `cpu` one measured on the embedded engine (onboard_cell), the fleet's other node
types planned (plan_cell). It prints what the deployment rests on, read from the values the
assets stored: the serving configuration (hash) per node type, the published variant, and the
measured cell's three kinds of start, benchmark, manifest (none: `cpu` is not a deployment
target) and readiness verdict with its reasons; then the readiness grid (fleet_report), with
why each of the model's cells is or is not ready.
`--ui` instead keeps the S3 server up and runs `dagster dev` on 127.0.0.1; with
S3_ENDPOINT_URL and its credentials set, `--ui` runs on that endpoint and starts no server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The S3 server's data, credentials and the CLI's env file; a test points it elsewhere.
DATA = Path(os.environ.get("ONBOARDING_DATA_DIR") or ROOT / ".data")
MODEL_DIR = ROOT / ".cache" / "smollm2-135m-instruct"
TWINS_DIR = ROOT / "twins"
DEMO_MODEL = "smollm2-135m"


def credentials() -> tuple[str, str]:
    """Demo credentials, made once per checkout and kept 0600 beside the server's data."""
    path = DATA / "s3-credentials.json"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"access_key": "onb" + secrets.token_hex(8),
                                    "secret_key": secrets.token_urlsafe(24)}))
        path.chmod(0o600)
    creds = json.loads(path.read_text())
    return creds["access_key"], creds["secret_key"]


def write_env_file(keys: list[str]) -> Path:
    """The environment for the CLI beside a running `dev.sh ui` (0600): those of `keys` set."""
    env_file = DATA / "onboarding.env"
    DATA.mkdir(parents=True, exist_ok=True)
    env_file.write_text("".join(f"{k}={os.environ[k]}\n" for k in keys if k in os.environ))
    env_file.chmod(0o600)
    return env_file


PATHS = ("ONBOARDING_CACHE_ROOT", "ONBOARDING_OUTPUT_DIR", "DAGSTER_HOME")


def start_s3():
    from resources.seaweedfs import LocalS3Server

    access, secret = credentials()
    server = LocalS3Server(data_dir=DATA / "seaweedfs", access_key=access,
                           secret_key=secret).start()
    os.environ.update(server.env())
    env_file = write_env_file([*server.env(), *PATHS])
    print(f"local S3 (SeaweedFS) at {server.endpoint_url}, data in {server.data_dir}; "
          f"environment for the CLI in {env_file}")
    return server


USER_S3 = ("S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# What an endpoint answers for credentials it does not accept (the AWS S3 error codes).
_BAD_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"}


def use_user_s3() -> str | None:
    """The user's own S3 endpoint, when S3_ENDPOINT_URL is set: the UI then onboards from it,
    with the user's credentials, and no local server starts (docs/onboard-your-model.md).

    Checked before anything starts: the credentials the pipeline's S3 resource reads must be
    set, and the endpoint must accept them; a refusal of the listing itself (AccessDenied)
    still proves both, since a bucket policy may allow only the model prefixes.
    """
    endpoint = os.environ.get("S3_ENDPOINT_URL")
    if not endpoint:
        return None
    missing = [k for k in USER_S3[1:] if not os.environ.get(k)]
    if missing:
        raise SystemExit(f"S3_ENDPOINT_URL is set ({endpoint}) but {' and '.join(missing)} "
                         "is not: export the credentials of that endpoint too, or unset "
                         "S3_ENDPOINT_URL to use the local SeaweedFS server")
    from botocore.exceptions import BotoCoreError, ClientError

    from resources.s3 import S3ObjectStore

    store = S3ObjectStore(endpoint_url=endpoint, access_key_id=os.environ[USER_S3[1]],
                          secret_access_key=os.environ[USER_S3[2]])
    try:
        store.client().list_buckets()
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _BAD_CREDENTIALS:
            raise SystemExit(f"{endpoint} refuses AWS_ACCESS_KEY_ID "
                             f"{os.environ[USER_S3[1]]!r} ({code}): export that endpoint's "
                             "access key and secret") from None
    except BotoCoreError as exc:
        raise SystemExit(f"S3_ENDPOINT_URL {endpoint} does not answer ({exc}): check the URL "
                         "(scheme, host, port), or unset it to use the local SeaweedFS "
                         "server") from None
    env_file = write_env_file([USER_S3[0], "AWS_DEFAULT_REGION", *PATHS])
    print(f"your S3 endpoint {endpoint} (S3_ENDPOINT_URL, with your AWS_ACCESS_KEY_ID "
          f"{os.environ[USER_S3[1]]}); no local S3 server started, nothing uploaded. "
          f"Paths for the CLI in {env_file} (your credentials stay in your environment)")
    return endpoint


def upload_model(server, source: str, model_dir: Path = MODEL_DIR) -> None:
    from onboarding.fetch.catalog import parse_source
    from onboarding.fetch.checkpoint_manifest import is_checkpoint_file
    from resources.s3 import S3ObjectStore

    ref = parse_source(source)
    store = S3ObjectStore(endpoint_url=server.endpoint_url, access_key_id=server.access_key,
                          secret_access_key=server.secret_key)
    listed = store.client().list_objects_v2(Bucket=ref.location, Prefix=ref.path)
    have = {o["Key"][len(ref.path):]: o["Size"] for o in listed.get("Contents", [])}
    local = {p.name: p.stat().st_size for p in model_dir.iterdir()
             if p.is_file() and is_checkpoint_file(p.name)}
    if have == local:
        print(f"{source} already holds the model ({sum(local.values()) / 1e6:.0f} MB)")
        return
    t0 = time.monotonic()
    store.upload_dir(model_dir, ref.location, ref.path)
    print(f"uploaded {len(local)} files to {source} in {time.monotonic() - t0:.1f}s")


def upload_twins(server, specs) -> None:
    """Each performance twin's config.json and the twins' shared tokenizer (twins/, docs/
    twins.md) to its source, so `--model <twin id>` fetches it like any model (its weights are
    random)."""
    import tempfile

    from onboarding.fetch.twins import TWINS_DATA, twin_source_dir

    for spec in specs:
        if spec.is_twin and spec.source.startswith("s3://") and (TWINS_DATA / spec.id).is_dir():
            with tempfile.TemporaryDirectory() as tmp:
                upload_model(server, spec.source, twin_source_dir(spec.id, Path(tmp) / spec.id))


def register_partitions(instance) -> list[str]:
    """Every catalogued model and the fleet's node types (what the sensors register in
    `dagster dev`)."""
    from pipelines.cells import fleet_node_types
    from pipelines.resources import config_files

    keys = sorted(config_files().catalog().specs)
    for name, wanted in (("models", keys), ("node_types", fleet_node_types(config_files()))):
        known = set(instance.get_dynamic_partitions(name))
        new = [k for k in wanted if k not in known]
        if new:
            instance.add_dynamic_partitions(name, new)
    return keys


@contextlib.contextmanager
def output_to(path: Path):
    """This process's stdout and stderr (file descriptors 1 and 2: what the libraries the steps
    call print, their progress bars and warnings, and their subprocesses') appended to `path`
    while the block runs; yields a stream to the terminal for the run's own lines."""
    sys.stdout.flush()
    sys.stderr.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = {n: os.dup(n) for n in (1, 2)}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    terminal = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    try:
        for n in saved:
            os.dup2(fd, n)
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for n, old in saved.items():
            os.dup2(old, n)
            os.close(old)
        os.close(fd)
        terminal.close()


def run_job(model: str, selection: list[str] | None, sweep: str) -> bool:
    """The model's own stages (onboard_model), then each of its cells: measured here where the
    engine's node type is the cell's (onboard_cell), planned elsewhere (plan_cell), as the
    `cells_after_model` sensor does in `dagster dev`; then the readiness grid."""
    import dagster as dg

    from assets.partitions import cell_key
    from assets.stack import observe_stack
    from pipelines.cells import cells_of
    from pipelines.definitions import defs
    from pipelines.resources import config_files
    from pipelines.run_timing import TreeSampler

    instance = dg.DagsterInstance.get()
    register_partitions(instance)
    fp, recorded = observe_stack(instance, config_files())
    print(stack_line(fp, config_files().stack().fingerprint, recorded))
    runs = [("onboard_model", model)] + [
        (job, str(cell_key(model, nt)))
        for nt, job in cells_of(config_files().spec(model).node_types, config_files()).items()]
    values: dict[str, Any] = {}
    manifests: list = []
    ok, fleet = True, None
    with TreeSampler() as sampler:
        for job_name, key in runs:
            job = defs.resolve_job_def(job_name)
            stages = {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
            picked = sorted(stages & set(selection)) if selection else None
            if selection and not picked:
                continue
            result = _run_one(instance, job, key, picked, sweep, sampler)
            ok = ok and result.success
            stored = stored_values(result)
            if job_name != "plan_cell":  # the measured cell's values, not a planned one's
                values.update({k: v for k, v in stored.items() if v is not None})
            if stored.get("kserve_manifest") is not None:  # every cell's manifest, side by side
                manifests.append(stored["kserve_manifest"])
            if "fleet_report" in {e.asset_key.to_user_string()
                                  for e in result.get_asset_materialization_events()}:
                fleet = result.asset_value("fleet_report")
            if job_name == "onboard_model" and not result.success:
                break  # its cells need its results
    if manifests:
        values["kserve_manifest"] = merged_manifests(manifests)
    wanted = set(selection) if selection else set(SUMMARY_ASSETS)
    print("\n".join(["", *summary(model, values, wanted)]))
    if fleet is not None:
        print("\n".join(["", *grid_lines(fleet, model)]))
    return ok


def merged_manifests(cells: list):
    """The manifests of every cell's run as one set (each cell renders its node type only)."""
    import dataclasses

    first = cells[0]
    merged = {f: {} for f in ("files", "services", "skipped", "errors", "config_hashes",
                              "measured", "published")}
    for m in cells:
        for f, into in merged.items():
            into.update(getattr(m, f))
    return dataclasses.replace(first, routes=tuple(r for m in cells for r in m.routes), **merged)


def grid_lines(fleet, model: str) -> list[str]:
    """The readiness grid (fleet_report), the onboarded model's cells with their reasons."""
    from onboarding.reports.pages import cell_mark

    node_types = list(dict.fromkeys(r.node_type for r in fleet.rows))
    width = max([len(r.model) for r in fleet.rows] + [5])
    out = [f"readiness grid ({fleet.html_path}):",
           ("  " + "model".ljust(width) + "".join(f"  {nt:<12}" for nt in node_types)).rstrip()]
    by = {(r.model, r.node_type): r for r in fleet.rows}
    for m in sorted({r.model for r in fleet.rows}):
        out.append(("  " + m.ljust(width) + "".join(
            f"  {cell_mark(by[(m, nt)]) if (m, nt) in by else '':<12}" for nt in node_types)
        ).rstrip())
    out.append(f"  {model}, why:")
    out += [f"    {r.node_type:<6} {'ready' if r.ready else r.why}"
            for r in fleet.rows if r.model == model]
    return out


def _run_one(instance, job, key: str, selection: list[str] | None, sweep: str, sampler):
    import dagster as dg

    from pipelines.resources import config_files
    from pipelines.run_console import QUIET_CONSOLE, RunConsole
    from pipelines.run_timing import breakdown_lines, run_step_timings

    stages = set(selection) if selection else \
        {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
    run_config = config_files().automation().launch.run_config(sweep, stages)
    print(f"\n{job.name}[{key}]: {sweep} sweep, as run config: "
          f"{json.dumps(run_config.get('ops', run_config))}")
    run_id = str(uuid.uuid4())
    log_path = DATA / "runs" / f"{run_id}.log"
    print(f"  run {run_id}: one line per step here; every event (DEBUG included) and the "
          f"libraries' own output in {log_path}")
    t0 = time.monotonic()
    with output_to(log_path) as terminal, RunConsole(instance, run_id, log_path, out=terminal):
        result = job.execute_in_process(
            partition_key=key, instance=instance, run_config={**run_config, **QUIET_CONSOLE},
            asset_selection=[dg.AssetKey(s) for s in selection] if selection else None,
            raise_on_error=False, run_id=run_id)
    print(f"{job.name}[{key}]: {'SUCCESS' if result.success else 'FAILED'} "
          f"in {time.monotonic() - t0:.0f}s (run {result.run_id})")
    done = [e.asset_key.to_user_string() for e in result.get_asset_materialization_events()]
    print(f"  materialized: {', '.join(done) or 'nothing'}")
    checks = list(result.get_asset_check_evaluations())
    print(f"  checks: {sum(ev.passed for ev in checks)} of {len(checks)} passed")
    for ev in checks:
        if not ev.passed:
            print(f"  check {ev.asset_key.to_user_string()}.{ev.check_name} FAILED "
                  f"({ev.severity.value})")
    for event in result.all_events:
        if event.is_step_failure:
            print(f"  step {event.step_key} FAILED: {event.step_failure_data.error.message}")
    pages = {e.asset_key.to_user_string(): e.event_specific_data.materialization.metadata[
        "page"].value for e in result.get_asset_materialization_events()
        if e.asset_key.to_user_string() in ("readiness_report", "fleet_report")}
    if "readiness_report" in pages:
        print(f"  readiness report of {key}: {pages['readiness_report']}")
    if job.name != "plan_cell":
        print(f"  where the time went (run {result.run_id}: step start and end records; CPU "
              "seconds of this process tree, the engine included):")
        print("\n".join(breakdown_lines(run_step_timings(instance, result.run_id, sampler))))
    return result


def _interrupt(signum, frame):
    raise KeyboardInterrupt


# `dagster dev` warns on every start that it is superseded by `dg dev`, the command of the `dg`
# project layout (pyproject [tool.dg]), which this project does not use: same processes, same
# workspace.yaml. A message filter, so the engine's interpreter (no dagster) is not affected.
QUIET_DEV = "ignore:Function `dev_command` is superseded"


def run_dagster_dev(port: int) -> int:
    """`dagster dev` in its own process group. Ctrl+C here stops it the way its own Ctrl+C
    does: SIGTERM to `dagster dev` alone, which stops the webserver and the daemon before the
    code server they poll; whatever is left of the group (run workers, engines) then gets
    SIGTERM and, after a grace period, SIGKILL."""
    from onboarding.common.processes import reap_group

    warnings = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), QUIET_DEV) if w)
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "dagster"), "dev", "-h", "127.0.0.1",
                             "-p", str(port), "-w", "workspace.yaml"], cwd=ROOT,
                            env={**os.environ, "PYTHONWARNINGS": warnings},
                            start_new_session=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        print("stopping dagster dev ...")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        return 130
    finally:
        reap_group(proc, grace_s=20)


SUMMARY_ASSETS = ("serving_config", "published_variant", "load_timing", "serving_benchmark",
                  "kserve_manifest", "readiness")
ABSENT = "not materialized in this run"


def stored_values(result) -> dict[str, Any]:
    """The values the summary's assets stored in this run (None for those it did not
    materialize: a failed or skipped step)."""
    done = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    return {a: result.asset_value(a) if a in done else None for a in SUMMARY_ASSETS}


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def _configs(splan) -> list[str]:
    return [f"    {nt:<6} {c.hash}  {c.precision}, TP {c.tensor_parallel}, max-num-seqs "
            f"{c.max_num_seqs}" for nt, c in sorted(splan.configs.items())] + [
        f"    {nt:<6} none: {why}" for nt, why in sorted(splan.skipped.items())]


def _published(published: dict) -> list[str]:
    return [f"    {p}: {v.uri} ("
            + ("already published" if v.skipped else f"uploaded {v.bytes_uploaded:,} bytes")
            + f", derived pull {_s(v.pull_s)})" for p, v in sorted(published.items())]


def _starts(t) -> list[str]:
    if t.cold_start_p95_s is None:
        return [f"    nothing started: {t.reason}"]
    kinds = {"cold weights": t.cold_weights_p50_s, "warm": t.warm_start_p50_s}
    line = (f"    configuration {t.config_hash or '?'} on {t.node_type} ({t.precision}): "
            f"fully cold p50 {_s(t.cold_start_p50_s)} / p95 {_s(t.cold_start_p95_s)}"
            + "".join(f", {k} p50 {_s(v)}" for k, v in kinds.items() if v is not None)
            + "".join(f"; {k}: not started in this pass" for k, v in kinds.items() if v is None))
    return [line] + ([f"    stand-in: {t.reason}"] if t.reason else [])


def _benchmark(b) -> list[str]:
    if not b.config_hash:
        return [f"    nothing measured: {'; '.join(b.slo_violations)}"]
    verdict = "met" if b.slo_pass else "missed: " + "; ".join(b.slo_violations[:2])
    return [(f"    configuration {b.config_hash} on {b.node_type} ({b.precision}): "
             f"{b.tokens_per_s_per_gpu:.0f} {'tokens/s/GPU' if b.gpus else 'tokens/s (no GPU)'}, "
             f"saturation {b.saturation_concurrency}; "
             f"SLOs {verdict} ({'blocking' if b.slo_blocking else 'warning only'})")]


def _manifests(m) -> list[str]:
    lines = [f"    {nt:<6} {path}  configuration {m.config_hashes.get(nt, '?')}, "
             f"{'measured' if m.measured.get(nt) else 'unmeasured'}, "
             f"{'published' if m.published.get(nt) else 'unpublished'}"
             for nt, path in sorted(m.files.items())]
    lines += [f"    {nt:<6} no manifest: {why}" for nt, why in sorted(m.skipped.items())]
    return lines + ([] if m.valid else [f"    INVALID: {'; '.join(sorted(m.errors))}"])


def stack_line(observed: str, stack_yaml: str, recorded: bool) -> str:
    """The two stack hashes under the names the UI shows them by: the observation (stack.yaml
    and this node's packages; each stage's `serving_stack_fingerprint` metadata) and
    stack.yaml's own (the manifests' `stack-fingerprint` label, `stack_fingerprint`)."""
    return (f"serving stack: serving_stack_fingerprint {observed} (stack.yaml and this "
            f"node's packages; "
            f"{'observation recorded' if recorded else 'unchanged since the last observation'}"
            f"), stack_fingerprint {stack_yaml} (stack.yaml alone: the manifests' "
            "stack-fingerprint label)")


def _readiness(r) -> list[str]:
    from onboarding.reports.verdict import sentence

    said, next_step = sentence(r.ready, r.reasons,
                               [(n.node_type, n.ready, n.reasons) for n in r.nodes])
    lines = [f"    {n.node_type:<6} " + ("ready" if n.ready else "; ".join(n.reasons))
             for n in r.nodes]
    return [f"    {said} {next_step}"] + [f"    {why}" for why in r.reasons] + lines


SECTIONS = (
    ("serving_config", "serving configuration hash per node type", _configs),
    ("published_variant", "published variant", _published),
    ("load_timing", "starts", _starts),
    ("serving_benchmark", "benchmark", _benchmark),
    ("kserve_manifest", "manifests", _manifests),
    ("readiness", "readiness", _readiness),
)


def summary(model: str, values: dict[str, Any], wanted: set[str]) -> list[str]:
    """What the model's deployment rests on, one short section per asset that was asked for."""
    if not wanted & set(SUMMARY_ASSETS):
        return []
    out = [f"{model}:"]
    for asset, title, lines in SECTIONS:
        if asset not in wanted:
            continue
        value = values.get(asset)
        if asset == "readiness" and value is not None:
            title = f"readiness: {'ready' if value.ready else 'not ready'}"
        out.append(f"  {title} ({asset})" + ("" if value is not None else f": {ABSENT}"))
        if value is not None:
            out += lines(value)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEMO_MODEL, help="partition key (catalog id)")
    parser.add_argument("--select", nargs="*", help="only these assets (default: the job's)")
    parser.add_argument("--full", action="store_true",
                        help="every eval item and the profile's whole sweep (default: the quick "
                             "pass, 100 items per eval task and configs/automation.yaml's "
                             "quick sweep)")
    parser.add_argument("--ui", action="store_true", help="run `dagster dev` instead")
    parser.add_argument("--port", type=int, default=3000)
    args = parser.parse_args()
    # Ctrl+C and a plain `kill` both end in the `finally` below, which stops what we started
    # (also when a non-interactive shell started us with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    os.environ.setdefault("ONBOARDING_CACHE_ROOT", str(DATA / "nvme"))
    os.environ.setdefault("ONBOARDING_OUTPUT_DIR", str(DATA / "manifests"))
    if not args.ui and os.environ.get("S3_ENDPOINT_URL"):
        print(f"S3_ENDPOINT_URL ({os.environ['S3_ENDPOINT_URL']}) is left for `dev.sh ui`: "
              "the demo runs on its own local S3 server")
    server = None if args.ui and use_user_s3() else start_s3()
    try:
        from pipelines.resources import config_files

        if server is not None:
            upload_model(server, config_files().spec(DEMO_MODEL).source)
            upload_twins(server, config_files().catalog().specs.values())
        if args.ui:
            import dagster as dg

            register_partitions(dg.DagsterInstance.get())
            print(f"Dagster UI: http://127.0.0.1:{args.port}  (Ctrl+C stops it"
                  + (" and the S3 server)" if server is not None else ")"))
            return run_dagster_dev(args.port)
        if not args.full:
            os.environ.setdefault("ONBOARDING_EVAL_LIMIT", "100")
        sweep = "full" if args.full else "quick"
        print(f"onboarding {args.model} ({sweep} pass; eval items per task: "
              f"{os.environ.get('ONBOARDING_EVAL_LIMIT', 'all')}"
              + ("; shrunk for time: the eval items (an inconclusive gate still re-evaluates on "
                 "more), one engine start in load timing (fully cold, the kind its check judges; "
                 "no cold-weights or warm start) and the serving sweep below; --full runs every "
                 "item, every kind of start and the whole sweep" if sweep == "quick" else "")
              + ")")
        return 0 if run_job(args.model, args.select, sweep) else 1
    except KeyboardInterrupt:
        return 130
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
