"""Pipeline stages without Snakemake: a diverged model keeps its row, files are atomic."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from crosslip.data import Dataset, save_prepared
from crosslip.io import write_json
from crosslip.models import SoftplusNet, save_model
from crosslip.pipeline import (
    INSTANCE_SCHEMA,
    attack_stage,
    certify_stage,
    eval_indices,
    instances_stage,
)
from crosslip.report import add_diverged, summarize


def tiny_dataset(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(40, 6)) / 255).astype(np.float32)
    y = rng.integers(0, 3, size=40).astype(np.int64)
    ds = Dataset("toy", x[:30], y[:30], x[30:], y[30:], (6,), 3)
    save_prepared(ds, tmp_path / "toy.npz")
    return tmp_path / "toy.npz"


def run_stages(tmp_path, status):
    data = tiny_dataset(tmp_path)
    net = SoftplusNet(6, 3, hidden=4)
    save_model(net, tmp_path / "model.pt")
    cfg = {"regularizer": "none", "lr": 0.1, "lam": 0.0, "seed": 0}
    metrics = {"status": status, "dataset": "toy", "model_id": "m", "config": cfg,
               "test_error": None if status != "ok" else 0.5}  # fmt: skip
    write_json(metrics, tmp_path / "metrics.json")
    certify_stage(data, tmp_path / "model.pt", tmp_path / "metrics.json", tmp_path / "c.parquet",
                  n_points=6, rtol=1e-3)  # fmt: skip
    attack_stage(data, tmp_path / "model.pt", tmp_path / "metrics.json", tmp_path / "a.parquet",
                 n_points=6, rtol=1e-3, max_steps=20)  # fmt: skip
    df = instances_stage(tmp_path / "c.parquet", tmp_path / "a.parquet",
                         tmp_path / "metrics.json", "m", tmp_path / "i.parquet")  # fmt: skip
    return df, metrics


def test_stages_write_the_instance_schema(tmp_path):
    df, _ = run_stages(tmp_path, "ok")
    table = pq.read_table(tmp_path / "i.parquet")
    assert table.schema.equals(INSTANCE_SCHEMA, check_metadata=False)
    assert len(df) == 6 and list(df["test_index"]) == list(eval_indices(10, 6))
    ok = df["attack_success"]
    assert (df.loc[ok, "upper_bound"] >= df.loc[ok, "guarantee_local"]).all()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_diverged_model_has_no_instances_but_keeps_its_summary_row(tmp_path):
    df, metrics = run_stages(tmp_path, "diverged")
    assert len(df) == 0
    assert pq.read_table(tmp_path / "i.parquet").schema.equals(INSTANCE_SCHEMA,
                                                               check_metadata=False)  # fmt: skip
    summary = add_diverged(summarize(df), [metrics])
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["status"] == "diverged" and row["n_eval"] == 0


def test_eval_indices_are_a_fixed_sorted_subset():
    a = eval_indices(1000, 200)
    assert len(a) == 200 and np.all(np.diff(a) > 0) and np.array_equal(a, eval_indices(1000, 200))
    assert np.array_equal(eval_indices(50, 200), np.arange(50))
