"""What crosslip uses of Snakemake beyond its documented interface, each against the
installed Snakemake (crosslip.jobs.snakemake_internals): a release that moves one fails
here, with a message that names what moved. The workflow itself replaces no Snakemake
method and reads no stack frame."""

from __future__ import annotations

import re
import sys

import pytest

from crosslip.jobs import runlock
from crosslip.jobs.snakemake_internals import command_line, is_main_process, is_snakemake_command

from .helpers import ROOT

SNAKEMAKE = "/some/venv/bin/snakemake"


def parsed(*args: str):
    args_ = command_line([SNAKEMAKE, *args])
    assert args_ is not None, (
        "snakemake.cli.parse_args no longer parses a plain command line: the run lock "
        "(crosslip.jobs.runlock) cannot tell a run from a dry run"
    )
    return args_


@pytest.mark.parametrize(
    "args,runs",
    [
        (("--cores", "2"), True),
        (("-n",), False),
        (("--dry-run", "--cores", "1"), False),
        (("--unlock",), False),
        (("--lint",), False),
        (("--summary",), False),
        (("--report", "r.html"), False),
        (("--list-rules",), False),
        (("--nolock", "--cores", "1"), False),
    ],
)
def test_the_command_line_says_whether_a_command_runs_jobs(args, runs):
    got = runlock.takes_lock(parsed(*args))
    assert got == runs, (
        f"snakemake.cli.parse_args({list(args)}) no longer sets what "
        f"crosslip.jobs.runlock.READ_ONLY_ACTIONS reads ({runlock.READ_ONLY_ACTIONS})"
    )


def test_the_command_line_says_whether_this_is_a_runs_main_process():
    assert is_main_process(parsed("--cores", "1"))
    for mode in ("subprocess", "remote"):
        assert not is_main_process(parsed("--mode", mode, "--cores", "1")), (
            "snakemake.cli.parse_args no longer gives --mode as an ExecMode: the job "
            "processes of a run would take the run lock"
        )


def test_only_snakemakes_own_command_line_is_read():
    assert is_snakemake_command([SNAKEMAKE, "-n"])
    assert is_snakemake_command(["/lib/python3/site-packages/snakemake/__main__.py"])
    assert not is_snakemake_command([sys.executable, "-m", "pytest"])
    assert not is_snakemake_command([])
    assert command_line(["pytest", "-n"]) is None  # the Python API, a test: no lock
    assert command_line([SNAKEMAKE, "--no-such-option"]) is None  # Snakemake reports it


def test_no_stack_frame_is_read_and_no_snakemake_attribute_is_assigned():
    """The words of the done-when: the package reads no frame, assigns no attribute of a
    Snakemake class, and the Snakefile and rules reach no workflow internals."""
    src = ROOT / "src" / "crosslip"
    text = {p: p.read_text() for p in src.rglob("*.py")}
    assert not [p for p, t in text.items() if "sys._getframe" in t]
    assigned = re.compile(r"^\s*(PythonScript|Workflow|Rule|Job|DAG)\.\w+\s*=", re.M)
    assert not [p for p, t in text.items() if assigned.search(t)]
    rules = [ROOT / "Snakefile", *(ROOT / "workflow" / "rules").glob("*.smk")]
    internal = re.compile(
        r"workflow\.(overwrite_configfiles|scheduler|modifier|resource_settings|exec_mode)"
    )
    assert not [p for p in rules if internal.search(p.read_text())]
