"""Scaling out: the SLURM profile plans every preset without touching SLURM, asks a GPU for
the jobs that run on the config's device (train, certify, attack; none with device: cpu),
takes site settings from the environment and runs the join and the aggregation where
Snakemake runs; the local GPU profile runs one such job at a time."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .helpers import (
    ROOT,
    dry_run_counts,
    dry_run_jobs,
    fields,
    run_snakemake,
    snakemake_cmd,
    stage_of,
    trained_models,
)
from .workflow_helpers import LOCAL_RULES

SLURM_PROFILE = ROOT / "profiles" / "slurm"
LOCAL_GPU_PROFILE = ROOT / "profiles" / "local-gpu"
PRESETS = sorted((ROOT / "config" / "presets").glob("*.yaml"))
# Every SLURM client command the plugin could call; the fakes log their call and fail.
SLURM_COMMANDS = (
    "sbatch",
    "srun",
    "salloc",
    "scancel",
    "sinfo",
    "squeue",
    "sacct",
    "sacctmgr",
    "sshare",
    "scontrol",
)
SUBMITTING = {"sbatch", "srun", "salloc", "scancel"}
SITE_VARS = ("CROSSLIP_SLURM_PARTITION", "CROSSLIP_SLURM_GPU_PARTITION", "CROSSLIP_SLURM_ACCOUNT")
#: The rules whose jobs run on config `device` and declare the gpu resource.
GPU_RULES = {"train", "certify", "attack"}


@pytest.fixture
def fake_slurm(tmp_path):
    """PATH with fake SLURM commands first (each logs its call and fails, so that a real
    cluster is never reached even where one exists), and no CROSSLIP_SLURM_* settings."""
    bindir, log = tmp_path / "fake-slurm-bin", tmp_path / "slurm-calls.log"
    bindir.mkdir()
    for name in SLURM_COMMANDS:
        script = bindir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit 1\n')
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in SITE_VARS}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env, log


def dry_run(workdir: Path, *args: str, env: dict) -> tuple[list[dict], str]:
    cmd = snakemake_cmd(workdir, "-n", *args)
    proc = run_snakemake(cmd, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = dry_run_jobs(proc.stdout)
    assert len(jobs) == dry_run_counts(proc.stdout)["total"] > 0, proc.stdout[-3000:]
    for job in jobs:  # as the tests read them
        job["wildcards"], job["resources"] = fields(job["wildcards"]), fields(job.get("resources"))
        job.setdefault("threads", "1")
    return jobs, proc.stdout + proc.stderr


def called(log: Path) -> set[str]:
    return {line.split()[0] for line in log.read_text().splitlines()} if log.exists() else set()


@pytest.mark.slow
def test_on_a_cluster_the_join_and_the_aggregation_run_where_snakemake_runs(
    one_model_run, tmp_path, fake_slurm
):
    """Redone through profiles/slurm with SLURM commands that all fail, the per-model join
    (instances), the summary, the tables and the figures run here, submit nothing and
    write what the local run wrote."""
    env, log = fake_slurm
    work = tmp_path / "work"
    shutil.copytree(one_model_run, work, symlinks=True)  # mtimes kept
    joined = sorted((work / "results" / "instances").rglob("*.parquet"))
    assert joined  # the run's one model
    before = [p.read_bytes() for p in joined]
    cmd = snakemake_cmd(work, "--profile", str(SLURM_PROFILE), configfile=work / "config.yaml")
    # The plugin's status thread sleeps its interval (40 s by default) between checks, even
    # with no job submitted, and Snakemake waits for it at the end: 1 s, as the real
    # cluster's test (tests/slurm_cluster.py), instead of 35 s idle.
    cmd += ["--slurm-init-seconds-before-status-checks", "1"]
    cmd += ["--forcerun", *sorted(LOCAL_RULES)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    ran = set(re.findall(r"^localrule (\w+):", out, re.M)) - {"all"}  # the target: no job
    assert ran == LOCAL_RULES, out[-3000:]
    assert not re.findall(r"^rule \w+:", out, re.M), out[-3000:]  # no job for the executor
    assert not called(log) & SUBMITTING, log.read_text()
    assert [p.read_bytes() for p in joined] == before


def test_presets_exist():
    """The preset dry runs below are parametrized over this glob: it must not be empty."""
    assert PRESETS, "no config/presets/*.yaml"
    for preset in PRESETS:
        assert isinstance(yaml.safe_load(preset.read_text()), dict), preset


@pytest.mark.slow
@pytest.mark.parametrize("preset", [None, *PRESETS], ids=["default", *(p.stem for p in PRESETS)])
def test_slurm_dry_run_asks_a_gpu_for_the_device_jobs_only(tmp_path, fake_slurm, preset):
    env, log = fake_slurm
    args = ["--profile", str(SLURM_PROFILE)]
    if preset is not None:
        args += ["--configfile", str(preset)]
    jobs, out = dry_run(tmp_path / "work", *args, env=env)
    assert f"Using profiles {SLURM_PROFILE} and workflow specific profile" in out  # +default
    rules = {stage_of(job["rule"]) for job in jobs}
    if preset is not None and "certify:\n  models: best" in preset.read_text():
        # the select_models checkpoint decides after training which models are evaluated
        assert {"prepare_data", "train", "select_models"} <= rules and "certify" not in rules
    else:
        assert {"prepare_data", "train", "certify", "attack", "instances"} <= rules
    for job in jobs:
        res = job["resources"]
        assert res.get("gpu", "0") == ("1" if stage_of(job["rule"]) in GPU_RULES else "0"), job
        assert "gres" not in res and "slurm_extra" not in res, job
        assert "mem_mb" in res and "runtime" in res and "cpus_per_task" in res, job
        assert "slurm_partition" not in res and "slurm_account" not in res, job  # env unset
    trained = trained_models(jobs)
    assert len(trained) == len(set(trained)) > 0
    # Planning needs no SLURM: nothing was submitted (the plugin only probes
    # `scontrol show config` for a default and carries on when that fails).
    assert not called(log) & SUBMITTING, log.read_text()
    assert not (tmp_path / "work" / "results").exists()


@pytest.mark.slow
def test_slurm_profile_site_settings_from_environment(tmp_path, fake_slurm):
    env, log = fake_slurm
    env = {
        **env,
        "CROSSLIP_SLURM_PARTITION": "cpuq",
        "CROSSLIP_SLURM_GPU_PARTITION": "gpuq",
        "CROSSLIP_SLURM_ACCOUNT": "proj42",
    }
    jobs, _ = dry_run(tmp_path, "--profile", str(SLURM_PROFILE), "--cores", "64", env=env)
    assert jobs
    for job in jobs:
        res = job["resources"]
        on_gpu = stage_of(job["rule"]) in GPU_RULES  # train_grid_*: train's partition
        assert res["slurm_partition"] == ("gpuq" if on_gpu else "cpuq"), job
        assert res["slurm_account"] == "proj42", job
        # cpus_per_task follows the rule's threads (2 for train, certify, attack)
        assert res["cpus_per_task"] == job["threads"], job
    assert {job["threads"] for job in jobs if job["rule"] == "train"} == {"2"}
    assert not called(log) & SUBMITTING


@pytest.mark.slow
def test_slurm_profile_names_existing_rules():
    """set-resources keys are rule names; a renamed rule would silently lose its GPU."""
    profile = yaml.safe_load((SLURM_PROFILE / "config.yaml").read_text())
    assert profile["executor"] == "slurm" and profile["rerun-incomplete"] is True
    assert {"jobs", "latency-wait", "retries", "default-resources"} <= set(profile)
    proc = run_snakemake(snakemake_cmd(ROOT, "--list-rules"), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rules = set(proc.stdout.split())
    assert GPU_RULES <= rules and set(profile["set-resources"]) == GPU_RULES
    # the rules' own gpu (from config device) applies: the profile does not override it
    assert not any("gpu" in res for res in profile["set-resources"].values())


@pytest.mark.slow
def test_local_gpu_profile_is_accepted_by_the_workflow(tmp_path, fake_slurm):
    profile = yaml.safe_load((LOCAL_GPU_PROFILE / "config.yaml").read_text())
    assert profile["resources"] == {"gpu": 1} and profile["cores"] == "all"
    assert "executor" not in profile  # local execution
    jobs, out = dry_run(tmp_path, "--profile", str(LOCAL_GPU_PROFILE), env=fake_slurm[0])
    assert f"Using profiles {LOCAL_GPU_PROFILE} and workflow specific profile" in out  # +default
    on_gpu = {stage_of(job["rule"]) for job in jobs if job["resources"].get("gpu") == "1"}
    assert on_gpu == GPU_RULES


@pytest.mark.slow
@pytest.mark.parametrize("profile", [LOCAL_GPU_PROFILE, SLURM_PROFILE], ids=["local-gpu", "slurm"])
def test_device_cpu_claims_no_gpu(tmp_path, fake_slurm, profile):
    """With device: cpu no job declares a GPU: the profile's limit does not serialize them
    and SLURM submits them without --gpus."""
    jobs, _ = dry_run(
        tmp_path, "--profile", str(profile), "--config", "device=cpu", env=fake_slurm[0]
    )
    assert GPU_RULES <= {job["rule"] for job in jobs}
    assert all(job["resources"].get("gpu", "0") == "0" for job in jobs), jobs


TOY = """
rule all:
    input: expand("out/{i}.txt", i=range(2))

rule job:
    output: "out/{i}.txt"
    resources: gpu=1
    shell: "date +%s.%N > {output}.start; sleep 1.5; date +%s.%N > {output}"
"""


def gpu_job_intervals(workdir: Path, *args: str) -> list[tuple[float, float]]:
    workdir.mkdir()
    (workdir / "Snakefile").write_text(TOY)
    cmd = snakemake_cmd(workdir, *args, snakefile=workdir / "Snakefile")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = workdir / "out"
    return sorted(
        (float((out / f"{i}.txt.start").read_text()), float((out / f"{i}.txt").read_text()))
        for i in range(2)
    )


@pytest.mark.slow
def test_local_gpu_profile_runs_one_gpu_job_at_a_time(tmp_path):
    """Two jobs that declare gpu=1, as train does: serial with the profile, parallel without
    a limit (Snakemake treats a resource it has no limit for as unlimited), so the declaration
    costs a laptop without a GPU nothing."""
    first, second = gpu_job_intervals(tmp_path / "profile", "--profile", str(LOCAL_GPU_PROFILE))
    assert first[1] <= second[0], "gpu jobs overlapped under profiles/local-gpu"
    first, second = gpu_job_intervals(tmp_path / "nolimit", "--cores", "2")
    assert second[0] < first[1], "without a gpu limit the jobs should run side by side"
