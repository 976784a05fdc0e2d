"""End to end through the UI's own API: `dagster dev` on 127.0.0.1 with a temporary DAGSTER_HOME,
the real SeaweedFS, a launch over GraphQL (what the launchpad sends), the new-checkpoint sensor
firing for a checkpoint uploaded meanwhile, the model's cells following its planning run
(`cells_after_model`: one run per node type), and headless Chromium screenshots of the asset
graph and of the readiness grid (models x node types, the partitions of `readiness`).

Knobs (environment):
- ONBOARDING_E2E_ASSETS: comma-separated asset selection of the launched run (default
  `checkpoint`, the fast stage; `all` launches the whole onboard_model job).
- ONBOARDING_E2E_LOCATION: `module:attribute` of the code location (default
  `pipelines.definitions:defs`).
- ONBOARDING_E2E_SENSOR_ASSETS: what the sensor's run materializes (default `checkpoint`;
  `all`: the whole job).
- ONBOARDING_E2E_DROP_DIR: the checkpoint uploaded while the first run runs (default the tiny
  random Llama; e.g. `.cache/smollm2-135m-instruct` for the small real model).
- ONBOARDING_E2E_TIMEOUT_S: how long to wait for each run (default 600).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.processes import free_port, reap_group
from tests.conftest import write_spec
from tests.e2e.docs_screenshots import keep_for_docs

pytestmark = pytest.mark.slow

ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "e2e"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TIMEOUT_S = float(os.environ.get("ONBOARDING_E2E_TIMEOUT_S", "600"))
MODEL = "tiny-e2e"


def _default_sigint() -> None:
    """In the child before exec. `dagster dev` stops on SIGTERM by running its SIGINT handler;
    a suite started with SIGINT ignored (in the background of a non-interactive shell) hands
    that on, so the SIGTERM did nothing and stop() waited out its whole 60 s grace before the
    SIGKILL (measured: teardown 60 s in such a run, 5 s in a foreground one)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class DagsterDev:
    """`dagster dev` in its own process group; stop() ends the group (webserver, daemon, code
    server and run workers) and waits for it."""

    def __init__(self, workdir: Path, env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "dagster-dev.log"
        self.workspace = workdir / "workspace.yaml"
        module, attribute = os.environ.get(
            "ONBOARDING_E2E_LOCATION", "pipelines.definitions:defs").split(":")
        self.workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": {
            "module_name": module, "attribute": attribute, "location_name": "onboarding",
            "working_directory": str(PROJECT_ROOT)}}]}))
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> DagsterDev:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [str(PROJECT_ROOT / ".venv" / "bin" / "dagster"), "dev", "-w", str(self.workspace),
             "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=PROJECT_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_default_sigint)  # noqa: PLW1509 (one signal() call, no lock taken)
        log.close()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"dagster dev exited {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/server_info", timeout=2):
                    pass
                if self._location_loaded():
                    return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise AssertionError(f"dagster dev not serving within 300 s:\n{self.tail()}")

    def _location_loaded(self) -> bool:
        data = self.gql("""{ workspaceOrError { ... on Workspace { locationEntries {
            name loadStatus locationOrLoadError { __typename
              ... on PythonError { message } } } } } }""")
        entries = data["workspaceOrError"]["locationEntries"]
        for e in entries:
            err = e["locationOrLoadError"]
            if err and err["__typename"] == "PythonError":
                raise AssertionError(f"code location failed to load: {err['message']}")
        return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)

    def gql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(self.url + "/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            out = json.loads(resp.read())
        if out.get("errors"):
            raise AssertionError(f"GraphQL errors: {out['errors']}")
        return out["data"]

    def tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:  # run workers and code servers share the group: all of it goes
            reap_group(proc, grace_s=60)


LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
  }
}"""
RUN = """query Run($id: ID!) { runOrError(runId: $id) { ... on Run { status tags { key value } } } }"""
DRY_RUN = """
mutation DryRun($selector: ScheduleSelector!, $timestamp: Float) {
  scheduleDryRun(selectorData: $selector, timestamp: $timestamp) {
    __typename
    ... on DryRunInstigationTick { evaluationResult {
      runRequests { runKey tags { key value } } skipReason error { message } } }
    ... on PythonError { message }
  }
}"""
RUNS = """query Runs($filter: RunsFilter) { runsOrError(filter: $filter) {
  ... on Runs { results { runId jobName status tags { key value } } } } }"""
# what the partitions view of a multi-partitioned asset draws its grid from
PARTITION_STATUSES = """query Statuses($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) {
  ... on AssetNode { assetPartitionStatuses { __typename
    ... on MultiPartitionStatuses { primaryDimensionName ranges {
      primaryDimStartKey primaryDimEndKey secondaryDim { __typename
        ... on DefaultPartitionStatuses { materializedPartitions failedPartitions
          unmaterializedPartitions materializingPartitions } } } } } } } }"""
MULTI_PARTITIONS = """query Keys($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) {
  ... on AssetNode { partitionKeysByDimension { name partitionKeys } } } }"""
CELL_TRIGGER_TAG = "onboarding/after_run"  # pipelines/cells.py: the run a cell's run followed


def _wait(predicate, what: str, dev: DagsterDev, timeout_s: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}\n{dev.tail()}")


def _run_status(dev: DagsterDev, run_id: str) -> str:
    return dev.gql(RUN, {"id": run_id})["runOrError"]["status"]


def _finished(dev: DagsterDev, run_id: str) -> str | None:
    status = _run_status(dev, run_id)
    return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None


def _partitions(home: Path) -> list[str]:
    from dagster import DagsterInstance

    with DagsterInstance.from_ref(_instance_ref(home)) as inst:
        return inst.get_dynamic_partitions("models")


def _stack_versions(home: Path) -> list[str]:
    """Data versions of the recorded serving_stack observations, newest first."""
    from dagster import AssetKey, DagsterInstance

    with DagsterInstance.from_ref(_instance_ref(home)) as inst:
        records = inst.fetch_observations(AssetKey("serving_stack"), limit=10).records
        return [r.asset_observation.tags.get("dagster/data_version") for r in records]


def _instance_ref(home: Path):
    from dagster._core.instance.ref import InstanceRef

    return InstanceRef.from_dir(str(home))


@pytest.fixture
def deployment(tmp_path, s3_server, s3_store, tiny_checkpoint, unique_prefix):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "configs" / "dagster.yaml", home / "dagster.yaml")
    configs = tmp_path / "configs"
    shutil.copytree(PROJECT_ROOT / "configs", configs, ignore=shutil.ignore_patterns("models"))
    (configs / "models").mkdir()
    automation = yaml.safe_load((configs / "automation.yaml").read_text())
    sensor_assets = os.environ.get("ONBOARDING_E2E_SENSOR_ASSETS", "checkpoint")
    automation["discovery"].update(
        prefix=unique_prefix + "incoming/", minimum_interval_s=5,
        run_assets=None if sensor_assets == "all" else sensor_assets.split(","))
    automation["stack"]["observe_interval_s"] = 10
    (configs / "automation.yaml").write_text(yaml.safe_dump(automation))
    s3_store.upload_dir(tiny_checkpoint, "models", unique_prefix + "catalogued/")
    write_spec(configs, MODEL, f"s3://models/{unique_prefix}catalogued/")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ONBOARDING_")},
        **s3_server.env(),
        "DAGSTER_HOME": str(home),
        "ONBOARDING_CONFIG_DIR": str(configs),
        "ONBOARDING_DISCOVERED_DIR": str(tmp_path / "discovered"),
        "ONBOARDING_CACHE_ROOT": str(tmp_path / "nvme"),
        "ONBOARDING_OUTPUT_DIR": str(tmp_path / "out"),
        "ONBOARDING_EXECUTOR": "in_process",
        "DAGSTER_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
    }
    dev = DagsterDev(tmp_path, env)
    try:
        yield dev.start(), home, configs, unique_prefix
    finally:
        dev.stop()
        shutil.copy(dev.log_path, _artifacts() / "dagster-dev.log")


def _artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def test_launch_from_the_ui_api_and_sensor_picks_up_an_upload(deployment, s3_store,
                                                              tiny_checkpoint):
    dev, home, configs, prefix = deployment
    _wait(lambda: MODEL in _partitions(home), "catalog_partitions_sensor to register the model",
          dev, timeout_s=180)
    selection = os.environ.get("ONBOARDING_E2E_ASSETS", "checkpoint")
    params = {
        "selector": {"repositoryLocationName": "onboarding", "repositoryName": "__repository__",
                     "jobName": "onboard_model",
                     **({} if selection == "all" else {"assetSelection": [
                         {"path": [a.strip()]} for a in selection.split(",")]})},
        "runConfigData": {},
        "mode": "default",
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": MODEL}]},
    }
    launched = dev.gql(LAUNCH, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    # While it runs, a checkpoint lands in the watched prefix.
    dropped = Path(os.environ.get("ONBOARDING_E2E_DROP_DIR") or tiny_checkpoint)
    s3_store.upload_dir(dropped, "models", prefix + "incoming/dropped-model/")

    assert _wait(lambda: _finished(dev, run_id), f"run {run_id}", dev) == "SUCCESS", dev.tail()

    def sensor_run():
        runs = dev.gql(RUNS, {"filter": {"tags": [
            {"key": "onboarding/trigger", "value": "new_checkpoint"}]}})["runsOrError"]["results"]
        return runs[0] if runs else None

    triggered = _wait(sensor_run, "the new-checkpoint sensor's run", dev)
    tags = {t["key"]: t["value"] for t in triggered["tags"]}
    assert tags["dagster/partition"] == "dropped-model"
    assert tags["dagster/run_key"] == f"dropped-model@{tags['onboarding/content_id']}"
    assert _wait(lambda: _finished(dev, triggered["runId"]), "the sensor's run", dev) == "SUCCESS"
    assert "dropped-model" in _partitions(home)

    # The daemon records the stack sensor's observation; a stack edit records a new one.
    first = _wait(lambda: _stack_versions(home), "a serving_stack observation", dev, 120)
    stack = yaml.safe_load((configs / "stack.yaml").read_text())
    stack["versions"]["vllm"] = "0.99.0"
    (configs / "stack.yaml").write_text(yaml.safe_dump(stack))
    latest = _wait(lambda: [v for v in _stack_versions(home) if v != first[0]],
                   "a serving_stack observation after the stack edit", dev, 120)
    assert latest[0] != first[0]

    # "Test schedule" in the UI: the re-validation tick, evaluated now. The dropped model is
    # ready only when its run went through kserve_manifest (ONBOARDING_E2E_SENSOR_ASSETS=all).
    tick = dev.gql(DRY_RUN, {"selector": {
        "repositoryLocationName": "onboarding", "repositoryName": "__repository__",
        "scheduleName": "revalidation_schedule"}, "timestamp": time.time()})["scheduleDryRun"]
    assert tick["__typename"] == "DryRunInstigationTick", tick
    result = tick["evaluationResult"]
    assert result["error"] is None, result["error"]
    partitions = sorted({t["value"] for r in result["runRequests"] or [] for t in r["tags"]
                         if t["key"] == "dagster/partition"})
    full = os.environ.get("ONBOARDING_E2E_SENSOR_ASSETS") == "all"
    assert partitions == (["dropped-model"] if full else []), result
    if not full:
        assert "current with stack" in result["skipReason"]

    # with the default knobs nothing but this model's planning run made a serving variant or
    # started a cell, so what each cell shows is known exactly
    _cells_follow_the_planning_run(dev, home, exact=selection == "checkpoint" and not full)
    _screenshot(dev)


def _launch(dev: DagsterDev, job: str, tags: dict[str, str], assets: list[str] | None) -> str:
    """A run launched as the launchpad launches it; its id."""
    params = {
        "selector": {"repositoryLocationName": "onboarding", "repositoryName": "__repository__",
                     "jobName": job,
                     **({} if assets is None else {"assetSelection": [
                         {"path": [a]} for a in assets]})},
        "runConfigData": {},
        "mode": "default",
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
    }
    launched = dev.gql(LAUNCH, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def _cells_follow_the_planning_run(dev: DagsterDev, home: Path, exact: bool) -> None:
    """The model's own stages up to its plan (checkpoint, then serving_config, planned without
    a quantized variant); when that run succeeds, `cells_after_model` requests one run per cell
    of the fleet: onboard_cell where the node type can be measured here (the embedded `cpu`),
    plan_cell on the GPU node types. The cpu cell's run fails (its engine steps need the
    serving variant, never made: a real failed cell); the planned cells render and judge.
    Not `exact` (a knob ran more of the job): the planned cells alone are held to it."""
    planned = _launch(dev, "onboard_model", {"dagster/partition": MODEL},
                      ["checkpoint", "serving_config"])
    assert _wait(lambda: _finished(dev, planned), f"run {planned}", dev) == "SUCCESS", dev.tail()

    def cell_runs():
        runs = dev.gql(RUNS, {"filter": {"tags": [
            {"key": CELL_TRIGGER_TAG, "value": planned}]}})["runsOrError"]["results"]
        done = [r for r in runs if r["status"] in ("SUCCESS", "FAILURE", "CANCELED")]
        return runs if len(runs) == 3 and len(done) == 3 else None

    runs = _wait(cell_runs, "the three cell runs cells_after_model requests", dev)
    by_cell = {next(t["value"] for t in r["tags"] if t["key"] == "dagster/partition"):
               (r["jobName"], r["status"]) for r in runs}
    expected = {f"{MODEL}|cpu": ("onboard_cell", "FAILURE"),
                f"{MODEL}|b300": ("plan_cell", "SUCCESS"),
                f"{MODEL}|h200": ("plan_cell", "SUCCESS")}
    if not exact:
        by_cell.pop(f"{MODEL}|cpu")
        expected.pop(f"{MODEL}|cpu")
    assert by_cell == expected, (by_cell, dev.tail())
    if not exact:
        return

    # what the grid shows, from the API it is drawn from: models x node types, two cells
    # materialized, the cpu cell failed, the other model's cells never run
    key = {"key": {"path": ["readiness"]}}
    dims = {d["name"]: set(d["partitionKeys"]) for d in dev.gql(MULTI_PARTITIONS, key)[
        "assetNodeOrError"]["partitionKeysByDimension"]}
    assert dims == {"model": {MODEL, "dropped-model"}, "node_type": {"b300", "h200", "cpu"}}
    statuses = dev.gql(PARTITION_STATUSES, key)["assetNodeOrError"]["assetPartitionStatuses"]
    assert statuses["__typename"] == "MultiPartitionStatuses", statuses
    assert statuses["primaryDimensionName"] == "model"
    # a range: consecutive models whose node types have the same statuses
    shown = {(r["primaryDimStartKey"], r["primaryDimEndKey"]): {
        k: set(r["secondaryDim"][f"{k}Partitions"]) for k in ("materialized", "failed",
                                                              "materializing")}
        for r in statuses["ranges"]}
    none = {"materialized": set(), "failed": set(), "materializing": set()}
    assert shown.pop((MODEL, MODEL)) == {"materialized": {"b300", "h200"}, "failed": {"cpu"},
                                         "materializing": set()}, statuses
    assert all(v == none for v in shown.values()), statuses  # dropped-model: never run
    from dagster import AssetKey, DagsterInstance

    with DagsterInstance.from_ref(_instance_ref(home)) as inst:
        assert inst.get_materialized_partitions(AssetKey("readiness")) == {
            f"{MODEL}|b300", f"{MODEL}|h200"}
        assert inst.get_materialized_partitions(AssetKey("readiness_report")) == {
            f"{MODEL}|b300", f"{MODEL}|h200"}


def _screenshot(dev: DagsterDev) -> None:
    """The model's asset graph (everything upstream of its manifest) and its checkpoint
    partition page, as the UI renders them."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    out = _artifacts()
    graph = "/assets/kserve_manifest?view=lineage&lineageScope=upstream&lineageDepth=20"
    shots = {
        "asset-graph.png": (graph, "serving_stack"),
        f"checkpoint-{MODEL}.png": (f"/assets/checkpoint?view=partitions&partition={MODEL}",
                                    MODEL),
        # the cells as the partitions view draws a two-dimensional asset: the models, the
        # node types of the one selected (a status dot each), and its h200 cell's verdict
        "readiness-grid.png": (f"/assets/readiness?view=partitions&partition={MODEL}%7Ch200",
                               "next_step"),
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            for name, (path, expect) in shots.items():
                page.goto(dev.url + path, wait_until="networkidle", timeout=120_000)
                _dismiss_welcome(page, PlaywrightError)
                try:
                    page.get_by_text(expect, exact=True).first.wait_for(timeout=60_000)
                finally:
                    page.wait_for_timeout(1500)  # the graph lays out after its data arrives
                    page.screenshot(path=str(out / name), full_page=True)
        finally:
            browser.close()
    for name in shots:
        assert (out / name).stat().st_size > 10_000, name
    keep_for_docs(out / "asset-graph.png", "screenshot-ui-asset-graph.png")
    keep_for_docs(out / f"checkpoint-{MODEL}.png", "screenshot-ui-checkpoint.png")
    keep_for_docs(out / "readiness-grid.png", "screenshot-ui-readiness-grid.png")


def _dismiss_welcome(page, error_type) -> None:
    """A fresh browser profile gets the UI's one-time community dialog over the page."""
    try:
        page.get_by_role("button", name="Skip").click(timeout=3_000)
    except error_type:
        pass  # not shown
