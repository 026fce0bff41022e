"""The authors' adversarial-training samples (crosslip.attacks.one_step): one box-constrained
step towards the runner-up class for a random fraction of the gap.

On a linear classifier the linearization is exact, so the sample's gap ``f_c - f_j`` must be
``(1 - r)`` times the gap at ``x``, and its norm the minimum of the per-row reference solver;
the stacked closed form must equal the automatic-differentiation one per network; a step the
box does not allow leaves the point where it is."""

from __future__ import annotations

import pytest
import torch

from crosslip.attacks import one_step, one_step_stacked, project_box_reference
from crosslip.attacks.one_step import box_step, runner_up
from crosslip.models import StackedSoftplusNet

from .helpers import random_net, random_points

NORMS = [1.0, 2.0, float("inf")]


def linear_model(d: int, k: int, seed: int) -> torch.nn.Linear:
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(d, k).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(k, d, generator=g, dtype=torch.float64))
        model.bias.copy_(torch.randn(k, generator=g, dtype=torch.float64))
    return model


def fractions(m: int, seed: int) -> torch.Tensor:
    return torch.rand(m, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_the_runner_up_is_the_second_largest_logit():
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0], [5.0, 4.0, 4.5, 0.0]])
    c, j, gap = runner_up(logits)
    assert c.tolist() == [1, 0] and j.tolist() == [2, 2]
    torch.testing.assert_close(gap, torch.tensor([1.0, 0.5]))
    c, j, gap = runner_up(logits.expand(3, 2, 4))  # a grid of networks: (G, m)
    assert c.shape == j.shape == gap.shape == (3, 2) and j[2].tolist() == [2, 2]


@pytest.mark.parametrize("p", NORMS)
def test_on_a_linear_model_the_step_closes_the_stated_fraction_of_the_gap_minimally(p):
    d, k, m = 12, 5, 40
    model = linear_model(d, k, 0)
    x = random_points(m, d, 1)
    r = fractions(m, 2)
    out = one_step(model, x, r, p)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    with torch.no_grad():
        before, after = model(x), model(out)
    c, j, gap = runner_up(before)
    rows = torch.arange(m)
    moved = (out != x).any(1)
    assert moved.sum() >= m // 2, "most steps of a random linear model fit in the box"
    # linear: the sample's gap is exactly (1 - r) times the gap at x
    torch.testing.assert_close(
        (after[rows, c] - after[rows, j])[moved], ((1 - r) * gap)[moved], rtol=1e-9, atol=1e-9
    )
    # and no smaller step does it: the reference solver's norm
    v = model.weight[c] - model.weight[j]
    ref = project_box_reference(x, v.detach(), -(r * gap), p)
    norms = torch.linalg.vector_norm(out - x, ord=p, dim=1)
    ref_norms = torch.linalg.vector_norm(ref, ord=p, dim=1)
    torch.testing.assert_close(norms[moved], ref_norms[moved], rtol=1e-9, atol=1e-12)
    # a point that did not move: its step does not fit in the box
    capacity = (v.abs() * torch.where(v > 0, x, 1 - x)).sum(1)
    assert ((r * gap)[~moved] > capacity[~moved] * (1 - 1e-9)).all()


def test_a_step_the_box_does_not_allow_leaves_the_point_and_no_fraction_moves_nothing():
    d = 6
    x = torch.zeros(3, d, dtype=torch.float64)  # every coordinate at the lower face
    v = torch.ones(3, d, dtype=torch.float64)  # decreasing <v, .> needs x to go below 0
    out = box_step(x, v, torch.tensor([0.5, 0.0, -1.0], dtype=torch.float64), float("inf"))
    assert torch.equal(out, x)
    # halfway: the box allows a decrease of at most 3 (each coordinate down by 0.5); a
    # larger one is not made at all (not even the box corner), a smaller one is
    x = torch.full((2, d), 0.5, dtype=torch.float64)
    for p in NORMS:
        out = box_step(x, v[:2], torch.tensor([3.5, 2.5], dtype=torch.float64), p)
        assert torch.equal(out[0], x[0]) and (out[1] < x[1]).any()
        assert float((out[1] - x[1]).sum()) == pytest.approx(-2.5)
    x = random_points(4, d, 3)
    out = box_step(x, v[:1].expand(4, d), torch.tensor([0.0, 0.1, 0.0, 1e-3]), 2.0)
    assert torch.equal(out[[0, 2]], x[[0, 2]]) and (out[[1, 3]] != x[[1, 3]]).any(1).all()
    model = linear_model(d, 4, 1)
    assert torch.equal(one_step(model, x, torch.zeros(4, dtype=torch.float64), 2.0), x)


@pytest.mark.parametrize("p", NORMS)
def test_the_stacked_closed_form_equals_each_network_by_autograd(p):
    nets = [random_net(9, 4, 7, seed, scale=3.0) for seed in range(3)]  # with biases
    stack = StackedSoftplusNet(nets)
    x, r = random_points(10, 9, 4), fractions(10, 5)
    out = one_step_stacked(stack, x, r, p)
    assert out.shape == (3, 10, 9)
    for g, net in enumerate(nets):
        alone = one_step(net.eval(), x, r, p)
        torch.testing.assert_close(out[g], alone, rtol=1e-12, atol=1e-12)
        assert (alone != x).any(1).sum() >= 5  # the steps did move points
