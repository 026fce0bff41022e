"""Foundation benchmark: the default workflow's stages on mnist5k, in one process.

Prints the time of one training epoch (none vs Cross-Lipschitz), certification of the 200
evaluation points (batched search vs a per-point loop of the same code, side by side) and the
L2 upper bounds, with the machine and the device named; the last line is one JSON object.
``--device`` (``auto``: CUDA if torch sees one) runs every stage there; CUDA is synchronised
before every clock reading, so the times cover the computation.
Run: .venv/bin/python benchmarks/bench_pipeline.py [--device auto]
"""

from __future__ import annotations

import argparse

import torch

from _harness import finish, parser, start, timed
from crosslip.attacks import upper_bound
from crosslip.certify import certify_softplus
from crosslip.data import load_dataset
from crosslip.pipeline import eval_indices
from crosslip.training.core import TrainConfig
from crosslip.training.single import train


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--points", type=int, default=200, help="evaluation points")
    ap.add_argument("--epochs", type=int, default=5, help="epochs of the certified network")
    ap.add_argument(
        "--reference-points",
        type=int,
        default=50,
        help="points of the per-point loop (extrapolated to --points)",
    )
    return ap


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    ds = load_dataset("mnist5k")
    n_pts, n_ref = args.points, min(args.reference_points, args.points)
    res = {}
    for reg, lam in (("none", 0.0), ("cross_lipschitz", 1e-3)):
        cfg = TrainConfig(regularizer=reg, lam=lam, lr=0.2, epochs=1)
        _, secs = timed(
            lambda cfg=cfg: train(cfg, ds, device=dev),
            dev,
        )
        res[f"train_epoch_{reg}_s"] = secs
    cfg = TrainConfig(epochs=args.epochs)
    net = train(cfg, ds, device=dev).model
    net = net.to(dev)
    x = torch.as_tensor(ds.x_test[eval_indices(len(ds.x_test), n_pts)]).to(dev)
    cert, res["certify_batched_s"] = timed(lambda: certify_softplus(net, x, kinds=("local",)), dev)
    ref, secs = timed(
        lambda: [certify_softplus(net, x[i : i + 1], kinds=("local",)) for i in range(n_ref)],
        dev,
    )
    res["certify_per_point_s"] = secs * n_pts / max(n_ref, 1)
    agree = torch.allclose(
        torch.cat([r["guarantee_local"] for r in ref]), cert["guarantee_local"][:n_ref], rtol=1e-9
    )
    ub, res["attack_s"] = timed(lambda: upper_bound(net, x, p=2), dev)
    per_point = res["certify_per_point_s"]
    res["speedup_certify_vs_per_point"] = per_point / res["certify_batched_s"]
    n_train = len(ds.x_train)
    print(bench.machine_line())
    print(f"train, 1 epoch of {n_train} points, none:            {res['train_epoch_none_s']:.2f} s")
    cl, plain = res["train_epoch_cross_lipschitz_s"], res["train_epoch_none_s"]
    print(f"train, 1 epoch of {n_train} points, cross_lipschitz: {cl:.2f} s  (x{cl / plain:.1f})")
    print(
        f"certify {n_pts} points, batched:    {res['certify_batched_s']:.2f} s "
        f"({n_pts / res['certify_batched_s']:.0f} points/s)"
    )
    print(
        f"certify {n_pts} points, per point:  {per_point:.2f} s "
        f"(extrapolated from {n_ref}); speed-up x{res['speedup_certify_vs_per_point']:.1f}; "
        f"identical results: {agree}"
    )
    print(
        f"L2 upper bounds {n_pts} points x 9 targets: {res['attack_s']:.2f} s; "
        f"mean guarantee {cert['guarantee_local'].mean():.4f} <= mean upper bound "
        f"{ub.norm[ub.success].mean():.4f}"
    )
    finish({**bench.header(), "points": n_pts, "results_agree": bool(agree), **res})


if __name__ == "__main__":
    main()
