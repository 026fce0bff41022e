"""Interruptions: every output is written under a temporary name, then renamed; SIGKILL,
SIGINT and SIGTERM during a run; the same command redoes exactly the unfinished jobs and the
results equal an uninterrupted run."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from crosslip import pipeline
from crosslip.data import Dataset, save_prepared
from crosslip.io.files import atomic_dir, atomic_path, read_json, write_json
from crosslip.jobserver import server as job_server
from crosslip.models.checkpoints import save_model
from crosslip.pipeline import (
    attack_stage,
    certify_stage,
    train_stage,
)
from crosslip.report.tables import write_tables

from .helpers import fields, random_net, snakemake_cmd
from .job_gate import JobGate
from .workflow_helpers import (
    SECONDS,
    SWEEP,
    THREADS,
    changed,
    files_under,
    finished_rules,
    offline_env,
    planned_jobs,
    snakemake,
    temporaries,
)

#: signals to a run reach its jobs' own processes: no job server (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("jobs_in_own_processes")

# --------------------------------------------------------------------------------------
# 3a. atomic outputs: temporary name, then rename
# --------------------------------------------------------------------------------------


def test_atomic_path_leaves_no_file_and_no_temporary_on_error(tmp_path):
    out = tmp_path / "sub" / "out.parquet"
    with pytest.raises(RuntimeError, match="killed"), atomic_path(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(".out.parquet.")
        tmp.write_bytes(b"half of a file")
        raise RuntimeError("killed")
    assert files_under(tmp_path / "sub") == []
    out.write_bytes(b"previous result")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError
    assert out.read_bytes() == b"previous result"  # the old output stays whole
    assert files_under(tmp_path / "sub") == ["out.parquet"]


def test_atomic_path_renames_only_a_finished_file(tmp_path):
    out = tmp_path / "out.txt"
    with atomic_path(out) as tmp:
        tmp.write_text("part 1 ")
        assert not out.exists()  # invisible under its final name while being written
        with open(tmp, "a") as fh:
            fh.write("part 2")
    assert out.read_text() == "part 1 part 2" and files_under(tmp_path) == ["out.txt"]


class Killed(BaseException):
    """Stands for SIGKILL arriving just before a rename (BaseException: nothing catches it)."""


def test_atomic_dir_replaces_a_folder_only_once_the_new_one_is_complete(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("first")
        assert not out.exists() and tmp.parent == tmp_path and tmp.name.startswith(".run.")
    assert files_under(tmp_path) == ["run", "run/a.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes it
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "b.txt").write_text("half")
        raise RuntimeError
    assert files_under(tmp_path) == ["run", "run/a.txt"]  # the old folder stays whole
    real = Path.rename

    def fails_at_the_second_rename(self, target):
        if self.name.endswith(".tmp"):
            raise OSError("no space left")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", fails_at_the_second_rename)
    with pytest.raises(OSError), atomic_dir(out) as tmp:
        (tmp / "b.txt").write_text("complete")
    assert files_under(tmp_path) == ["run", "run/a.txt"]  # the old folder put back
    monkeypatch.undo()
    with atomic_dir(out) as tmp:
        (tmp / "b.txt").write_text("second")
    assert files_under(tmp_path) == ["run", "run/b.txt"]


def test_atomic_dir_puts_back_a_folder_that_a_kill_left_aside(tmp_path):
    """A kill between the two renames (the old folder moved aside, the new one not yet in
    place) leaves ``.run.*.old``: the next write to ``run`` starts by putting it back, and a
    failing write then leaves it there; one left beside a folder in place is removed."""
    (tmp_path / ".run.x1.old").mkdir()
    (tmp_path / ".run.x1.old" / "a.txt").write_text("first")
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "run"):
        raise RuntimeError
    assert files_under(tmp_path) == ["run", "run/a.txt"]
    (tmp_path / "file").write_text("a file, not a folder")
    with atomic_dir(tmp_path / "file") as tmp:
        (tmp / "b.txt").write_text("b")
    assert files_under(tmp_path) == ["file", "file/b.txt", "run", "run/a.txt"]
    (tmp_path / ".run.x2.old").mkdir()  # a kill after the second rename: the new one is in
    with atomic_dir(tmp_path / "run") as tmp:
        (tmp / "c.txt").write_text("c")
    assert files_under(tmp_path) == ["file", "file/b.txt", "run", "run/c.txt"]


@pytest.fixture
def stage_inputs(tmp_path):
    """A toy dataset, a trained-looking net and its metrics, as a workflow would have them."""
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(40, 6)) / 255).astype(np.float32)
    y = rng.integers(0, 3, size=40).astype(np.int64)
    save_prepared(Dataset("toy", x[:30], y[:30], x[30:], y[30:], (6,), 3), tmp_path / "toy.npz")
    save_model(random_net(6, 3, 8, 0, 4.0).float(), tmp_path / "model.pt")
    metrics = {
        "status": "ok",
        "dataset": "toy",
        "model_id": "m",
        "test_error": 0.5,
        "config": {"regularizer": "none", "lr": 0.1, "lam": 0.0, "seed": 0},
    }
    write_json(metrics, tmp_path / "metrics.json")
    return tmp_path


def _stage_writers(d: Path):
    """name -> (function writing outputs, its outputs in the order written)."""
    train = {"regularizer": "none", "lr": 0.1, "lam": 0.0, "epochs": 1, "hidden": 4}
    inputs = (d / "toy.npz", d / "model.pt", d / "metrics.json")
    kw = {"n_points": 4, "rtol": 1e-2}
    summary = pd.DataFrame({"a": [1.0]})
    return {
        "prepare_data": (
            lambda: pipeline.prepare_data("mnist5k", d / "o" / "data.npz", str(d / "cache"), None),
            ["data.npz"],
        ),
        "train": (
            lambda: train_stage(
                d / "toy.npz", train, "m", d / "o" / "model.pt", d / "o" / "metrics.json"
            ),
            ["model.pt", "metrics.json"],
        ),
        "certify": (lambda: certify_stage(*inputs, d / "o" / "c.parquet", **kw), ["c.parquet"]),
        "attack": (
            lambda: attack_stage(
                *inputs,
                d / "o" / "a.parquet",
                max_steps=5,
                norms=("l2",),
                refine_steps=0,
                examples_out=d / "o" / "ex.npz",
                **kw,
            ),
            ["a.parquet", "ex.npz"],
        ),
        "tables": (
            lambda: write_tables(summary, d / "o" / "t.csv", d / "o" / "t.md", d / "o" / "t.tex"),
            ["t.csv", "t.md", "t.tex"],
        ),
    }


@pytest.mark.parametrize("stage", ["prepare_data", "train", "certify", "attack", "tables"])
def test_every_stage_output_appears_only_by_rename(stage_inputs, monkeypatch, stage):
    """Kill each stage just before each of its renames: the output being written is absent
    under its final name (a writer that wrote the final name directly would leave it there,
    half-written, and never reach a rename); the outputs renamed before are whole."""
    d = stage_inputs
    write, outputs = _stage_writers(d)[stage]
    real_replace = os.replace
    for n in range(len(outputs)):
        shutil.rmtree(d / "o", ignore_errors=True)
        calls = []

        def replace(src, dst, n=n, calls=calls):
            if len(calls) == n:
                raise Killed(dst)
            calls.append(dst)
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        with pytest.raises(Killed):
            write()
        monkeypatch.setattr(os, "replace", real_replace)
        assert [Path(c).name for c in calls] == outputs[:n]
        assert files_under(d / "o") == sorted(outputs[:n])  # no partial output, no temporary


# --------------------------------------------------------------------------------------
# 3b. interruptions: SIGKILL, then the same command
# --------------------------------------------------------------------------------------

#: One sweep for the load test (section 6) and, as the uninterrupted reference, for the
#: interruption test: 6 models (one diverges: weight decay 1 at lr 1000), 1000 certified
#: points each (the whole mnist5k test split), 5 attacked points: 32 jobs, each a few
#: tenths of a second of computation after a few seconds of Python start-up (the interrupted
#: jobs are held at the gate, tests/job_gate.py, so their length does not matter).
#: The interruption test's config: two models of the sweep, everything else the same.
INTERRUPT = changed(
    SWEEP,
    train__grid={
        "none": {"lr": [0.2], "lambda": [0.0]},
        "cross_lipschitz": {"lr": [0.2], "lambda": [1.0e-3]},
    },
)
MODELS = ["cross_lipschitz-lr0.2-lam0.001-seed0", "none-lr0.2-lam0-seed0"]
TARGETS = [f"results/instances/mnist5k/{m}.parquet" for m in MODELS]


def job_outputs(rule: str, wildcards: dict[str, str]) -> list[str]:
    """The outputs of a job of workflow/rules/*.smk (results folder: ``results``)."""
    ds, m = wildcards.get("dataset"), wildcards.get("model")
    return {
        "prepare_data": [f"results/data/{ds}.npz"],
        "train": [f"results/models/{ds}/{m}/model.pt", f"results/models/{ds}/{m}/metrics.json"],
        "certify": [f"results/certify/{ds}/{m}.parquet"],
        "attack": [f"results/attack/{ds}/{m}.parquet", f"results/examples/{ds}/{m}.npz"],
        "instances": [f"results/instances/{ds}/{m}.parquet"],
    }[rule]


def marked_incomplete(work: Path) -> set[str]:
    """Outputs that Snakemake marked incomplete: it marks a job's outputs when the job starts
    and unmarks them when it has finished (Snakemake 9 keeps one file per output in
    .snakemake/incomplete, named by the url-safe base64 of its path)."""
    folder = work / ".snakemake" / "incomplete"
    marks = [p.name for p in folder.iterdir() if p.is_file()] if folder.exists() else []
    return {base64.urlsafe_b64decode(m).decode() for m in marks if m != "migration_underway"}


def unfinished(work: Path, plan: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Jobs of ``plan`` that have not finished: an output is missing, or exists but its job
    was killed before Snakemake saw it finish (a job killed after its last rename)."""
    incomplete = marked_incomplete(work)
    return {
        job
        for job in plan
        if any(
            not (work / o).is_file() or o in incomplete for o in job_outputs(job[0], fields(job[1]))
        )
    }


#: The command of the interruption test: the default run with --rerun-incomplete, as the
#: profiles set it (redo a job whose outputs exist but that was killed before it finished;
#: safe because every output is renamed into place complete).
RUN = ["--cores", "2", "--rerun-incomplete", *TARGETS, *THREADS]


def dry_run(work: Path, *extra: str) -> subprocess.CompletedProcess:
    """What the run command would do now."""
    return snakemake(work, "-n", "--rerun-incomplete", *extra, *TARGETS)


def plan_now(work: Path) -> set[tuple[str, str]]:
    """The jobs the run command would run now (its dry run must succeed)."""
    proc = dry_run(work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return planned_jobs(proc.stdout)


def interruptible() -> None:
    """In the child before Snakemake starts: Ctrl-C's default action, as in a terminal. A
    test session started in the background by a non-interactive shell (``cmd &``) inherits
    SIGINT ignored, and Python then never installs its KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(work: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The run command, in its own process group (as a terminal or a batch system would);
    ``env``: the environment, before the offline proxies (``offline_env``)."""
    return subprocess.Popen(
        snakemake_cmd(work, *RUN, configfile=work / "config.yaml"),
        env=offline_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=interruptible,
    )


def signal_a_certification(
    work: Path, send: Callable[[int, int], None]
) -> tuple[subprocess.Popen, str, str]:
    """Start the run with its first certify job held as it opens its log
    (tests/job_gate.py), call ``send(job's pid, run's pid)`` (the run leads its process
    group), and wait for the run to end: the run, its output and the held job's model. A
    signal reaches the held job at once: it waits, it is not stopped."""
    with JobGate(at="log") as gate:
        proc = start(work, gate.env)
        job = gate.hold("certify", proc)
        send(job.pid, proc.pid)
        out = proc.communicate(timeout=600)[0]
    return proc, out, job.wildcards["model"]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to Snakemake and all its jobs at once (a killed terminal, node, allocation);
    every process of the run has ended afterwards."""
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    psutil.wait_procs(family, timeout=30)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)


def instances(work: Path) -> dict[str, pd.DataFrame]:
    folder = work / "results" / "instances" / "mnist5k"
    return {p.stem: pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))}


def mtimes(work: Path) -> dict[str, int]:
    return {
        str(p.relative_to(work)): p.stat().st_mtime_ns
        for p in (work / "results").rglob("*")
        if p.is_file() and p.parts[len(work.parts) + 1] not in ("logs", "benchmarks")
    }


@pytest.mark.slow
def test_killed_runs_resume_with_the_same_command_and_equal_an_uninterrupted_run(
    tmp_path, load_run, jobs_in_own_processes, monkeypatch
):
    """The reference is the uninterrupted sweep of section 6: the same jobs (same
    parameters, data, threads) for these two models. The interrupted runs' jobs run in
    processes of their own; the last run, after every interruption, runs under the
    session's job server where there is one (Snakemake and its jobs), as the uninterrupted
    run did."""
    reference = load_run[0]
    work = tmp_path / "work"
    plan = planned_jobs(snakemake(work, "-n", *TARGETS, config=INTERRUPT).stdout)
    assert len(plan) == 9  # prepare_data, 2 x (train, certify, attack, instances)
    interruptions = 0

    # (a) SIGKILL to Snakemake and its jobs while a model trains.
    with JobGate(at="log") as gate:
        proc = start(work, gate.env)
        job = gate.hold("train", proc)
        kill_group(proc)
    model = job.wildcards["model"]
    interruptions += 1
    assert not (work / f"results/models/mnist5k/{model}/model.pt").exists()  # killed mid-way
    assert not (work / f"results/models/mnist5k/{model}/metrics.json").exists()
    # (a kill during a write would leave a hidden temporary, never a file under its final
    # name; the kill lands as the job opens its log here, so there is none)
    leftovers = set(temporaries(work / "results"))
    # Snakemake's lock files outlive a SIGKILL; the run lock does not (crosslip.jobs.runlock), so
    # the same command needs no --unlock (the run itself: tests/test_resume.py).
    todo = plan_now(work)
    assert todo == unfinished(work, plan) and ("train", f"dataset=mnist5k, model={model}") in todo
    assert ("prepare_data", "dataset=mnist5k") not in todo  # finished before: kept

    # A kill between the two renames of a training job (model.pt written, metrics.json not)
    # leaves a file that Snakemake marked incomplete: without --rerun-incomplete (which
    # profiles/default sets for every command) it stops.
    half = work / f"results/models/mnist5k/{model}/model.pt"
    half.parent.mkdir(parents=True, exist_ok=True)
    half.write_bytes(b"written before the kill")
    stopped = snakemake(work, "-n", "--workflow-profile", "none", *TARGETS)
    assert stopped.returncode == 1
    assert "IncompleteFilesException" in stopped.stdout + stopped.stderr
    assert "--rerun-incomplete" in stopped.stdout + stopped.stderr
    assert plan_now(work) == todo  # with it, the job is redone
    half.unlink()

    # (b) The scheduler kills a certification job (SIGKILL to its process only).
    proc, out, model = signal_a_certification(work, lambda job, _: os.kill(job, signal.SIGKILL))
    interruptions += 1
    assert proc.returncode == 1 and "Error in rule certify" in out, out
    assert not (work / f"results/certify/mnist5k/{model}.parquet").exists()
    leftovers |= set(temporaries(work / "results"))
    todo = plan_now(work)  # no lock left: Snakemake itself was not killed
    assert todo == unfinished(work, plan) and ("certify", f"dataset=mnist5k, model={model}") in todo
    assert ("train", f"dataset=mnist5k, model={model}") not in todo

    # (c) Ctrl-C in the terminal (SIGINT to Snakemake and its jobs) during a certification:
    # Snakemake stops the jobs and releases its lock.
    proc, out, model = signal_a_certification(work, lambda _, run: os.killpg(run, signal.SIGINT))
    interruptions += 1
    assert proc.returncode == 1, out
    assert not (work / f"results/certify/mnist5k/{model}.parquet").exists()
    leftovers |= set(temporaries(work / "results"))
    todo = plan_now(work)
    assert todo == unfinished(work, plan) and ("certify", f"dataset=mnist5k, model={model}") in todo

    # (d) A batch system ends the allocation (scancel, time limit: SIGTERM to Snakemake and
    # its jobs, SIGKILL after a grace period) during a certification.
    proc, out, model = signal_a_certification(work, lambda _, run: os.killpg(run, signal.SIGTERM))
    interruptions += 1
    # The jobs die of the signal; Snakemake reports them failed, exits 1 and releases its
    # lock (unlike after a SIGKILL), so the same command can simply run again.
    assert proc.returncode == 1 and "died with <Signals.SIGTERM" in out, out
    assert "Error in rule certify" in out
    assert not (work / f"results/certify/mnist5k/{model}.parquet").exists()
    leftovers |= set(temporaries(work / "results"))
    todo = plan_now(work)
    assert todo == unfinished(work, plan) and ("certify", f"dataset=mnist5k, model={model}") in todo
    kept = {k: v for k, v in mtimes(work).items() if k not in marked_incomplete(work)}

    # The same command again: exactly the unfinished jobs run, nothing finished is redone.
    server_socket = jobs_in_own_processes  # the socket the fixture took out, if any
    if server_socket:  # no signal now: the process model is not the point
        monkeypatch.setenv(job_server.ENV, server_socket)
    proc = snakemake(work, *RUN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert finished_rules(proc.stdout + proc.stderr) == Counter(r for r, _ in todo)
    assert {k: v for k, v in mtimes(work).items() if k in kept} == kept
    done = dry_run(work)
    assert "Nothing to be done" in done.stdout + done.stderr

    # The results equal the uninterrupted run's (wall times aside), row for row.
    got, want = instances(work), instances(reference)
    assert sorted(got) == MODELS and set(MODELS) <= set(want)
    lost = 0
    for m in MODELS:
        lost += len(want[m]) - len(got[m])
        pd.testing.assert_frame_equal(
            got[m].drop(columns=SECONDS), want[m].drop(columns=SECONDS), check_exact=True
        )
        a = read_json(work / f"results/models/mnist5k/{m}/metrics.json")
        b = read_json(reference / f"results/models/mnist5k/{m}/metrics.json")
        a.pop("seconds"), b.pop("seconds")
        assert a == b
    assert lost == 0 and interruptions == 4
    assert set(temporaries(work / "results")) <= leftovers  # no run leaves a temporary
