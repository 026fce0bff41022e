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

#: Guarantee columns of the per-instance results that the summary averages.
MEAN_COLUMNS = [
    "guarantee_local", "guarantee_global", "ratio_global_local", "guarantee_l2", "guarantee_l1",
    "guarantee_linf", "guarantee_l2_box", "guarantee_l1_box", "guarantee_linf_box",
]  # fmt: skip
SUMMARY_COLUMNS = [
    "dataset", "model_id", "regularizer", "lr", "lam", "seed", "status", "test_error",
    "n_eval", "n_correct", *[f"mean_{c}" for c in MEAN_COLUMNS], "mean_upper_bound",
    "attack_success_rate",
]  # fmt: skip
TABLE1_COLUMNS = ["dataset", "regularizer", "model_id", "test_error", "n_correct",
                  "mean_ratio_global_local", "mean_ratio_all_models"]  # fmt: skip

REG_STYLE = {
    "none": ("tab:gray", "o"),
    "weight_decay": ("tab:blue", "s"),
    "dropout": ("tab:green", "^"),
    "cross_lipschitz": ("tab:red", "D"),
    "kernel_logreg": ("tab:purple", "v"),
    "kernel_cl": ("tab:orange", "P"),
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
                **{f"mean_{c}": ok[c].mean() for c in MEAN_COLUMNS},
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


def table1(summary: pd.DataFrame) -> pd.DataFrame:
    """Table 1 of the paper: the mean ratio ``alpha_global / alpha_local`` of the L2
    guarantees (global constant vs Proposition 2.3) per dataset and regularizer, for the
    model with the lowest test error of that regularizer (the paper reports the best
    parameters), next to the mean over all its models. Means over correctly classified
    points with a positive local guarantee."""
    ok = summary[(summary["status"] == "ok") & summary["mean_ratio_global_local"].notna()]
    rows = []
    for (ds, reg), g in ok.groupby(["dataset", "regularizer"], sort=True):
        best = g.sort_values(["test_error", "model_id"]).iloc[0]
        rows.append({
            "dataset": ds, "regularizer": reg, "model_id": best["model_id"],
            "test_error": best["test_error"], "n_correct": best["n_correct"],
            "mean_ratio_global_local": best["mean_ratio_global_local"],
            "mean_ratio_all_models": g["mean_ratio_global_local"].mean(),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=TABLE1_COLUMNS)


def write_tables(table: pd.DataFrame, csv: Path | str, md: Path | str) -> None:
    """Write a table as CSV and as Markdown (atomically)."""
    with atomic_path(csv) as tmp:
        table.to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        tmp.write_text(table.to_markdown(index=False, floatfmt=".4g") + "\n")


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
