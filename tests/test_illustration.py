"""The illustration of adversarial samples (Section 5): kernel and network columns on the same
test points, each point correctly classified by every model shown; from one config (one
results folder) through Snakemake, and the choice of columns and points on its own."""

from __future__ import annotations

import subprocess

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from crosslip.report.illustration import (
    ILLUSTRATION_COLUMNS,
    common_correct_points,
    illustration_models,
    plot_adversarial_samples,
)

from .helpers import ROOT, snakemake_cmd
from .workflow_helpers import THREADS

PNG, PDF = b"\x89PNG", b"%PDF"


def example(preds, labels, first_index=0, d=4):
    """Stored candidates of one model: test points first_index.. with these predictions."""
    n = len(preds)
    return {
        "test_index": np.arange(first_index, first_index + n),
        "label": np.asarray(labels),
        "pred": np.asarray(preds),
        "adv_class": (np.asarray(preds) + 1) % 3,
        "x": np.full((n, d), 0.5, dtype=np.float32),
        "delta": np.full((n, d), 0.1),
        "adv": np.full((n, d), 0.6),
        "norm": np.full(n, 0.2),
        "success": np.ones(n, dtype=bool),
        "shape": np.array([2, 2]),
        "class_names": np.array(["a", "b", "c"]),
    }


def summary_row(model_id, regularizer, test_error, lam=1e-3, setting="plain"):
    return {
        "dataset": "toy",
        "model_id": model_id,
        "family": "kernel" if regularizer.startswith("kernel") else "mlp",
        "regularizer": regularizer,
        "lam": lam,
        "setting": setting,
        "status": "ok",
        "test_error": test_error,
    }


LABELS = [0, 1, 2, 0, 1, 2, 0, 1]


def test_points_are_those_every_model_classifies_correctly():
    examples = {
        "k": example([0, 1, 0, 0, 1, 2, 0, 1], LABELS),  # wrong at 2
        "n": example([1, 1, 2, 0, 1, 0, 0, 1], LABELS),  # wrong at 0 and 5
        "m": example(LABELS, LABELS),
    }
    assert common_correct_points(examples, ["k", "n", "m"], 3) == [1, 3, 4]
    assert common_correct_points(examples, ["k", "n", "m"], 10) == [1, 3, 4, 6, 7]
    assert common_correct_points(examples, ["m"], 2) == [0, 1]
    assert common_correct_points(examples, ["k", "n"], 0) == []
    # a model with fewer candidates limits the choice to the common ones
    examples["short"] = example(LABELS[:4], LABELS[:4])
    assert common_correct_points(examples, ["k", "n", "short"], 5) == [1, 3]
    # models attacked on other points cannot be shown side by side
    examples["other"] = example(LABELS, LABELS, first_index=100)
    with pytest.raises(ValueError, match="different test points"):
        common_correct_points(examples, ["k", "other"], 2)


def test_columns_are_the_best_model_per_method_kernels_first():
    summary = pd.DataFrame(
        [
            summary_row("wd-a", "weight_decay", 0.05),
            summary_row("wd-b", "weight_decay", 0.03),
            summary_row("wd-aug", "weight_decay", 0.01, setting="augment"),
            summary_row("cl", "cross_lipschitz", 0.04),
            summary_row("klr-0", "kernel_logreg", 0.01, lam=0.0),  # No Reg.: its own method
            summary_row("klr", "kernel_logreg", 0.02, lam=1e-6),
            summary_row("kcl", "kernel_cl", 0.03, lam=0.1),
            summary_row("no-samples", "dropout", 0.001),
        ]
    )
    examples = {m: example(LABELS, LABELS) for m in summary["model_id"] if m != "no-samples"}
    assert illustration_models(summary, examples, "toy") == [
        ("kernel_logreg", "klr"),
        ("kernel_cl", "kcl"),
        ("weight_decay", "wd-b"),
        ("cross_lipschitz", "cl"),
        ("kernel_noreg", "klr-0"),
    ]


def test_figure_shows_only_points_correct_for_every_model(tmp_path):
    summary = pd.DataFrame(
        [summary_row("kcl", "kernel_cl", 0.02, lam=0.1), summary_row("cl", "cross_lipschitz", 0.03)]
    )
    examples = {
        ("toy", "kcl"): example([1, 1, 2, 0, 1, 2, 0, 1], LABELS),  # wrong at 0
        ("toy", "cl"): example([0, 1, 1, 0, 1, 2, 0, 1], LABELS),  # wrong at 2
    }
    png, pdf, csv = tmp_path / "a.png", tmp_path / "a.pdf", tmp_path / "a.csv"
    record = plot_adversarial_samples(summary, examples, png, pdf, n_points=2, csv=csv)
    assert png.read_bytes()[:4] == PNG and pdf.read_bytes()[:4] == PDF
    written = pd.read_csv(csv)
    assert list(written.columns) == ILLUSTRATION_COLUMNS and len(written) == 4
    assert sorted(set(written["test_index"])) == [1, 3]
    assert (written["pred"] == written["label"]).all()
    assert list(record["method"].unique()) == ["kernel_cl", "cross_lipschitz"]


def test_examples_without_labels_are_refused(tmp_path):
    from crosslip.report.illustration import load_examples

    path = tmp_path / "toy" / "m.npz"
    path.parent.mkdir()
    ex = example(LABELS, LABELS)
    del ex["label"]
    np.savez(path, **ex)
    with pytest.raises(ValueError, match="without the true labels"):
        load_examples([str(path)])


#: Networks and Gaussian-kernel models in one results folder, the best per method certified.
ILLUSTRATION = {
    "datasets": ["mnist5k"],
    "model": {"hidden": 16},
    "train": {
        "epochs": 2,
        "grid": {
            "weight_decay": {"lr": [0.2], "lambda": [1.0e-4, 1.0e-3]},
            "cross_lipschitz": {"lr": [0.2], "lambda": [1.0e-3]},
        },
    },
    "kernel": {
        "n_centers": 40,
        "max_iter": 20,
        "grid": {
            "kernel_logreg": {"a": [1.0], "lambda": [1.0e-6]},
            "kernel_cl": {"a": [1.0], "lambda": [0.1]},
        },
    },
    "certify": {"models": "best", "n_points": 25, "kinds": ["local"]},
    "attack": {
        "n_points": 25,
        "norms": ["l2"],
        "refine_steps": 0,
        "n_examples": 3,
        "example_candidates": 25,
    },
}


@pytest.mark.slow
def test_one_config_draws_kernel_and_network_columns_on_common_correct_points(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(ILLUSTRATION))
    target = "results/figures/adversarial_samples.png"
    cfg = tmp_path / "config.yaml"
    cmd = snakemake_cmd(tmp_path, "--cores", "2", target, *THREADS, configfile=cfg)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = tmp_path / "results" / "figures"
    assert (figures / "adversarial_samples.png").read_bytes()[:4] == PNG
    assert (figures / "adversarial_samples.pdf").read_bytes()[:4] == PDF
    shown = pd.read_csv(figures / "adversarial_samples.csv")
    # one column per method, kernels first; the best network of the two weight decays
    summary = pd.read_csv(tmp_path / "results" / "tables" / "summary.csv")
    best_wd = (
        summary[summary["regularizer"] == "weight_decay"]
        .sort_values(["test_error", "model_id"])["model_id"]
        .iloc[0]
    )
    methods = shown.drop_duplicates("model_id")[["method", "model_id"]].values.tolist()
    assert [m for m, _ in methods] == [
        "kernel_logreg",
        "kernel_cl",
        "weight_decay",
        "cross_lipschitz",
    ]
    assert dict(methods)["weight_decay"] == best_wd
    # the same test points for every model, as many as asked for
    points = shown.groupby("model_id")["test_index"].apply(list)
    assert all(p == points.iloc[0] for p in points) and len(points.iloc[0]) == 3
    # each point correctly classified by every model shown: in the stored samples and in
    # the certification's per-instance results of the same model
    assert (shown["pred"] == shown["label"]).all()
    for model_id, rows in shown.groupby("model_id"):
        inst = pq.read_table(
            tmp_path / "results" / "instances" / "mnist5k" / f"{model_id}.parquet"
        ).to_pandas()
        inst = inst.set_index("test_index").loc[rows["test_index"]]
        assert inst["correct"].all(), model_id
        assert (inst["pred"].to_numpy() == rows["pred"].to_numpy()).all(), model_id
        assert (inst["label"].to_numpy() == rows["label"].to_numpy()).all(), model_id
