"""The summary of the per-instance results and the tables (Section 5).

Means of guarantees and upper bounds are taken over the *correctly classified* evaluated
points (a guarantee certifies the decision, which is only worth certifying when right);
``attack_success_rate`` is over the same points, and ``mean_upper_bound`` (and every other
upper-bound mean) averages the successful attacks only; ``max_ratio_global_local`` and
``n_global_above_local`` are taken over the same points. ``share_best_l2_<method>`` is how
often each L2 method (:data:`~crosslip.results_schema.L2_UPPER_METHODS`) gave the smallest
verified upper bound, over the same points where one did. ``share_exact_<norm>`` is the
share of the same points whose best certificate is within 1% of the best upper bound
(:func:`crosslip.certified_accuracy.share_exact`). A diverged model keeps its row with
status ``diverged`` and empty means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..certified_accuracy import (
    DEFAULT_RADII,
    accuracy_columns,
    accuracy_row,
    evaluated,
    share_exact,
)
from ..io.files import atomic_path
from ..norms import NORMS
from ..results_schema import (
    L2_UPPER_METHODS,
    MEAN_COLUMNS,
    MODEL_KEYS,
    UPPER_COLUMNS,
    model_keys,
)

SUMMARY_COLUMNS = [
    *MODEL_KEYS,
    "n_eval",
    "n_correct",
    "n_certified",
    *[f"mean_{c}" for c in MEAN_COLUMNS],
    "mean_upper_bound",
    "attack_success_rate",
    *[f"mean_{c}" for c in UPPER_COLUMNS],
    *[f"share_best_l2_{m}" for m in L2_UPPER_METHODS],
    "max_ratio_global_local",
    "n_global_above_local",
    *[f"share_exact_{norm}" for norm in NORMS],
]
TABLE1_COLUMNS = [
    "dataset",
    "setting",
    "regularizer",
    "model_id",
    "test_error",
    "n_correct",
    "mean_ratio_global_local",
    "mean_ratio_all_models",
]
KERNEL_TABLE_COLUMNS = [
    "dataset",
    "method",
    "model_id",
    "kernel_a",
    "lam",
    "test_error",
    "n_correct",
    "mean_upper_bound",
    "mean_upper_bound_linf",
    "mean_guarantee_local",
    "attack_success_rate",
]


def _n_global_above_local(ok: pd.DataFrame) -> float:
    """Section 5 found the global guarantee "always worse" than the local one: the number of
    points where ``guarantee_global > guarantee_local`` (NaN when no point has both)."""
    both = ok[["guarantee_global", "guarantee_local"]].dropna()
    if not len(both):
        return np.nan
    return float((both["guarantee_global"] > both["guarantee_local"]).sum())


def _best_shares(ok: pd.DataFrame) -> dict[str, float]:
    """How often each L2 method gave the smallest verified upper bound, over the points of
    ``ok`` where one did (NaN when none did)."""
    best = ok["upper_bound_l2_best_method"].dropna()
    return {
        f"share_best_l2_{m}": (best == m).mean() if len(best) else float("nan")
        for m in L2_UPPER_METHODS
    }


def summarize(
    instances: pd.DataFrame, radii: Mapping[str, Sequence[float]] | None = None
) -> pd.DataFrame:
    """One row per model: test error and mean bounds (see module docstring), then the
    certified accuracy and its attack bound at each radius of ``radii`` (norm -> radii;
    default: the schema's ``certify.radii``; :mod:`crosslip.certified_accuracy`)."""
    radii = DEFAULT_RADII if radii is None else radii
    rows = []
    for key, g in instances.groupby(MODEL_KEYS, dropna=False, sort=True):
        ok = g[g["correct"].fillna(False).astype(bool)]
        rows.append(
            {
                **dict(zip(MODEL_KEYS, key, strict=True)),
                "n_eval": len(g),
                "n_correct": len(ok),
                "n_certified": len(evaluated(g)),
                **{f"mean_{c}": ok[c].mean() for c in MEAN_COLUMNS},
                "mean_upper_bound": ok["upper_bound"].mean(),
                "attack_success_rate": ok["attack_success"].mean() if len(ok) else float("nan"),
                **{f"mean_{c}": ok[c].mean() for c in UPPER_COLUMNS},
                **_best_shares(ok),
                "max_ratio_global_local": ok["ratio_global_local"].max(),
                "n_global_above_local": _n_global_above_local(ok),
                **{f"share_exact_{norm}": share_exact(g, norm) for norm in NORMS},
                **accuracy_row(g, radii),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS + accuracy_columns(radii))


def add_diverged(summary: pd.DataFrame, metrics: list[dict]) -> pd.DataFrame:
    """Add a row for every model without instances (e.g. diverged), so none is dropped."""
    have = set(zip(summary["dataset"], summary["model_id"], strict=True))
    extra = []
    for m in metrics:
        if (m["dataset"], m["model_id"]) in have:
            continue
        extra.append(
            {**model_keys(m, m["model_id"]), "n_eval": 0, "n_correct": 0, "n_certified": 0}
        )
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
    ok = ok[ok["family"] == "mlp"]
    rows = []
    for (ds, setting, reg), g in ok.groupby(["dataset", "setting", "regularizer"], sort=True):
        best = g.sort_values(["test_error", "model_id"]).iloc[0]
        rows.append(
            {
                "dataset": ds,
                "setting": setting,
                "regularizer": reg,
                "model_id": best["model_id"],
                "test_error": best["test_error"],
                "n_correct": best["n_correct"],
                "mean_ratio_global_local": best["mean_ratio_global_local"],
                "mean_ratio_all_models": g["mean_ratio_global_local"].mean(),
            }
        )
    return pd.DataFrame(rows, columns=TABLE1_COLUMNS)


def kernel_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The kernel table of Section 5: per dataset, the Gaussian-kernel model with the lowest
    test error of each regularizer (K-LogReg, K-CL), and, where the grid holds Kernel-LogReg
    with lambda = 0, the best unregularized one ("No Reg."); its test error, mean L2 upper
    bound (the paper's search, Section 4) and mean L2 guarantee (Proposition 2.2)."""
    ok = summary[(summary["status"] == "ok") & (summary["family"] == "kernel")]
    rows = []
    groups = [
        ("No Reg.", ok[(ok["regularizer"] == "kernel_logreg") & (ok["lam"] == 0)]),
        ("K-LogReg", ok[(ok["regularizer"] == "kernel_logreg") & (ok["lam"] > 0)]),
        ("K-CL", ok[ok["regularizer"] == "kernel_cl"]),
    ]
    for ds in sorted(set(ok["dataset"])):
        for method, g in groups:
            g = g[g["dataset"] == ds]
            if not len(g):
                continue
            best = g.sort_values(["test_error", "model_id"]).iloc[0]
            rows.append(
                {"method": method, **{c: best[c] for c in KERNEL_TABLE_COLUMNS if c != "method"}}
            )
    return pd.DataFrame(rows, columns=KERNEL_TABLE_COLUMNS)


def read_summary(path: Path | str) -> pd.DataFrame:
    """Read ``tables/summary.csv`` back with its column types."""
    return pd.read_csv(
        path,
        dtype={
            "dataset": str,
            "model_id": str,
            "family": str,
            "regularizer": str,
            "setting": str,
            "status": str,
        },
    )


def write_tables(
    table: pd.DataFrame, csv: Path | str, md: Path | str, tex: Path | str | None = None
) -> None:
    """Write a table as CSV, Markdown and (optionally) a LaTeX ``tabular`` (atomically)."""
    with atomic_path(csv) as tmp:
        table.to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        tmp.write_text(table.to_markdown(index=False, floatfmt=".4g") + "\n")
    if tex is not None:
        with atomic_path(tex) as tmp:
            tmp.write_text(
                table.to_latex(index=False, float_format="%.4g", na_rep="--", escape=True)
            )
