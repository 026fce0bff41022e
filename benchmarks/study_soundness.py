"""Study: a strong minimal-norm attack against every certificate of a finished run.

For every one-hidden-layer network of the plain setting in ``--results`` (its
``instances/<dataset>/*.parquet``, its models and prepared data), on its first
``--points`` correctly classified test points, in one process: the minimal-norm attack
(:func:`crosslip.attacks.min_norm_attack`) at the thorough budget (200 steps per walk, every
target, 8 random restarts, every walk to its end) with ``--restarts`` restarts, started
from nothing (not from the run's samples), in each norm of ``--norms``. Every sample it
reports changes the class, verified by a forward pass; a certificate is sound only if no
such sample lies inside its ball. Per network and norm:

* ``violations``: points whose verified sample is closer than the run's best certificate
  of the set the attack searches, the ball in the box ``[0, 1]^d``
  (:func:`crosslip.certified_accuracy.bracket_guarantee`: ``guarantee_<norm>_best_box``,
  at least the ball's ``guarantee_<norm>_best``); any at all is a bug;
* the ratio of the strong attack's norm to the certificate (its minimum, median and mean),
  and the share of points where they are within 1% (the bracket closed);
* the strong attack against the run's own best upper bound (mean ratio, share smaller).

Run: ``.venv/bin/python benchmarks/study_soundness.py --results results/mnist-certified-cpu
--points 500 --out docs/reproduction/studies/soundness/mnist-certified.json``; the last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch

from _harness import finish, parser, start, timed
from crosslip.attacks import min_norm_attack
from crosslip.attacks.min_norm import THOROUGH
from crosslip.certified_accuracy import EXACT_RTOL, best_upper_bound, bracket_guarantee
from crosslip.data import load_prepared
from crosslip.models.checkpoints import load_model
from crosslip.norms import norm_p
from study_bracket import mlp_frames


def arguments() -> argparse.ArgumentParser:
    """The study's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--results", type=Path, required=True, help="a finished run's results")
    ap.add_argument("--points", type=int, default=500, help="correct test points per network")
    ap.add_argument("--norms", nargs="+", default=["l2"], choices=["l2", "l1", "linf"])
    ap.add_argument("--steps", type=int, default=THOROUGH["steps"], help="steps per walk")
    ap.add_argument(
        "--restarts", type=int, default=THOROUGH["restarts"], help="random restarts per point"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return ap


def network_rows(results: Path, df, args, dev) -> list[dict]:
    """The study's figures of one network, one row per norm (module docstring)."""
    model_id, dataset = df["model_id"].iloc[0], df["dataset"].iloc[0]
    ok = df[df["correct"].astype(bool)].head(args.points)
    data = load_prepared(results / "data" / f"{dataset}.npz")
    net = load_model(results / "models" / dataset / model_id / "model.pt")
    idx = ok["test_index"].to_numpy()
    x = torch.as_tensor(data.x_test[idx].reshape(len(idx), -1), dtype=torch.float64).to(dev)
    k = int(net.W.shape[0]) if hasattr(net, "W") else 10
    budget = {**THOROUGH, "steps": args.steps, "restarts": args.restarts, "targets": k - 1}
    rows = []
    for norm in args.norms:
        res, seconds = timed(
            lambda n=norm: min_norm_attack(net, x, p=norm_p(n), progress=False, **budget), dev
        )
        strong = np.where(res.success.numpy(), res.norm.numpy(), np.inf)
        cert = bracket_guarantee(ok, norm).to_numpy()
        run_upper = best_upper_bound(ok, norm).to_numpy()
        known = np.isfinite(strong) & np.isfinite(cert) & (cert > 0)
        ratio = strong[known] / cert[known]
        versus = np.isfinite(strong) & np.isfinite(run_upper)
        rows.append(
            {
                "network": model_id,
                "regularizer": df["regularizer"].iloc[0],
                "norm": norm,
                "points": len(idx),
                "found": int(np.isfinite(strong).sum()),
                "violations": int((strong < cert * (1 - 1e-12)).sum()),
                "ratio_min": float(ratio.min()) if len(ratio) else math.nan,
                "ratio_median": float(np.median(ratio)) if len(ratio) else math.nan,
                "ratio_mean": float(ratio.mean()) if len(ratio) else math.nan,
                "share_within_1pct": float((ratio <= 1 + EXACT_RTOL / (1 - EXACT_RTOL)).mean())
                if len(ratio)
                else math.nan,
                "strong_vs_run_upper_mean": float((strong[versus] / run_upper[versus]).mean())
                if versus.any()
                else math.nan,
                "share_strong_smaller": float((strong[versus] < run_upper[versus]).mean())
                if versus.any()
                else math.nan,
                "seconds": seconds,
            }
        )
    return rows


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    rows = []
    for df in mlp_frames(args.results, setting="plain"):
        for r in network_rows(args.results, df, args, dev):
            rows.append(r)
            print(
                f"{r['network']:<36} {r['norm']:>4}: {r['violations']} violations on "
                f"{r['found']}/{r['points']} samples; attack / certificate min "
                f"x{r['ratio_min']:.4f}, median x{r['ratio_median']:.3f}; within 1% on "
                f"{100 * r['share_within_1pct']:.1f}%; vs the run's best upper bound "
                f"x{r['strong_vs_run_upper_mean']:.4f} ({r['seconds']:.0f} s)",
                flush=True,
            )
    print(bench.machine_line())
    res = {
        "kind": "soundness",
        **bench.header(),
        "results": str(args.results),
        "steps": args.steps,
        "restarts": args.restarts,
        "rows": rows,
        "violations": sum(r["violations"] for r in rows),
    }
    finish(res, args.out)


if __name__ == "__main__":
    main()
