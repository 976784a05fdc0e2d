"""The engine frontend's CPU as the sweep reads it: /proc, windows, the frontend-bound mark."""

import os
import subprocess
import sys
import time

import pytest

from onboarding.common.plots import plt
from onboarding.serving.frontend import (
    FRONTEND_BOUND_LABEL,
    FrontendSampler,
    cpu_between,
    frontend_columns,
    frontend_cpu_delta,
    frontend_processes_cpu_s,
    process_cpu_s,
    tree_cpu_s,
)
from onboarding.serving.plots import mark_frontend_bound, sweep_png


def test_cpu_between_interpolates_inside_the_samples_and_refuses_outside():
    samples = [(0.0, 10.0), (1.0, 10.5), (2.0, 11.5)]
    assert cpu_between(samples, 0.0, 2.0) == pytest.approx(1.5)
    assert cpu_between(samples, 0.5, 1.5) == pytest.approx(0.25 + 0.5)
    assert cpu_between(samples, -0.1, 1.0) is None  # before the first sample
    assert cpu_between(samples, 1.0, 2.1) is None  # after the last
    assert cpu_between(samples[:1], 0.0, 0.0) is None


def test_a_point_above_0_9_of_a_core_is_frontend_bound():
    assert frontend_columns(9.5, 10.0) == {"frontend_cpu_cores": 0.95, "frontend_bound": True}
    assert frontend_columns(9.0, 10.0)["frontend_bound"] is False  # at the limit: not above
    assert frontend_columns(None, 10.0) == {"frontend_cpu_cores": None, "frontend_bound": None}


def test_the_tree_counts_the_children_too():
    code = ("import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\ntime.sleep(30)")
    busy = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while process_cpu_s(busy.pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tree_cpu_s(os.getpid()) >= process_cpu_s(os.getpid()) + process_cpu_s(busy.pid)
    finally:
        busy.kill()
        busy.wait()


def test_the_sampler_reads_a_process_and_says_why_it_cannot():
    with FrontendSampler(os.getpid(), interval_s=0.05) as s:
        t = time.process_time()
        while time.process_time() - t < 0.2:
            pass
        cols = s.columns(0.1)
    assert cols["frontend_cpu_cores"] is not None and cols["frontend_cpu_cores"] >= 0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with FrontendSampler(gone.pid) as s:
        assert s.columns(1.0) == {"frontend_cpu_cores": None, "frontend_bound": None}
    assert str(gone.pid) in s.unavailable


def _rows(bound_at: int | None):
    return [{"scenario": "chat", "load": c, "output_tokens_per_s": 100.0 * c,
             "ttft_p95_s": 0.1 * c, "itl_mean_ms": 10.0 + c, "frontend_cpu_cores": c / 64,
             "frontend_bound": c == bound_at} for c in (1, 16, 64)]


def test_the_plot_crosses_the_frontend_bound_points_and_says_so_once():
    fig, axes = plt.subplots(1, 3)
    mark_frontend_bound(axes, _rows(64))
    mark_frontend_bound(axes, _rows(64))  # a second scenario: still one legend entry
    labels = [ax.get_legend_handles_labels()[1] for ax in axes]
    plt.close(fig)
    assert labels == [[FRONTEND_BOUND_LABEL]] * 3
    fig, axes = plt.subplots(1, 3)
    mark_frontend_bound(axes, _rows(None))
    assert [ax.get_legend_handles_labels()[1] for ax in axes] == [[]] * 3
    plt.close(fig)
    assert sweep_png(_rows(64), "t").startswith(b"\x89PNG")


def test_reaped_adds_the_cpu_of_children_that_exited_and_were_waited_for():
    """`reaped` is what the run timing needs (a step's engine exits before the step ends) and
    what the frontend figure must leave out (the API server's own CPU only)."""
    import os
    import subprocess
    import sys

    from onboarding.serving.frontend import process_cpu_s

    own0, all0 = process_cpu_s(os.getpid()), process_cpu_s(os.getpid(), reaped=True)
    subprocess.run([sys.executable, "-c",
                    "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"],
                   check=True)
    own, both = process_cpu_s(os.getpid()) - own0, process_cpu_s(os.getpid(), reaped=True) - all0
    assert both - own >= 0.4  # the child's 0.5 CPU s, counted only with reaped


def test_the_frontend_is_the_launcher_and_its_api_servers_not_the_engine_core_below_it():
    """`vllm serve --api-server-count N` runs a launcher with N API server children beside the
    EngineCore child (the titles vLLM sets: VLLM::APIServer_0, VLLM::EngineCore); the API
    servers' CPU is the frontend's, the engine core's and its workers' is not."""
    burn = ("import sys, time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\ntime.sleep(30)")
    launcher = ("import subprocess, sys, time\n"
                f"burn = {burn!r}\n"
                "kids = [subprocess.Popen([sys.executable, '-c', burn, title]) for title in "
                "('VLLM::APIServer_0', 'VLLM::APIServer_1', 'VLLM::EngineCore')]\n"
                "time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", launcher])
    try:
        titles = engine_titles()
        before = frontend_processes_cpu_s(proc.pid, titles)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            after = frontend_processes_cpu_s(proc.pid, titles)
            kids = {p: tc for p, tc in after.items() if p != proc.pid}
            if (sum("APIServer" in t for t, _ in kids.values()) == 2
                    and all(c >= 0.3 for t, c in kids.values() if "APIServer" in t)):
                break
            time.sleep(0.1)
        # the launcher's own command line names the titles too: count its children only
        titles = [t for p, (t, _) in after.items() if p != proc.pid]
        assert sum("APIServer" in t for t in titles) == 2
        assert not any("EngineCore" in t for t in titles)
        assert proc.pid in after
        assert list(frontend_processes_cpu_s(proc.pid)) == [proc.pid]  # no titles: pid alone
        delta = frontend_cpu_delta(before, after)
        servers = [c for p, (t, c) in delta.items() if p != proc.pid and "APIServer" in t]
        assert len(servers) == 2 and all(c > 0.2 for c in servers)
    finally:
        for p in [*(int(c) for c in (os.popen(f"pgrep -P {proc.pid}").read().split())), proc.pid]:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
        proc.wait()


def engine_titles() -> list[str]:
    """The vLLM template's `engine_process_titles` (configs/stack.yaml)."""
    from onboarding.common.paths import PROJECT_ROOT
    from onboarding.serving.stack import load_stack

    return load_stack(PROJECT_ROOT / "configs" / "stack.yaml").templates[
        "vllm"].engine_process_titles
