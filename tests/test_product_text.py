"""The product reads as a reference, not a lab notebook: no internal issue numbers, no names by
run number, no mechanics of borrowing a test GPU in code, configs, tests, scripts, bench or docs;
no path outside the repository (`../shared`: a user's clone has none beside it).

Upstream references stay: `owner/repo#N`, `owner/repo issue N`, "upstream issue N" and URLs are
not flagged. Recorded data (tests/data/, each recording's own README) and vendored files
(deploy/crds/, deploy/kserve-crds/, LICENSE) are not product text; but no file or folder
anywhere, recordings included, is named by run or issue number, and no recorded file (a
recording's own README aside, where its history belongs) uses such a name, cites a session by
its number or points outside the repository. The CI script (.ci/) runs beside the project's
other checkouts and may name them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from onboarding.common.paths import PROJECT_ROOT

SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".toml", ".md", ".json", ".txt", ".jinja",
            ".dockerignore", ".gitignore")
SKIPPED = ("tests/data/", "deploy/crds/", "deploy/kserve-crds/", ".venv")
# where a path outside the repository may be named: the CI script, which runs in a workspace
# that has the other checkouts beside this one
OUTSIDE_ALLOWED = (".ci/",)

# "issue N", "issues N, M", "issue #N", "issueN-expectations": an internal tracker number
# (a name such as ISSUEN_KINDS is NAME_REF's)
ISSUE = re.compile(r"\bissues?(?:\s+#?|\s*#|[-_]?)\d+(?!\w)", re.IGNORECASE)
ISSUE_AT_END = re.compile(r"\bissues?\s*$", re.IGNORECASE)
NUMBER_AT_START = re.compile(r"\s*(?:#|//|\*|\"\"\")?\s*#?\d+(?!\w)")
# what may stand right before an upstream issue: "owner/repo ", "upstream ", a URL
UPSTREAM = re.compile(r"([\w.-]+/[\w.-]+|upstream|github\.com\S*)\s*$", re.IGNORECASE)
# a function, class, test or constant named by run number: recording_runN, runN_sweep, _run_N
NAMED_BY_RUN = re.compile(
    r"^\s*(?:async\s+def|def|class)\s+(\w*?(?:run\d|_run_\d)\w*)"
    r"|^([A-Z0-9_]*RUN_?\d+[A-Z0-9_]*)\s*=", re.IGNORECASE)
FILE_BY_RUN = re.compile(r"run\d|_run_\d", re.IGNORECASE)
# a file or folder, anywhere in the repository, named by run or issue number (h200-...-runN/,
# test_issueN.py)
PATH_BY_NUMBER = re.compile(r"(?:run|issue)[-_]?\d", re.IGNORECASE)
# a mention of such a name anywhere (test_h200_runN_replay.py, runN_sweep_section, the
# constant ISSUEN_KINDS); the recordings' folder names (tests/data/gpu/h200-slo-target/) are
# data and not matched
NAME_REF = re.compile(r"\b(?:\w+_(?:run|issue)_?\d+\w*|\w*?(?:run|issue)\d+_\w+)\b",
                      re.IGNORECASE)
# a folder beside the checkout, which a user's clone does not have
OUTSIDE = re.compile(r"\.\./shared\b")
# borrowing a remote test GPU: the project's text says what device and command, not this
LENDING = re.compile(r"\b(lent|leases?|leased)\b", re.IGNORECASE)
# a session on a test GPU by its ordinal ("the tenth H200 run", "the fourth, fifth and eighth
# runs' rows") or a repetition labelled like one ("c256 run N of"); a recording is named by topic
ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
           r"|twelfth|\d+(?:st|nd|rd|th))")
RUN_ORDINAL = re.compile(
    rf"\b{ORDINAL}\s+(?:[HB]\d00|GPU)\s+(?:run|session)s?\b"
    rf"|\b{ORDINAL}(?:,\s*{ORDINAL})*,?\s+and\s+{ORDINAL}\s+runs\b"
    r"|\brun\s+\d+\s+of\b"
    # a recording cited by its session number: "run N: ...", "run N's versions", "(..., run N)",
    # "the run-N prepare.json", "run N twins.json"
    r"|\brun[- ]\d+(?:['\u2019]s\b|:|\)|\s+\S+\.json\b|\s+prepare\b)", re.IGNORECASE)


def repository_paths() -> list[str]:
    """Every file git tracks or would track (not .git, not what .gitignore ignores)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=PROJECT_ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return sorted(set(out))


def product_files() -> list[Path]:
    return [PROJECT_ROOT / p for p in repository_paths()
            if (p.endswith(SUFFIXES) or Path(p).name.startswith("Dockerfile")
                or p.startswith(OUTSIDE_ALLOWED))
            and not p.startswith(SKIPPED)
            and Path(p).name != "LICENSE" and p != "tests/test_product_text.py"
            and (PROJECT_ROOT / p).is_file()]


def recording_readme(p: str) -> bool:
    """A recording's own README (tests/data/.../<recording>/README.md, not the GPU recordings'
    index): its history is allowed there."""
    return (p.startswith("tests/data/") and Path(p).name == "README.md"
            and p != "tests/data/gpu/README.md")


def recorded_files() -> list[Path]:
    """The text files under tests/data/ other than the recordings' own READMEs."""
    out = []
    for p in repository_paths():
        path = PROJECT_ROOT / p
        if p.startswith("tests/data/") and not recording_readme(p) and path.is_file():
            head = path.read_bytes()[:4096]
            if b"\0" not in head:
                out.append(path)
    return out


def findings(path: Path, text: str) -> list[str]:
    """`file:line: what` for every place in `text` that reads as internal history."""
    rel = path.relative_to(PROJECT_ROOT)
    out = []
    if FILE_BY_RUN.search(path.name):
        out.append(f"{rel}: file named by run number")
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        for m in ISSUE.finditer(line):
            if not UPSTREAM.search(line[:m.start()]):
                out.append(f"{rel}:{n}: internal issue number {m.group(0)!r}")
        # the same, wrapped: "issue" ending one line, its number opening the next
        if (m := ISSUE_AT_END.search(line)) and n < len(lines) and \
                NUMBER_AT_START.match(lines[n]) and not UPSTREAM.search(line[:m.start()]):
            out.append(f"{rel}:{n}: internal issue number {m.group(0)!r} wrapped onto the "
                       "next line")
        if path.suffix == ".py" and (m := NAMED_BY_RUN.search(line)):
            out.append(f"{rel}:{n}: named by run number {(m.group(1) or m.group(2))!r}")
        elif m := NAME_REF.search(line):
            out.append(f"{rel}:{n}: a name by run or issue number {m.group(0)!r}")
        if m := LENDING.search(line):
            out.append(f"{rel}:{n}: GPU-lending word {m.group(0)!r}")
        if m := RUN_ORDINAL.search(line):
            out.append(f"{rel}:{n}: a run by its ordinal {m.group(0)!r}")
        if (m := OUTSIDE.search(line)) and not rel.as_posix().startswith(OUTSIDE_ALLOWED):
            out.append(f"{rel}:{n}: a path outside the repository {m.group(0)!r}")
    return out


def recorded_findings(path: Path, text: str) -> list[str]:
    """Of a recorded file: a name by run or issue number, a recording cited by its session
    number (an expectation written here, such as h200x2/expected/plan.json), or a path outside
    the repository. The recorder's own labels (`"c256 run N"`) are data."""
    rel = path.relative_to(PROJECT_ROOT)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if m := NAME_REF.search(line):
            out.append(f"{rel}:{n}: a name by run or issue number {m.group(0)!r}")
        if m := RUN_ORDINAL.search(line):
            out.append(f"{rel}:{n}: a run by its ordinal {m.group(0)!r}")
        if m := OUTSIDE.search(line):
            out.append(f"{rel}:{n}: a path outside the repository {m.group(0)!r}")
    return out


def path_findings(paths: list[str]) -> list[str]:
    """Every file and folder named by run or issue number, each folder once."""
    named = {str(Path(*Path(p).parts[:i + 1]))
             for p in paths for i, part in enumerate(Path(p).parts)
             if PATH_BY_NUMBER.search(part)}
    return [f"{n}: named by run or issue number" for n in sorted(named)]


def _num(text: str) -> str:
    """The self-tests' examples with their numbers: written `run @3`, `issue @23` here so this
    file does not itself name a run or an issue."""
    return text.replace("@", "")


def _nums(texts: list[str]) -> list[str]:
    return [_num(t) for t in texts]


def test_the_checks_catch_what_they_are_for_and_spare_upstream_references():
    """Not vacuous: each pattern flags its kind and lets an upstream reference through."""
    probe = PROJECT_ROOT / "onboarding" / _num("probe_run@3.py")
    text = _num("# issue @23: x\n# see vllm-project/vllm issue @42738 and upstream issue @5\n"
            "def recording_run@2():\nH200_RUN@9 = 1\n# on the lent H200\n"
            "# kserve/kserve#5348, https://github.com/a/b/issues/7\n"
            "# tests/data/gpu/h200-slo-target/onboard-A.json; see test_h200_run@4_replay.py\n"
            "# from the tenth H200 run\n# replaces the fourth, fifth and eighth runs' rows\n"
            "# skipped: c256 run @2 of `frontend`\n"
            "# the first run installs it; from its second run on; c=256 repetition 2 of x\n"
            "KINDS = ISSUE@23_KINDS  # format issue@26-expectations/1, issue #@7\n"
            "# see ../shared/gpu/README.md; shared/ and ./shared are fine\n"
            "# run @3: pieces 2.1 min; pinned to run @3's versions (ready in 106 s, run @2)\n"
            "# the run-@3 prepare.json, run @1 twins.json; run @2 replicas, 3 runs: fine\n")
    got = findings(probe, text)
    assert [g.split(": ", 1)[1] for g in got] == _nums([
        "file named by run number", "internal issue number 'issue @23'",
        "named by run number 'recording_run@2'", "named by run number 'H200_RUN@9'",
        "GPU-lending word 'lent'", "a name by run or issue number 'test_h200_run@4_replay'",
        "a run by its ordinal 'tenth H200 run'",
        "a run by its ordinal 'fourth, fifth and eighth runs'",
        "a run by its ordinal 'run @2 of'",
        "internal issue number 'issue@26'", "internal issue number 'issue #@7'",
        "a name by run or issue number 'ISSUE@23_KINDS'",
        "a path outside the repository '../shared'",
        "a run by its ordinal 'run @3:'", "a run by its ordinal 'run-@3 prepare.json'"])
    # the CI script may name the checkouts beside this one
    assert findings(PROJECT_ROOT / ".ci" / "run", "cd ../shared/x\n") == []


def test_an_issue_number_wrapped_onto_the_next_line_is_caught():
    probe = PROJECT_ROOT / "onboarding" / "probe.py"
    text = _num("# re-sent them all before issue\n# @28's fix\n\"\"\"Named so before issue\n"
                "@27, when\"\"\"\n# see vllm-project/vllm issue\n# @42738; tracked in issues\n# @4, @5\n")
    got = [g.split(": ", 1)[1] for g in findings(probe, text)]
    assert got == ["internal issue number 'issue' wrapped onto the next line"] * 2 + \
        ["internal issue number 'issues' wrapped onto the next line"]


def test_the_name_and_recording_checks_catch_what_they_are_for():
    """Not vacuous: a folder or file named by run or issue number is flagged wherever it is,
    each folder once; a recorded file's names and paths are read, its run labels are not; the
    recordings' own READMEs are left to their history."""
    assert path_findings(_nums(["tests/data/gpu/h200-2026-12-02-run@5/README.md",
                          "tests/data/gpu/h200-2026-12-02-run@5/onboard-A.json",
                          "tests/assets/test_issue@23.py", "tests/data/gpu/h200/twins.json",
                          "docs/runbook.md"])) == _nums([
        "tests/assets/test_issue@23.py: named by run or issue number",
        "tests/data/gpu/h200-2026-12-02-run@5: named by run or issue number"])
    probe = PROJECT_ROOT / "tests" / "data" / "gpu" / "x" / "plan.json"
    text = _num('{"c256 run @2": {}, "basis": "(../shared/gpu/README.md)",\n'
            ' "format": "x", "n": "ISSUE@23_KINDS", "source": "pinned to run @3\'s versions"}\n')
    assert [g.split(": ", 1)[1] for g in recorded_findings(probe, text)] == _nums([
        "a path outside the repository '../shared'",
        "a name by run or issue number 'ISSUE@23_KINDS'", "a run by its ordinal \"run @3's\""])
    assert recording_readme("tests/data/gpu/h200-slo-target/README.md")
    assert recording_readme("tests/data/operations/cpu-engine/README.md")
    assert not recording_readme("tests/data/gpu/README.md")  # the index is product text too
    assert not recording_readme("tests/data/gpu/h200-slo-target/frontend.json")


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


def test_no_file_or_folder_is_named_by_run_or_issue_number():
    bad = path_findings(repository_paths())
    assert not bad, ("name these by what they hold or prove (a recording by its topic, as "
                     "tests/data/gpu/README.md does), and update every reference:\n"
                     + "\n".join(bad))


def test_recorded_files_name_nothing_by_number_and_no_path_outside_the_repository():
    bad = [f for path in recorded_files()
           for f in recorded_findings(path, path.read_text(errors="replace"))]
    assert not bad, (f"{len(bad)} places in recorded files; cite a recording by its folder "
                     "and an upstream source as a file at a tag:\n" + "\n".join(bad))
