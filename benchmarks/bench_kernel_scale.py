"""Kernel models at scale: Kernel-CL training and certification on full MNIST within a budget.

For each number of expansion points ``N`` (``--centers``), on all 60,000 MNIST training
digits: one Kernel-CL training run of ``--iterations`` L-BFGS iterations
(:func:`crosslip.training.kernel.train_kernel`: bandwidth, Gram matrix, seconds per iteration,
the plan the budget gave), then Proposition 2.2 guarantees for ``--points`` test digits with
the plan of the budget (:func:`crosslip.certify.kernel_bounds.certify_kernel`) and, with
``--streamed``, again with the (N, N) arrays recomputed per tile (as for a model whose
arrays do not fit, forced by a budget of the minimum and two (N, N) arrays). ``--device``
picks the device (``auto``: CUDA if there is one). The largest ``N`` whose training fits
the budget on that device comes from :func:`crosslip.kernel_memory.largest_centers`. The
model is trained for a few iterations only: the timings, not its accuracy, are the point.
Wall-clock and CPU time of the process are both reported: on a shared machine the CPU time
is the steadier figure.

Run: ``.venv/bin/python benchmarks/bench_kernel_scale.py --mirror <folder with the MNIST
files> [--centers 2000 5000] [--device auto]``; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from _harness import Run, finish, parser, start
from crosslip.certify.kernel_bounds import certify_kernel, plan_for
from crosslip.config.schema import default
from crosslip.data import load_dataset
from crosslip.kernel_memory import GIB, certify_minimum_bytes, largest_centers
from crosslip.models.kernels import gamma_from_data
from crosslip.training.kernel import KernelTrainConfig, train_kernel


def run(bench: Run) -> dict:
    """The figures (module docstring); each size's row is also printed as it is done."""
    args, device = bench.args, bench.device
    ds = load_dataset("mnist", cache_dir=args.cache, mirror_dir=args.mirror)
    n, d = ds.x_train.shape
    budget = args.memory_gb * GIB
    out: dict = {
        **bench.header(),
        "threads": torch.get_num_threads(),
        "memory_gb": args.memory_gb,
        "n_train": int(n),
        "largest_centers_kernel_cl": largest_centers(n, d, 10, "kernel_cl", budget, device.type),
        "largest_centers_kernel_logreg": largest_centers(
            n, d, 10, "kernel_logreg", budget, device.type
        ),
        "sizes": [],
    }
    x_eval = torch.as_tensor(ds.x_test[: args.points])
    # gamma = a / rho^2 from the first --gamma-points digits only: the full nearest-neighbour
    # pass (2 n^2 d flops) is timed by the training metric bandwidth_seconds when
    # --gamma-points is 0; the timings below do not depend on the value of gamma
    gamma = None
    if args.gamma_points:
        sub = torch.as_tensor(ds.x_train[: args.gamma_points], dtype=torch.float64)
        gamma = gamma_from_data(sub, a=1.0, neighbours=40)
    out["gamma"], out["gamma_points"] = gamma, args.gamma_points or int(n)
    for N in args.centers:
        cfg = KernelTrainConfig(
            regularizer="kernel_cl", lam=1e-2, a=1.0, n_centers=N, max_iter=args.iterations
        )
        res = train_kernel(
            cfg, ds.head(test=1000), device=device, memory_gb=args.memory_gb, gamma=gamma
        )
        m = res.metrics
        row = {"lbfgs_evaluations": len(m["curve"])}
        row |= {
            k: m[k]
            for k in (
                "n_centers",
                "bandwidth_seconds",
                "penalty_matrix_seconds",
                "setup_seconds",
                "setup_cpu_seconds",
                "lbfgs_iterations",
                "seconds_per_lbfgs_iteration",
                "cpu_seconds_per_lbfgs_iteration",
                "chunk_rows",
                "gram_passes",
                "kernel_matrix_kept",
                "memory_peak_gib",
                "memory_device_reserve_gib",
            )
        }
        row["cuda_peak_gib"] = m.get("cuda_peak_gib")
        plan = plan_for(res.model, args.memory_gb, device)
        row["certify_plan"] = {
            "cache_pairs": plan.cache_pairs,
            "store_h": plan.store_h,
            "points": plan.points,
            "peak_gib": plan.peak_bytes / GIB,
        }
        t0, c0 = time.perf_counter(), time.process_time()
        cert = certify_kernel(res.model, x_eval, memory_gb=args.memory_gb, device=device)
        row["certify_seconds_per_point"] = (time.perf_counter() - t0) / len(x_eval)
        row["certify_cpu_seconds_per_point"] = (time.process_time() - c0) / len(x_eval)
        row["mean_evaluations"] = cert["evaluations"].double().mean().item()
        if args.streamed:
            # the minimum and two (N, N) arrays: too small for the cached ones
            tiny = (certify_minimum_bytes(N, d, 10, device.type) + 2 * 8 * N * N) / GIB
            t0, c0 = time.perf_counter(), time.process_time()
            again = certify_kernel(res.model, x_eval, memory_gb=tiny, device=device)
            row["streamed_plan_points"] = plan_for(res.model, tiny, device).points
            row["streamed_seconds_per_point"] = (time.perf_counter() - t0) / len(x_eval)
            row["streamed_cpu_seconds_per_point"] = (time.process_time() - c0) / len(x_eval)
            g0, g1 = cert["guarantee_local"], again["guarantee_local"]
            row["streamed_max_rel_diff"] = ((g1 - g0).abs() / g0.clamp_min(1e-300)).max().item()
        out["sizes"].append(row)
        print(json.dumps(row), flush=True)
    return out


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--centers", type=int, nargs="+", default=[2000, 5000])
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument(
        "--gamma-points",
        type=int,
        default=0,
        help="estimate gamma on this many training digits (0: all)",
    )
    ap.add_argument("--points", type=int, default=16)
    ap.add_argument("--memory-gb", type=float, default=default("kernel.memory_gb"))
    ap.add_argument("--mirror", default=None, help="folder with the official MNIST files")
    ap.add_argument("--cache", default="results/downloads")
    ap.add_argument(
        "--streamed",
        action="store_true",
        help="also certify with the pair arrays recomputed per tile",
    )
    return ap


def main() -> None:
    finish(run(start(arguments())))


if __name__ == "__main__":
    main()
