"""The kernel memory plans hold for the arrays torch really allocates, measured on the CPU.

:mod:`crosslip.kernel_memory` counts the arrays of a kernel training or certification job
and turns a budget into chunk sizes; CUDA adds a reserve (cuBLAS workspaces, the caching
allocator's slack) that only a GPU shows (tests/test_kernel_scale.py compares the plan with
``torch.cuda.max_memory_allocated`` there). Everything else is the same arrays on either
device, so these tests run the real jobs on the CPU within small budgets, measure the peak
of torch's CPU allocator (every tensor and every temporary inside an operator,
:func:`tests.device_checks.cpu_peak_bytes`) and compare it with the plan: a phase that the
plan undercounts fails here, on every run. Each case is chosen so that a different phase
of the plan is the largest, and the plan must not be loose either (at least
:data:`TIGHT` of the measured peak), so that an undercount cannot hide in slack elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crosslip.certify.kernel_bounds import certify_kernel
from crosslip.certify.kernel_bounds import plan_for as certify_plan_for
from crosslip.kernel_memory import GIB, certify_minimum_bytes, train_minimum_bytes
from crosslip.models.kernels import GaussianKernelModel
from crosslip.training.kernel import KernelTrainConfig, plan_for, train_kernel

from .device_checks import cpu_peak_bytes
from .helpers import toy_dataset

#: The measured peak is at least this share of the plan's (a plan far above what is
#: allocated would let an undercounted phase pass unnoticed).
TIGHT = 0.75


def blobs(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` float32 points around ``k`` random means in [0, 1]^d, and their labels."""
    gen = np.random.default_rng(seed)
    means = gen.random((k, d))
    y = gen.integers(0, k, n)
    return (means[y] + 0.15 * gen.standard_normal((n, d))).astype(np.float32), y


def test_cpu_peak_bytes_follows_allocations_and_frees():
    """The measuring tool itself: two 8 MB arrays at most at once, in this sequence."""

    def work() -> float:
        a = torch.zeros(1000, 1000, dtype=torch.float64)
        b = a + 1
        del a
        c = b @ b
        return float(c[0, 0])

    out, peak = cpu_peak_bytes(work)
    assert out == 1000.0
    assert 16_000_000 <= peak < 16_000_000 + 4096


# (n, N, d, K, regularizer, budget over the minimum, L-BFGS iterations, the largest phase)
TRAIN_CASES = {
    # few rows, several passes, Kt recomputed, L-BFGS history full: L-BFGS's (K, N) arrays
    "lbfgs-history": (400, 200, 5, 100, "kernel_cl", 1.0, 40, "lbfgs"),
    "logreg-history": (400, 200, 5, 100, "kernel_logreg", 1.0, 40, "lbfgs"),
    # one pass, chunks of all rows (the symmetrization's tiles as large as the matrix)
    "gram-one-pass": (1000, 1000, 50, 10, "kernel_cl", 50.0, 2, "penalty"),
    # large inputs, few centres: the nearest-neighbour distances
    "bandwidth": (1500, 60, 784, 10, "kernel_cl", 1.5, 2, "bandwidth"),
    # Kt kept, with (n, K) logits of the whole training set
    "kt-kept": (600, 600, 5, 200, "kernel_logreg", 30.0, 40, "lbfgs"),
}


@pytest.mark.parametrize("case", sorted(TRAIN_CASES))
def test_training_stays_within_its_plan(case):
    n, N, d, K, reg, factor, iters, phase = TRAIN_CASES[case]
    data = toy_dataset(*blobs(n, d, K, 1), K, 200, checked=False)  # beyond [0, 1]
    memory_gb = factor * train_minimum_bytes(n, N, d, K, reg) / GIB
    cfg = KernelTrainConfig(
        regularizer=reg, lam=1e-2, n_centers=N, neighbours=10, max_iter=iters, tol=1e-12
    )
    plan = plan_for(cfg, n, d, K, memory_gb)
    phases = plan.phases()
    assert max(phases, key=phases.get) == phase, phases
    res, peak = cpu_peak_bytes(lambda: train_kernel(cfg, data, "cpu", memory_gb))
    assert res.metrics["status"] == "ok" and res.metrics["memory_peak_gib"] == plan.peak_bytes / GIB
    if phase == "lbfgs":
        assert res.metrics["lbfgs_iterations"] > 20  # the history is full
    assert peak <= plan.peak_bytes <= plan.budget, (peak, phases)
    assert peak >= TIGHT * plan.peak_bytes, (peak, phases)


# (N, d, K, points, budget over the minimum, pair arrays cached, H stored, points at once)
CERTIFY_CASES = {
    "tiles-one-point": (300, 20, 10, 6, 1.0, False, False, 1),
    "tiles-streamed": (300, 20, 10, 12, 3.0, False, False, 4),
    "stored-h": (600, 20, 10, 20, 100.0, True, True, 8),
}


@pytest.mark.parametrize("case", sorted(CERTIFY_CASES))
def test_certification_stays_within_its_plan(case):
    """Several chunks of points each: a chunk's arrays must be gone before the next chunk
    builds its own."""
    N, d, K, m, factor, cached, stored, points = CERTIFY_CASES[case]
    g = torch.Generator().manual_seed(0)
    model = GaussianKernelModel(torch.rand(N, d, generator=g, dtype=torch.float64), K, 1.0 / d)
    with torch.no_grad():
        model.coef.copy_(torch.randn(K, N, generator=g, dtype=torch.float64))
    x = torch.rand(m, d, generator=g, dtype=torch.float64)
    memory_gb = factor * certify_minimum_bytes(N, d, K) / GIB
    plan = certify_plan_for(model, memory_gb)
    assert (plan.cache_pairs, plan.store_h, plan.points) == (cached, stored, points)
    assert m >= 2 * points  # more than one chunk
    cert, peak = cpu_peak_bytes(lambda: certify_kernel(model, x, memory_gb=memory_gb))
    assert (cert["guarantee_local"] > 0).all()
    assert peak <= plan.peak_bytes <= plan.budget, peak
    assert peak >= TIGHT * plan.peak_bytes, peak
