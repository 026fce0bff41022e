"""Aggregation of the per-instance results into tables and figures (Section 5).

Means of guarantees and upper bounds are taken over the *correctly classified* evaluated
points (a guarantee certifies the decision, which is only worth certifying when right);
``attack_success_rate`` is over the same points, and ``mean_upper_bound`` averages the
successful attacks only. A diverged model keeps its row with status ``diverged`` and empty
means.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from .io import atomic_path

SUMMARY_COLUMNS = [
    "dataset", "model_id", "regularizer", "lr", "lam", "seed", "status", "test_error",
    "n_eval", "n_correct", "mean_guarantee_local", "mean_guarantee_global",
    "mean_ratio_global_local", "mean_upper_bound", "attack_success_rate",
]  # fmt: skip

REG_STYLE = {
    "none": ("tab:gray", "o"),
    "weight_decay": ("tab:blue", "s"),
    "dropout": ("tab:green", "^"),
    "cross_lipschitz": ("tab:red", "D"),
}


def summarize(instances: pd.DataFrame) -> pd.DataFrame:
    """One row per model: test error and mean bounds (see module docstring)."""
    keys = ["dataset", "model_id", "regularizer", "lr", "lam", "seed", "status", "test_error"]
    rows = []
    for key, g in instances.groupby(keys, dropna=False, sort=True):
        ok = g[g["correct"].fillna(False).astype(bool)]
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                "n_eval": len(g),
                "n_correct": len(ok),
                "mean_guarantee_local": ok["guarantee_local"].mean(),
                "mean_guarantee_global": ok["guarantee_global"].mean(),
                "mean_ratio_global_local": ok["ratio_global_local"].mean(),
                "mean_upper_bound": ok["upper_bound"].mean(),
                "attack_success_rate": ok["attack_success"].mean() if len(ok) else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def add_diverged(summary: pd.DataFrame, metrics: list[dict]) -> pd.DataFrame:
    """Add a row for every model without instances (e.g. diverged), so none is dropped."""
    have = set(zip(summary["dataset"], summary["model_id"], strict=True))
    extra = []
    for m in metrics:
        if (m["dataset"], m["model_id"]) in have:
            continue
        cfg = m["config"]
        extra.append({
            "dataset": m["dataset"], "model_id": m["model_id"],
            "regularizer": cfg["regularizer"], "lr": cfg["lr"], "lam": cfg["lam"],
            "seed": cfg["seed"], "status": m["status"], "test_error": m["test_error"],
            "n_eval": 0, "n_correct": 0,
        })  # fmt: skip
    if not extra:
        return summary
    return pd.concat([summary, pd.DataFrame(extra)], ignore_index=True)[SUMMARY_COLUMNS]


def write_tables(summary: pd.DataFrame, csv: Path | str, md: Path | str) -> None:
    """Write the summary as CSV and as a Markdown table (atomically)."""
    with atomic_path(csv) as tmp:
        summary.to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        tmp.write_text(summary.to_markdown(index=False, floatfmt=".4g") + "\n")


def plot_bounds_vs_error(summary: pd.DataFrame, png: Path | str, pdf: Path | str) -> None:
    """Section 5 figure: mean L2 upper bound and mean L2 guarantee against test error,
    one marker per model, colour and shape per regularizer, one row per dataset."""
    data = summary[summary["status"] == "ok"]
    datasets = sorted(summary["dataset"].unique()) or ["(none)"]
    fig, axes = plt.subplots(len(datasets), 2, figsize=(10, 4 * len(datasets)), squeeze=False)
    for row, ds in zip(axes, datasets, strict=True):
        sub = data[data["dataset"] == ds]
        for ax, col, title in (
            (row[0], "mean_upper_bound", "Adversarial resistance (upper bound), $L_2$"),
            (row[1], "mean_guarantee_local", "Robustness guarantee (lower bound), $L_2$"),
        ):
            for reg, g in sub.groupby("regularizer"):
                color, marker = REG_STYLE.get(reg, ("black", "x"))
                ax.scatter(100 * g["test_error"], g[col], c=color, marker=marker, label=reg, s=40)
            ax.set_xlabel("test error (%)")
            ax.set_ylabel(col.replace("_", " "))
            ax.set_title(f"{ds}: {title}", fontsize=10)
            ax.grid(alpha=0.3)
            if len(sub):
                ax.legend(fontsize=8)
    fig.tight_layout()
    for path in (png, pdf):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=Path(path).suffix[1:], dpi=120)
    plt.close(fig)
