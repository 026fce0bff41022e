"""The workflow on a real single-node SLURM cluster (tests/cluster/slurm.sh) through
``--profile profiles/slurm``: every rule runs as a SLURM job (the aggregate ones too, with
``local_aggregation: false``), the results equal a local run's, a second run does nothing,
and a job that fails is reported with its SLURM job id and, on the terminal, its reason
(though its stderr went to the SLURM log), while the results already made stay. Skipped,
with the reason, where the SLURM and munge packages are missing and cannot be installed
(not root, no apt-get).

The runs are made in the background while the other tests run (tests/slurm_cluster.py);
the tests check their records. The first test compares with the local run of the same
config (``one_model_run``), so it runs on the worker that made that run; the second needs
no local run and so runs wherever and whenever the scheduler puts it, usually late, when
the background runs have ended."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from crosslip.io.logs import failure_reason

from . import slurm_cluster
from .slurm_cluster import session_folder
from .workflow_helpers import LOCAL_RULES, ONE_MODEL_ID

#: The rules of ONE_MODEL: those that always run as batch jobs, and the others, `localrules`
#: by default (LOCAL_RULES), batch jobs too with ``local_aggregation: false`` (the test's
#: setting).
BATCH_RULES = {"prepare_data", "train", "certify", "attack"}


@pytest.fixture(scope="session")
def first_run(request) -> dict:
    """The record of the first run through the cluster, made in the background
    (tests/slurm_cluster.py); skips, with the reason, where no cluster could start."""
    record = slurm_cluster.wait(session_folder(request.config))
    if "skip" in record:
        pytest.skip(record["skip"])
    assert "error" not in record, record["error"]
    return record


@pytest.fixture(scope="session")
def later_runs(request, first_run) -> dict:
    """The record of the runs after the first: the same command again, a second start of
    the cluster, and a failing run (made only after a first run that succeeded)."""
    assert first_run["returncode"] == 0, first_run["output"][-6000:]
    record = slurm_cluster.wait(session_folder(request.config), slurm_cluster.LATER)
    assert "error" not in record, record["error"]
    return record


def batch_jobs(output: str) -> dict[str, list[str]]:
    """Rule (the first word of its SLURM log folder, grid rules folded) -> SLURM job ids
    of the jobs Snakemake submitted, from its output."""
    found: dict[str, list[str]] = {}
    for slurm_id, log in slurm_cluster.submitted(output):
        rule = re.search(r"slurm_logs/rule_([a-z0-9_]+?)(?:_mnist5k\w*)?/", log).group(1)
        found.setdefault(rule, []).append(slurm_id)
    return found


def state(shown: str) -> str:
    """The JobState of ``scontrol show job``'s output (or the output, where it has none)."""
    match = re.search(r"JobState=(\w+)", shown)
    return match.group(1) if match else shown.strip()


def results_of(work: Path) -> dict[str, pd.DataFrame]:
    """The per-instance results and the summary, without the timing columns."""
    res = work / "results"
    files = sorted((res / "instances").rglob("*.parquet"))
    out = {p.relative_to(res).as_posix(): pd.read_parquet(p) for p in files}
    out["tables/summary.csv"] = pd.read_csv(res / "tables" / "summary.csv")
    return {k: v.drop(columns=[c for c in v if c.endswith("_seconds")]) for k, v in out.items()}


@pytest.mark.slow
def test_the_workflow_runs_through_a_real_slurm_cluster(one_model_run, first_run, request):
    session = session_folder(request.config)
    out = first_run["output"]
    assert first_run["returncode"] == 0, out[-6000:]
    print(f"ONE_MODEL through SLURM: {first_run['seconds']:.1f} s")
    # every rule went through the cluster, as a job that SLURM ran to completion
    jobs = batch_jobs(out)
    assert set(jobs) == BATCH_RULES | LOCAL_RULES, jobs
    shown = first_run["jobs"]  # scontrol show job of each, right after the run
    for ids in jobs.values():
        assert all(state(shown[i]) == "COMPLETED" for i in ids), ids
    # with device auto, train, certify and attack ask for one GPU each (the profile's
    # syntax, sbatch --gpus=1), which the node's gres.conf declares; the rest ask for none
    for rule, ids in jobs.items():
        gpus = ["TresPerJob=gres:gpu:1" in shown[i] for i in ids]
        assert gpus == [rule in {"train", "certify", "attack"}] * len(ids), (rule, ids)
    # the same results as the local run of the same config (the copy taken right after the
    # run: the failing run of the next test changes the work folder)
    local, remote = results_of(one_model_run), results_of(session / slurm_cluster.FIRST_RESULTS)
    assert sorted(remote) == sorted(local)
    for name, frame in local.items():
        pd.testing.assert_frame_equal(remote[name], frame, obj=name)


@pytest.mark.slow
def test_after_a_slurm_run_nothing_is_redone_and_a_failed_job_is_reported(later_runs, request):
    session = session_folder(request.config)
    work = session / "work"
    # a second run submits nothing
    again = later_runs["again"]
    assert again["returncode"] == 0 and "Nothing to be done" in again["output"], again
    assert "SLURM jobid" not in again["output"]
    # a second start from a client's shell (PATH with the srun wrapper first: how a user
    # brings a stopped daemon back) keeps the wrapper on the real srun, not on itself
    restart = later_runs["restart"]
    assert restart["returncode"] == 0, restart["output"]
    wrapper = restart["srun"].split("exec ", 1)[1]
    assert not wrapper.startswith(str(session / "cluster")), wrapper
    # a job that fails (a damaged model file) is reported, with its SLURM job id, and
    # loses nothing: the results made before stay, the failed job leaves no output. The
    # command asks for the certification only: the node's one GPU runs one GPU job at a
    # time, and the plugin's status interval grows by 10 s after each check that sees no
    # job succeed, so a failing attack queued behind it made the run 66 s instead of 35 s
    failed = later_runs["failed"]
    fout = failed["stdout"] + failed["stderr"]
    assert failed["returncode"] != 0, fout[-3000:]
    assert failed["jobs"], fout[-3000:]  # the jobs it reports failed (slurm_cluster.failed_jobs)
    assert all(state(shown) == "FAILED" for shown in failed["jobs"].values()), failed["jobs"]
    res = work / "results"
    model = res / "models" / "mnist5k" / ONE_MODEL_ID / "model.pt"
    assert model.read_bytes() == b"damaged"  # the file that the failing run was given
    assert "Error in rule certify" in fout and "Error in rule attack" not in fout
    assert f"{model.relative_to(work)}: refused to load" in "".join(
        p.read_text() for p in (res / "logs").rglob("*.log")
    )
    # the reason reaches the terminal although each job's stderr went to its SLURM log:
    # crosslip's summary names each failed job, its one-line reason and its own log
    lines = failed["stderr"].splitlines()
    summary = [ln for ln in lines if re.fullmatch(r"crosslip: \d+ job\(s\) failed:", ln)]
    assert len(summary) == 1, failed["stderr"][-3000:]
    listed = lines[lines.index(summary[0]) + 1 :][: int(summary[0].split()[1])]
    assert len(listed) == 1 and listed[0].startswith("  certify ("), listed
    for line in listed:
        log = re.search(r"\[log: (\S+)\]$", line).group(1)
        assert f": {failure_reason(work / log)}  [log: {log}]" in line
        assert "refused to load" in line
    # the tables of the first run are as they were, and no temporary is left
    tables = session / slurm_cluster.FIRST_RESULTS / "results" / "tables"
    kept = {p.name: p.read_bytes() for p in tables.iterdir()}
    assert {p.name: p.read_bytes() for p in (res / "tables").iterdir()} == kept
    assert not list((res / "certify").rglob("*.parquet.tmp*"))
