"""Minimal-norm attack benchmark: the L2 upper bounds of ``min_norm_attack`` beside the
paper's procedure and its refinement, on the data shape of the 200-epoch models.

A 784-1024-10 softplus network trained briefly on real digits (by default the one of
``bench_attack.py`` and ``bench_certify.py``: full MNIST from the mirror
``../shared/data/mnist``, 3 epochs of plain SGD, cached under ``results/bench/``); the first
``--points`` test points (default all 10,000, the data shape of the 200-epoch runs), L2:

1. the paper's procedure (``upper_bound``, all targets), then the refinement
   (``refine_upper_bound``, ``--refine-steps`` re-linearizations), as the attack stage runs
   them: the baseline, timed in the same process;
2. ``min_norm_attack`` started from the refined samples with the stage's settings
   (``--steps``, ``--targets``, ``--restarts``; the schema's defaults): time, and its ratio
   to the baseline's; the mean L2 norm of each method over the points where all three
   succeeded, the ratios of the means, the share of points where the attack is smaller than
   the refinement by more than 0.1%, and where each method gives the smallest bound;
3. a longer run on the first ``--check-points`` points (twice the steps and the restarts,
   another seed): how much the stage's settings leave on the table (mean ratio of the
   default's norm to the longer run's; 1 means converged).

``--dataset mnist5k`` (offline) with ``--hidden`` and ``--epochs`` trains a small network
instead (the smoke tests use it; nothing is cached then). ``--device`` (``auto``: CUDA if
torch sees one) runs everything there; CUDA is synchronised before every clock reading.
Run: ``.venv/bin/python benchmarks/bench_min_norm.py [--device auto] [--points 10000]``;
the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy

import torch

from _harness import MNIST_MIRROR, finish, parser, start, timed
from bench_certify import full_mnist, trained_net
from crosslip.attacks import min_norm_attack, refine_upper_bound, upper_bound
from crosslip.config.schema import default
from crosslip.data import load_dataset
from crosslip.training.core import TrainConfig
from crosslip.training.single import train


def network(args: argparse.Namespace):
    """The benchmark's network and dataset: the cached 784-1024-10 MNIST net of the other
    attack benchmarks by default, else one trained here for ``--epochs`` (not cached)."""
    ds = full_mnist(args.mirror) if args.dataset == "mnist" else load_dataset(args.dataset)
    if args.dataset == "mnist" and args.hidden == 1024 and args.epochs == 3:
        net, _ = trained_net(ds)
        return net, ds
    cfg = TrainConfig(epochs=args.epochs, lr=0.2, hidden=args.hidden)
    res = train(cfg, ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes)
    return res.model, ds


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--mirror", default=str(MNIST_MIRROR))
    ap.add_argument("--dataset", choices=["mnist", "mnist5k"], default="mnist")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--refine-steps", type=int, default=default("attack.refine_steps"))
    ap.add_argument("--steps", type=int, default=default("attack.min_norm_steps"))
    ap.add_argument("--targets", type=int, default=default("attack.min_norm_targets"))
    ap.add_argument("--restarts", type=int, default=default("attack.min_norm_restarts"))
    ap.add_argument("--check-points", type=int, default=500, help="0: no longer run")
    return ap


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    net, ds = network(args)
    x = torch.as_tensor(ds.x_test[: args.points])
    with torch.no_grad():
        err = float((net(x).argmax(1).numpy() != ds.y_test[: args.points]).mean())
    net = copy.deepcopy(net).to(dev)
    x = x.to(dev)
    settings = dict(steps=args.steps, targets=args.targets, restarts=args.restarts)
    upper_bound(net, x[:64], progress=False)  # warm-up
    min_norm_attack(net, x[:8], steps=2, targets=1, restarts=1, progress=False)

    ub, paper_s = timed(lambda: upper_bound(net, x, p=2, progress=False), dev)
    ref, refine_s = timed(
        lambda: refine_upper_bound(net, x, ub, p=2, steps=args.refine_steps, progress=False), dev
    )
    mn, mn_s = timed(lambda: min_norm_attack(net, x, start=ref, **settings, progress=False), dev)
    ok = ub.success & ref.success & mn.success
    norms = {"paper": ub.norm[ok], "refined": ref.norm[ok], "min_norm": mn.norm[ok]}
    means = {k: float(v.mean()) for k, v in norms.items()}
    stack = torch.stack(list(norms.values()), 1)
    winner = stack.argmin(1)  # the earlier method on a tie, as the stage's best column
    res: dict = {
        **bench.header(),
        "dataset": args.dataset,
        "network": f"{x.shape[1]}-{args.hidden}-{ds.num_classes}",
        "train_epochs": args.epochs,
        "test_error": err,
        "points": len(x),
        "refine_steps": args.refine_steps,
        **{f"min_norm_{k}": v for k, v in settings.items()},
        "paper_seconds": paper_s,
        "refine_seconds": refine_s,
        "min_norm_seconds": mn_s,
        "ratio_time_min_norm_to_paper_and_refined": mn_s / (paper_s + refine_s),
        "success_rate": {
            "paper": float(ub.success.double().mean()),
            "refined": float(ref.success.double().mean()),
            "min_norm": float(mn.success.double().mean()),
        },
        "points_all_succeeded": int(ok.sum()),
        "mean_upper_bound": means,
        "ratio_mean_min_norm_to_paper": means["min_norm"] / means["paper"],
        "ratio_mean_min_norm_to_refined": means["min_norm"] / means["refined"],
        "share_min_norm_below_refined": float(
            (norms["min_norm"] < norms["refined"] * (1 - 1e-3)).double().mean()
        ),
        "share_best": {k: float((winner == i).double().mean()) for i, k in enumerate(norms)},
    }
    if args.check_points > 0:
        m = min(args.check_points, len(x))
        longer = dict(steps=2 * args.steps, targets=args.targets, restarts=2 * args.restarts)
        part = type(ref)(*(getattr(ref, f)[:m] for f in type(ref).__annotations__))
        chk, chk_s = timed(
            lambda: min_norm_attack(net, x[:m], start=part, **longer, seed=1, progress=False),
            dev,
        )
        both = mn.success[:m] & chk.success
        res.update(
            check_points=m,
            check_seconds=chk_s,
            check_ratio_mean_default_to_longer=float((mn.norm[:m][both] / chk.norm[both]).mean()),
            check_share_longer_smaller=float(
                (chk.norm[both] < mn.norm[:m][both] * (1 - 1e-3)).double().mean()
            ),
        )

    print(bench.machine_line())
    print(
        f"network: {res['network']} softplus, {args.dataset}, {args.epochs} epochs, test error "
        f"{err:.2%}; {len(x)} test points x {x.shape[1]}, L2"
    )
    print(
        f"paper's procedure: {paper_s:.1f} s, mean {means['paper']:.4f}; refinement "
        f"({args.refine_steps} re-linearizations): {refine_s:.1f} s, mean {means['refined']:.4f}"
    )
    print(
        f"min-norm attack ({args.steps} steps, {args.targets} targets, {args.restarts} "
        f"restarts, from the refined samples): {mn_s:.1f} s "
        f"(x{res['ratio_time_min_norm_to_paper_and_refined']:.1f} the two above), mean "
        f"{means['min_norm']:.4f}: x{res['ratio_mean_min_norm_to_paper']:.4f} the paper's, "
        f"x{res['ratio_mean_min_norm_to_refined']:.4f} the refined; below the refined by "
        f">0.1% on {res['share_min_norm_below_refined']:.1%} of {int(ok.sum())} points"
    )
    shares = ", ".join(f"{k} {v:.1%}" for k, v in res["share_best"].items())
    print(f"smallest bound per point: {shares}")
    if args.check_points > 0:
        print(
            f"longer run (2x steps and restarts, another seed) on {res['check_points']} "
            f"points: {res['check_seconds']:.1f} s; default / longer = "
            f"{res['check_ratio_mean_default_to_longer']:.5f} on average, longer smaller by "
            f">0.1% on {res['check_share_longer_smaller']:.1%}"
        )
    finish(res)


if __name__ == "__main__":
    main()
