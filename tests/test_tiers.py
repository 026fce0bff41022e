"""The test tiers cannot drift: a test that runs Snakemake is marked ``slow`` (by
conftest.py when it uses a shared workflow fixture; otherwise it fails), so that
``make test-fast`` (``-m "not slow"``) never runs a workflow. The tests of one shared run
form one pytest-xdist group, so that ``make test``'s workers make each run once."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from . import conftest
from .helpers import dry_run_jobs, run_snakemake, runs_in_process, snakemake_cmd, without_stamps
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


def process_state() -> tuple:
    """What a Snakemake run may change in its process (tests/helpers.py:_as_a_command)."""
    return (
        os.getcwd(),
        dict(os.environ),
        list(sys.path),
        list(sys.argv),
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
        list(warnings.filters),
        warnings.showwarning,
        [
            (lg.level, list(lg.handlers))
            for lg in map(logging.getLogger, ("", "snakemake", "snakemake.logging"))
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "args", "says"),
    [
        pytest.param(BASE, [], "This was a dry-run", id="dry run"),
        pytest.param(
            changed(BASE, train__epochs=0),
            [],
            "config key train.epochs: out of range (0)",
            id="rejected config",
        ),
        # an error before Snakemake has set up its logging: Python's last resort prints it
        pytest.param(
            BASE,
            ["--set-resources", "train:notvalid"],
            "Invalid resource definition",
            id="early error",
        ),
    ],
)
def test_a_command_that_runs_no_job_runs_in_this_process_as_in_its_own(
    tmp_path, monkeypatch, case, args, says
):
    """run_snakemake runs a dry run in the test process (snakemake.cli.main): the same exit
    status, jobs and messages as the snakemake command in a process of its own, and the
    test process as it was before."""
    import snakemake.cli

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(case))
    cmd = snakemake_cmd(tmp_path, "-n", *args, configfile=tmp_path / "c.yaml")
    assert runs_in_process(cmd) and not runs_in_process([c for c in cmd if c != "-n"])
    env = {**os.environ, "CROSSLIP_TEST_MARK": "1"}
    calls = []
    main = snakemake.cli.main
    monkeypatch.setattr(snakemake.cli, "main", lambda argv: calls.append(argv) or main(argv))
    state = process_state()
    here = run_snakemake(cmd, env=env, cwd=tmp_path.parent)
    assert calls == [cmd[1:]]  # in this process
    assert process_state() == state
    alone = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path.parent
    )
    assert here.returncode == alone.returncode == (0 if says == "This was a dry-run" else 1)
    assert without_stamps(here.stdout) == without_stamps(alone.stdout)
    assert without_stamps(here.stderr) == without_stamps(alone.stderr)
    assert says in here.stdout + here.stderr
    if here.returncode == 0:
        assert dry_run_jobs(here.stdout)


TOY = """
rule all:
    input: "out.txt"

rule make:
    output: "out.txt"
    script: "make.py"
"""


@pytest.mark.slow
def test_a_script_edited_between_two_commands_in_this_process_is_seen(tmp_path):
    """Snakemake reruns a job whose script is newer than its output; it caches the scripts'
    modification times for the life of a process, which is a whole pytest worker here:
    run_snakemake empties that cache after each command."""
    (tmp_path / "Snakefile").write_text(TOY)
    script = tmp_path / "make.py"
    script.write_text("open(snakemake.output[0], 'w').write('made')\n")
    cmd = snakemake_cmd(tmp_path, "--cores", "1", snakefile=tmp_path / "Snakefile")
    assert run_snakemake(cmd).returncode == 0
    planned = run_snakemake([*cmd, "-n"])
    assert planned.returncode == 0 and "Nothing to be done" in planned.stdout + planned.stderr
    later = (tmp_path / "out.txt").stat().st_mtime + 10
    os.utime(script, (later, later))
    planned = run_snakemake([*cmd, "-n"])
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert [job["rule"] for job in dry_run_jobs(planned.stdout)] == ["make", "all"]
