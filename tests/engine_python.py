"""One Python of the engine's virtualenv (.venv-engine) for the whole test session.

Tests that ask the installed vLLM itself (its flag and env registries, its quantization config
classes) used to start a fresh interpreter each and import vLLM again, about 8 CPU seconds (30 s
on a loaded 2-core machine) every time. Here one interpreter imports vLLM's heavy modules once
and runs each test's snippet in a fresh namespace; what a snippet prints comes back as text.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from functools import cache

from onboarding.common.paths import PROJECT_ROOT

ENGINE_PY = PROJECT_ROOT / ".venv-engine" / "bin" / "python"
ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PATH": "/usr/bin",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
REPLY = "@@engine-python-reply@@ "  # marks the worker's answers among what vLLM may print

_WORKER = r"""
import contextlib, io, json, sys, traceback
import vllm.envs  # noqa: F401  the heavy import, once: torch and vLLM's config modules
out = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(request["code"], {"__name__": "__snippet__", "argv": request["argv"]})
        reply = {"ok": True, "stdout": printed.getvalue()}
    except BaseException:  # the snippet's failure is the test's to report
        reply = {"ok": False, "stdout": printed.getvalue(), "error": traceback.format_exc()}
    out.write(REPLY + json.dumps(reply) + "\n")
    out.flush()
""".replace("REPLY", repr(REPLY))


class EngineSnippetError(RuntimeError):
    pass


class EnginePython:
    """A long-lived interpreter of the engine's venv; `run` executes one snippet in it."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close(); a pipe
        # nobody reads while vLLM logs could fill up and stall the worker)
        self._proc = subprocess.Popen(
            [str(ENGINE_PY), "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=ENV,
        )

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:]

    def run(self, code: str, *argv: str) -> str:
        """What `code` printed; `argv` is a list named `argv` in its namespace."""
        with self._lock:
            if self._proc.poll() is not None:
                raise EngineSnippetError(
                    f"the engine's Python exited with {self._proc.returncode}"
                    f": {self._stderr_tail()}"
                )
            self._proc.stdin.write(json.dumps({"code": code, "argv": list(argv)}) + "\n")
            self._proc.stdin.flush()
            timer = threading.Timer(self.timeout_s, self._proc.kill)
            timer.start()
            try:
                for line in self._proc.stdout:
                    if line.startswith(REPLY):
                        reply = json.loads(line[len(REPLY) :])
                        break
                else:
                    raise EngineSnippetError(f"the engine's Python exited: {self._stderr_tail()}")
            finally:
                timer.cancel()
        if not reply["ok"]:
            raise EngineSnippetError(reply["error"][-3000:])
        return reply["stdout"]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


@cache
def engine_python() -> EnginePython:
    """The session's one interpreter (closed by tests/conftest.py at the session's end)."""
    return EnginePython()


def close_engine_python() -> None:
    if engine_python.cache_info().currsize:
        engine_python().close()
        engine_python.cache_clear()
