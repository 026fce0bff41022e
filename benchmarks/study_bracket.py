"""Study: how much of the bracket [guarantee, best upper bound] each certificate closes.

Reads the per-instance results of a finished workflow run (``--results``, its
``instances/<dataset>/*.parquet``: certified with the certificates beyond the paper and
attacked with every L2 upper bound) and, per one-hidden-layer network, over its correctly
classified points:

* the mean L2 guarantee of each certificate: the paper's (Proposition 2.3,
  ``guarantee_local``), Theorem 2.1 with the tightest bound (``guarantee_l2``), integrated
  along the ray, the linear relaxation, the curvature bound, and the best per point;
* the mean best verified upper bound (``upper_bound_l2_best``) and the bracket
  ``best upper bound / guarantee`` for the paper's guarantee and for each certificate (ratios
  of the means, as the guarantee-gap study measured 3.37 for Cross-Lipschitz);
* the share of the paper's bracket each certificate closes, on a log scale:
  ``log(guarantee / paper's) / log(upper bound / paper's)`` (0: nothing, 1: all of it);
* how often each certificate gives the best guarantee (``guarantee_l2_best_method``);
* in every norm (L2, L1, Linf): the mean best certificate of the ball and of the ball in
  the box ``[0, 1]^d``, the mean best upper bound (every attack keeps its samples in the
  box), the bracket of each (the box's is the one of the minimal perturbation that the
  attacks search; the ball's also holds, as the box's samples lie in the ball), and the
  share of points where the box's certificate meets the upper bound within 1%
  (``exact_<norm>``).

Run: ``.venv/bin/python benchmarks/study_bracket.py --results results/mnist5k-200-cpu
--out docs/reproduction/studies/guarantee-gap/mnist5k-200ep-bracket.json``; the last line is
one JSON object. No torch: it reads the results only.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from _harness import finish, parser
from crosslip.certified_accuracy import (
    best_guarantee,
    best_upper_bound,
    bracket_guarantee,
    share_exact,
)
from crosslip.device import describe_machine
from crosslip.norms import NORMS
from crosslip.results_schema import L2_GUARANTEE_METHODS

#: The certificates of the study and their columns, the paper's first.
CERTIFICATES = {**L2_GUARANTEE_METHODS, "best": "guarantee_l2_best"}


def arguments() -> argparse.ArgumentParser:
    """The study's options (module docstring)."""
    ap = parser(__doc__, torch_options=False)
    ap.add_argument("--results", type=Path, required=True, help="a finished run's results")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return ap


def network_row(df: pd.DataFrame) -> dict:
    """The study's figures of one network's per-instance results (module docstring)."""
    ok = df[df["correct"].astype(bool)]
    upper = float(ok["upper_bound_l2_best"].mean())
    paper = float(ok["guarantee_local"].mean())
    row = {
        "network": df["model_id"].iloc[0],
        "dataset": df["dataset"].iloc[0],
        "regularizer": df["regularizer"].iloc[0],
        "test_error": float(df["test_error"].iloc[0]),
        "n_correct": len(ok),
        "mean_upper_bound_best": upper,
    }
    for name, col in CERTIFICATES.items():
        mean = float(ok[col].mean()) if col in ok else math.nan
        row[f"mean_{name}"] = mean
        row[f"bracket_{name}"] = upper / mean if mean > 0 else math.nan
        closed = math.log(mean / paper) / math.log(upper / paper) if upper > paper > 0 else 0
        row[f"closed_{name}"] = closed if mean > 0 else math.nan
    best = ok["guarantee_l2_best_method"].dropna()
    for name in L2_GUARANTEE_METHODS:
        row[f"share_best_{name}"] = float((best == name).mean()) if len(best) else math.nan
    for norm in NORMS:  # every norm's best certificate against its best upper bound
        cert, up = best_guarantee(ok, norm), best_upper_bound(ok, norm)
        row[f"mean_best_{norm}"] = float(cert.mean())
        row[f"mean_upper_bound_{norm}"] = float(up.mean())
        row[f"bracket_best_{norm}"] = (
            float(up.mean() / cert.mean()) if cert.mean() > 0 else math.nan
        )
        box = bracket_guarantee(ok, norm)
        row[f"mean_best_box_{norm}"] = float(box.mean())
        row[f"bracket_box_{norm}"] = float(up.mean() / box.mean()) if box.mean() > 0 else math.nan
        row[f"share_exact_{norm}"] = share_exact(df, norm)
    return row


def mlp_frames(results: Path, setting: str | None = None) -> list[pd.DataFrame]:
    """The per-instance results of every one-hidden-layer network of a finished run that
    was certified with the certificates beyond the paper (of ``setting`` only, if given)."""
    files = sorted((results / "instances").glob("*/*.parquet"))
    if not files:
        raise SystemExit(f"{results}: no instances/<dataset>/*.parquet (a finished run?)")
    frames = (pd.read_parquet(path) for path in files)
    return [
        df
        for df in frames
        if len(df)
        and df["family"].iloc[0] == "mlp"
        and "guarantee_l2_best" in df
        and (setting is None or df["setting"].iloc[0] == setting)
    ]


def main() -> None:
    args = arguments().parse_args()
    rows = [network_row(df) for df in mlp_frames(args.results)]
    res = {
        "kind": "bracket",
        "machine": describe_machine("cpu"),
        "results": str(args.results),
        "certificates": list(CERTIFICATES),
        "rows": rows,
    }
    for r in rows:
        print(
            f"{r['network']:<40} paper {r['mean_paper']:.3f} best {r['mean_best']:.3f} "
            f"upper {r['mean_upper_bound_best']:.3f}: bracket x{r['bracket_paper']:.2f} -> "
            f"x{r['bracket_best']:.2f} ("
            + ", ".join(f"{n} {r[f'closed_{n}']:.0%}" for n in CERTIFICATES if n != "paper")
            + " closed); brackets (ball, box) "
            + ", ".join(
                f"{n} x{r[f'bracket_best_{n}']:.2f}, x{r[f'bracket_box_{n}']:.2f}" for n in NORMS
            )
        )
    finish(res, args.out)


if __name__ == "__main__":
    main()
