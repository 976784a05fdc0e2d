"""The product reads as a reference, not a lab notebook: no internal issue numbers, no names by
run number, no mechanics of borrowing a test GPU in code, configs, tests, scripts, bench or docs.

Upstream references stay: `owner/repo#N`, `owner/repo issue N`, "upstream issue N" and URLs are
not flagged. Recorded data (tests/data/, each recording's own README) and vendored files
(deploy/crds/, deploy/kserve-crds/, LICENSE) are not product text.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from onboarding.common.paths import PROJECT_ROOT

SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".toml", ".md", ".json")
SKIPPED = ("tests/data/", "deploy/crds/", "deploy/kserve-crds/", ".venv")

# "issue 23", "issues 3, 17": an internal tracker number
ISSUE = re.compile(r"\bissues?\s+\d+", re.IGNORECASE)
# what may stand right before an upstream issue: "owner/repo ", "upstream ", a URL
UPSTREAM = re.compile(r"([\w.-]+/[\w.-]+|upstream|github\.com\S*)\s*$", re.IGNORECASE)
# a function, class, test or constant named by run number: recording_run2, run3_sweep, _run_4
NAMED_BY_RUN = re.compile(
    r"^\s*(?:async\s+def|def|class)\s+(\w*?(?:run\d|_run_\d)\w*)"
    r"|^([A-Z0-9_]*RUN_?\d+[A-Z0-9_]*)\s*=", re.IGNORECASE)
FILE_BY_RUN = re.compile(r"run\d|_run_\d", re.IGNORECASE)
# a mention of such a name anywhere (test_h200_run4_replay.py, run3_sweep_section); the
# recordings' folder names (tests/data/gpu/h200-slo-target/) are data and not matched
NAME_REF = re.compile(r"\b(?:\w+_run_?\d+\w*|run\d+_\w+)\b", re.IGNORECASE)
# borrowing a remote test GPU: the project's text says what device and command, not this
LENDING = re.compile(r"\b(lent|leases?|leased)\b", re.IGNORECASE)
# a session on a test GPU by its ordinal ("the tenth H200 run", "the fourth, fifth and eighth
# runs' rows") or a repetition labelled like one ("c256 run 2 of"); a recording is named by topic
ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
           r"|twelfth|\d+(?:st|nd|rd|th))")
RUN_ORDINAL = re.compile(
    rf"\b{ORDINAL}\s+(?:[HB]\d00|GPU)\s+(?:run|session)s?\b"
    rf"|\b{ORDINAL}(?:,\s*{ORDINAL})*,?\s+and\s+{ORDINAL}\s+runs\b"
    r"|\brun\s+\d+\s+of\b", re.IGNORECASE)


def product_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=PROJECT_ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [PROJECT_ROOT / p for p in sorted(set(out))
            if p.endswith(SUFFIXES) and not p.startswith(SKIPPED)
            and Path(p).name != "LICENSE" and p != "tests/test_product_text.py"
            and (PROJECT_ROOT / p).is_file()]


def findings(path: Path, text: str) -> list[str]:
    """`file:line: what` for every place in `text` that reads as internal history."""
    rel = path.relative_to(PROJECT_ROOT)
    out = []
    if FILE_BY_RUN.search(path.name):
        out.append(f"{rel}: file named by run number")
    for n, line in enumerate(text.splitlines(), 1):
        for m in ISSUE.finditer(line):
            if not UPSTREAM.search(line[:m.start()]):
                out.append(f"{rel}:{n}: internal issue number {m.group(0)!r}")
        if path.suffix == ".py" and (m := NAMED_BY_RUN.search(line)):
            out.append(f"{rel}:{n}: named by run number {(m.group(1) or m.group(2))!r}")
        elif m := NAME_REF.search(line):
            out.append(f"{rel}:{n}: a name by run number {m.group(0)!r}")
        if m := LENDING.search(line):
            out.append(f"{rel}:{n}: GPU-lending word {m.group(0)!r}")
        if m := RUN_ORDINAL.search(line):
            out.append(f"{rel}:{n}: a run by its ordinal {m.group(0)!r}")
    return out


def test_the_checks_catch_what_they_are_for_and_spare_upstream_references():
    """Not vacuous: each pattern flags its kind and lets an upstream reference through."""
    probe = PROJECT_ROOT / "onboarding" / "probe_run3.py"
    text = ("# issue 23: x\n# see vllm-project/vllm issue 42738 and upstream issue 5\n"
            "def recording_run2():\nH200_RUN9 = 1\n# on the lent H200\n"
            "# kserve/kserve#5348, https://github.com/a/b/issues/7\n"
            "# tests/data/gpu/h200-slo-target/onboard-A.json; see test_h200_run4_replay.py\n"
            "# from the tenth H200 run\n# replaces the fourth, fifth and eighth runs' rows\n"
            "# skipped: c256 run 2 of `frontend`\n"
            "# the first run installs it; from its second run on; c=256 repetition 2 of x\n")
    got = findings(probe, text)
    assert [g.split(": ", 1)[1] for g in got] == [
        "file named by run number", "internal issue number 'issue 23'",
        "named by run number 'recording_run2'", "named by run number 'H200_RUN9'",
        "GPU-lending word 'lent'", "a name by run number 'test_h200_run4_replay'",
        "a run by its ordinal 'tenth H200 run'",
        "a run by its ordinal 'fourth, fifth and eighth runs'",
        "a run by its ordinal 'run 2 of'"]


def test_json_descriptions_are_product_text():
    """A config's JSON (its `description`, a point's `source`) is read like any other file; a
    recording's JSON under tests/data/ is not."""
    names = {p.relative_to(PROJECT_ROOT).as_posix() for p in product_files()}
    assert "configs/predict/h200_points.json" in names
    assert not any(n.startswith("tests/data/") for n in names)


def test_no_internal_history_in_code_configs_tests_scripts_bench_or_docs():
    bad = [f for path in product_files() for f in findings(path, path.read_text())]
    assert not bad, (f"{len(bad)} places read as internal history; say what the code does "
                     "and why today, name things by topic, cite upstream as owner/repo#N:\n"
                     + "\n".join(bad))
