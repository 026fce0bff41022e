"""The workflow on a real single-node SLURM cluster (tests/cluster/slurm.sh) through
``--profile profiles/slurm``: every rule runs as a SLURM job (the aggregate ones too, with
``local_aggregation: false``), the results equal a local run's, a second run does nothing,
and a job that fails is reported with its SLURM job id and, on the terminal, its reason
(though its stderr went to the SLURM log), while the results already made stay. Skipped,
with the reason, where the SLURM and munge packages are missing and cannot be installed
(not root, no apt-get)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from crosslip.io import failure_reason

from .helpers import ROOT, snakemake_cmd
from .workflow_helpers import ONE_MODEL, ONE_MODEL_ID, THREADS, offline_env

CLUSTER = ROOT / "tests" / "cluster" / "slurm.sh"
#: The rules of ONE_MODEL: those that always run as batch jobs, and the aggregate ones,
#: `localrules` by default (workflow/rules/aggregate.smk: seconds each, they run where
#: Snakemake runs), batch jobs too with ``local_aggregation: false`` (the test's setting).
BATCH_RULES = {"prepare_data", "train", "certify", "attack", "instances"}
LOCAL_RULES = {"summary", "table1", "figure_bounds", "figure_bracket", "figure_training"}
LOCAL_RULES |= {"figure_adversarial"}


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> dict[str, str]:
    """The environment of a client of a running test cluster (SLURM_CONF, PATH); the
    daemons are stopped, by their ids, at the end of the session."""
    folder = tmp_path_factory.mktemp("slurm")
    start = subprocess.run(
        ["bash", str(CLUSTER), "start", str(folder)], capture_output=True, text=True, timeout=900
    )
    if start.returncode == 3:
        pytest.skip(f"no SLURM cluster: {start.stderr.strip()}")
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        shown = subprocess.run(
            ["bash", str(CLUSTER), "env", str(folder)], capture_output=True, text=True, check=True
        )
        env = offline_env() | dict(line.split("=", 1) for line in shown.stdout.splitlines())
        yield env
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(folder)], timeout=60)


def batch_jobs(output: str) -> dict[str, list[str]]:
    """Rule (the first word of its SLURM log folder, grid rules folded) -> SLURM job ids
    of the jobs Snakemake submitted, from its output."""
    found: dict[str, list[str]] = {}
    for slurm_id, log in re.findall(r"submitted with SLURM jobid (\d+) \(log: (\S+)\)", output):
        rule = re.search(r"slurm_logs/rule_([a-z0-9_]+?)(?:_mnist5k\w*)?/", log).group(1)
        found.setdefault(rule, []).append(slurm_id)
    return found


def show_job(env: dict[str, str], slurm_id: str) -> str:
    """``scontrol show job`` of a job the cluster still holds (MinJobAge 300 s)."""
    shown = subprocess.run(
        ["scontrol", "show", "job", slurm_id], capture_output=True, text=True, env=env
    )
    return shown.stdout + shown.stderr


def job_state(env: dict[str, str], slurm_id: str) -> str:
    match = re.search(r"JobState=(\w+)", show_job(env, slurm_id))
    return match.group(1) if match else show_job(env, slurm_id).strip()


def results_of(work: Path) -> dict[str, pd.DataFrame]:
    """The per-instance results and the summary, without the timing columns."""
    res = work / "results"
    files = sorted((res / "instances").rglob("*.parquet"))
    out = {p.relative_to(res).as_posix(): pd.read_parquet(p) for p in files}
    out["tables/summary.csv"] = pd.read_csv(res / "tables" / "summary.csv")
    return {k: v.drop(columns=[c for c in v if c.endswith("_seconds")]) for k, v in out.items()}


@pytest.mark.slow
def test_the_workflow_runs_through_a_real_slurm_cluster(slurm_cluster, one_model_run, tmp_path):
    env = slurm_cluster
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump({**ONE_MODEL, "local_aggregation": False}))
    cmd = snakemake_cmd(
        work,
        "--profile",
        str(ROOT / "profiles" / "slurm"),
        "--slurm-init-seconds-before-status-checks",
        "1",
        "--latency-wait",
        "5",
        "--retries",
        "0",
        configfile=work / "config.yaml",
    )
    cmd += THREADS  # as the local run: one thread per job, so the numbers agree
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    print(f"ONE_MODEL through SLURM: {seconds:.1f} s")
    # every rule went through the cluster, as a job that SLURM ran to completion
    jobs = batch_jobs(out)
    assert set(jobs) == BATCH_RULES | LOCAL_RULES, jobs
    for ids in jobs.values():
        assert all(job_state(env, i) == "COMPLETED" for i in ids), ids
    # with device auto, train, certify and attack ask for one GPU each (the profile's
    # syntax, sbatch --gpus=1), which the node's gres.conf declares; the rest ask for none
    for rule, ids in jobs.items():
        gpus = ["TresPerJob=gres:gpu:1" in show_job(env, i) for i in ids]
        assert gpus == [rule in {"train", "certify", "attack"}] * len(ids), (rule, ids)
    # the same results as the local run of the same config
    local, remote = results_of(one_model_run), results_of(work)
    assert sorted(remote) == sorted(local)
    for name, frame in local.items():
        pd.testing.assert_frame_equal(remote[name], frame, obj=name)
    # a second run submits nothing
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    assert "SLURM jobid" not in again.stdout + again.stderr
    # a job that fails (a damaged model file) is reported, with its SLURM job id, and
    # loses nothing: the results made before stay, the failed job leaves no output
    res = work / "results"
    model = res / "models" / "mnist5k" / ONE_MODEL_ID / "model.pt"
    model.write_bytes(b"damaged")
    kept = {p: p.read_bytes() for p in (res / "tables").iterdir()}
    failed = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    fout = failed.stdout + failed.stderr
    assert failed.returncode != 0, fout[-3000:]
    failed_ids = re.findall(r"SLURM-job '(\d+)' failed", fout)
    assert failed_ids and all(job_state(env, i) == "FAILED" for i in failed_ids), fout[-3000:]
    assert re.search(r"Error in rule (certify|attack)", fout)
    assert f"{model.relative_to(work)}: refused to load" in "".join(
        p.read_text() for p in (res / "logs").rglob("*.log")
    )
    # the reason reaches the terminal although each job's stderr went to its SLURM log:
    # crosslip's summary names each failed job, its one-line reason and its own log
    lines = failed.stderr.splitlines()
    summary = [ln for ln in lines if re.fullmatch(r"crosslip: \d+ job\(s\) failed:", ln)]
    assert len(summary) == 1, failed.stderr[-3000:]
    listed = lines[lines.index(summary[0]) + 1 :][: int(summary[0].split()[1])]
    assert listed and all(re.match(r"  (certify|attack) \(", ln) for ln in listed), listed
    for line in listed:
        log = re.search(r"\[log: (\S+)\]$", line).group(1)
        assert f": {failure_reason(work / log)}  [log: {log}]" in line
        assert "refused to load" in line
    assert {p: p.read_bytes() for p in (res / "tables").iterdir()} == kept
    assert not list((res / "certify").rglob("*.parquet.tmp*"))
