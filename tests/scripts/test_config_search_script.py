"""bench/config_search.py resolves a search without starting anything (--dry-run); the real
search it runs is tests/e2e/test_config_search_vllm.py's."""

import subprocess
import sys

from onboarding.common.paths import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "bench" / "config_search.py"


def test_config_search_dry_run_lists_the_candidates_and_the_budget():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "smollm2-135m", "--model-dir",
         str(PROJECT_ROOT / ".cache" / "smollm2-135m-instruct"), "--dry-run"],
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, check=True).stdout
    assert "smollm2-135m on cpu: 3 candidates" in out
    assert "(the plan)" in out and "max_num_seqs=4, max_num_batched_tokens=2048" in out
    assert "budget 15.0 min" in out and "percentile=90.0" in out
