"""The SLURM tests' cluster (tests/cluster/slurm.sh) and their runs through
``--profile profiles/slurm``, made by a background process that the test session starts as
soon as it has collected a SLURM test (``tests/conftest.py``).

The runs spend most of their time waiting: the executor plugin checks the status of its
jobs at an interval that grows by 10 s after each check that sees no job succeed (the first
run 90-100 s, the later runs about 35 s together). Run inside a test, each held a pytest
worker, and so a core, idle for that time. In the background they overlap the other tests;
the tests wait for the records (:func:`wait`) and check them as they checked the runs they
made themselves.

The background process, in ``session/work``:

1. starts the cluster in ``session/cluster`` and runs ONE_MODEL through it; keeps a copy of
   the results (``session/first_results/results``: the per-instance results and the tables) and
   writes ``first_run.json``: ``skip`` (why no cluster could start), or the run's return
   code, output and seconds, and ``scontrol show job`` of every job it submitted, taken at
   once (the cluster forgets a job ``MinJobAge`` seconds after it ended);
2. then, only where the first run succeeded: the same command again; a second start of the
   cluster from a client's shell; a failing run (a damaged model file, the certification
   only); and writes ``later_runs.json`` with their outputs and the failed jobs' states.

``python -m tests.slurm_cluster FOLDER`` is the background process.

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
from .workflow_helpers import ONE_MODEL, ONE_MODEL_ID, THREADS, changed, offline_env

CLUSTER = ROOT / "tests" / "cluster" / "slurm.sh"
#: The tests that use the cluster: the session starts its runs when it selects one.
TESTS = "tests/test_slurm.py::"
RECORD = "first_run.json"
LATER = "later_runs.json"
#: The copy of the first run's results (the failing run changes the work folder).
FIRST_RESULTS = "first_results"
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


def failed_jobs(output: str) -> list[str]:
    """SLURM job id of every job that Snakemake reports failed, from its output."""
    return re.findall(r"SLURM-job '(\d+)' failed", output)


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
    """Start the cluster in ``session/cluster``, run ONE_MODEL through it in
    ``session/work`` and copy its results to ``session/first_results``; the record (module
    docstring)."""
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
    for folder in ("instances", "tables"):
        if (work / "results" / folder).is_dir():
            shutil.copytree(work / "results" / folder, session / FIRST_RESULTS / "results" / folder)
    return {"returncode": proc.returncode, "output": out, "seconds": seconds, "jobs": jobs}


def later_runs(session: Path) -> dict:
    """After a successful first run: the same command again (``again``: return code and
    output); ``slurm.sh start`` from a client's shell, with the srun wrapper first on PATH
    (``restart``: return code, output and the srun wrapper's text after it); and a run of the
    certification only with the model file damaged (``failed``: return code, stdout and
    stderr, and ``scontrol show job`` of each job that the run reports failed)."""
    cluster, work = session / "cluster", session / "work"
    env = client_env(cluster)
    again = subprocess.run(command(work), capture_output=True, text=True, env=env, timeout=300)
    started = start_cluster(cluster, env)
    model = work / "results" / "models" / "mnist5k" / ONE_MODEL_ID / "model.pt"
    model.write_bytes(b"damaged")
    certified = f"results/certify/mnist5k/{ONE_MODEL_ID}.parquet"
    failed = subprocess.run(
        command(work, certified), capture_output=True, text=True, env=env, timeout=600
    )
    return {
        "again": {"returncode": again.returncode, "output": again.stdout + again.stderr},
        "restart": {
            "returncode": started.returncode,
            "output": started.stdout + started.stderr,
            "srun": (cluster / "bin" / "srun").read_text(),
        },
        "failed": {
            "returncode": failed.returncode,
            "stdout": failed.stdout,
            "stderr": failed.stderr,
            "jobs": {i: show_job(env, i) for i in failed_jobs(failed.stdout + failed.stderr)},
        },
    }


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


def wait(session: Path, name: str = RECORD, timeout: float = 900) -> dict:
    """The record ``name`` (:data:`RECORD` or :data:`LATER`), once written; the runs are
    started here if the session did not start them (a test run alone in a way that skipped
    the hook)."""
    if not (session / "pid").exists():
        start(session)
    record = session / name
    deadline = time.monotonic() + timeout
    while not record.exists():
        if time.monotonic() > deadline:
            log = (session / "background.log").read_text()
            raise TimeoutError(f"no {name} after {timeout} s: {log[-3000:]}")
        time.sleep(0.5)
    return json.loads(record.read_text())


def write_record(session: Path, name: str, make) -> dict:
    """``make()``'s record (or the traceback of its error, which the test reports) written
    to ``session/name`` under a temporary name first; the record."""
    try:
        record = make()
    except Exception:
        record = {"error": traceback.format_exc()}
    tmp = session / f".{name}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.rename(session / name)
    return record


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
    first = write_record(folder, RECORD, lambda: first_run(folder))
    if first.get("returncode") == 0:  # the tests wait for it only then
        write_record(folder, LATER, lambda: later_runs(folder))
