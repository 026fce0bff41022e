"""Formatting is enforced, not hand-kept: ruff's formatter and snakefmt leave every file
unchanged, and ruff's lints pass (the same checks as `make lint`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "format", "--check", "."],
        ["ruff", "check", "."],
        ["snakefmt", "--check", "Snakefile", "workflow"],
    ],
    ids=["ruff-format", "ruff-check", "snakefmt"],
)
def test_the_tree_is_formatted_and_lint_clean(command):
    proc = subprocess.run(
        [str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_no_formatter_escapes_for_hand_alignment():
    hits = [
        f"{path.relative_to(ROOT)}:{i}"
        for folder in ("src", "tests", "benchmarks", "workflow")
        for path in (ROOT / folder).rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if "fmt: " + "skip" in line or "fmt: " + "off" in line
    ]
    assert hits == []
