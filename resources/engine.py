"""The engine launcher: vLLM or SGLang as a subprocess, from a template in configs/stack.yaml.

One interface, engines differ only by template (command, flags, log line, metric names):
`Engine.serve(...)` is a context manager that yields a ready `RunningEngine` and always reaps
the whole process group on the way out, whether the step succeeded, failed or was cancelled
(Dagster interrupts a step by raising inside it, so `finally` runs). Readiness is `/health`
answering 200 and then one real completion, because vLLM answers /health before the first
request has paid for lazy initialisation.

One hand-off: `time_starts(..., hand_off=True)` parks its last start, once measured,
instead of reaping it, and a later `serve_shared` of the same configuration (hash, model path
and content) in the same process takes it over instead of paying for another start: the
serving benchmark runs on load_timing's warm start. At most one engine is ever up: any other
start reaps a parked engine first, and the resource's teardown (the run's end in the in-process
executor, the step's end in a step process) and an atexit hook reap one nothing took.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import dataclasses
import gc
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from onboarding.common.errors import OnboardingError
from onboarding.common.paths import PROJECT_ROOT
from onboarding.common.processes import free_port, log_tail, port_is_free, reap_group
from onboarding.common.refs import VariantRef
from onboarding.deploy.serving_plan import local_config
from onboarding.fetch.catalog import ModelSpec
from onboarding.fetch.twins import DUMMY_LOAD_FORMAT
from onboarding.serving import page_cache
from onboarding.serving.engine_config import EngineConfig
from onboarding.serving.kernels import read_kernel_facts
from onboarding.serving.stack import EngineTemplate, HardwareProfile, hardware_class, servable
from onboarding.serving.stats import StartSample
from resources.config_files import ConfigFiles

LOG_TAIL_LINES = 40
POLL_INTERVAL_S = 0.25
HEALTH_PROBE_TIMEOUT_S = 2.0
# SIGTERM -> SIGKILL grace when stopping an engine that served: vLLM frees its workers on SIGTERM.
REAP_GRACE_S = 15.0
# ... and for one that missed its start deadline: the deadline is the budget, a hung engine
# that ignores SIGTERM must not add the full grace to it.
REAP_GRACE_AFTER_DEADLINE_S = 3.0
# A crashing engine closes its sockets a moment before its process is gone: after a point whose
# requests lost their connection, wait this long for the exit before calling the engine alive.
EXIT_SETTLE_S = 2.0
_CONNECTION_CAUSES = frozenset({"connect_failed", "connection_lost", "stream_dropped"})


class EngineError(OnboardingError):
    """The engine could not be started or did not become ready; the log tail is in `cause`."""


@dataclass
class StartPhases:
    """Seconds from process start to each milestone of one engine start."""

    weights_loaded_s: float | None = None  # the engine's own "weights loaded" log line seen
    engine_weights_load_s: float | None = None  # the load time the engine reports, if any
    health_ready_s: float | None = None
    first_token_s: float | None = None  # = the start time a user waits for


def describe_exit(code: int) -> str:
    """`exited with code 3`, or `was killed by SIGKILL (exit code -9)`."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was killed by {name} (exit code {code})"


@dataclass(kw_only=True)
class RunningEngine:
    base_url: str
    port: int
    pid: int
    served_name: str
    log_path: Path
    argv: list[str]
    dropped_args: list[str]
    phases: StartPhases = field(default_factory=StartPhases)
    process: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    config_hash: str = ""
    # "" : started for the caller; else the kind of the load-timing start it was handed off from
    reused_from: str = ""
    # the kernels the start chose, as its log named them by the time it was ready
    # (onboarding/serving/kernels.py; the template's kernel_facts)
    kernels: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def exit_code(self) -> int | None:
        """None while the engine process runs; its exit status once it has exited."""
        return None if self.process is None else self.process.poll()

    def exited(self, errors_by_cause: Mapping[str, int] | None = None) -> bool:
        """Whether the engine has exited; after a point whose requests lost their connection
        (`errors_by_cause`), give a dying engine EXIT_SETTLE_S to be seen as gone."""
        if self.process is None:
            return False
        if errors_by_cause and _CONNECTION_CAUSES & errors_by_cause.keys():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(EXIT_SETTLE_S)
        return self.process.poll() is not None

    def exited_error(self, point: str, kept: str) -> EngineError:
        """The error for an engine that died while it was being measured: the exit code, what
        was kept of the measurements, and the engine's own last log lines."""
        code = self.exit_code()
        how = describe_exit(code) if code is not None else "stopped answering"
        return EngineError(
            f"the engine serving {self.served_name} on port {self.port} (pid {self.pid})",
            f"{how} during point {point}; {kept}; log {self.log_path}, last lines:\n"
            f"{log_tail(self.log_path, LOG_TAIL_LINES)}",
            "Read the log lines above (out of memory, a crash in the engine, a process killed "
            "from outside); the sweep needs an engine that stays up to the end, so re-run the "
            "step once the cause is fixed.")


@dataclass
class _Parked:
    """A started, measured engine waiting for a later step of the same configuration."""

    key: tuple[str, str, str]  # (config hash, model path, content hash)
    running: RunningEngine
    kind: str  # the load-timing start it was: fully_cold, cold_weights or warm
    cleanup: Any = None  # called once it is reaped (its scratch caches)

    def reap(self) -> None:
        """Stop its process group, then remove what it used."""
        try:
            if self.running.process is not None:
                reap_group(self.running.process, grace_s=REAP_GRACE_S)
        finally:
            if self.cleanup is not None:
                self.cleanup()


_PARKED: list[_Parked] = []  # at most one


def _key(variant: VariantRef, config: EngineConfig) -> tuple[str, str, str]:
    return (config.hash, str(variant.path), variant.content_hash)


def release_parked() -> None:
    """Reap the parked engine, if any, and remove what it used."""
    while _PARKED:
        _PARKED.pop().reap()


atexit.register(release_parked)

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if the step process dies (even by SIGKILL), so a
    killed run worker cannot leave an engine holding the GPU; vLLM stops its workers on SIGTERM.
    One syscall through an already-loaded libc: no allocation or lock a forked thread could
    hold, which is what makes `preexec_fn` risky in threaded parents."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _http_get_status(url: str, timeout_s: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def detect_hardware() -> str:
    """`smNN` of GPU 0 from nvidia-smi's compute capability, or `cpu` when there is no GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "cpu"
    out = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30, check=False)
    caps = out.stdout.split()
    if out.returncode != 0 or not caps:
        return "cpu"
    major, _, minor = caps[0].partition(".")
    return f"sm{int(major)}{int(minor or 0)}"


def _check_model_dir(variant: VariantRef) -> None:
    """Refuse a model path the engine cannot load before starting it: vLLM finds out only
    after importing itself (16 s on the CPU build), with the cause deep in its log."""
    path = Path(variant.path)
    if not path.exists():
        cause = "does not exist"
    elif not path.is_dir():
        cause = "is not a directory"
    elif not (path / "config.json").is_file():
        cause = "holds no config.json (the engine reads the model's architecture from it)"
    else:
        return
    raise EngineError(f"model path {path} of {variant.model} ({variant.precision})", cause,
                      "Re-materialize the variant (checkpoint, or quantized for a quantized "
                      "precision) so the path it records holds the model again; on a node, "
                      "check that the cache volume is mounted.")


def weight_files(checkpoint_dir: Path) -> list[Path]:
    files = sorted(checkpoint_dir.rglob("*.safetensors"))
    if not files:
        raise EngineError(str(checkpoint_dir), "no *.safetensors weight files",
                          "Point the variant at an exported Hugging Face checkpoint directory.")
    return files


def _page_state(kind: str, files: list[Path]) -> float:
    """Weights pre-read (warm) or evicted (the cold kinds); their resident fraction after, NaN
    when there are no weight files (random weights)."""
    if not files:
        return float("nan")
    res = page_cache.make_warm(files) if kind == "warm" else page_cache.make_cold(files)
    return res.fraction


def visible_gpu_count() -> int:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False)
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


class Engine(dg.ConfigurableResource):
    """Starts the serving engine for one variant. Local and production differ in config only."""

    engine: str = Field(default="", description="template name in configs/stack.yaml engines; "
                        "empty = the stack's own (images.engine) (ENGINE_KIND)")
    bin_dir: str = Field(default=str(PROJECT_ROOT / ".venv-engine" / "bin"),
                         description="directory holding the engine's executables "
                         "(ENGINE_BIN_DIR)")
    hardware: str = Field(default="auto", description="'auto', 'cpu' or 'smNN' (e.g. sm100) "
                          "(ENGINE_HARDWARE)")
    node_type: str = Field(default="cpu", description="entry of configs/nodes.yaml, or 'cpu' "
                           "(ONBOARDING_NODE_TYPE)")
    node_name: str = Field(default="", description="the node this engine runs on (a `nodes` "
                           "partition key: its Kubernetes node name); empty = the hostname "
                           "(ONBOARDING_NODE_NAME)")
    gpus: str = Field(default="", description="CUDA_VISIBLE_DEVICES for the engine, e.g. '0,1' "
                      "(ENGINE_GPUS)")
    cpu_kvcache_space_gib: int = Field(default=2, description="KV cache GiB on the CPU engine, "
                                       "set through the cpu profile's kv_cache_space_env "
                                       "(ENGINE_CPU_KVCACHE_SPACE_GIB)")
    port: int = Field(default=0, description="0 picks a free port on 127.0.0.1 (ENGINE_PORT)")
    start_timeout_s: float = Field(default=300.0, gt=0, description="ENGINE_START_TIMEOUT_S")
    log_dir: str = Field(default="", description="engine logs; empty = a temp directory "
                         "(ENGINE_LOG_DIR)")
    engine_version: str = Field(default="", description="the installed engine's version; empty "
                                "= read from the engine's virtualenv (bin_dir/python)")
    configs: ConfigFiles | None = Field(default=None, description="where stack.yaml (the engine "
                                        "templates) lives; default: the repository's configs/")

    def installed_version(self) -> str:
        """The engine's version as installed next to `bin_dir` (pip metadata of the first of its
        template's `distributions` installed), or `engine_version` when set."""
        if self.engine_version:
            return self.engine_version
        python = Path(self.bin_dir) / "python"
        dists = self.template().distributions
        if not python.is_file() or not dists:
            return "unknown"
        code = ("import importlib.metadata as m, sys\n"
                "for d in sys.argv[1:]:\n"
                "    try:\n        print(m.version(d)); break\n"
                "    except m.PackageNotFoundError:\n        pass\n")
        proc = subprocess.run([str(python), "-c", code, *dists], capture_output=True, text=True,
                              timeout=60, check=False)
        return proc.stdout.strip() or "unknown"

    def local(self, precision: str) -> dict[str, str]:
        """What `serving_plan` needs to know of the engine at hand."""
        return {"node_type": self.node_type, "hardware": self.resolved_hardware(),
                "engine": self.kind(), "engine_version": self.installed_version(),
                "precision": precision}

    def adhoc_config(self, variant: VariantRef, served_name: str,
                     engine_args: dict[str, Any] | None = None) -> EngineConfig:
        """A configuration for this engine outside any plan (client tests, evaluation runs):
        the hardware defaults and `engine_args`."""
        spec = ModelSpec(id=variant.model, source=f"s3://local/{variant.model}/",
                         served_name=served_name, engine_args=engine_args or {})
        return self.local_config(spec, variant.precision)

    def local_config(self, spec: ModelSpec, precision: str) -> EngineConfig:
        """This engine's own configuration of `spec` at `precision` (`local_config`: the
        hardware defaults and the model's production parameters; one device)."""
        return local_config(spec, self.template(), self.kind(), self.installed_version(),
                            self.resolved_hardware(), self.node_type, precision)

    # ---- what this engine can serve ----

    def kind(self) -> str:
        """The engine's name: ENGINE_KIND, else the one stack.yaml's manifests run."""
        return self.engine or (self.configs or ConfigFiles()).stack().engine

    def template(self) -> EngineTemplate:
        configs = self.configs or ConfigFiles()
        templates = configs.stack().templates
        if self.kind() not in templates:
            raise EngineError(f"engine {self.kind()!r}", f"no template in "
                              f"{configs.path('stack.yaml')} (known: "
                              f"{', '.join(sorted(templates))})",
                              "Set ENGINE_KIND to a known engine or add its template.")
        return templates[self.kind()]

    def resolved_node_name(self) -> str:
        """The node whose acceptance the measurements here rely on."""
        return self.node_name or socket.gethostname()

    def resolved_hardware(self) -> str:
        return detect_hardware() if self.hardware == "auto" else self.hardware

    def off_node_type(self, node_type: str, nodes: Any) -> str:
        """Why this engine is not on a `node_type` node ("" when it is): the node type it is
        configured for (ONBOARDING_NODE_TYPE), then the hardware it finds (a pod scheduled on
        another pool). `nodes`: configs/nodes.yaml; a node type it does not list runs on the
        CPU build."""
        if self.node_type != node_type:
            return (f"this engine is configured for node type {self.node_type!r} "
                    "(ONBOARDING_NODE_TYPE)")
        listed = nodes.node_types.get(node_type)
        want = listed.arch if listed is not None else "cpu"
        found = self.resolved_hardware()
        if found != want:
            return f"the hardware here is {found}, a {node_type} node has {want}"
        return ""

    def require_node_type(self, node_type: str, nodes: Any, what: str) -> None:
        """Fail before measuring anything when this step does not run on `node_type`: a
        measurement of one node type stored under another would be a wrong truth."""
        if why := self.off_node_type(node_type, nodes):
            raise EngineError(f"{what}: partition node type {node_type!r}", why,
                              f"Run this cell on a {node_type} node (in a cluster the run's "
                              "partition places its GPU steps on that pool), or materialize "
                              f"the cell of {self.node_type!r} instead.")

    def gpu_count(self) -> int:
        """GPUs the engine gets: ENGINE_GPUS, else what the step sees (a k8s step pod gets its
        GPUs from the device plugin and sets no ENGINE_GPUS); 0 on the CPU engine."""
        if self.gpus:
            return len([g for g in self.gpus.split(",") if g.strip()])
        if self.resolved_hardware() == "cpu":
            return 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return len([g for g in visible.split(",") if g.strip()])
        return visible_gpu_count()

    def can_serve(self, precision: str) -> tuple[bool, str]:
        hw = self.resolved_hardware()
        return servable(self.template(), self.kind(), hw, precision)

    def servable_precisions(self) -> list[str]:
        return list(self.template().serves.get(self.resolved_hardware(), []))

    # ---- load timing ----

    def time_starts(self, variant: VariantRef, config: EngineConfig,
                    repeats: Mapping[str, int], start_timeout_s: float | None = None,
                    log: Any = None, hand_off: bool = False
                    ) -> tuple[list[StartSample], page_cache.RawRead]:
        """Starts of each kind (serving_stats.START_KINDS), in that order.

        fully_cold: weights evicted (verified by residency) and the engine's compile/kernel
        caches pointed at an empty directory, as a new pod on a fresh node sees them. The last
        fully cold start's caches then serve the cold_weights starts (weights evicted again) and
        the warm ones (weights pre-read). The engine's own code and libraries stay cached, as on
        a node whose image is already pulled. The raw sequential read of the same files, from a
        cold cache, is measured first as the physical reference.

        A performance twin's configuration (`load_format: dummy`) reads no weights: nothing is
        evicted or read, its samples' resident fraction is NaN and the raw read is empty.

        `hand_off`: the last start, once its sample is taken, is parked for a later
        `serve_shared` of the same configuration instead of reaped (with its scratch caches,
        removed when it is reaped). Every start is a measured one either way.
        """
        random_weights = config.param("load_format") == DUMMY_LOAD_FORMAT
        files = [] if random_weights else weight_files(Path(variant.path))
        raw = page_cache.RawRead(0, 0.0)
        if files:
            gc.collect()  # an earlier step in this process may still hold the weights mmapped
            page_cache.make_cold(files)
            raw = page_cache.sequential_read(files)
        caches = Path(tempfile.mkdtemp(prefix="engine-caches-"))
        samples = []
        plan = [(kind, i) for kind in ("fully_cold", "cold_weights", "warm")
                for i in range(repeats.get(kind, 0))]
        parked = False
        try:
            warm_caches = caches / "fully_cold-0"
            for n, (kind, i) in enumerate(plan):
                cache_dir = caches / f"fully_cold-{i}" if kind == "fully_cold" \
                    else warm_caches
                if kind == "fully_cold":
                    warm_caches = cache_dir
                resident = _page_state(kind, files)
                last = hand_off and n == len(plan) - 1
                with self.serve(variant, config, start_timeout_s=start_timeout_s,
                                cache_dir=cache_dir,
                                park_as=kind if last else None) as running:
                    ph = running.phases
                    samples.append(StartSample(
                        kind=kind, resident_fraction=resident,
                        weights_loaded_s=ph.weights_loaded_s,
                        engine_weights_load_s=ph.engine_weights_load_s,
                        health_ready_s=ph.health_ready_s, first_token_s=ph.first_token_s,
                        kernels=running.kernels))
                parked = any(p.running is running for p in _PARKED)
                if log is not None:
                    log.info(f"{kind} start {i + 1}/{repeats[kind]}: {samples[-1].describe()}"
                             + (" (kept up for a later step of configuration "
                                f"{config.hash})" if last else ""))
        finally:
            if parked:
                _PARKED[-1].cleanup = lambda: shutil.rmtree(caches, ignore_errors=True)
            else:
                shutil.rmtree(caches, ignore_errors=True)
        return samples, raw

    @contextlib.contextmanager
    def serve_shared(self, variant: VariantRef, config: EngineConfig,
                     start_timeout_s: float | None = None) -> Iterator[RunningEngine]:
        """The parked engine of this configuration when one is up (`reused_from` says which
        start it was), else a start of its own; reaped on the way out either way."""
        found = next((p for p in _PARKED if p.key == _key(variant, config)), None)
        if found is None or found.running.exit_code() is not None:
            with self.serve(variant, config, start_timeout_s=start_timeout_s) as running:
                yield running
            return
        _PARKED.remove(found)
        running = dataclasses.replace(found.running, reused_from=found.kind)
        try:
            yield running
        finally:
            found.reap()

    def teardown_after_execution(self, context: Any) -> None:
        """The run's (or the step process's) end: no engine outlives it."""
        release_parked()

    # ---- starting ----

    @contextlib.contextmanager
    def serve(self, variant: VariantRef, config: EngineConfig | str,
              engine_args: dict[str, Any] | None = None,
              start_timeout_s: float | None = None,
              cache_dir: Path | None = None,
              park_as: str | None = None) -> Iterator[RunningEngine]:
        """Start `config` (a served name instead: an ad-hoc configuration of `engine_args`),
        wait until a real completion succeeds, yield, and always reap; `park_as` (a start
        kind): after a body that did not raise, park it for `serve_shared` instead."""
        release_parked()  # one engine at a time, and none beside a measured start
        if isinstance(config, str):
            config = self.adhoc_config(variant, config, engine_args)
        template = self.template()
        hw = self.resolved_hardware()
        ok, reason = servable(template, self.kind(), hw, variant.precision)
        if not ok:
            raise EngineError(f"{variant.model} ({variant.precision})", reason,
                              "Serve a precision this hardware supports, or run on a node "
                              "type that has the kernels.")
        if config.hardware != hw:
            raise EngineError(f"configuration {config.hash} of {config.model}",
                              f"is for hardware {config.hardware}, this engine runs on {hw}",
                              "Start the configuration of the node type at hand (the engine "
                              "resource's node_type and hardware).")
        _check_model_dir(variant)
        port = self.port or free_port()
        if not port_is_free(port):
            raise EngineError(f"port {port} on 127.0.0.1", "already in use by another process",
                              "Stop that process, or set ENGINE_PORT=0 to pick a free port.")
        argv = [part.format(bin_dir=self.bin_dir) for part in template.command] + \
            config.args(variant.path, port, "127.0.0.1")
        exe = argv[0]
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise EngineError(f"engine executable {exe}", "missing or not executable",
                              "Run scripts/setup.sh to build the engine virtualenv, or set "
                              "ENGINE_BIN_DIR to the directory that holds it.")
        env = {**os.environ, **config.env}
        if cache_dir is not None:  # compile/kernel caches there; None: the engine's defaults
            env.update({name: str(cache_dir / sub) for name, sub in template.cache_env.items()})
        space_env = template.hardware.get(hardware_class(hw), HardwareProfile()).kv_cache_space_env
        if hw == "cpu" and space_env:
            env[space_env] = str(self.cpu_kvcache_space_gib)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        log_root = Path(self.log_dir) if self.log_dir else Path(tempfile.gettempdir())
        log_root.mkdir(parents=True, exist_ok=True)
        log_path = log_root / f"engine-{variant.model}-{port}-{int(time.time())}.log"
        timeout_s = start_timeout_s or self.start_timeout_s
        with open(log_path, "wb") as log:
            log.write((json.dumps(argv) + "\n").encode())
            log.flush()
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                    preexec_fn=_die_with_parent)  # noqa: PLW1509
        running = RunningEngine(base_url=f"http://127.0.0.1:{port}", port=port, pid=proc.pid,
                                served_name=config.served_name, log_path=log_path, argv=argv,
                                dropped_args=list(config.dropped), process=proc,
                                config_hash=config.hash)
        ready = parked = False
        try:
            self._wait_ready(proc, running, template, t0, timeout_s)
            ready = True
            running.kernels = read_kernel_facts(
                template.kernel_facts, log_path.read_text(errors="replace").splitlines())
            yield running
            if park_as is not None and proc.poll() is None:
                _PARKED.append(_Parked(_key(variant, config), running, park_as))
                parked = True
        finally:
            if not parked:
                late = not ready and time.perf_counter() - t0 >= timeout_s
                reap_group(proc, grace_s=REAP_GRACE_AFTER_DEADLINE_S if late else REAP_GRACE_S)

    def _wait_ready(self, proc: subprocess.Popen, running: RunningEngine,
                    template: EngineTemplate, t0: float, timeout_s: float) -> None:
        """Poll until a real completion succeeds. `timeout_s` is the whole budget: every probe
        is bounded by what is left of it, so a hung engine fails at its deadline."""
        what = f"{self.kind()} serving {running.served_name} on port {running.port}"
        pattern = re.compile(template.weights_loaded_pattern or r"(?!)")  # None: never
        health_url = running.base_url + template.health_path
        phases = running.phases
        offset = 0
        probe_error = ""
        while True:
            elapsed = time.perf_counter() - t0
            if phases.weights_loaded_s is None:
                offset = self._scan_log(running.log_path, offset, pattern, phases, elapsed)
            code = proc.poll()
            if code is not None:
                port_note = ""
                tail = log_tail(running.log_path)
                if "address already in use" in tail.lower():
                    port_note = f" (port {running.port} was taken after it was chosen)"
                raise EngineError(what, f"the engine exited with code {code} during start"
                                  f"{port_note}; log {running.log_path}, last lines:\n{tail}",
                                  "Read the log lines above; fix the engine args or the model.")
            left_s = timeout_s - elapsed
            if left_s <= 0:
                health = ("answered 200; the completion probe did not succeed: "
                          f"{probe_error or 'not tried'}" if phases.health_ready_s
                          else "never answered 200")
                raise EngineError(what, f"not ready after {timeout_s:.0f} s (health {health}); "
                                  f"log {running.log_path}, last lines:\n"
                                  f"{log_tail(running.log_path)}",
                                  "Raise ENGINE_START_TIMEOUT_S if the model is just slow to "
                                  "load, otherwise read the log.")
            if phases.health_ready_s is None and _http_get_status(
                    health_url, min(HEALTH_PROBE_TIMEOUT_S, left_s)) == 200:
                phases.health_ready_s = time.perf_counter() - t0
                if phases.weights_loaded_s is None:
                    self._scan_log(running.log_path, offset, pattern, phases,
                                   phases.health_ready_s)
            left_s = timeout_s - (time.perf_counter() - t0)
            if phases.health_ready_s is not None and left_s > 0:
                probe_error = self._first_completion(running, left_s)
                if not probe_error:
                    phases.first_token_s = time.perf_counter() - t0
                    return
            time.sleep(min(POLL_INTERVAL_S, max(timeout_s - (time.perf_counter() - t0), 0)))

    @staticmethod
    def _scan_log(path: Path, offset: int, pattern: re.Pattern, phases: StartPhases,
                  elapsed: float) -> int:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].decode(errors="replace").splitlines():
            if m := pattern.search(line):
                phases.weights_loaded_s = elapsed
                secs = m.groupdict().get("seconds")
                phases.engine_weights_load_s = float(secs) if secs else None
                break
        return offset + end

    @staticmethod
    def _first_completion(running: RunningEngine, timeout_s: float) -> str:
        """One real completion, bounded by `timeout_s`: "" when it succeeded, else why not."""
        body = json.dumps({"model": running.served_name, "prompt": "Hello", "max_tokens": 1,
                           "temperature": 0.0}).encode()
        req = urllib.request.Request(running.base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                payload = json.loads(r.read())
        except TimeoutError:
            return f"timed out after {timeout_s:.1f} s"
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "" if payload.get("choices") else f"no choices in {str(payload)[:200]}"
