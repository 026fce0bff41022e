"""Study: the L2 curvature certificate minimised over the ball, on a finished run's networks.

For every one-hidden-layer network of the plain setting in ``--results`` (its
``instances/<dataset>/*.parquet``, certified and attacked with every L2 certificate and
upper bound, and its models and prepared data), on its first ``--points`` correctly
classified test points, in one process:

* certifies the L2 curvature certificate in its largest-eigenvalue form
  (``certify.trust_region_steps: 0``) and minimised over the ball (``--steps`` Lanczos
  steps, :mod:`crosslip.certify.trust_region`; ``--expansion-steps`` moves of the units'
  expansion points, ``certify.expansion_steps``), and Theorem 2.1's tightest bound
  (``guarantee_l2``) for the time it takes, side by side;
* compares with the run's own per-point results: the paper's guarantee (Proposition 2.3),
  the best certificate of the run (``guarantee_l2_best``), and the best verified upper bound
  (``upper_bound_l2_best``); the new best per point is the larger of the run's best and the
  new curvature certificate (both sound);
* reports per network the means, the bracket ``mean upper bound / mean best`` before and
  after (ratios of the means, as ``study_bracket.py``), the share of the paper's bracket now
  closed on a log scale, and the seconds per point of each certificate.

Run: ``.venv/bin/python benchmarks/study_trust_region.py --results results/mnist5k-200-cpu
--out docs/reproduction/studies/guarantee-gap/mnist5k-200ep-trust-region.json``; the last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd
import torch

from _harness import finish, parser, start, timed
from crosslip.certify.engine import certify_softplus
from crosslip.data import load_prepared
from crosslip.models.checkpoints import load_model
from study_bracket import mlp_frames


def arguments() -> argparse.ArgumentParser:
    """The study's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--results", type=Path, required=True, help="a finished run's results")
    ap.add_argument("--points", type=int, default=200, help="correct test points per network")
    ap.add_argument("--steps", type=int, default=8, help="Lanczos steps (trust_region_steps)")
    ap.add_argument(
        "--expansion-steps", type=int, default=1, help="moves of the expansion points (certify)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return ap


def closed(mean: float, paper: float, upper: float) -> float:
    """The share of the paper's bracket ``[paper, upper]`` below ``mean``, on a log scale."""
    return math.log(mean / paper) / math.log(upper / paper) if upper > paper > 0 else math.nan


def network_row(results: Path, df: pd.DataFrame, points: int, steps: int, moves: int, dev) -> dict:
    """The study's figures of one network (module docstring)."""
    model_id, dataset = df["model_id"].iloc[0], df["dataset"].iloc[0]
    ok = df[df["correct"].astype(bool)].head(points)
    data = load_prepared(results / "data" / f"{dataset}.npz")
    net = load_model(results / "models" / dataset / model_id / "model.pt")
    idx = ok["test_index"].to_numpy()
    x = torch.as_tensor(data.x_test[idx].reshape(len(idx), -1), dtype=torch.float64).to(dev)
    l2, t_l2 = timed(lambda: certify_softplus(net, x, kinds=("l2",)), dev)
    kinds = ("l2", "curvature")
    plain, t_plain = timed(lambda: certify_softplus(net, x, kinds=kinds, trust_region_steps=0), dev)
    exact, t_exact = timed(
        lambda: certify_softplus(
            net, x, kinds=kinds, trust_region_steps=steps, expansion_steps=moves
        ),
        dev,
    )
    if not (plain["pred"].cpu().numpy() == ok["pred"].to_numpy()).all():
        raise SystemExit(f"{model_id}: the predictions differ from the run's")
    run_best = torch.as_tensor(ok["guarantee_l2_best"].to_numpy().copy())
    curvature = exact["guarantee_l2_curvature"]
    best = torch.maximum(run_best, curvature)
    upper = float(ok["upper_bound_l2_best"].mean())
    paper = float(ok["guarantee_local"].mean())
    n = len(idx)
    row = {
        "network": model_id,
        "regularizer": df["regularizer"].iloc[0],
        "points": n,
        "expansion_steps": moves,
        "mean_paper": paper,
        "mean_guarantee_l2": float(l2["guarantee_l2"].mean()),
        "mean_curvature_lambda_max": float(plain["guarantee_l2_curvature"].mean()),
        "mean_curvature_trust_region": float(curvature.mean()),
        "mean_best_run": float(run_best.mean()),
        "mean_best": float(best.mean()),
        "mean_upper_bound_best": upper,
        "bracket_run": upper / float(run_best.mean()),
        "bracket_best": upper / float(best.mean()),
        "closed_run": closed(float(run_best.mean()), paper, upper),
        "closed_best": closed(float(best.mean()), paper, upper),
        "share_trust_region_best": float((curvature > run_best).double().mean()),
        "seconds_per_point_l2": t_l2 / n,
        "seconds_per_point_curvature": t_plain / n,
        "seconds_per_point_trust_region": t_exact / n,
        "trust_region_vs_l2_seconds": t_exact / t_l2,
    }
    return row


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    rows = []
    for df in mlp_frames(args.results, setting="plain"):
        rows.append(
            network_row(args.results, df, args.points, args.steps, args.expansion_steps, dev)
        )
        r = rows[-1]
        print(
            f"{r['network']:<36} best {r['mean_best_run']:.3f} -> {r['mean_best']:.3f} "
            f"(curvature {r['mean_curvature_lambda_max']:.3f} -> "
            f"{r['mean_curvature_trust_region']:.3f}), upper {r['mean_upper_bound_best']:.3f}:"
            f" bracket x{r['bracket_run']:.2f} -> x{r['bracket_best']:.2f}; "
            f"{r['seconds_per_point_trust_region']:.3f} s/point "
            f"(x{r['trust_region_vs_l2_seconds']:.0f} guarantee_l2's)",
            flush=True,
        )
    print(bench.machine_line())
    res = {
        "kind": "trust_region",
        **bench.header(),
        "results": str(args.results),
        "steps": args.steps,
        "expansion_steps": args.expansion_steps,
        "rows": rows,
        "max_bracket_best": max(r["bracket_best"] for r in rows),
        "max_bracket_run": max(r["bracket_run"] for r in rows),
    }
    finish(res, args.out)


if __name__ == "__main__":
    main()
