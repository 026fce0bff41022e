"""Shared by the workflow tests: a small config (BASE) and ways to vary it, Snakemake runs
that cannot reach the internet, and readers of a results folder."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from crosslip.models.checkpoints import load_model

from .helpers import dry_run_jobs, run_snakemake, snakemake_cmd

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
SECONDS = ["certify_seconds", "attack_seconds"]  # wall time: differs between runs
#: Every Snakemake subprocess gets proxies at a closed loopback port: a download attempt
#: fails at once instead of reaching the internet.
OFFLINE = {
    k: "http://127.0.0.1:9" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
}


def offline_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (this process's environment if None) with :data:`OFFLINE`'s proxies."""
    env = {**(os.environ if base is None else base), **OFFLINE}
    env.pop("no_proxy", None)
    env.pop("NO_PROXY", None)
    return env


def write_config(work: Path, cfg: dict | str) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "config.yaml"
    path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg, sort_keys=False))
    return path


def snakemake(
    work: Path, *args: str, config: dict | str | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    if config is not None:
        write_config(work, config)
    return run_snakemake(
        snakemake_cmd(work, *args, configfile=work / "config.yaml"),
        timeout=timeout,
        env=offline_env(),
    )


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def temporaries(folder: Path) -> list[str]:
    """Leftover temporaries of atomic writes (``.<name>.*.tmp``) and downloads (``*.part``)."""
    return [p for p in files_under(folder) if p.endswith((".tmp", ".part"))]


BASE = {
    "datasets": ["mnist5k"],
    "model": {"hidden": 8},
    "train": {
        "epochs": 1,
        "grid": {
            "none": {"lr": [0.2], "lambda": [0.0]},
            "dropout": {"lr": [0.2], "keep_hidden": [0.5]},
        },
    },
    "certify": {"n_points": 5, "kinds": ["local", "global"]},
    "attack": {"n_points": 5, "norms": ["l2"], "refine_steps": 0},
}
DELETE = object()


def changed(cfg: dict, **changes) -> dict:
    """A deep copy of ``cfg`` with ``a__b__c=value`` set at ``cfg[a][b][c]`` (DELETE: removed)."""
    out = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if value is DELETE:
            node.pop(last)
        else:
            node[last] = value
    return out


SWEEP = {
    "datasets": ["mnist5k"],
    "model": {"hidden": 32},
    "train": {
        "batch_grid": False,  # one job per model: the load test wants many jobs
        "epochs": 6,
        "grid": {
            "none": {"lr": [0.2], "lambda": [0.0]},
            "weight_decay": {"lr": [0.2, 1000.0], "lambda": [1.0]},
            "dropout": {"lr": [0.2], "keep_hidden": [0.5]},
            "cross_lipschitz": {"lr": [0.2], "lambda": [1.0e-3, 1.0e-2]},
        },
    },
    "certify": {"n_points": 1000, "kinds": ["local", "global"]},
    "attack": {
        "n_points": 5,
        "norms": ["l2"],
        "refine_steps": 0,
        "n_examples": 1,
        "min_norm_steps": 10,
        "min_norm_targets": 1,
        "min_norm_restarts": 0,
    },
}
DIVERGED = "weight_decay-lr1000-lam1-seed0"
#: The pipeline tests' tiny run (conftest ``tiny_run``): 4 net regularizers x 3 settings and
#: 3 kernel models, 15 certified and attacked points each; the networks of each setting
#: trained as one model, each family and setting certified and attacked in one job.
TINY_RUN = {
    "datasets": ["mnist5k"],
    "model": {"hidden": 16},
    "train": {
        "epochs": 1,
        "settings": ["plain", "augment", "adversarial"],
        "grid": {
            "none": {"lr": [0.2], "lambda": [0.0]},
            "weight_decay": {"lr": [0.2], "lambda": [1.0e-4]},
            "dropout": {"lr": [0.2], "keep_hidden": [0.5]},
            "cross_lipschitz": {"lr": [0.2], "lambda": [1.0e-3]},
        },
    },
    "kernel": {
        "n_centers": 60,
        "max_iter": 20,
        "grid": {
            "kernel_logreg": {"a": [1.0], "lambda": [0.0, 1.0e-4]},
            "kernel_cl": {"a": [1.0], "lambda": [0.1]},
        },
    },
    # every model of a family and setting certified (attacked) in one job: the batched
    # path of the evaluation, and 8 jobs instead of 30
    "certify": {"n_points": 15, "batch_models": True},
    # a short minimal-norm attack (the default budget's walks are most of the run's attack
    # time): the pipeline, not the attack's strength, is what these runs test
    "attack": {
        "n_points": 15,
        "batch_models": True,
        "min_norm_steps": 20,
        "min_norm_targets": 1,
        "min_norm_restarts": 1,
    },
}
#: One thread per job: two jobs run at once on the 2 cores (and every run of a model uses
#: the same number of threads, so that its floating-point results are reproducible). Last
#: on a command line: --set-threads takes every argument after it.
THREADS = ["--set-threads", "train=1", "certify=1", "attack=1"]


def planned_jobs(output: str) -> set[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run (``-n``) lists."""
    return {(job["rule"], job["wildcards"]) for job in dry_run_jobs(output)}


def finished_rules(output: str) -> Counter:
    return Counter(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", output))


OUTPUT_DIRS = ("data", "models", "certify", "attack", "examples", "instances", "tables")


def read_output(path: Path) -> None:
    """Read a workflow output completely; raises on a half-written file."""
    if path.suffix == ".parquet":
        pq.read_table(path)
    elif path.suffix == ".json":
        json.loads(path.read_text())
    elif path.suffix == ".pt":
        load_model(path)
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            for k in z.files:
                z[k]
    elif path.suffix == ".csv":
        pd.read_csv(path)


class Watcher(threading.Thread):
    """Reads every output the moment it appears under its final name, while the workflow
    runs: a half-written output would fail to parse."""

    def __init__(self, results: Path):
        super().__init__(daemon=True)
        self.results, self.seen, self.broken = results, set(), []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.scan()
            time.sleep(0.02)
        self.scan()

    def scan(self) -> None:
        for sub in OUTPUT_DIRS:
            for p in (self.results / sub).rglob("*") if (self.results / sub).exists() else []:
                if p.name.startswith(".") or not p.is_file() or p in self.seen:
                    continue
                self.seen.add(p)
                try:
                    read_output(p)
                except Exception as exc:  # any parse error is the finding
                    self.broken.append(f"{p}: {exc!r}")


def run_load(work: Path) -> tuple:
    plan = snakemake(work, "-n", config=SWEEP)
    assert plan.returncode == 0, plan.stderr
    watcher = Watcher(work / "results")
    watcher.start()
    t0 = time.monotonic()
    proc = snakemake(work, "--cores", "2", *THREADS)
    seconds = time.monotonic() - t0
    watcher.stop.set()
    watcher.join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (
        work,
        planned_jobs(plan.stdout),
        finished_rules(proc.stdout + proc.stderr),
        watcher,
        seconds,
    )


#: One cross-Lipschitz model, 5 jobs of a few seconds each and the tables: the run that the
#: rerun tests change and the resume tests interrupt (tests/test_rerun.py, test_resume.py).
ONE_MODEL = {
    "datasets": ["mnist5k"],
    "model": {"hidden": 16},
    "train": {"epochs": 2, "grid": {"cross_lipschitz": {"lr": [0.2], "lambda": [1.0e-3]}}},
    "kernel": {"grid": {}},
    "certify": {"n_points": 10},
    # a short minimal-norm attack, as TINY_RUN's: these runs test the pipeline
    "attack": {
        **{"n_points": 10, "refine_steps": 0, "min_norm_steps": 20},
        **{"min_norm_targets": 1, "min_norm_restarts": 1},
    },
}
ONE_MODEL_ID = "cross_lipschitz-lr0.2-lam0.001-seed0"
#: The rules of a ONE_MODEL run that are `localrules` with the default
#: ``local_aggregation: true`` (workflow/rules/aggregate.smk: seconds each, they run where
#: Snakemake runs): the per-model join, the summary, the tables and the figures.
LOCAL_RULES = frozenset(
    {
        "instances",
        "summary",
        "table1",
        "figure_adversarial",
        "figure_bounds",
        "figure_bracket",
        "figure_certified_accuracy",
        "figure_training",
    }
)


def run_one_model(work: Path) -> Path:
    """ONE_MODEL run to the end in ``work`` (``--cores 2``, one thread per job: THREADS);
    afterwards no lock file is left and nothing is to be done."""
    from crosslip.jobs.runlock import snakemake_lock_files

    proc = snakemake(work, "--cores", "2", *THREADS, config=ONE_MODEL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not snakemake_lock_files(work)
    again = snakemake(work, "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    return work


def run_tiny(work: Path) -> Path:
    """TINY_RUN run to the end in ``work`` (``--cores 2``, one thread per job: its jobs are
    mostly start-up, so two at once take about two thirds of the time of one at a time
    with two threads). What the run printed on its standard output is kept in
    ``work/run-stdout.txt``."""
    proc = snakemake(work, "--cores", "2", *THREADS, config=TINY_RUN, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (work / "run-stdout.txt").write_text(proc.stdout)
    return work
