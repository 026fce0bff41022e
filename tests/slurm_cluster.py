"""The SLURM test's cluster (tests/cluster/slurm.sh) and its first run through
``--profile profiles/slurm``, made by a background process that the test session starts as
soon as it has collected the SLURM test (``tests/conftest.py``).

The first run spends most of its 100 s waiting: the executor plugin checks the status of
its jobs at an interval that grows by 10 s after each check that sees no job finish. Run
inside the test, it held a pytest worker, and so a core, idle for that time. In the
background it overlaps the other tests; the test waits for its record (:func:`wait`) and
checks it as it checked the run it made itself, then makes the second and the failing run.

The record (``first_run.json`` in the session's folder, written once the run has ended):
``skip`` (why no cluster could start), or the run's return code, output and seconds, and
``scontrol show job`` of every job it submitted, taken at once (the cluster forgets a job
``MinJobAge`` seconds after it ended). ``python -m tests.slurm_cluster FOLDER`` is the
background process.

``python -m tests.slurm_cluster node-failure DIR`` is the node-failure check of
docs/scaling.md, made by hand (:func:`node_failure`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, snakemake_cmd
from .workflow_helpers import ONE_MODEL, THREADS, changed, offline_env

CLUSTER = ROOT / "tests" / "cluster" / "slurm.sh"
#: The test that uses the cluster: the session starts the first run when it selects it.
TEST = "tests/test_slurm.py::test_the_workflow_runs_through_a_real_slurm_cluster"
RECORD = "first_run.json"
#: Where the controller process keeps the session's folder (pytest's stash); workers get it
#: in their ``workerinput`` (conftest.pytest_configure_node).
FOLDER = pytest.StashKey[Path]()
WORKER_KEY = "crosslip_slurm_folder"


def session_folder(config: pytest.Config) -> Path:
    """The test session's folder for the cluster and its first run, the same in every
    pytest-xdist worker."""
    if hasattr(config, "workerinput"):
        return Path(config.workerinput[WORKER_KEY])
    return config.stash[FOLDER]


def command(work: Path, *targets: str) -> list[str]:
    """The run command (of ``targets``; all by default): ONE_MODEL with
    ``local_aggregation: false`` (every rule a SLURM job) through profiles/slurm, the
    plugin's first status check 1 s after a submission, and one thread per job as the local
    run (``--set-threads`` last: it takes every argument after it). Through
    helpers.snakemake_cmd, which fails a test that runs it unless marked slow."""
    return snakemake_cmd(
        work,
        "--profile",
        str(ROOT / "profiles" / "slurm"),
        "--slurm-init-seconds-before-status-checks",
        "1",
        "--latency-wait",
        "5",
        "--retries",
        "0",
        *targets,
        *THREADS,
        configfile=work / "config.yaml",
    )


def client_env(folder: Path) -> dict[str, str]:
    """The environment of a client of the cluster started in ``folder`` (SLURM_CONF, PATH)."""
    shown = subprocess.run(
        ["bash", str(CLUSTER), "env", str(folder)], capture_output=True, text=True, check=True
    )
    return offline_env() | dict(line.split("=", 1) for line in shown.stdout.splitlines())


def submitted(output: str) -> list[tuple[str, str]]:
    """(SLURM job id, SLURM log) of every job Snakemake submitted, from its output."""
    return re.findall(r"submitted with SLURM jobid (\d+) \(log: (\S+)\)", output)


def show_job(env: dict[str, str], slurm_id: str) -> str:
    """``scontrol show job`` of a job the cluster still holds (MinJobAge 300 s)."""
    shown = subprocess.run(
        ["scontrol", "show", "job", slurm_id], capture_output=True, text=True, env=env
    )
    return shown.stdout + shown.stderr


def start_cluster(cluster: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``slurm.sh start cluster`` (a cluster already running is started again, as a user
    brings a stopped daemon back); exit code 3: SLURM cannot be installed here."""
    return subprocess.run(
        ["bash", str(CLUSTER), "start", str(cluster)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def first_run(session: Path) -> dict:
    """Start the cluster in ``session/cluster`` and run ONE_MODEL through it in
    ``session/work``; the record (module docstring)."""
    cluster = session / "cluster"
    cluster.mkdir(exist_ok=True)
    start = start_cluster(cluster)
    if start.returncode == 3:
        return {"skip": f"no SLURM cluster: {start.stderr.strip()}"}
    if start.returncode != 0:
        return {
            "error": f"slurm.sh start failed ({start.returncode}): {start.stdout}{start.stderr}"
        }
    env = client_env(cluster)
    work = session / "work"
    work.mkdir(exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump({**ONE_MODEL, "local_aggregation": False}))
    t0 = time.perf_counter()
    proc = subprocess.run(command(work), capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    jobs = {slurm_id: show_job(env, slurm_id) for slurm_id, _ in submitted(out)}
    return {"returncode": proc.returncode, "output": out, "seconds": seconds, "jobs": jobs}


def start(session: Path) -> None:
    """Start the background process (its own session, so that :func:`stop` can end it and
    its children); its pid goes to ``session/pid``."""
    session.mkdir(parents=True, exist_ok=True)
    with open(session / "background.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.slurm_cluster", str(session)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (session / "pid").write_text(str(proc.pid))


def wait(session: Path, timeout: float = 900) -> dict:
    """The first run's record, once written; the run is started here if the session did
    not start it (the test run alone in a way that skipped the hook)."""
    if not (session / "pid").exists():
        start(session)
    record = session / RECORD
    deadline = time.monotonic() + timeout
    while not record.exists():
        if time.monotonic() > deadline:
            log = (session / "background.log").read_text()
            raise TimeoutError(f"no first SLURM run after {timeout} s: {log[-3000:]}")
        time.sleep(0.5)
    return json.loads(record.read_text())


def stop(session: Path) -> None:
    """End the background process if it still runs and stop the cluster's daemons (by the
    ids slurm.sh recorded); for the end of the test session."""
    pid = session / "pid"
    if pid.exists():
        try:
            os.killpg(int(pid.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass
    if (session / "cluster").exists():
        subprocess.run(["bash", str(CLUSTER), "stop", str(session / "cluster")], timeout=60)


def node_failure(cluster: Path) -> int:
    """The node-failure check of docs/scaling.md, by hand (about 5 minutes, as root, from
    the repository root; not in the suite): ONE_MODEL at 60 epochs of 1024 hidden units on
    the CPU through the cluster in ``cluster`` (started if it is not), with
    ``--slurm-no-requeue``; ``slurmd`` killed by its pid while the training job runs. Passes
    (0) when Snakemake reports the job as ``NODE_FAIL`` and exits 1, and the same command,
    with ``slurmd`` back, then runs to the end; else 1. The outputs are
    ``cluster/node-failure/run{1,2}.log``."""

    def restart() -> None:
        started = start_cluster(cluster)
        if started.returncode:
            raise RuntimeError(f"slurm.sh start failed: {started.stdout}{started.stderr}")

    restart()
    env = client_env(cluster)
    work = cluster / "node-failure"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    cfg = changed(ONE_MODEL, model__hidden=1024, train__epochs=60, device="cpu")
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    cmd = command(work, "--slurm-no-requeue")
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"node failure: {time.monotonic() - t0:.0f} s: {text}", flush=True)

    def squeue(fields: str) -> list[str]:
        shown = subprocess.run(
            ["squeue", "-h", "-o", fields], capture_output=True, text=True, env=env
        )
        return shown.stdout.splitlines()

    with open(work / "run1.log", "w") as log:
        run = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    while not any(re.match(r"rule_train\S* RUNNING$", ln) for ln in squeue("%k %T")):
        if run.poll() is not None:
            say("the run ended before its training job ran")
            return 1
        time.sleep(2)
    time.sleep(15)
    slurmd = int((cluster / "slurmd.pid").read_text())
    say(f"killing slurmd (pid {slurmd}) while the training job runs")
    os.kill(slurmd, signal.SIGTERM)
    try:
        code = run.wait(timeout=300)
    except subprocess.TimeoutExpired:
        say("Snakemake still waited 300 s after the kill: the job was requeued, not failed")
        run.kill()
        run.wait()
        # its jobs go first: slurm.sh start waits for an idle node, which a requeued job
        # running again would keep busy
        left = [ln.split()[0] for ln in squeue("%i %Z") if ln.split()[1:] == [str(work)]]
        subprocess.run(["scancel", *left], env=env, check=False)
        restart()
        return 1
    reported = re.search(
        r"failed due to a node failure.*NODE_FAIL", (work / "run1.log").read_text()
    )
    if code != 1 or not reported:
        say(f"expected exit 1 and a reported NODE_FAIL, got exit {code} (see {work}/run1.log)")
        return 1
    say("Snakemake reported the node failure and exited 1")
    restart()
    say("slurmd is back; the same command again")
    with open(work / "run2.log", "w") as log:
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode:
            say(f"the second run failed (see {work}/run2.log)")
            return 1
    say("the same command resumed the run to the end (exit 0)")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "node-failure":
        sys.exit(node_failure(Path(sys.argv[2]).resolve()))
    folder = Path(sys.argv[1])
    try:
        record = first_run(folder)
    except Exception:  # the test reports it, with the traceback
        record = {"error": traceback.format_exc()}
    tmp = folder / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.rename(folder / RECORD)
