"""Shared fixtures: a real SeaweedFS S3 server on 127.0.0.1, a catalog dir, tiny checkpoints."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import os
import shutil
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")
# Under pytest-xdist (scripts/dev.sh test runs its workers) each worker gets one OpenMP
# thread: the vLLM CPU engine pins its worker to core 0 (the other core is its API server's),
# and a 2-thread torch beside it spun at its barriers (the SmolLM2 quantize e2e took 335 s
# instead of 60). A test is the same test on one thread. Serial runs keep the defaults. Set
# before anything imports torch.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from onboarding.common.paths import PROJECT_ROOT
from resources.config_files import ConfigFiles, OutputDirs
from resources.s3 import S3ObjectStore
from resources.seaweedfs import LocalS3Server
from tests.fakes.faulty_s3_proxy import FaultyS3Proxy
from tests.tiny_models import build_tiny_llama

ACCESS_KEY, SECRET_KEY = "onboarding-test", "onboarding-test-secret"


def _work_units(root: Path = PROJECT_ROOT) -> dict[str, str]:
    """Module, or module::test, -> the unit of work it goes in, read from the sources (the
    pytest-xdist controller collects nothing itself): "engine" for what is marked `engine`;
    a module that has a module-scoped fixture is one unit, so the fixture is set up once."""
    units = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = str(path.relative_to(root))
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets) \
                    and "mark.engine" in ast.unparse(node.value):
                units[rel] = "engine"
            elif isinstance(node, ast.FunctionDef) and any(
                    "mark.engine" in ast.unparse(d) for d in node.decorator_list):
                units[f"{rel}::{node.name}"] = "engine"
            elif isinstance(node, ast.FunctionDef) and any(
                    "fixture" in ast.unparse(d) and "scope='module'" in ast.unparse(d)
                    for d in node.decorator_list):
                units.setdefault(rel, rel)
    return units


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """The tests that start the vLLM CPU engine (marked `engine`, checked by
    tests/test_markers.py) go to one worker as one unit of work, in their order: never two
    engines at once on the 2 cores, and, the largest unit, handed out first. A module with a
    module-scoped fixture goes whole too; every other test is a unit of its own, for whichever
    worker is free, in the order pytest_collection_modifyitems below sets. (pytest 9 ignores the node-id suffix that xdist's own `loadgroup` groups
    by: measured, its groups were split across workers.)"""
    if config.getoption("dist") != "load":  # `-n N` alone; an explicit --dist is obeyed
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the order is the collection's (sorted below)

    units = _work_units()

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module, _, name = nodeid.partition("::")
            test = f"{module}::{name.split('[')[0]}"
            return units.get(test) or units.get(module) or nodeid

    return Units(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    """On a pytest-xdist worker, the order the units of work are handed out in: the engine unit,
    its `alone` test first; the `waits` tests, which run beside that one; the whole modules;
    the rest, each kept in its order. An `alone(first=False)` test keeps its place (it shares
    its module's engine fixture: moved first, it would start that engine a second time) and
    still has the machine to itself when it runs."""
    if not WORKER:
        return
    units = _work_units()

    def rank(item) -> int:
        module, _, name = item.nodeid.partition("::")
        unit = units.get(f"{module}::{name.split('[')[0]}") or units.get(module)
        alone = item.get_closest_marker("alone")
        if alone is not None and alone.kwargs.get("first", True):
            return 0
        if unit == "engine":
            return 1
        return 2 if item.get_closest_marker("waits") else 3 if unit else 4

    items.sort(key=rank)  # stable


@contextlib.contextmanager
def _machine(root: Path, alone: bool):
    """A test marked `alone` has the machine to itself: it waits for the test running beside it
    to end and no other starts until it is done (writer first: the gate), except those marked
    `waits` (they take no part: hardly any CPU). Others share it."""
    with open(root / "machine.gate", "a") as gate, open(root / "machine.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # both released when the files close


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around setup (module and session fixtures included), call and teardown of each test."""
    if not WORKER:
        yield
        return
    if item.get_closest_marker("waits"):
        yield
        return
    root = Path(item.config.option.basetemp).parent  # the run's, shared by its workers
    with _machine(root, item.get_closest_marker("alone") is not None):
        yield


def forget_dagster_state_storage() -> None:
    """Clear the defs-state storage Dagster 1.13 keeps in a ContextVar while an instance is
    entered (dagster/_core/storage/defs_state/base.py, `set_defs_state_storage`, from
    `DagsterInstance.__enter__`). Two instances exited out of order leave the first one's
    storage there after that instance is gone, and a later `dg.materialize` without an instance
    then fails on it ("Attempted to resolve undefined DagsterInstance weakref", seen once in a
    whole-suite run, tests/scripts/test_demo.py; tests/test_floors.py reproduces it)."""
    from dagster._core.storage.defs_state.base import _current_storage

    _current_storage.set(None)


@pytest.fixture(autouse=True)
def _no_state_storage_from_an_earlier_test():
    """Each test starts without a Dagster instance's storage that an earlier test left."""
    forget_dagster_state_storage()


def pytest_sessionfinish(session, exitstatus) -> None:
    from tests.engine_python import close_engine_python

    close_engine_python()  # the engine Python that tests asking vLLM itself shared


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> LocalS3Server:
    server = LocalS3Server(data_dir=tmp_path_factory.mktemp("seaweedfs"), access_key=ACCESS_KEY,
                           secret_key=SECRET_KEY)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_store(s3_server) -> S3ObjectStore:
    return S3ObjectStore(endpoint_url=s3_server.endpoint_url, access_key_id=ACCESS_KEY,
                         secret_access_key=SECRET_KEY, chunk_size_mb=1, max_concurrency=8,
                         max_attempts=2)


@pytest.fixture
def s3_proxy(s3_server) -> FaultyS3Proxy:
    """The real SeaweedFS behind a proxy that misbehaves on demand (tests/fakes/faulty_s3_proxy)."""
    with FaultyS3Proxy(s3_server.endpoint_url) as proxy:
        yield proxy


def tool_client(s3_server, with_checksums: bool = False):
    """A plain boto3 client, as another tool would use; no additional checksums unless asked."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=s3_server.endpoint_url, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"},
                      request_checksum_calculation="when_supported" if with_checksums
                      else "when_required"))


def upload_like_a_tool(s3_server, path: Path, key: str, part_bytes: int | None = None,
                       checksum: str | None = None) -> dict:
    """Upload one file as ordinary tools do: no sha256 metadata; a multipart upload (ETag
    `<md5 of part md5s>-<parts>`) when `part_bytes` is set; an S3 additional checksum only when
    `checksum` names one (boto3 would add CRC32 by default). Returns the HEAD of the object."""
    from boto3.s3.transfer import TransferConfig

    client = tool_client(s3_server, with_checksums=bool(checksum))
    big = 1 << 40
    cfg = TransferConfig(multipart_threshold=part_bytes or big, multipart_chunksize=part_bytes or big)
    extra = {"ChecksumAlgorithm": checksum} if checksum else None
    client.upload_file(str(path), "models", key, Config=cfg, ExtraArgs=extra)
    return client.head_object(Bucket="models", Key=key, ChecksumMode="ENABLED")


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> dict[str, str]:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server.env()


@pytest.fixture
def unique_prefix() -> str:
    return f"t-{uuid.uuid4().hex[:10]}/"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """Two-shard random Llama (about 0.2 MB per shard) with an index."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", shards=2)


SMOL = PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"


def tiny_with_smol_tokenizer(tiny_checkpoint: Path, dest: Path) -> Path:
    """A copy of the tiny random Llama at `dest` with SmolLM2's tokenizer beside it, so token-
    exact prompts can be built for it; skips where SmolLM2 was not built."""
    if not (SMOL / "tokenizer.json").is_file():
        pytest.skip(f"{SMOL} not built; scripts/build_smollm2.py builds it offline")
    shutil.copytree(tiny_checkpoint, dest)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SMOL / name, dest / name)
    return dest


@pytest.fixture
def config_dir(tmp_path) -> Path:
    """A copy of configs/ without model specs; tests add the specs they need."""
    target = tmp_path / "configs"
    shutil.copytree(PROJECT_ROOT / "configs", target,
                    ignore=shutil.ignore_patterns("models"))
    (target / "models").mkdir()
    return target


@pytest.fixture
def configs(config_dir, tmp_path) -> ConfigFiles:
    """The one door to `config_dir` (what every asset, sensor and schedule asks)."""
    return ConfigFiles(config_dir=str(config_dir),
                       discovered_dir=str(tmp_path / "discovered-specs"))


@pytest.fixture
def outputs(tmp_path) -> OutputDirs:
    return OutputDirs(manifests_dir=str(tmp_path / "manifests"),
                      reports_dir=str(tmp_path / "reports"))


def write_spec(config_dir: Path | ConfigFiles, model_id: str, source: str, **extra) -> Path:
    import yaml

    root = config_dir.root if isinstance(config_dir, ConfigFiles) else config_dir
    path = root / "models" / f"{model_id}.yaml"
    path.write_text(yaml.safe_dump({"id": model_id, "source": source,
                                    "served_name": model_id, **extra}))
    return path


def assert_golden(path: Path, text: str, changed: str) -> None:
    """`text` is the reviewed file at `path`; UPDATE_GOLDEN=1 rewrites it first, for review."""
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} missing: run with UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), changed
