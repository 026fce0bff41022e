"""What a user reads speaks of the project as it is: no development sessions or "stops", no
issue numbers, no team, and no path to the folder beside the developers' checkout
(``../shared``: a user's checkout has none; the tests read it as ``$CROSSLIP_SHARED``).

Checked: every text file under the trees a user reads (:data:`TREES`) and the top-level files
(:data:`FILES`), the generated pages and records included (``docs/performance.md``,
``docs/reproduction.md``, the benchmark records and the exported runs' ``run.yaml``: a
command or path recorded there is read as prose), but the tables, figures and study results
of the exported runs (:data:`DATA`), which hold numbers only.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from .helpers import ROOT

#: The folders a user reads, and the files beside them.
TREES = ("src", "docs", "config", "benchmarks", "profiles", "workflow")
FILES = (
    "README.md",
    "Snakefile",
    "Makefile",
    "config.yaml",
    "environment.yml",
    "pyproject.toml",
)
#: Records that are data, as patterns of paths relative to the repository (``fnmatch``:
#: ``*`` matches ``/`` too; see the module docstring).
DATA = (
    "docs/reproduction/*/tables/*",
    "docs/reproduction/*/figures/*",
    "docs/reproduction/studies/*.json",
)
#: Build and cache folders, never committed.
SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints"}
SKIPPED_SUFFIXES = (".egg-info",)

#: What must not be said, by why, each a case-insensitive pattern. Precise on purpose:
#: "stops early", "the walk stops once", pytest's "test session", "a GPU session", "shared
#: by every run" and ``$CROSSLIP_SHARED/paper`` are ordinary and pass (:data:`ORDINARY`).
FORBIDDEN = {
    "a development session": (
        r"\b(?:this|that|last|previous|earlier|next|later) session\b"
        r"|\bsession(?:'s)? notes?\b"
        r"|\b(?:development|dev|working) sessions?\b"
    ),
    "a development stop": r"\b(?:last|previous|earlier|next) stop\b|\bstop #?\d+\b",
    "an issue number or an open issue": (
        r"\bissues? (?:#|no\.? ?)?\d+\b|\bissue #|\bopen issues?\b|\bitem \d+ of the issue"
    ),
    "a team": r"\bteams?\b",
    "the folder beside the developers' checkout": (
        r"\.\./shared\b|(?<![\w$.-])shared/(?:data|paper|gpu-runs)\b"
    ),
}
PATTERNS = {why: re.compile(p, re.IGNORECASE) for why, p in FORBIDDEN.items()}

#: Phrases each pattern must flag, and ordinary ones none may flag.
FLAGGED = [
    "as noted in this session",
    "see the session notes",
    "a previous session measured it",
    "the last stop's CI run",
    "at stop 12 the suite took",
    "the target of issue 24",
    "(open issue, item 3)",
    "see issue #7",
    "a team decision",
    "the mirror ../shared/data/mnist",
    "--mirror /work/shared/data/mnist",
    "in shared/paper/ beside the checkout",
]
ORDINARY = [
    "training stops early once the loss is not finite",
    "the walk stops once its best norm has not improved",
    "wait for it to end or stop it, then run the same command again",
    "pytest's test session starts one job server",
    "A GPU session in parts of under 10 minutes each, so that a session can be split",
    "shared by every network of that seed",
    "the shared tiny run of the tests",
    "its tests read $CROSSLIP_SHARED/paper/ and $CROSSLIP_SHARED/gpu-runs/",
    "Please file an issue",
    "a known issue of the driver",
    "git clone --shared -n",
    "results/bench/downloads, else /path/to/mnist",
]


def is_data(rel: str) -> bool:
    """Whether the file ``rel`` (relative to the repository) is a data record."""
    return any(fnmatchcase(rel, pattern) for pattern in DATA)


def user_files() -> list[Path]:
    """Every file a user reads that is not a data record (see the module docstring)."""
    out = [ROOT / name for name in FILES if (ROOT / name).is_file()]
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if any(p in SKIPPED_DIRS or p.endswith(SKIPPED_SUFFIXES) for p in parts):
                continue
            if path.is_file() and not is_data(path.relative_to(ROOT).as_posix()):
                out.append(path)
    return out


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a figure)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line number, why, what matched) for each forbidden word or path in ``text``."""
    return [
        (n, why, m.group(0))
        for n, line in enumerate(text.splitlines(), 1)
        for why, pattern in PATTERNS.items()
        for m in pattern.finditer(line)
    ]


@pytest.mark.parametrize("phrase", FLAGGED)
def test_the_patterns_flag_what_they_are_for(phrase: str) -> None:
    assert findings(phrase), phrase


@pytest.mark.parametrize("phrase", ORDINARY)
def test_the_patterns_leave_ordinary_english_alone(phrase: str) -> None:
    assert not findings(phrase), findings(phrase)


def test_the_data_records_are_left_out_and_the_prose_is_read() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in user_files()}
    for prose in [
        "README.md",
        "docs/data.md",
        "docs/reproduction-record.md",
        "docs/reproduction/mnist-h100-200ep/notes.md",
        "src/crosslip/reproduction/targets.yaml",
        "src/crosslip/reproduction/record.md.j2",
        "config/reproduction/mnist_200_gpu.yaml",
        "benchmarks/bench_preset.py",
    ]:
        assert prose in files, prose
    for generated in [
        "docs/performance.md",
        "docs/reproduction.md",
        "docs/reproduction/mnist-h100-200ep/run.yaml",
        "docs/benchmarks/bench_train.json",
    ]:
        assert generated in files, generated
    for data in ["docs/reproduction/mnist-h100-200ep/tables/summary.csv"]:
        assert (ROOT / data).is_file() and data not in files, data


def test_what_a_user_reads_speaks_of_no_session_stop_issue_team_or_shared_folder() -> None:
    found = []
    for path in user_files():
        text = text_of(path)
        if text is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        lines = text.splitlines()
        for n, why, what in findings(text):
            found.append(f"{rel}:{n}: {why} ({what!r}): {lines[n - 1].strip()[:160]}")
    assert not found, "\n".join(["words a user should not read:", *found])
