"""The sort-free projections for one right-hand side per row (:func:`project_box`) against the
sorted solver (:class:`BoxProblem`, itself checked against LP/QP solvers and the per-row
reference) on rows of MNIST's size, on every path: Newton's method and its sort-based
finish after ``max_steps`` (p = 2, inf); for p = 1 the sampled bracket, its splitting, and
the small and the large ``topk``, on rows built to defeat the sample (ties, few distinct
values, heavy tails, the threshold at either end)."""

from __future__ import annotations

import math

import pytest
import torch

from crosslip.attacks import BoxProblem, project_box, single_rhs

from .test_box_projection_corners import check_solution

NORMS = [1.0, 2.0, math.inf]


def hard_rows(d: int = 784, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, v, t)`` float64: 8 kinds of rows x 8 required decreases (fractions of the
    capacity from 1e-9 to 1 and beyond)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    kinds = [
        randn(d),  # plain
        torch.full((d,), 0.7, dtype=torch.float64) * torch.sign(randn(d)),  # one |v|: ties
        torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)[torch.randint(3, (d,), generator=g)]
        * torch.sign(randn(d)),  # three distinct |v|
        torch.exp(4 * randn(d)) * torch.sign(randn(d)),  # heavy tails
        randn(d) * (rand(d) < 0.1),  # mostly zeros
        torch.linspace(1e-3, 1, d, dtype=torch.float64).flip(0),  # sorted: a biased sample
        randn(d).abs() * 1e-30,  # tiny: v^2 near underflow in float32, fine in float64
        randn(d).round(),  # integers: many ties and zeros
    ]
    fracs = torch.tensor([1e-9, 1e-4, 0.01, 0.3, 0.7, 0.99, 1 - 1e-12, 1.1], dtype=torch.float64)
    v = torch.stack([k for k in kinds for _ in fracs])
    x = rand(len(v), d)
    x[rand(len(v), d) < 0.15] = 0.0  # points on the faces
    x[rand(len(v), d) < 0.15] = 1.0
    cap = BoxProblem.build(x, v, 1).capacity
    t = fracs.repeat(len(kinds)) * cap
    return x, v, t


def assert_same_optimum(x, v, t, p, **kwargs):
    prob = BoxProblem.build(x, v, p)
    ref, _, ref_feasible = prob.solve(t)
    delta, feasible = project_box(x, v, -t, p, **kwargs)
    assert torch.equal(feasible, ref_feasible)
    check_solution(x, v, -t, 0.0, 1.0, ref, feasible, prob.capacity)
    check_solution(x, v, -t, 0.0, 1.0, delta, feasible, prob.capacity)
    a, b = (torch.linalg.vector_norm(z, ord=p, dim=1) for z in (delta, ref))
    # up to the optimum's own change under a relative change of t by 1e-12: near capacity
    # on heavy-tailed rows, the last coordinates to move have tiny |v|, and the rounding of
    # the sums that reach t moves the norm by far more than 1e-9 (in either solver)
    wobble = [
        torch.linalg.vector_norm(prob.solve(t * (1 + e))[0], ord=p, dim=1) for e in (1e-12, -1e-12)
    ]
    tol = 1e-9 * b + (wobble[0] - wobble[1]).abs()
    assert torch.all((a - b).abs() <= tol), ((a - b).abs() / b).max()
    assert (tol > 1e-6 * b).sum() <= 2  # that allowance is large only on such rows
    if p == 2:  # the L2 optimum is unique (where t's rounding does not move it)
        ok = tol <= 2e-9 * b
        assert torch.allclose(delta[ok], ref[ok], rtol=1e-9, atol=1e-12)
    return delta


@pytest.mark.parametrize("p", NORMS)
def test_the_sort_free_projection_equals_the_sorted_one_on_hard_rows(p):
    x, v, t = hard_rows()
    assert_same_optimum(x, v, t, p)


@pytest.mark.parametrize("p", [2.0, math.inf])
@pytest.mark.parametrize("max_steps", [1, 2, 4])
def test_rows_left_after_max_steps_are_finished_exactly(p, max_steps):
    """Newton stops after ``max_steps`` with rows still moving; the sorted solver finishes
    them to the same optimum (with one step almost every row is left)."""
    x, v, t = hard_rows(d=200, seed=1)
    assert_same_optimum(x, v, t, p, max_steps=max_steps)


@pytest.mark.parametrize(
    ("stride", "offsets", "topk", "rounds"),
    [
        (8, (0,), 1, 0),  # one pivot, no splitting: the large topk takes almost every row
        (64, (-1, 0, 1), 2, 1),  # a poor sample and one split round
        (1, (-3, 0, 3), 4, 3),  # the full row as sample
    ],
)
def test_every_path_of_the_l1_threshold_search(monkeypatch, stride, offsets, topk, rounds):
    """The sample only steers the search; any sample, pivot set and topk size gives the
    same optimum."""
    monkeypatch.setattr(single_rhs, "SAMPLE_STRIDE", stride)
    monkeypatch.setattr(single_rhs, "SAMPLE_OFFSETS", offsets)
    monkeypatch.setattr(single_rhs, "TOPK_CANDIDATES", topk)
    monkeypatch.setattr(single_rhs, "SPLIT_ROUNDS", rounds)
    monkeypatch.setattr(single_rhs, "PIVOT_CHUNK", 7)  # several chunks
    x, v, t = hard_rows(d=120, seed=3)
    assert_same_optimum(x, v, t, 1.0)


@pytest.mark.parametrize("p", NORMS)
def test_single_rows_and_rows_that_need_no_step(p):
    x = torch.full((4, 5), 0.5, dtype=torch.float64)
    v = torch.tensor([[1.0, -2.0, 0.0, 3.0, 0.5]] * 4, dtype=torch.float64)
    c = torch.tensor([0.0, 1.0, -0.25, -100.0], dtype=torch.float64)
    delta, feasible = project_box(x, v, c, p)
    assert feasible.tolist() == [True, True, True, False]
    assert torch.all(delta[:2] == 0)
    assert torch.equal(x[3] + delta[3], torch.tensor([0.0, 1.0, 0.5, 0.0, 0.0]).double())
    d1, f1 = project_box(x[2:3], v[2:3], c[2:3], p)
    assert torch.equal(d1, delta[2:3]) and bool(f1)


def test_an_empty_bracket_falls_back_to_the_whole_row(monkeypatch):
    """Sums that disagree through rounding could leave no value in the bracket; the search
    then restarts from the whole row. Simulated: the first pivot evaluation claims that
    every pivot reaches t with no value at or above it."""
    real = single_rhs._at_pivots
    calls = []

    def inconsistent(absv, A, pivots):
        calls.append(len(absv))
        out = real(absv, A, pivots)
        if len(calls) == 1:
            out[:, 0] = torch.finfo(out.dtype).max
            out[:, 1] = 0.0
        return out

    monkeypatch.setattr(single_rhs, "_at_pivots", inconsistent)
    x, v, t = hard_rows(d=150, seed=4)
    assert_same_optimum(x, v, t, 1.0)
    assert len(calls) > 1  # the split rounds ran on the restarted rows
