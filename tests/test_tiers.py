"""The test tiers cannot drift: a test that runs Snakemake is marked ``slow`` (by
conftest.py when it uses a shared workflow fixture; otherwise it fails), so that
``make test-fast`` (``-m "not slow"``) never runs a workflow. The tests of one shared run
form one pytest-xdist group, so that ``make test``'s workers make each run once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from . import conftest
from .helpers import dry_run_jobs, run_snakemake, runs_in_process, snakemake_cmd
from .workflow_helpers import BASE, changed


class FakeItem:
    """What the collection hook reads and writes of a test item."""

    def __init__(self, fixturenames: list[str], slow: bool = False):
        self.fixturenames = fixturenames
        self.markers: list[tuple] = [("slow",)] if slow else []

    def get_closest_marker(self, name: str):
        return next((m for m in self.markers if m[0] == name), None)

    def add_marker(self, mark) -> None:
        self.markers.append((mark.name, *mark.args))


def test_a_test_that_uses_a_shared_run_is_marked_slow_and_grouped_by_the_run():
    names = sorted(conftest.WORKFLOW_FIXTURES)
    items = [FakeItem(["tmp_path", name]) for name in names]
    plain, marked = FakeItem(["tmp_path", "server"]), FakeItem(["load_run"], slow=True)
    conftest.pytest_collection_modifyitems(None, [*items, plain, marked])
    assert [item.markers for item in items] == [[("slow",), ("xdist_group", n)] for n in names]
    assert plain.markers == []
    assert marked.markers == [("slow",), ("xdist_group", "load_run")]


def test_an_unmarked_test_that_starts_snakemake_fails(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="not marked slow"):
        snakemake_cmd(tmp_path, "-n")


@pytest.mark.slow
def test_a_slow_test_may_start_snakemake(tmp_path):
    cmd = snakemake_cmd(tmp_path, "-n", configfile=tmp_path / "c.yaml")
    assert cmd[1:3] == ["-s", str(Path(conftest.__file__).parents[1] / "Snakefile")]
    assert cmd[-3:] == ["--configfile", str(tmp_path / "c.yaml"), "-n"]


def test_in_this_session_the_tests_of_one_shared_run_share_one_xdist_group(request):
    """Under ``--dist loadgroup`` the group must reach pytest-xdist's scheduler (the node id
    ends with ``@<group>``). pytest 9.2 stores node ids where pytest-xdist 3.8 cannot add the
    suffix: the groups are then lost without a word, and every worker makes every shared run
    again (pyproject.toml keeps pytest below 9.2 for that reason)."""
    grouped = [
        (item, name)
        for item in request.session.items
        for name in sorted(conftest.WORKFLOW_FIXTURES & set(item.fixturenames))
    ]
    if not grouped:
        pytest.skip("no test of this session uses a shared run")
    for item, name in grouped:
        assert item.get_closest_marker("xdist_group").args == (name,), item.nodeid
    if request.config.getoption("loadgroup", False):  # set in the workers of --dist loadgroup
        assert all(item.nodeid.endswith(f"@{name}") for item, name in grouped)


def without_stamps(text: str) -> list[tuple[str, ...]]:
    """The lines of a Snakemake output but those that differ between two starts (the time
    stamps, and the date and workflow id of its header), sorted, each as its sorted items
    (split after commas, semicolons and colons): Snakemake lists some sets (the jobs, a
    job's reasons) in the order of Python's string hashes, which differ between processes."""
    return sorted(
        tuple(sorted(re.split(r"[,;:] ", line)))
        for line in text.splitlines()
        if not re.fullmatch(r"\[\w{3} \w{3} +\d+ [\d:]+ \d{4}\]", line)
        and not line.lstrip().startswith(("Date:", "Workflow ID:"))
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(BASE, id="dry run"),
        pytest.param(changed(BASE, train__epochs=0), id="rejected config"),
    ],
)
def test_a_command_that_runs_no_job_runs_in_this_process_as_in_its_own(tmp_path, case):
    """run_snakemake runs a dry run in the test process (snakemake.cli.main): the same exit
    status, jobs and messages as the snakemake command in a process of its own, and the
    test process as it was before (working directory, environment, sys.path, signals)."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(case))
    cmd = snakemake_cmd(tmp_path, "-n", configfile=tmp_path / "c.yaml")
    assert runs_in_process(cmd) and not runs_in_process(cmd[:-1])
    env = {**os.environ, "CROSSLIP_TEST_MARK": "1"}
    import snakemake.cli  # noqa: F401  (its import appends to sys.path once, not a run)

    state = (os.getcwd(), dict(os.environ), list(sys.path), signal.getsignal(signal.SIGTERM))
    here = run_snakemake(cmd, env=env)
    assert (os.getcwd(), dict(os.environ), list(sys.path), signal.getsignal(signal.SIGTERM)) == (
        state
    )
    alone = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert here.returncode == alone.returncode == (0 if case["train"]["epochs"] else 1)
    assert without_stamps(here.stdout) == without_stamps(alone.stdout)
    assert without_stamps(here.stderr) == without_stamps(alone.stderr)
    if here.returncode == 0:
        assert dry_run_jobs(here.stdout) and "This was a dry-run" in here.stdout
    else:
        assert "config key train.epochs: out of range (0)" in here.stdout + here.stderr
