"""Attack benchmark: exact box-constrained projections and upper bounds.

1. Projections: 10,000 x 784 rows for p = 1, 2, inf, one right-hand side per row
   (``project_box``: no full sort of the rows; the median of ``--rounds`` runs, as
   this shared 2-core machine is noisy), in float32 (as AutoAttack's FAB projections run)
   and float64; rows/s; a sort-based baseline in the style of FAB's projections
   (``sort_baseline.py``) and crosslip's sorted solver (``BoxProblem``: build + one solve,
   what the upper-bound search reuses for many right-hand sides) timed alternately in the
   same process, their times, the ratio and the largest relative difference of the norms;
   the per-row implementation (``project_box_reference``) side by side on a subset:
   speed-up and the largest relative difference of the norms.
2. Upper bounds on full MNIST (from the folder ``--mirror``, else the download cache under
   ``results/bench/`` or a download) for a trained 784-1024-10 network (cached by
   ``bench_certify.py`` under ``results/bench/``, trained if missing):
   all 10,000 test points, all 9 targets, L2, the paper's procedure, then the refinement;
   mean upper bounds of both.

``--device`` (``auto``: CUDA if torch sees one) runs the projections and upper bounds there
(the per-row reference stays on the CPU); CUDA is synchronised before every clock reading.
Run: ``.venv/bin/python benchmarks/bench_attack.py [--device auto]``; the last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import copy
from functools import partial

import torch

from _harness import add_mirror_argument, finish, medians, parser, start, timed
from bench_certify import full_mnist, trained_net
from crosslip.attacks import (
    BoxProblem,
    project_box,
    project_box_reference,
    refine_upper_bound,
    upper_bound,
)
from sort_baseline import project_sorted

NAMES = {1.0: "l1", 2.0: "l2", float("inf"): "linf"}


def instances(n: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g).to(dtype)
    v = torch.randn(n, d, generator=g).to(dtype)
    frac = torch.rand(n, generator=g).to(dtype)
    return x, v, frac


def capacity(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The largest decrease of ``<v, delta>`` in the box [0, 1] (n,)."""
    return (v.abs() * torch.where(v > 0, x, 1 - x)).sum(1)


def solve_all(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, p: float) -> torch.Tensor:
    """Solve every row once (the timed unit) for the decrease ``t``."""
    return project_box(x, v, -t, p)[0]


def solve_boxproblem(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, p: float):
    """The same unit for crosslip's sorted solver: build (sort) and one solve."""
    return BoxProblem.build(x, v, p).solve(t)[0]


def solve_sorted(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, p: float):
    """The same unit for the FAB-style sort-based baseline (:mod:`sort_baseline`)."""
    return project_sorted(x, v, t, p)


def projections(n: int, d: int, n_ref: int, rounds: int, device: torch.device) -> dict:
    out: dict = {"projection_rows": n, "projection_dim": d, "projection_rounds": rounds}
    for dtype, tag in ((torch.float32, ""), (torch.float64, "_float64")):
        x, v, frac = (t.to(device) for t in instances(n, d, dtype))
        t = frac * capacity(x, v)
        secs, diffs, speedup, base, base_diff, boxp, boxp_diff = ({} for _ in range(7))
        for p, name in NAMES.items():
            delta = solve_all(x, v, t, p)  # warm-up at full size; kept for checks
            other = solve_sorted(x, v, t, p)
            sorted_own = solve_boxproblem(x, v, t, p)
            # median of the rounds, crosslip and the baselines alternating
            solvers = {"ours": solve_all, "theirs": solve_sorted, "own": solve_boxproblem}
            kinds = {k: partial(solve, x, v, t, p) for k, solve in solvers.items()}
            median = medians(kinds, rounds, device)
            secs[name], base[name], boxp[name] = median["ours"], median["theirs"], median["own"]
            a = torch.linalg.vector_norm(delta.double(), ord=p, dim=1)
            for z, out_diff in ((other, base_diff), (sorted_own, boxp_diff)):
                b = torch.linalg.vector_norm(z.double(), ord=p, dim=1)
                out_diff[name] = float(((a - b).abs() / b.clamp_min(1e-30)).max())
            c = -t[:n_ref].cpu()
            xr, vr = x[:n_ref].cpu(), v[:n_ref].cpu()
            ref, rsecs = timed(partial(project_box_reference, xr, vr, c, p))
            speedup[name] = rsecs / n_ref * n / secs[name]
            a = torch.linalg.vector_norm(delta[:n_ref].cpu().double(), ord=p, dim=1)
            b = torch.linalg.vector_norm(ref.double(), ord=p, dim=1)
            diffs[name] = float(((a - b).abs() / b.clamp_min(1e-30)).max())
        out[f"projection_seconds{tag}"] = secs
        out[f"projection_rows_per_second{tag}"] = {k: n / s for k, s in secs.items()}
        out[f"projection_speedup_vs_reference{tag}"] = speedup
        out[f"projection_max_rel_diff{tag}"] = diffs
        out[f"sort_baseline_seconds{tag}"] = base
        out[f"projection_speedup_vs_sort_baseline{tag}"] = {k: base[k] / secs[k] for k in secs}
        out[f"sort_baseline_max_rel_diff{tag}"] = base_diff
        out[f"sorted_solver_seconds{tag}"] = boxp
        out[f"sorted_solver_max_rel_diff{tag}"] = boxp_diff
    return out


def report_projections(res: dict, machine_line: str) -> None:
    print(machine_line)
    for tag, label in (("", "float32"), ("_float64", "float64")):
        for name in NAMES.values():
            secs_p = res["projection_seconds" + tag][name]
            rate = res["projection_rows_per_second" + tag][name]
            speed = res["projection_speedup_vs_reference" + tag][name]
            diff = res["projection_max_rel_diff" + tag][name]
            base = res["sort_baseline_seconds" + tag][name]
            ratio = res["projection_speedup_vs_sort_baseline" + tag][name]
            bdiff = res["sort_baseline_max_rel_diff" + tag][name]
            own = res["sorted_solver_seconds" + tag][name]
            print(
                f"projection {name:>4}, 10000 x 784, {label}: {secs_p:.3f} s "
                f"({rate:,.0f} rows/s); sort-based (FAB-style) baseline {base:.3f} s: "
                f"x{ratio:.2f}; sorted BoxProblem {own:.3f} s: x{own / secs_p:.2f}; "
                f"x{speed:.0f} vs per-row reference, max rel. diff {diff:.1e} "
                f"(vs baseline {bdiff:.1e})"
            )


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    add_mirror_argument(ap)
    ap.add_argument("--reference-rows", type=int, default=100)
    ap.add_argument("--refine-steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per projection")
    ap.add_argument("--projections-only", action="store_true", help="skip the MNIST upper bounds")
    return ap


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    res: dict = bench.header()
    res.update(projections(10_000, 784, args.reference_rows, args.rounds, dev))
    if args.projections_only:
        report_projections(res, bench.machine_line())
        finish(res)
        return

    ds = full_mnist(args.mirror)
    net, _ = trained_net(ds)
    net = copy.deepcopy(net).to(dev)
    x = torch.as_tensor(ds.x_test).to(dev)
    upper_bound(net, x[:64])  # warm-up
    ub, secs = timed(lambda: upper_bound(net, x, p=2), dev)
    ref, rsecs = timed(lambda: refine_upper_bound(net, x, ub, p=2, steps=args.refine_steps), dev)
    ok = ub.success
    res.update(
        points=len(x),
        upper_bound_seconds=secs,
        refine_seconds=rsecs,
        refine_steps=args.refine_steps,
        success_rate=float(ok.double().mean()),
        mean_upper_bound_paper=float(ub.norm[ok].mean()),
        mean_upper_bound_refined=float(ref.norm[ok].mean()),
        share_refined_smaller=float((ref.norm[ok] < ub.norm[ok] * (1 - 1e-9)).double().mean()),
    )

    report_projections(res, bench.machine_line())
    print(
        f"L2 upper bounds, {len(x)} MNIST test points x 9 targets: {secs:.1f} s; success "
        f"{res['success_rate']:.1%}; mean {res['mean_upper_bound_paper']:.4f} (paper)"
    )
    print(
        f"refinement, {args.refine_steps} re-linearizations: {rsecs:.1f} s; mean "
        f"{res['mean_upper_bound_refined']:.4f}; smaller on "
        f"{res['share_refined_smaller']:.1%} of the points"
    )
    finish(res)


if __name__ == "__main__":
    main()
