"""Rerun only what changed: after a finished tiny run, each change plans exactly the jobs
that depend on it, by Snakemake's rerun triggers (missing output, params, set of inputs,
code digests of crosslip.jobs.tracking), and nothing else.

The workflow (Snakefile, workflow/, src/, ...) is copied next to the run, because some tests
edit library files, whose digests the copy's Snakefile reads: the real repository is never
touched. The finished run is the session's shared one-model run (conftest
``one_model_run``), copied once per module beside the workflow copy (a finished run that
moves has nothing to do); every scenario restores it to the same absolute paths from a
snapshot (mtimes preserved), so scenarios are independent. The jobs still import
``crosslip`` from the installed package, not from the copy; the copy's files only drive
Snakemake's planning."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, dry_run_counts, dry_run_jobs, run_snakemake, snakemake_cmd
from .workflow_helpers import ONE_MODEL, ONE_MODEL_ID

WORKFLOW_FILES = ("Snakefile", "config.yaml", "environment.yml", "workflow", "src", "config")
PER_MODEL = ("train", "certify", "attack", "instances")

TINY = ONE_MODEL
OLD_MODEL = ONE_MODEL_ID
NEW_MODEL = "cross_lipschitz-lr0.2-lam0.01-seed0"  # test (a) adds lambda 1e-2 to the grid

pytestmark = pytest.mark.slow  # a copy of the shared tiny run, then one more model


@dataclass
class Run:
    repo: Path  # the copied workflow
    work: Path  # the finished run's working directory

    def snakemake(self, *args: str, config: dict = TINY) -> subprocess.CompletedProcess:
        cfg = self.work / "config.yaml"
        cfg.write_text(yaml.safe_dump(config))
        cmd = snakemake_cmd(self.work, *args, configfile=cfg, snakefile=self.repo / "Snakefile")
        proc = run_snakemake(cmd, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    def plan(self, *args: str, config: dict = TINY) -> dict[str, dict]:
        """Jobs of a dry run, by key ``rule[wildcards]``, checked against its job count."""
        out = self.snakemake("-n", *args, config=config).stdout
        jobs = jobs_by_key(out)
        assert len(jobs) == dry_run_counts(out)["total"], out[-3000:]
        return jobs


def jobs_by_key(stdout: str) -> dict[str, dict]:
    """The dry-run listing by key ``rule[wildcards]``."""
    return {f"{job['rule']}[{job['wildcards']}]": job for job in dry_run_jobs(stdout)}


def key(rule: str, model: str) -> str:
    return f"{rule}[dataset=mnist5k, model={model}]"


def downstream(dag: dict[str, dict], start: set[str]) -> set[str]:
    """``start`` and every job that (transitively) consumes an output of one of them, from
    the inputs and outputs the full plan lists: the structure, not the rerun decision."""
    found = set(start)
    while True:
        made = {f for k in found for f in dag[k]["output"]}
        more = {k for k, job in dag.items() if k not in found and made & set(job["input"])}
        if not more:
            return found
        found |= more


def full_dag(run: Run, config: dict = TINY) -> dict[str, dict]:
    return run.plan("--forceall", config=config)


def of_rule(jobs, rule: str) -> set[str]:
    return {k for k, job in jobs.items() if job["rule"] == rule}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, one_model_run):
    base = tmp_path_factory.mktemp("rerun")
    live, snapshot = base / "live", base / "snapshot"
    for name in WORKFLOW_FILES:
        src, dst = ROOT / name, live / "repo" / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    run = Run(live / "repo", live / "work")
    shutil.copytree(one_model_run, run.work, symlinks=True)  # mtimes kept
    assert "Nothing to be done" in run.snakemake("-n").stdout
    shutil.copytree(live, snapshot, symlinks=True)
    return run, snapshot, full_dag(run)


@pytest.fixture
def tiny_dag(finished):
    """Every job of TINY with its inputs and outputs (the same for tests (b) and (c))."""
    return finished[2]


@pytest.fixture
def run(finished):
    """The finished run, restored from its snapshot at the same absolute paths."""
    run, snapshot, _ = finished
    live = run.repo.parent
    shutil.rmtree(live)
    shutil.copytree(snapshot, live, symlinks=True)
    return run


def test_unchanged_run_plans_nothing(run):
    assert run.plan() == {}
    # an mtime-only change of a library file is no change: Snakemake compares the checksum
    # it recorded for the input
    (run.repo / "src" / "crosslip" / "certify" / "search.py").touch()
    assert run.plan() == {}


def test_new_grid_value_runs_only_the_new_model_and_what_depends_on_it(run):
    grid = {**TINY["train"]["grid"], "cross_lipschitz": {"lr": [0.2], "lambda": [1e-3, 1e-2]}}
    config = {**TINY, "train": {**TINY["train"], "grid": grid}}
    dag = full_dag(run, config)
    planned = run.plan(config=config)
    new = {key(rule, NEW_MODEL) for rule in PER_MODEL}
    assert set(planned) == downstream(dag, {key("train", NEW_MODEL)})
    assert new <= set(planned)
    per_model = {k for k in planned if planned[k]["rule"] in (*PER_MODEL, "prepare_data")}
    assert per_model == new  # no job of the old model, no data preparation
    assert planned[key("train", NEW_MODEL)]["reason"].startswith("Missing output files")
    for k in set(planned) - new:  # tables and figures: the set of their inputs changed
        assert "Set of input files has changed" in planned[k]["reason"] or (
            "Input files updated by another job" in planned[k]["reason"]
        ), planned[k]

    res = run.work / "results"
    old_files = [p for p in res.rglob(f"*{OLD_MODEL}*") if p.is_file()]
    old_files += list((res / "models" / "mnist5k" / OLD_MODEL).iterdir())
    assert len(old_files) >= 10  # model, metrics, parquets, examples, logs, benchmarks
    before = {p: p.stat().st_mtime_ns for p in old_files}
    run.snakemake("--cores", "2", config=config)
    assert {p: p.stat().st_mtime_ns for p in old_files} == before
    assert (res / "instances" / "mnist5k" / f"{NEW_MODEL}.parquet").exists()
    assert run.plan(config=config) == {}


@pytest.mark.parametrize("change", [{"rtol": 2e-3}, {"n_points": 8}])
def test_certification_setting_reruns_certification_only(run, tiny_dag, change):
    config = {**TINY, "certify": {**TINY["certify"], **change}}
    planned = run.plan(config=config)
    certify = of_rule(tiny_dag, "certify")
    assert certify == {key("certify", OLD_MODEL)}
    assert set(planned) == downstream(tiny_dag, certify)
    assert of_rule(planned, "instances") == {key("instances", OLD_MODEL)}
    for rule in ("prepare_data", "train", "attack"):
        assert not of_rule(planned, rule), rule
    for k in certify:
        assert "Params have changed since last execution" in planned[k]["reason"]


def edit_code(path: Path) -> None:
    """A change of behaviour: a new module-level statement."""
    with path.open("a") as f:
        f.write("\nEDITED_BY_TEST_RERUN = 1\n")


def test_editing_the_certification_code_reruns_certification_and_tables_not_training(run, tiny_dag):
    edit_code(run.repo / "src" / "crosslip" / "certify" / "search.py")
    planned = run.plan()
    certify = of_rule(tiny_dag, "certify")
    assert set(planned) == downstream(tiny_dag, certify)
    for k in certify:
        assert "params" in planned[k]["reason"].lower(), planned[k]
    assert not of_rule(planned, "train") and not of_rule(planned, "attack")
    assert not of_rule(planned, "prepare_data")


def test_editing_a_training_module_reruns_training(run, tiny_dag):
    edit_code(run.repo / "src" / "crosslip" / "training" / "regularizers.py")
    planned = run.plan()
    train = of_rule(tiny_dag, "train")
    assert set(planned) == downstream(tiny_dag, train)
    assert not of_rule(planned, "prepare_data")


def test_editing_docstrings_and_comments_reruns_nothing(run):
    for module in ("models/softplus_net.py", "training/single.py", "certify/search.py"):
        path = run.repo / "src" / "crosslip" / module
        text = path.read_text()
        start = text.index('"""') + 3
        path.write_text(text[:start] + "Edited docstring. " + text[start:] + "\n# a comment\n")
    assert run.plan() == {}


def test_a_finished_run_moved_to_another_folder_has_nothing_to_do(run, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(run.repo.parent, moved, symlinks=True)
    other = Run(moved / "repo", moved / "work")
    assert other.plan() == {}
