"""Foundation benchmark: the default workflow's stages on mnist5k, in one process.

Prints the time of one training epoch (none vs Cross-Lipschitz), certification of the 200
evaluation points (batched search vs a per-point loop of the same code, side by side) and the
L2 upper bounds, with the machine named; the last line is one JSON object.
Run: .venv/bin/python benchmarks/bench_pipeline.py
"""

from __future__ import annotations

import json
import os
import time

import torch

from crosslip.attacks import upper_bound
from crosslip.certify import certify_softplus
from crosslip.data import load_dataset
from crosslip.device import describe_machine
from crosslip.pipeline import eval_indices
from crosslip.train import TrainConfig, train


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    ds = load_dataset("mnist5k")
    machine = describe_machine()
    res = {}
    for reg, lam in (("none", 0.0), ("cross_lipschitz", 1e-3)):
        cfg = TrainConfig(regularizer=reg, lam=lam, lr=0.2, epochs=1)
        _, secs = timed(
            lambda cfg=cfg: train(cfg, ds.x_train, ds.y_train, ds.x_test, ds.y_test, 10)
        )
        res[f"train_epoch_{reg}_s"] = secs
    net = train(TrainConfig(epochs=5), ds.x_train, ds.y_train, ds.x_test, ds.y_test, 10).model
    x = torch.as_tensor(ds.x_test[eval_indices(len(ds.x_test), 200)])
    cert, res["certify_batched_s"] = timed(lambda: certify_softplus(net, x, kinds=("local",)))
    n_ref = 50
    ref, secs = timed(
        lambda: [certify_softplus(net, x[i : i + 1], kinds=("local",)) for i in range(n_ref)]
    )
    res["certify_per_point_s_per_200"] = secs * 200 / n_ref
    agree = torch.allclose(
        torch.cat([r["guarantee_local"] for r in ref]), cert["guarantee_local"][:n_ref], rtol=1e-9
    )
    ub, res["attack_s"] = timed(lambda: upper_bound(net, x, p=2))
    res["speedup_certify_vs_per_point"] = (
        res["certify_per_point_s_per_200"] / res["certify_batched_s"]
    )
    print(f"machine: {machine}")
    print(f"train, 1 epoch of 4000 points, none:            {res['train_epoch_none_s']:.2f} s")
    cl, plain = res["train_epoch_cross_lipschitz_s"], res["train_epoch_none_s"]
    print(f"train, 1 epoch of 4000 points, cross_lipschitz: {cl:.2f} s  (x{cl / plain:.1f})")
    print(
        f"certify 200 points, batched:    {res['certify_batched_s']:.2f} s "
        f"({200 / res['certify_batched_s']:.0f} points/s)"
    )
    print(
        f"certify 200 points, per point:  {res['certify_per_point_s_per_200']:.2f} s "
        f"(extrapolated from {n_ref}); speed-up x{res['speedup_certify_vs_per_point']:.1f}; "
        f"identical results: {agree}"
    )
    print(
        f"L2 upper bounds 200 points x 9 targets: {res['attack_s']:.2f} s; "
        f"mean guarantee {cert['guarantee_local'].mean():.4f} <= mean upper bound "
        f"{ub.norm[ub.success].mean():.4f}"
    )
    print(json.dumps({"machine": machine, "points": 200, "results_agree": bool(agree), **res}))


if __name__ == "__main__":
    main()
