"""A killed run resumes with the same command; two runs for one results folder never overlap.

1. the run lock itself (``crosslip.jobs.runlock``), with real processes and no Snakemake: it dies
   with its holder (SIGKILL), refuses a second holder of the same results folder naming the
   first, lets one of many simultaneous takers win, removes Snakemake's lock files only
   when their writer is proven dead, and is taken for exactly the commands that run jobs
   (read from Snakemake's own command-line parser);
2. end to end, on a tiny config: SIGKILL to Snakemake and its jobs (as when a terminal or a
   login node is lost) under the plain command, ``profiles/local-gpu`` and ``make run``; the
   same command, with no ``--unlock`` and, for the plain one, no ``--rerun-incomplete``,
   runs exactly the unfinished jobs and ends with the results of an uninterrupted run;
   two runs started at once: one is refused with a message naming the other, which finishes
   with the same results; dry runs, ``--summary``, ``--lint``, ``--unlock`` and a job process
   as SLURM starts it (``--mode remote``) neither take nor break the lock of a live run.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml
from snakemake.cli import parse_args

from crosslip.jobs import runlock
from crosslip.jobs.runlock import RunLockBusy, acquire, probe_stale, snakemake_lock_files

from .helpers import ROOT, require_slow, run_snakemake, snakemake_cmd
from .job_gate import JobGate
from .test_interruptions import kill_group, marked_incomplete, mtimes, unfinished
from .workflow_helpers import (
    ONE_MODEL,
    ONE_MODEL_ID,
    SECONDS,
    THREADS,
    finished_rules,
    offline_env,
    planned_jobs,
)

# --------------------------------------------------------------------------------------
# 1. the run lock, with real processes
# --------------------------------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from crosslip.jobs.runlock import acquire
    work, results, locks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lock = acquire(work, results, "holder " + results)
    folder = Path(work, ".snakemake", "locks")
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(locks):  # as Snakemake writes them once its DAG is built
        (folder / f"{i}.input.lock").write_text("in\\n")
        (folder / f"{i}.output.lock").write_text(f"{results}/out\\n")
    print("held", flush=True)
    if sys.argv[4] == "release":
        lock.release()
        print("released", flush=True)
    time.sleep(600)
    """
)


def hold(work: Path, results: str = "results", locks: int = 0, release: bool = False):
    """A process that takes the run lock of ``results``, then writes ``locks`` pairs of
    Snakemake lock files (as a run does after building its DAG), and sleeps."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(work), results, str(locks), "release" * release],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "held\n"
    if release:
        assert proc.stdout.readline() == "released\n"
    return proc


def sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_the_lock_dies_with_its_holder_and_its_snakemake_locks_are_removed(tmp_path):
    holder = hold(tmp_path, locks=1)
    with pytest.raises(RunLockBusy):
        acquire(tmp_path, "results", "second")
    sigkill(holder)
    lock = acquire(tmp_path, "results", "second")
    assert sorted(p.name for p in lock.removed) == ["0.input.lock", "0.output.lock"]
    assert snakemake_lock_files(tmp_path) == [] and lock.kept == []
    assert [h.pid for h in lock.killed] == [holder.pid]
    lock.release()


def test_a_killed_runs_record_vouches_for_no_later_lock_file(tmp_path):
    """Any run here removes the locks of a killed run, once: later lock files are kept."""
    holder = hold(tmp_path, results="results/a", locks=1)
    sigkill(holder)
    lock = acquire(tmp_path, "results/b", "resume elsewhere")
    assert len(lock.removed) == 2 and [h.results for h in lock.killed] == ["results/a"]
    lock.release()
    (tmp_path / ".snakemake" / "locks" / "0.output.lock").write_text("written later\n")
    lock = acquire(tmp_path, "results/a", "resume a")
    assert lock.removed == [] and lock.killed == [] and len(lock.kept) == 1
    lock.release()


def test_a_second_run_of_the_same_results_folder_is_refused_naming_the_first(tmp_path):
    holder = hold(tmp_path, results="results/mnist")
    try:
        with pytest.raises(RunLockBusy) as refused:
            acquire(tmp_path, "results/mnist", "second")
        msg = str(refused.value)
        assert f"pid {holder.pid} " in msg and "holder results/mnist" in msg
        assert "'results/mnist'" in msg and "run the same command again" in msg
        assert "\n" not in msg
        # The same folder spelled differently is the same folder; another folder is free.
        with pytest.raises(RunLockBusy):
            acquire(tmp_path, str(tmp_path / "results" / "mnist"), "second")
        acquire(tmp_path, "results/cifar10", "other preset").release()
    finally:
        sigkill(holder)


def test_snakemake_locks_of_a_live_run_are_never_removed(tmp_path):
    """A live run of another results folder holds the workdir lock (shared): lock files are
    kept, even those of a killed run, since no one can tell them apart."""
    killed = hold(tmp_path, results="results/a", locks=1)
    sigkill(killed)
    live = hold(tmp_path, results="results/b", locks=2)
    try:
        before = {p: p.read_text() for p in snakemake_lock_files(tmp_path)}
        assert len(before) == 4
        assert probe_stale(tmp_path) == ([], [])
        lock = acquire(tmp_path, "results/a", "resume a")
        assert lock.removed == [] and lock.kept == [] and lock.killed == []
        assert sorted(lock.unchecked) == sorted(before)
        assert {p: p.read_text() for p in snakemake_lock_files(tmp_path)} == before
        lock.release()
    finally:
        sigkill(live)
    # Both dead now: all four are stale (written after the start of a killed run).
    stale, killed_runs = probe_stale(tmp_path)
    assert len(stale) == 4 and {h.results for h in killed_runs} == {"results/b"}
    assert len(snakemake_lock_files(tmp_path)) == 4  # the probe removes nothing
    lock = acquire(tmp_path, "results/a", "resume a")
    assert len(lock.removed) == 4
    lock.release()


def test_lock_files_that_no_killed_run_left_are_kept(tmp_path):
    """Lock files from before any run of this workflow here (another Snakemake process, or a
    version without this lock), or newer than the end of every run, are not ours to remove."""
    folder = tmp_path / ".snakemake" / "locks"
    folder.mkdir(parents=True)
    (folder / "0.output.lock").write_text("foreign\n")
    lock = acquire(tmp_path, "results", "first")
    assert lock.removed == [] and [p.name for p in lock.kept] == ["0.output.lock"]
    lock.release()
    ended = hold(tmp_path, release=True)  # a run that ended, then its process lingers
    sigkill(ended)
    (folder / "1.output.lock").write_text("foreign, later\n")
    lock = acquire(tmp_path, "results", "second")
    assert lock.removed == [] and len(lock.kept) == 2
    lock.release()
    # Older than the start of the killed run: kept; newer: removed.
    killed = hold(tmp_path, locks=0)
    sigkill(killed)
    os.utime(folder / "0.output.lock", (1, 1))
    os.utime(folder / "1.output.lock", (1, 1))
    (folder / "2.output.lock").write_text("after the killed run started\n")
    lock = acquire(tmp_path, "results", "third")
    assert [p.name for p in lock.removed] == ["2.output.lock"]
    assert sorted(p.name for p in lock.kept) == ["0.output.lock", "1.output.lock"]
    lock.release()


RACER = textwrap.dedent(
    """
    import os, sys, time
    from crosslip.jobs.runlock import RunLockBusy, acquire
    print("ready", flush=True)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.001)
    try:
        lock = acquire(sys.argv[1], "results", "racer")
    except RunLockBusy:
        print("refused", flush=True)
    else:
        print("won", flush=True)
        time.sleep(600)
    """
)


def test_of_many_runs_started_at_once_exactly_one_takes_the_lock(tmp_path):
    go = tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path), str(go)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    assert all(p.stdout.readline() == "ready\n" for p in racers)
    go.touch()
    said = Counter(p.stdout.readline().strip() for p in racers)
    for p in racers:
        sigkill(p)
    assert said == Counter({"won": 1, "refused": 5})


@pytest.mark.parametrize(
    ("argv", "takes"),
    [
        (["--cores", "2"], True),
        (["--cores", "all", "--rerun-incomplete", "results/x"], True),
        (["--touch", "--cores", "1"], True),
        (["--delete-all-output", "--cores", "1"], True),
        (["--report", "r.html", "--report-after-run", "--cores", "1"], True),
        (["-n"], False),
        (["--dry-run", "--cores", "2"], False),
        (["--delete-all-output", "-n"], False),
        (["--unlock"], False),
        (["--nolock", "--cores", "1"], False),
        (["--lint"], False),
        (["--report", "r.html"], False),
        (["--summary"], False),
        (["--list-rules"], False),
        (["--dag"], False),
    ],
)
def test_the_lock_is_taken_by_the_commands_that_write_only(argv, takes):
    """Runs, --touch, --delete-all-output, ... take it; read with Snakemake's own parser, so
    that a renamed option shows up here."""
    _, args = parse_args(["-s", str(ROOT / "Snakefile"), "--workflow-profile", "none", *argv])
    assert runlock.takes_lock(args) is takes


# --------------------------------------------------------------------------------------
# 2. end to end: SIGKILL, then the same command; two runs at once
# --------------------------------------------------------------------------------------

#: The tiny config of tests/test_rerun.py, one model: 5 jobs of a few seconds each.
TINY = ONE_MODEL
MODEL = ONE_MODEL_ID
TARGETS = [f"results/instances/mnist5k/{MODEL}.parquet"]
VENV = Path(sys.executable).parent.parent


def command(work: Path, variant: str) -> list[str]:
    """The run command of each way to start a run (``--set-threads`` last: it takes every
    argument after it; one thread per job keeps the floating-point results reproducible)."""
    config = work / "config.yaml"
    if variant == "make run":  # the Makefile's run target; -o: never reinstall the package
        require_slow("runs make run")
        args = ["--configfile", str(config), "--directory", str(work), *TARGETS, *THREADS]
        stamp = VENV / ".crosslip-installed"
        return [
            "make",
            "-s",
            "-C",
            str(ROOT),
            "-o",
            str(stamp),
            "run",
            f"VENV={VENV}",
            "CORES=2",
            "ARGS=" + shlex.join(args),
        ]
    profile = ["--profile", str(ROOT / "profiles" / "local-gpu")] if variant == "local-gpu" else []
    cores = [] if profile else ["--cores", "2"]
    # Snakemake in a process of its own, as users start it; its jobs fork from the session's
    # job server (tests/conftest.py) as under make run: a SIGKILL to the group ends the
    # job's process, and the server the fork (test_forkserver.py); jobs in processes of
    # their own are killed the same way in test_interruptions.py
    return snakemake_cmd(
        work, *profile, *cores, *TARGETS, *THREADS, configfile=config, served=False
    )


def setup(work: Path) -> None:
    work.mkdir(parents=True)
    (work / "config.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return run_snakemake(cmd, timeout=600, env=offline_env())


def start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """In its own process group, as a terminal or a batch system starts it; ``env``: the
    environment, before the offline proxies (``offline_env``)."""
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=offline_env(env),
        start_new_session=True,
    )


def dry_run(work: Path) -> subprocess.CompletedProcess:
    proc = run(snakemake_cmd(work, "-n", *TARGETS, configfile=work / "config.yaml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def instances(work: Path) -> pd.DataFrame:
    return pd.read_parquet(work / TARGETS[0]).drop(columns=SECONDS)


@pytest.fixture(scope="module")
def reference(one_model_run) -> pd.DataFrame:
    """The uninterrupted run's per-instance table: the shared run of TINY (conftest), made
    with the plain command's options (--cores 2, one thread per job), which left no lock."""
    assert not snakemake_lock_files(one_model_run)
    return instances(one_model_run)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["plain", "local-gpu", "make run"])
def test_sigkill_then_the_same_command_resumes_and_equals_an_uninterrupted_run(
    tmp_path, reference, variant
):
    work = tmp_path / "work"
    setup(work)
    cmd = command(work, variant)
    plan = planned_jobs(dry_run(work).stdout)
    assert {rule for rule, _ in plan} == {"prepare_data", "train", "certify", "attack", "instances"}

    # the train job held at its start (tests/job_gate.py; prepare_data let go first), however
    # fast or loaded the machine: Snakemake has marked its outputs incomplete by then
    with JobGate() as gate:
        proc = start(cmd, gate.env)
        job = gate.hold("train", proc)
        assert job.wildcards["model"] == MODEL
        kill_group(proc)
    # What used to stop the same command until --unlock: Snakemake's lock files are left.
    assert snakemake_lock_files(work)
    # A kill between the two renames of the training job (model.pt written, metrics.json
    # not): an output that exists but is marked incomplete.
    half = work / f"results/models/mnist5k/{MODEL}/model.pt"
    half.parent.mkdir(parents=True, exist_ok=True)
    half.write_bytes(b"written before the kill")
    assert f"results/models/mnist5k/{MODEL}/model.pt" in marked_incomplete(work)

    # A dry run says the lock files are stale, and changes nothing.
    locks = snakemake_lock_files(work)
    planned = dry_run(work)
    said = planned.stdout + planned.stderr  # a dry run logs to stdout
    assert "left by a killed run" in said and "no --unlock needed" in said
    assert snakemake_lock_files(work) == locks
    todo = unfinished(work, plan)
    assert planned_jobs(planned.stdout) == todo
    assert ("train", f"dataset=mnist5k, model={MODEL}") in todo
    assert ("prepare_data", "dataset=mnist5k") not in todo  # finished before the kill: kept
    kept = {k: v for k, v in mtimes(work).items() if k not in marked_incomplete(work)}

    # The same command: no --unlock, exactly the unfinished jobs, nothing finished redone.
    again = run(cmd)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert "LockException" not in out and "removed 2 stale Snakemake lock file(s)" in out
    assert finished_rules(out) == Counter(rule for rule, _ in todo)
    assert {k: v for k, v in mtimes(work).items() if k in kept} == kept
    assert not snakemake_lock_files(work) and not marked_incomplete(work)
    assert "Nothing to be done" in dry_run(work).stdout
    pd.testing.assert_frame_equal(instances(work), reference, check_exact=True)


@pytest.mark.slow
def test_two_runs_at_once_one_is_refused_and_neither_corrupts_the_other(tmp_path, reference):
    """Both runs start with a :class:`~tests.job_gate.JobGate`: the winner's first job
    (``prepare_data``) waits at its start until the test lets it go, so the winner is still
    running, with its locks, when the third run starts, however fast or loaded the machine
    (a run takes about 2.5 s here)."""
    work = tmp_path / "work"
    setup(work)
    cmd = command(work, "plain")
    with JobGate() as gate:
        first, second = start(cmd, gate.env), start(cmd, gate.env)
        job = gate.hold("prepare_data", first, second)
        deadline = time.monotonic() + 300
        while first.poll() is None and second.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        refused, winner = (first, second) if first.poll() is not None else (second, first)
        assert winner.pid in [p.pid for p in psutil.Process(job.pid).parents()]
        out = refused.communicate()[0]
        assert refused.returncode == 1, out[-3000:]
        assert "another run is writing to the results folder 'results'" in out
        assert f"Snakemake pid {winner.pid} " in out and "wait for it to end or stop it" in out
        assert "Finished jobid" not in out and "LockException" not in out

        # A third one, while the winner computes (its job held), is refused as well and
        # touches nothing.
        locks = {p: p.read_text() for p in snakemake_lock_files(work)}
        assert locks  # the winner's own Snakemake locks
        third = run(cmd)
        assert {p: p.read_text() for p in snakemake_lock_files(work)} == locks
        assert third.returncode == 1 and f"Snakemake pid {winner.pid} " in third.stderr
        assert "Finished jobid" not in third.stdout + third.stderr
        assert winner.poll() is None

    out = winner.communicate(timeout=600)[0]
    assert winner.returncode == 0, out[-3000:]
    assert finished_rules(out) == Counter(
        ["prepare_data", "train", "certify", "attack", "instances"]
    )
    pd.testing.assert_frame_equal(instances(work), reference, check_exact=True)
    assert not snakemake_lock_files(work)


@pytest.mark.slow
def test_read_only_commands_and_job_processes_neither_take_nor_break_a_live_lock(
    tmp_path, jobs_in_own_processes
):
    """A live run (a process holding the lock, with Snakemake lock files written). The job
    process of a SLURM job runs its job itself (no job server, as in a batch job)."""
    work = tmp_path / "work"
    setup(work)
    live = hold(work, locks=1)
    try:
        locks = {p: p.read_text() for p in snakemake_lock_files(work)}

        def sm(*args: str) -> subprocess.CompletedProcess:
            return run(snakemake_cmd(work, *args, configfile=work / "config.yaml"))

        for args in (["-n", *TARGETS], ["--summary"], ["--lint"]):
            proc = sm(*args)
            assert proc.returncode == 0, (args, proc.stdout[-2000:] + proc.stderr[-2000:])
            assert "crosslip:" not in proc.stdout + proc.stderr, args
            assert {p: p.read_text() for p in snakemake_lock_files(work)} == locks, args
        # A job process as a SLURM job starts it (the flags of Snakemake's spawn_jobs): it
        # parses the Snakefile again, in remote mode, while its run holds the lock.
        job = sm(
            "--mode",
            "remote",
            "--target-jobs",
            "prepare_data:dataset=mnist5k",
            "--force",
            "--nolock",
            "--no-hooks",
            "--ignore-incomplete",
            "--cores",
            "1",
        )
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
        assert (work / "results/data/mnist5k.npz").is_file()
        assert {p: p.read_text() for p in snakemake_lock_files(work)} == locks
        # A run is refused; --unlock removes Snakemake's lock files (as asked), not ours.
        refused = sm("--cores", "1", *TARGETS)
        assert refused.returncode == 1 and f"Snakemake pid {live.pid} " in refused.stderr
        assert sm("--unlock").returncode == 0
        assert not snakemake_lock_files(work)
        refused = sm("--cores", "1", *TARGETS)
        assert refused.returncode == 1 and f"Snakemake pid {live.pid} " in refused.stderr
    finally:
        sigkill(live)
