"""Load: a workflow of 32 jobs, two at a time on 2 cores, loses and duplicates no row."""

from __future__ import annotations

import pandas as pd
import pytest

from crosslip.io.files import read_json
from crosslip.models.checkpoints import load_model
from crosslip.report.tables import add_diverged, summarize

from .helpers import fields
from .workflow_helpers import (
    BASE,
    DIVERGED,
    changed,
    snakemake,
    temporaries,
)

# --------------------------------------------------------------------------------------
# 6. load: 32 jobs on 2 cores, no lost or duplicated rows; a diverging model in the sweep
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_many_jobs_on_two_cores_lose_and_duplicate_no_row(load_run):
    work, plan, ran, watcher, _ = load_run
    models = sorted({fields(wc)["model"] for rule, wc in plan if rule == "train"})
    assert len(models) == 6 and sum(ran.values()) == len(plan) >= 30
    assert ran["train"] == ran["certify"] == ran["attack"] == ran["instances"] == 6
    df = pd.read_parquet(work / "results" / "instances")
    ok = [m for m in models if m != DIVERGED]
    expected = {(m, i) for m in ok for i in range(1000)}  # n_points 1000: all test points
    got = list(zip(df["model_id"], df["test_index"], strict=True))
    assert len(got) == len(set(got)) == len(ok) * 1000  # no duplicate
    assert set(got) == expected  # none missing, none extra
    attacked = df[df["attack_success"].notna()].groupby("model_id")["test_index"].nunique()
    assert (attacked == 5).all() and sorted(attacked.index) == ok  # attack.n_points each
    assert len(expected) - len(set(got) & expected) == 0  # rows lost
    assert sorted(p.stem for p in (work / "results/instances/mnist5k").glob("*.parquet")) == models
    assert watcher.seen and watcher.broken == []  # no output was ever visible half-written
    assert temporaries(work / "results") == []  # and no temporary was left behind


@pytest.mark.slow
def test_a_diverging_model_is_recorded_and_the_sweep_continues(load_run):
    work, *_ = load_run
    res = work / "results"
    met = read_json(res / "models" / "mnist5k" / DIVERGED / "metrics.json")
    assert met["status"] == "diverged" and met["test_error"] is None
    load_model(res / "models" / "mnist5k" / DIVERGED / "model.pt")  # still a valid file
    assert pd.read_parquet(res / "instances" / "mnist5k" / f"{DIVERGED}.parquet").empty
    summary = pd.read_csv(res / "tables" / "summary.csv").set_index("model_id")
    assert len(summary) == 6
    assert summary.loc[DIVERGED, "status"] == "diverged" and summary.loc[DIVERGED, "n_eval"] == 0
    others = summary.drop(index=DIVERGED)
    assert (others["status"] == "ok").all() and (others["n_eval"] == 1000).all()
    assert others["test_error"].between(0, 1).all()
    assert (res / "tables" / "table1_global_local.csv").exists()
    assert (res / "figures" / "adversarial_samples.png").exists()
    # the summary agrees with the per-instance rows it was made from
    df = pd.read_parquet(res / "instances")
    again = add_diverged(
        summarize(df), [read_json(p) for p in sorted((res / "models").rglob("metrics.json"))]
    )
    assert sorted(again["model_id"]) == sorted(summary.index)


@pytest.mark.slow
def test_a_grid_value_of_a_million_or_more_gives_a_runnable_model(tmp_path):
    proc = snakemake(tmp_path, "-n", config=changed(BASE, train__grid__none__lr=[1.0e6]))
    assert proc.returncode == 0, proc.stderr
    assert "none-lr1e+06-lam0-seed0" in proc.stdout
