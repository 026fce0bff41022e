"""benchmarks.flops: the matrix-product flops a function dispatches, by dtype, and the
device's measured rate; the count of a training step agrees with the closed-form count the
benchmarks use for the arithmetic bound (Section 3.2's Cross-Lipschitz form included)."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.flops import count_flops, matmul_rate
from crosslip.models import StackedSoftplusNet
from crosslip.training.core import TrainConfig
from crosslip.training.grid import GridStep
from crosslip.training.regularizers import cross_lipschitz_flops

from .helpers import random_net, random_points


def test_products_are_counted_forward_and_backward_by_dtype():
    n, d, h = 5, 7, 11
    a = torch.randn(n, d, requires_grad=True)
    b = torch.randn(d, h, requires_grad=True)
    c = torch.randn(3, h, d, dtype=torch.float64)

    def work():
        (a @ b).sum().backward()  # forward, then the gradients of a and b
        torch.bmm(c, c.mT)  # (3, h, d) x (3, d, h)
        return "done"

    out, flops = count_flops(work)
    assert out == "done"
    assert flops == {"float32": 3 * 2 * n * d * h, "float64": 3 * 2 * h * d * h}
    assert count_flops(lambda: torch.randn(4, 4).exp().sum())[1] == {}


@pytest.mark.parametrize(("n", "d", "h"), [(16, 30, 40), (4, 100, 200)])  # Gram, gradients
def test_a_training_step_costs_what_the_closed_form_counts(n, d, h):
    """One batched step of a plain and a Cross-Lipschitz network: the forward's and
    backward's products (``4 n d H + 6 n H K`` each) plus the cheaper exact Cross-Lipschitz
    form (:func:`crosslip.training.regularizers.cross_lipschitz_flops`), and the small products that
    count leaves out (each ``O((K-1) H^2)`` or less, beside its ``O(n K H d)``): the
    Helmert contrasts ``Q W`` forward and backward, ``4 (K-1) K H``, and in the Gram form
    ``C = (QW)^T (QW)`` and its gradient, ``4 (K-1) H^2``."""
    k = 10
    nets = [random_net(d, k, h, seed) for seed in range(2)]
    cfgs = [
        TrainConfig(regularizer="none", hidden=h),
        TrainConfig(regularizer="cross_lipschitz", lam=0.1, hidden=h),
    ]
    step = GridStep(StackedSoftplusNet(nets), cfgs)
    x, y = random_points(n, d, 1), torch.arange(n) % k
    _, flops = count_flops(lambda: step(x, y))
    plain = 4 * n * d * h + 6 * n * h * k
    cl = cross_lipschitz_flops(n, d, k, h)
    left_out = 4 * (k - 1) * k * h + (4 * (k - 1) * h * h if cl["gram"] < cl["gradients"] else 0)
    assert flops == {"float64": 2 * plain + min(cl.values()) + left_out}


def test_the_matmul_rate_is_a_rate_of_the_dtype_asked_for():
    rate32 = matmul_rate([(64, 64, 64)], "cpu", torch.float32, repeats=2)
    rate64 = matmul_rate([(64, 64, 64)], "cpu", torch.float64, repeats=2)
    assert math.isfinite(rate32) and rate32 > 0 and math.isfinite(rate64) and rate64 > 0
