"""Benchmark: Proposition 2.2 guarantees for a Gaussian-kernel classifier (Section 2.2).

Builds ``f_j(x) = sum_r alpha_jr exp(-gamma ||x - x_r||^2)`` on ``n_centers`` expansion points
(real MNIST training digits where ``CROSSLIP_MNIST_MIRROR`` names a folder of the official
MNIST files and ``d = 784, K = 10``, else uniform random data in [0, 1]^d: the output says
which), with ``gamma = 1 / rho_KNN40^2``
(Section 5, ``a = 1``) and the coefficients of kernel ridge regression on one-hot targets
(one linear solve; a quick, sensible fit, not the paper's L-BFGS training). Then certifies
``n_points`` test points with the batched :func:`crosslip.kernel_bounds.certify_kernel`
(Theorem 2.1 search, rtol 1e-3), and ``reference_points`` of them with the literal per-point
:func:`crosslip.kernel_bounds.prop22_reference` in the same search, and checks that the
guarantees agree. ``--device`` (``auto``: CUDA if torch sees one) runs the batched
certification there (the literal reference stays on the CPU); CUDA is synchronised before
every clock reading. Prints the figures with the machine and device named; the last line is
one JSON object.
Run: .venv/bin/python benchmarks/bench_kernel_bound.py [--device auto]
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from _harness import finish, parser, start, timed
from crosslip.certify.kernel_bounds import certify_kernel, certify_kernel_reference
from crosslip.models.kernels import GaussianKernelModel, gamma_from_data

#: The folder of the official MNIST files: ``CROSSLIP_MNIST_MIRROR`` where set, else none.
_MIRROR = os.environ.get("CROSSLIP_MNIST_MIRROR")
MIRROR = Path(_MIRROR) if _MIRROR else None


def load_data(
    n_centers: int, n_points: int, d: int, K: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """(centers, center labels, points, point labels, description); float64 tensors."""
    rng = np.random.default_rng(seed)
    if d == 784 and K == 10 and MIRROR is not None and MIRROR.is_dir():
        from crosslip.data import load_dataset

        try:
            with tempfile.TemporaryDirectory() as cache:
                ds = load_dataset("mnist", cache_dir=cache, mirror_dir=MIRROR)
        except Exception as exc:  # any failure: fall back to random data, and say why
            print(f"MNIST mirror unusable ({exc}); using random data")
        else:
            tr = rng.choice(len(ds.x_train), n_centers, replace=False)
            te = rng.choice(len(ds.x_test), n_points, replace=False)
            return (
                torch.from_numpy(ds.x_train[tr]).double(),
                torch.from_numpy(ds.y_train[tr]),
                torch.from_numpy(ds.x_test[te]).double(),
                torch.from_numpy(ds.y_test[te]),
                f"MNIST ({n_centers} random training digits as centers, "
                f"{n_points} random test digits)",
            )
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(n_centers, d, generator=g, dtype=torch.float64),
        torch.randint(K, (n_centers,), generator=g),
        torch.rand(n_points, d, generator=g, dtype=torch.float64),
        torch.randint(K, (n_points,), generator=g),
        f"random uniform [0,1]^{d} data with random labels",
    )


def fit_ridge(model: GaussianKernelModel, labels: torch.Tensor, lam: float = 1.0) -> None:
    """Kernel ridge regression on the centers: ``alpha^T = (G + lam I)^{-1} Y``, ``Y`` the
    one-hot targets minus 1/K (``G`` the kernel matrix of the centers)."""
    K = model.coef.shape[0]
    with torch.no_grad():
        gram = model.kernel(model.centers)
        target = torch.nn.functional.one_hot(labels, K).to(gram) - 1.0 / K
        eye = torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
        model.coef.copy_(torch.linalg.solve(gram + lam * eye, target).T)


def run(
    n_centers: int = 2000,
    n_points: int = 500,
    d: int = 784,
    K: int = 10,
    seed: int = 0,
    reference_points: int = 5,
    device: torch.device | str = "cpu",
) -> dict:
    """Build the model, certify on ``device``, compare with the per-point reference on the
    CPU; return the figures."""
    centers, y_c, x, y, source = load_data(n_centers, n_points, d, K, seed)
    gamma, gamma_s = timed(lambda: gamma_from_data(centers, a=1.0, neighbours=40))
    model = GaussianKernelModel(centers, K, gamma)
    fit_ridge(model, y_c)
    dev = torch.device(device)
    on_dev = copy.deepcopy(model).to(dev)
    xd = x.to(dev)
    certify_kernel(on_dev, xd[:2], rtol=1e-3)  # warm-up
    cert, secs = timed(lambda: certify_kernel(on_dev, xd, rtol=1e-3), dev)
    cert = {k: v.cpu() for k, v in cert.items()}
    n_ref = min(reference_points, n_points)
    ref, ref_secs = timed(lambda: certify_kernel_reference(model, x[:n_ref], rtol=1e-3))
    g, g_ref = cert["guarantee_local"][:n_ref], ref["guarantee_local"]
    rel = ((g - g_ref).abs() / g_ref.abs().clamp_min(1e-300)).max().item() if n_ref else 0.0
    ref_per_point = ref_secs / max(n_ref, 1)
    return {
        "kernel_data": source,
        "kernel_points": n_points,
        "kernel_centers": n_centers,
        "kernel_dim": d,
        "kernel_classes": K,
        "kernel_gamma": gamma,
        "kernel_gamma_seconds": gamma_s,
        "kernel_accuracy": (cert["pred"] == y).double().mean().item(),
        "kernel_median_guarantee": cert["guarantee_local"].median().item(),
        "kernel_mean_evaluations": cert["evaluations"].double().mean().item(),
        "kernel_seconds": secs,
        "kernel_points_per_second": n_points / secs,
        "kernel_reference_points": n_ref,
        "kernel_reference_seconds_per_point": ref_per_point,
        "kernel_speedup_vs_reference": ref_per_point / (secs / n_points),
        "kernel_max_rel_diff": rel,
        "kernel_agree": bool(rel <= 1e-6),
    }


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--centers", type=int, default=2000, help="expansion points")
    ap.add_argument("--points", type=int, default=500, help="certified points")
    ap.add_argument("--reference-points", type=int, default=5)
    return ap


def main() -> None:
    bench = start(arguments())
    args = bench.args
    figures = run(
        n_centers=args.centers,
        n_points=args.points,
        reference_points=args.reference_points,
        device=bench.device,
    )
    res = {**figures, **bench.header()}
    print(bench.machine_line())
    print(f"data: {res['kernel_data']}")
    print(
        f"model: {res['kernel_centers']} centers, d = {res['kernel_dim']}, "
        f"K = {res['kernel_classes']}, gamma = {res['kernel_gamma']:.5g} "
        f"(KNN40 rule, a = 1; {res['kernel_gamma_seconds']:.2f} s); "
        f"accuracy on the certified points {res['kernel_accuracy']:.3f}"
    )
    print(
        f"certify {res['kernel_points']} points, batched:  {res['kernel_seconds']:.1f} s "
        f"({res['kernel_points_per_second']:.2f} points/s, "
        f"{res['kernel_mean_evaluations']:.1f} evaluations of the bound a point); "
        f"median guarantee {res['kernel_median_guarantee']:.4g}"
    )
    print(
        f"per-point reference on the CPU (literal Prop. 2.2): "
        f"{res['kernel_reference_seconds_per_point']:.2f} s/point on "
        f"{res['kernel_reference_points']} points; speedup x"
        f"{res['kernel_speedup_vs_reference']:.1f}"
    )
    print(
        f"guarantees agree with the reference: {res['kernel_agree']} "
        f"(max relative difference {res['kernel_max_rel_diff']:.2e})"
    )
    finish(res)


if __name__ == "__main__":
    main()
