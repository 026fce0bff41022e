"""Certification benchmark: full MNIST, a trained 784-1024-10 softplus network.

1. L2 guarantees of Theorem 2.1 + Proposition 2.3 for all 10,000 test points, R searched to
   a relative precision of 1e-3: wall time and points per second.
2. The straightforward per-point reference (:mod:`crosslip.certify.reference`: the (H, H)
   matrix beta built per class, one point at a time) on a subset, side by side: speed-up and
   the largest relative difference of the guarantees. The reference runs on the CPU (it is
   written for it), the batched search on ``--device``.
3. Every guarantee family of Theorem 2.1 (tighter L2, L1, Linf, box-constrained, global) on
   a subset, with their means and the Table 1 ratio.
4. The certificates beyond the paper (linear relaxation, curvature, Theorem 2.1 integrated;
   :mod:`crosslip.certify.engine` ``METHOD_KINDS``) in L2 on ``--method-points`` points: each
   one's seconds on top of today's ``guarantee_l2`` (local, global and tightest L2), all
   three together against it, their means, and the mean of the best sound L2 guarantee per
   point against the paper's (Proposition 2.3); also every norm and box variant together
   against today's every-kind certification (on ``--all-norms-points``). ``--model``
   certifies another network (any model file of the workflow, e.g. a 200-epoch one)
   instead of the cached one. The L2 curvature certificate minimised over the ball
   (``certify.trust_region_steps``, on by default; :mod:`crosslip.certify.trust_region`)
   on ``--trust-region-points``: the curvature column with it (it replaces the
   largest-eigenvalue form's search) on top of today's ``guarantee_l2``
   (``method_seconds["trust_region"]``, ``trust_region_vs_paper_l2_seconds``) beside the
   column without it, every certificate beyond the paper with and without it on the same
   points, and the curvature column's mean with and without it; the same with its units
   expanded about the point only (``certify.expansion_steps`` 0,
   :mod:`crosslip.certify.expansion`). Each timing of this section is the median of
   :data:`ROUNDS` rounds in turns: a method's
   seconds are a difference of two timings, and single timings moved them by half between
   runs here.
5. The Gaussian-kernel bound (Proposition 2.2) for 2,000 expansion points on 500 points.

The network is trained once (3 epochs of plain SGD, ~1 min here) and cached under
``results/bench/``. The data come from the folder ``--mirror`` of the official MNIST files,
else from the download cache under ``results/bench/`` or a download.
``--device`` (``auto``: CUDA if torch sees one) runs the batched guarantees there; CUDA is
synchronised before every clock reading, so the times cover the computation.
Run: ``.venv/bin/python benchmarks/bench_certify.py [--device auto]``; the last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

from _harness import ROOT, add_mirror_argument, finish, medians, parser, start, timed
from bench_kernel_bound import run as kernel_bound
from crosslip.certify import certify_softplus
from crosslip.certify.engine import METHOD_KINDS
from crosslip.certify.reference import certify_prop23_reference
from crosslip.data import Dataset, load_dataset
from crosslip.models.checkpoints import load_model, save_model
from crosslip.training.core import TrainConfig
from crosslip.training.single import train

#: Rounds of the timings of the certificates beyond the paper (section 4 of the module
#: docstring).
ROUNDS = 3

#: What the certification and attack benchmarks keep between runs: MNIST's prepared copy
#: and their network, trained once.
CACHE = ROOT / "results" / "bench"
NET = CACHE / "mnist-784-1024-10-none.pt"


def full_mnist(mirror: str | Path | None) -> Dataset:
    """Full MNIST from the folder ``mirror`` (None: none; downloads kept under ``CACHE``)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    return load_dataset("mnist", cache_dir=CACHE / "downloads", mirror_dir=mirror)


def trained_net(ds: Dataset, cache: Path = NET) -> tuple[torch.nn.Module, float | None]:
    """The network of 3 epochs of plain SGD on ``ds`` read from ``cache``, else trained and
    kept there; with the seconds of its training (None where it was read)."""
    if cache.exists():
        return load_model(cache), None
    t0 = time.perf_counter()
    res = train(TrainConfig(epochs=3, lr=0.2), ds)
    save_model(res.model, cache)
    return res.model, time.perf_counter() - t0


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    add_mirror_argument(ap)
    ap.add_argument("--reference-points", type=int, default=20)
    ap.add_argument("--all-kinds-points", type=int, default=1000)
    ap.add_argument("--method-points", type=int, default=10000)
    ap.add_argument("--all-norms-points", type=int, default=1000)
    ap.add_argument("--trust-region-points", type=int, default=1000)
    ap.add_argument("--trust-region-steps", type=int, default=8)
    ap.add_argument("--model", default=None, help="a model file to certify instead")
    ap.add_argument("--no-kernel", action="store_true", help="skip the kernel-bound timing")
    return ap


PAPER_L2 = ("local", "global", "l2")
OLD_KINDS = ("local", "global", "l2", "l1", "linf", "box")


def beyond(net, x: torch.Tensor, y, dev: torch.device, n_norms: int, trust: tuple) -> dict:
    """Section 4 of the module docstring: seconds per certificate beyond the paper, their
    ratio to today's L2 guarantees, and their means over the correctly classified points;
    ``trust``: (points, Lanczos steps) of the trust-region timing (0 points: none)."""
    kinds = {"paper": lambda: certify_softplus(net, x, kinds=PAPER_L2)}
    for method in METHOD_KINDS:
        kinds[method] = lambda m=method: certify_softplus(
            net, x, kinds=(*PAPER_L2, m), trust_region_steps=0
        )
    med = medians(kinds, ROUNDS, dev)
    base_s = med["paper"]
    seconds = {method: med[method] - base_s for method in METHOD_KINDS}
    n_tr, steps = trust
    tr: dict = {}
    if n_tr:
        xt, curv = x[:n_tr], (*PAPER_L2, "curvature")
        every_kind = (*PAPER_L2, *METHOD_KINDS)
        plain = certify_softplus(net, xt, kinds=curv, trust_region_steps=0)
        exact = certify_softplus(net, xt, kinds=curv, trust_region_steps=steps)
        fixed = certify_softplus(net, xt, kinds=curv, trust_region_steps=steps, expansion_steps=0)
        kinds = {
            "paper": lambda: certify_softplus(net, xt, kinds=PAPER_L2),
            "plain": lambda: certify_softplus(net, xt, kinds=curv, trust_region_steps=0),
            "exact": lambda: certify_softplus(net, xt, kinds=curv, trust_region_steps=steps),
            "fixed": lambda: certify_softplus(
                net, xt, kinds=curv, trust_region_steps=steps, expansion_steps=0
            ),
            "every": lambda: certify_softplus(net, xt, kinds=every_kind, trust_region_steps=0),
            "every_exact": lambda: certify_softplus(
                net, xt, kinds=every_kind, trust_region_steps=steps
            ),
        }
        med = medians(kinds, ROUNDS, dev)
        paper_t = med["paper"]
        seconds["trust_region"] = med["exact"] - paper_t
        ok_t = exact["pred"].cpu().numpy() == y[:n_tr]
        col = "guarantee_l2_curvature"
        tr = {
            "trust_region_points": n_tr,
            "trust_region_steps": steps,
            "trust_region_paper_l2_seconds": paper_t,
            "trust_region_vs_paper_l2_seconds": (med["exact"] - paper_t) / paper_t,
            "curvature_vs_paper_l2_seconds": (med["plain"] - paper_t) / paper_t,
            "methods_vs_paper_l2_seconds_same_points": (med["every"] - paper_t) / paper_t,
            "methods_with_trust_region_vs_paper_l2_seconds": (med["every_exact"] - paper_t)
            / paper_t,
            "trust_region_curvature_mean": float(exact[col].cpu()[ok_t].double().mean()),
            "trust_region_curvature_mean_without": float(plain[col].cpu()[ok_t].double().mean()),
            "trust_region_fixed_points_vs_paper_l2_seconds": (med["fixed"] - paper_t) / paper_t,
            "trust_region_curvature_mean_fixed_points": float(
                fixed[col].cpu()[ok_t].double().mean()
            ),
        }
    every, all_s = timed(lambda: certify_softplus(net, x, kinds=(*PAPER_L2, *METHOD_KINDS)), dev)
    xs = x[:n_norms]
    _, base_n = timed(lambda: certify_softplus(net, xs, kinds=PAPER_L2), dev)
    _, old_s = timed(lambda: certify_softplus(net, xs, kinds=OLD_KINDS), dev)
    _, full_s = timed(lambda: certify_softplus(net, xs, kinds=(*OLD_KINDS, *METHOD_KINDS)), dev)
    ok = every["pred"].cpu().numpy() == y[: len(x)]
    means = {
        k: float(v.cpu()[ok].double().mean())
        for k, v in every.items()
        if k.startswith("guarantee_l2") or k == "guarantee_local"
    }
    return {
        "method_points": len(x),
        "paper_l2_seconds": base_s,
        "method_seconds": seconds,
        **tr,
        "methods_l2_seconds": all_s - base_s,
        "methods_vs_paper_l2_seconds": (all_s - base_s) / base_s,
        "all_norms_points": len(xs),
        "all_kinds_old_seconds": old_s,
        "all_kinds_new_seconds": full_s,
        "methods_all_norms_vs_paper_l2_seconds": (full_s - old_s) / base_n,
        "method_means_correct": means,
        "best_vs_paper_mean_ratio": means["guarantee_l2_best"] / means["guarantee_local"],
    }


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    ds = full_mnist(args.mirror)
    net, train_s = (load_model(args.model), None) if args.model else trained_net(ds)
    x = torch.as_tensor(ds.x_test)
    with torch.no_grad():
        err = float((net(x).argmax(1).numpy() != ds.y_test).mean())
    res: dict = {**bench.header(), "test_error": err}
    if train_s is not None:
        res["train_seconds"] = train_s

    net_cpu, net = net, copy.deepcopy(net).to(dev)
    xd = x.to(dev)
    certify_softplus(net, xd[:64], kinds=("local",))  # warm-up
    cert, secs = timed(lambda: certify_softplus(net, xd, kinds=("local",), rtol=1e-3), dev)
    res.update(
        points=len(x),
        seconds=secs,
        points_per_second=len(x) / secs,
        mean_guarantee_local=float(cert["guarantee_local"].mean()),
        evaluations_mean=float(cert["evaluations"].float().mean()),
    )

    n_ref = args.reference_points
    ref, ref_s = timed(lambda: certify_prop23_reference(net_cpu, x[:n_ref], rtol=1e-3))
    diff = (cert["guarantee_local"][:n_ref].cpu() - ref).abs() / ref.abs().clamp_min(1e-300)
    res.update(
        reference_points=n_ref,
        reference_seconds_per_point=ref_s / n_ref,
        speedup_vs_reference=(ref_s / n_ref) / (secs / len(x)),
        max_rel_diff_vs_reference=float(diff.max()),
    )

    n_all = args.all_kinds_points
    full, all_s = timed(lambda: certify_softplus(net, xd[:n_all], kinds=OLD_KINDS), dev)
    full = {k: v.cpu() for k, v in full.items()}
    ok = full["pred"].numpy() == ds.y_test[:n_all]
    means = {k: float(v[ok].double().mean()) for k, v in full.items() if k.startswith("guarantee")}
    local, glob = full["guarantee_local"][ok], full["guarantee_global"][ok]
    res.update(
        all_kinds_points=n_all,
        all_kinds_seconds=all_s,
        means_correct=means,
        table1_ratio_global_local=float((glob / local).mean()),
        share_global_beats_local=float((glob > local).double().mean()),
        share_l2_tighter_than_local=float(
            (full["guarantee_l2"][ok] > local * (1 + 1e-9)).double().mean()
        ),
    )

    if args.method_points:
        trust = (args.trust_region_points, args.trust_region_steps)
        res.update(
            beyond(net, xd[: args.method_points], ds.y_test, dev, args.all_norms_points, trust)
        )

    if not args.no_kernel:
        res.update(kernel_bound(device=dev))

    print(bench.machine_line())
    print(f"network: 784-1024-10 softplus, plain SGD, test error {err:.2%}")
    print(
        f"Prop. 2.3 guarantees, {len(x)} points, rtol 1e-3: {secs:.1f} s "
        f"({res['points_per_second']:.0f} points/s, "
        f"{res['evaluations_mean']:.2f} R per point)"
    )
    print(
        f"per-point reference on the CPU ({n_ref} points): "
        f"{res['reference_seconds_per_point']:.3f} s/point"
        f" -> speed-up x{res['speedup_vs_reference']:.0f}, "
        f"max rel. diff {res['max_rel_diff_vs_reference']:.1e}"
    )
    print(f"all guarantee families, {n_all} points: {all_s:.1f} s")
    for k, v in means.items():
        print(f"  mean {k:<22} {v:.4f} (correctly classified points)")
    print(
        f"  Table 1 ratio global/local: {res['table1_ratio_global_local']:.3f}; global beats "
        f"local on {res['share_global_beats_local']:.1%}; tighter L2 beats Prop. 2.3 on "
        f"{res['share_l2_tighter_than_local']:.1%}"
    )
    if "method_seconds" in res:
        print(
            f"beyond the paper, L2, {res['method_points']} points: today's guarantee_l2 "
            f"{res['paper_l2_seconds']:.1f} s; on top of it "
            + ", ".join(f"{k} {v:.1f} s" for k, v in res["method_seconds"].items())
            + f"; all three x{res['methods_vs_paper_l2_seconds']:.2f} today's; every norm and "
            f"box x{res['methods_all_norms_vs_paper_l2_seconds']:.2f} "
            f"({res['all_norms_points']} points)"
        )
        if "trust_region_points" in res:
            print(
                f"  curvature minimised over the ball ({res['trust_region_steps']} Lanczos "
                f"steps), {res['trust_region_points']} points: the curvature column "
                f"x{res['curvature_vs_paper_l2_seconds']:.2f} -> "
                f"x{res['trust_region_vs_paper_l2_seconds']:.2f} today's guarantee_l2 "
                f"({res['trust_region_paper_l2_seconds']:.1f} s), its mean "
                f"{res['trust_region_curvature_mean_without']:.4f} -> "
                f"{res['trust_region_curvature_mean']:.4f}; every certificate "
                f"x{res['methods_vs_paper_l2_seconds_same_points']:.2f} -> "
                f"x{res['methods_with_trust_region_vs_paper_l2_seconds']:.2f}; with the "
                f"units expanded about the point only (certify.expansion_steps 0): "
                f"x{res['trust_region_fixed_points_vs_paper_l2_seconds']:.2f}, its mean "
                f"{res['trust_region_curvature_mean_fixed_points']:.4f}"
            )
        for k, v in res["method_means_correct"].items():
            print(f"  mean {k:<26} {v:.4f}")
        print(f"  best / paper (Prop. 2.3) mean: x{res['best_vs_paper_mean_ratio']:.3f}")
    if "kernel_seconds" in res:
        print(
            f"kernel bound (Prop. 2.2), {res['kernel_centers']} centres, "
            f"{res['kernel_points']} points: {res['kernel_seconds']:.1f} s "
            f"(x{res['kernel_speedup_vs_reference']:.0f} vs per-point reference)"
        )
    finish(res)


if __name__ == "__main__":
    main()
