"""Study: why Cross-Lipschitz does not raise the local guarantee.

Trains one grid of one-hidden-layer networks (the authors' settings: 784-1024-10 softplus,
alpha 10, no biases, their initialisation, SGD with batch 64, learning rate x0.1 at 72% and
x0.01 at 88% of the updates) as one batched model
(:func:`crosslip.training.grid.train_grid`), and at each epoch of ``--checkpoints``
splits every network's local L2 guarantee (Theorem 2.1 with Proposition 2.3) into its terms
(:func:`crosslip.certify.decomposition.decompose`) on the first ``--points`` test digits:

    guarantee = margin / L(0) * L(0) / L(R*)   (j* the class that binds at the optimum R*)

Per network and checkpoint, over the correctly classified points: the mean guarantee, the
mean over all points with 0 for errors (how the paper may have plotted it), the geometric
means of the guarantee, the margin ``f_c - f_j*``, ``L(0) = ||grad f_c - grad f_j*||`` at
the point and the growth ``L(R*) / L(0)`` (so that ``gm_guarantee = gm_margin / gm_lip_point
/ gm_growth`` up to the search's tolerance), the arithmetic means of these, the first-order
distance ``min_j m_j / L_j(0)``, the real growth estimated from below by gradient ascent over
the ball (``ascent_growth``; the rest of ``growth`` is the looseness of Proposition 2.3),
the shares of hidden units saturated off / on at the points and of units that can cross zero
in the ball, the units' sharpness ``alpha ||u_r||`` (median), the mean guarantee on
``--train-points`` training digits, and the test error on the whole test set. At the last
checkpoint also the L2 upper bounds on the first ``--attack-points`` test digits: the paper's
procedure, its refinement and the minimal-norm attack (:func:`upper_bounds`), so that each
network's robustness is bracketed between its guarantee and the smallest of them.

The networks are given as ``REGULARIZER:VALUE:LR`` (VALUE: lambda, or the keep probability
of a dropout network, whose inputs are kept with probability 0.9 as in the authors' code).
Run: ``.venv/bin/python benchmarks/study_guarantee_gap.py --dataset mnist --mirror
/path/to/mnist --epochs 20`` (``--mirror``: a folder of the official files; without it
they are downloaded); the last line is one JSON object, which ``--out`` also
writes, with the command, date, commit and machine.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from math import inf
from pathlib import Path

import numpy as np
import torch

from _harness import finish, parser, start
from crosslip.attacks import min_norm_attack, refine_upper_bound, upper_bound
from crosslip.certify.decomposition import decompose, unit_sharpness
from crosslip.data import load_dataset
from crosslip.models import SoftplusNet
from crosslip.training.core import TrainConfig, error_rate
from crosslip.training.grid import train_grid

DEFAULT_NETWORKS = [
    "none:0:0.5",
    "weight_decay:1e-4:0.5",
    "dropout:0.5:0.5",
    "cross_lipschitz:1e-3:0.5",
    "cross_lipschitz:1e-2:0.5",
    "none:0:0.2",
    "cross_lipschitz:1e-3:0.2",
]


def network_spec(text: str, **common) -> TrainConfig:
    """``REGULARIZER:VALUE:LR`` as a :class:`~crosslip.training.core.TrainConfig` (module
    docstring)."""
    try:
        reg, value, lr = text.split(":")
        value_f, lr_f = float(value), float(lr)
    except ValueError:
        raise SystemExit(f"a network is REGULARIZER:VALUE:LR, got {text!r}") from None
    if reg == "dropout":
        return TrainConfig(regularizer=reg, keep_hidden=value_f, keep_input=0.9, lr=lr_f, **common)
    return TrainConfig(regularizer=reg, lam=value_f, lr=lr_f, **common)


def label(cfg: TrainConfig) -> str:
    value = cfg.keep_hidden if cfg.regularizer == "dropout" else cfg.lam
    return f"{cfg.regularizer} {value:g} lr {cfg.lr:g}"


def gmean(v: torch.Tensor) -> float:
    """Geometric mean of the positive finite entries (NaN if none)."""
    v = v[torch.isfinite(v) & (v > 0)]
    return float(v.log().mean().exp()) if len(v) else math.nan


def mean(v: torch.Tensor) -> float:
    v = v[torch.isfinite(v)]
    return float(v.mean()) if len(v) else math.nan


def summarize(terms: dict[str, torch.Tensor], y: torch.Tensor) -> dict[str, float]:
    """The figures of one network on one set of points (module docstring)."""
    correct = terms["pred"] == y
    t = {k: v[correct] for k, v in terms.items()}
    usable = torch.isfinite(t["radius"]) & (t["guarantee"] > 0)
    u = {k: v[usable] for k, v in t.items()}
    return {
        "n_points": len(y),
        "n_correct": int(correct.sum()),
        "mean_guarantee": mean(t["guarantee"]),
        "mean_guarantee_all_zero": float(torch.where(correct, terms["guarantee"], 0).mean()),
        "gm_guarantee": gmean(u["guarantee"]),
        "gm_margin": gmean(u["margin"]),
        "gm_lip_point": gmean(u["lip_point"]),
        "gm_growth": gmean(u["growth"]),
        "mean_margin": mean(t["margin"]),
        "mean_lip_point": mean(t["lip_point"]),
        "mean_lip_radius": mean(t["lip_radius"]),
        "mean_growth": mean(t["growth"]),
        "mean_first_order": mean(t["first_order"]),
        "mean_ascent_growth": mean(u["lip_ascent"] / u["lip_point"]),
        "mean_looseness": mean(u["lip_radius"] / u["lip_ascent"]),
        "mean_radius": mean(t["radius"]),
        "share_off": mean(t["off"]),
        "share_on": mean(t["on"]),
        "share_crossing": mean(t["crossing"]),
    }


def upper_bounds(net: SoftplusNet, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The L2 upper bounds on the points ``x`` (n, d) whose labels start ``y``: the paper's
    procedure (Section 4), its refinement and the minimal-norm attack started from it, as
    in the attack stage (:mod:`crosslip.stages.attack`, default settings); each a mean over
    the correctly classified points where it succeeded, ``mean_upper_bound_best`` the mean
    of the smallest of the three per point, ``share_best_*`` how often each was smallest
    (ties to the earlier)."""
    paper = upper_bound(net, x, p=2, progress=False)
    refined = refine_upper_bound(net, x, paper, p=2)
    mn = min_norm_attack(net, x, start=refined, progress=False)
    correct = paper.pred == y[: len(x)]
    norms = torch.stack([paper.norm, refined.norm, mn.norm], dim=1).double()
    norms = torch.where(torch.stack([paper.success, refined.success, mn.success], 1), norms, inf)
    best, which = norms[correct].min(dim=1)
    found = torch.isfinite(best)
    row = {"attack_points": len(x)}
    for k, name in enumerate(("", "_refined", "_min_norm")):
        v = norms[correct, k]
        row[f"mean_upper_bound{name}"] = mean(v[torch.isfinite(v)])
        row[f"share_best{name or '_paper'}"] = float((which[found] == k).double().mean())
    row["mean_upper_bound_best"] = mean(best[found])
    return row


def evaluate(
    net: SoftplusNet,
    data: dict[str, torch.Tensor],
    device: torch.device,
    rtol: float,
    ascent_steps: int,
    attack_points: int,
) -> dict[str, float]:
    """Every figure of one network at one checkpoint (upper bounds if ``attack_points``)."""
    t0 = time.perf_counter()
    test = decompose(net, data["x"].to(device), rtol=rtol, ascent_steps=ascent_steps)
    row = summarize(test, data["y"])
    train_terms = decompose(net, data["x_train"].to(device), rtol=rtol, ascent_steps=0)
    row["mean_guarantee_train"] = summarize(train_terms, data["y_train"])["mean_guarantee"]
    row["test_error"] = error_rate(net, data["x_test_all"], data["y_test_all"])
    sharp = unit_sharpness(net)
    row["median_unit_sharpness"] = float(sharp.median())
    row["norm_w"] = float(torch.linalg.matrix_norm(net.W.detach().double()))
    row["norm_u"] = float(torch.linalg.matrix_norm(net.U.detach().double()))
    if attack_points:
        row.update(upper_bounds(net, data["x"][:attack_points].to(device), data["y"]))
    row["eval_seconds"] = time.perf_counter() - t0
    return row


def arguments() -> argparse.ArgumentParser:
    """The study's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--dataset", default="mnist5k")
    ap.add_argument("--mirror", default=None, help="mirror folder of the dataset's files")
    ap.add_argument("--train-subset", type=int, default=0, help="first N digits (0: all)")
    ap.add_argument("--networks", nargs="+", default=DEFAULT_NETWORKS)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[1, 3, 7, 14, 20])
    ap.add_argument("--points", type=int, default=1000, help="test digits decomposed")
    ap.add_argument("--train-points", type=int, default=300, help="training digits certified")
    ap.add_argument("--attack-points", type=int, default=500, help="at the last checkpoint")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--alpha", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--ascent-steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--verbose", action="store_true", help="training progress on stderr")
    return ap


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    if args.verbose:
        logging.basicConfig(format="%(asctime)s %(message)s")
        logging.getLogger("crosslip").setLevel(logging.INFO)
    ds = load_dataset(args.dataset, mirror_dir=args.mirror)
    trained_on = ds.head(args.train_subset or None)  # 0: all
    x_train, y_train = trained_on.x_train, trained_on.y_train
    common = dict(
        epochs=args.epochs, hidden=args.hidden, alpha=args.alpha, seed=args.seed, init="authors"
    )
    cfgs = [network_spec(s, **common) for s in args.networks]
    names = [label(c) for c in cfgs]
    x_test_all, y_test_all = torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test)
    data = {
        "x": x_test_all[: args.points].double(),
        "y": y_test_all[: args.points],
        "x_train": torch.from_numpy(x_train[: args.train_points]).double(),
        "y_train": torch.from_numpy(y_train[: args.train_points]),
        "x_test_all": x_test_all,
        "y_test_all": y_test_all,
    }
    last = max(c for c in args.checkpoints if c <= args.epochs)
    rows: list[dict] = []
    seconds = {"train": 0.0, "eval": 0.0}
    clock = [time.perf_counter()]

    def on_epoch(epoch: int, nets: list[SoftplusNet]) -> None:
        seconds["train"] += time.perf_counter() - clock[0]
        if epoch in args.checkpoints:
            for name, cfg, net in zip(names, cfgs, nets, strict=True):
                row = evaluate(
                    net,
                    data,
                    dev,
                    args.rtol,
                    args.ascent_steps,
                    args.attack_points if epoch == last else 0,
                )
                row = {"network": name, "regularizer": cfg.regularizer, "lr": cfg.lr, **row}
                row = {"epoch": epoch, **row}
                rows.append(row)
                seconds["eval"] += row["eval_seconds"]
                print(
                    f"epoch {epoch:>3} {name:<28} err {row['test_error']:.4f} guarantee "
                    f"{row['mean_guarantee']:.3f} (all {row['mean_guarantee_all_zero']:.3f}) "
                    f"gm {row['gm_guarantee']:.3f} = margin {row['gm_margin']:.3f} / L(0) "
                    f"{row['gm_lip_point']:.3f} / growth {row['gm_growth']:.3f} (ascent "
                    f"{row['mean_ascent_growth']:.3f}); off {row['share_off']:.2f} on "
                    f"{row['share_on']:.2f} crossing {row['share_crossing']:.2f}; train "
                    f"{row['mean_guarantee_train']:.3f}"
                    + (
                        f"; upper {row['mean_upper_bound']:.3f} refined "
                        f"{row['mean_upper_bound_refined']:.3f} min-norm "
                        f"{row['mean_upper_bound_min_norm']:.3f}"
                        if "mean_upper_bound" in row
                        else ""
                    ),
                    flush=True,
                )
        clock[0] = time.perf_counter()

    t0 = time.perf_counter()
    results = train_grid(cfgs, trained_on, device=dev, on_epoch=on_epoch)
    res = {
        **bench.header(),
        "dataset": args.dataset,
        "n_train": len(x_train),
        "epochs": args.epochs,
        "checkpoints": [c for c in args.checkpoints if c <= args.epochs],
        "points": args.points,
        "train_points": args.train_points,
        "attack_points": args.attack_points,
        "hidden": args.hidden,
        "alpha": args.alpha,
        "seed": args.seed,
        "networks": names,
        "status": [r.metrics["status"] for r in results],
        "train_seconds": seconds["train"],
        "eval_seconds": seconds["eval"],
        "seconds": time.perf_counter() - t0,
        "rows": rows,
    }
    finish(res, args.out)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
