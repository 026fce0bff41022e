"""Box-constrained projections (Section 4) on degenerate rows: ties, zeros in v, points on
the faces of the box, infeasible right-hand sides, single-coordinate rows, other boxes, and
float32 against float64. Each row is solved by the sorted solver (:class:`BoxProblem`) and
by the single-right-hand-side one (:func:`project_box`), and checked against an LP (p = 1,
inf), the per-row reference (every p) and the problem's own conditions (box, half-space,
feasibility flag)."""

from __future__ import annotations

import math

import pytest
import torch

from crosslip.attacks import BoxProblem, project_box, project_box_reference

from .test_attacks import lp_optimum

NORMS = [1.0, 2.0, math.inf]


def check_solution(x, v, c, lo, hi, delta, feasible, capacity):
    """The problem's own conditions on a solution ``delta`` (n, d) with flags ``feasible``:
    in the box, ``v_i = 0`` never moves, the half-space where feasible, no step where
    ``c >= 0``, and the box point with the largest decrease where infeasible."""
    assert not torch.isnan(delta).any()
    slack = 0.0 if (lo, hi) == (0.0, 1.0) else 1e-15 * (hi - lo)  # x - (x - lo) may round
    assert torch.all(x + delta >= lo - slack) and torch.all(x + delta <= hi + slack)
    assert torch.all(delta[v == 0] == 0)  # a coordinate with v_i = 0 never moves
    inner = (v * delta).sum(1)
    tol = 1e-9 * (1 + c.abs() + (v.abs() * (hi - lo)).sum(1))
    assert torch.all(inner[feasible] <= c[feasible] + tol[feasible])
    assert torch.all(delta[c >= 0] == 0)
    assert torch.equal(feasible, -c <= capacity * (1 + 1e-12))
    assert torch.allclose(inner[~feasible], -capacity[~feasible], rtol=1e-12, atol=0)


def check_rows(x, v, c, p, lo=0.0, hi=1.0):
    """Solve every row with :class:`BoxProblem` and with :func:`project_box` (no sort for
    p = 2, inf) and check both; returns BoxProblem's ``(delta, scale, feasible)``."""
    prob = BoxProblem.build(x, v, p, lo, hi)
    delta, scale, feasible = prob.solve(-c)
    assert not torch.isnan(scale).any()
    check_solution(x, v, c, lo, hi, delta, feasible, prob.capacity)
    assert torch.all(scale[c >= 0] == 0) and torch.all(torch.isinf(scale[~feasible]))
    one, one_feasible = project_box(x, v, c, p, lo, hi)
    check_solution(x, v, c, lo, hi, one, one_feasible, prob.capacity)
    ref = project_box_reference(x, v, c, p, lo, hi)
    norms = [torch.linalg.vector_norm(z, ord=p, dim=1) for z in (delta, ref, one)]
    assert torch.allclose(norms[0][feasible], norms[1][feasible], rtol=1e-9, atol=1e-12)
    assert torch.allclose(norms[2][feasible], norms[1][feasible], rtol=1e-9, atol=1e-12)
    if lo == 0.0 and hi == 1.0 and p != 2:
        for i in range(len(x)):
            res = lp_optimum(x[i].numpy(), v[i].numpy(), float(c[i]), p)
            assert (res.status == 0) == bool(feasible[i]), i
            if res.status == 0:
                assert float(norms[0][i]) == pytest.approx(res.fun, rel=1e-7, abs=1e-10)
    return delta, scale, feasible


def rhs(prob_cap: torch.Tensor, fracs: list[float]) -> torch.Tensor:
    return -torch.tensor(fracs, dtype=torch.float64) * prob_cap


@pytest.mark.parametrize("p", NORMS)
def test_ties_in_v_and_in_the_breakpoints(p):
    """Equal |v| (p = 1 ties), equal room/|v| (p = 2) and equal room (p = inf), with the
    required decrease ending inside a block of ties, at its start and at its end."""
    x = torch.tensor([[0.5] * 6, [0.25, 0.25, 0.75, 0.75, 0.5, 0.5]] * 3, dtype=torch.float64)
    v = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0, -2.0]] * 6, dtype=torch.float64)
    cap = BoxProblem.build(x, v, p).capacity
    # block of the two |v| = 2 coordinates: capacity 2 of 4 (row 0); 1/4, 1/2, 3/4 inside it
    c = rhs(cap, [0.25, 0.5, 0.75, 0.125, 1.0, 0.375])
    check_rows(x, v, c, p)


@pytest.mark.parametrize("p", NORMS)
def test_rows_with_zeros_in_v(p):
    """v with one nonzero entry, v = 0 entirely (capacity 0: any t > 0 is infeasible), and
    zeros mixed with values."""
    x = torch.full((5, 4), 0.5, dtype=torch.float64)
    v = torch.tensor(
        [
            [0.0, 0.0, 3.0, 0.0],
            [0.0, 0.0, -3.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [1.0, 0.0, -2.0, 0.0],
        ],
        dtype=torch.float64,
    )
    c = torch.tensor([-1.0, -1.5, -0.1, 0.0, -1.2], dtype=torch.float64)
    delta, _, feasible = check_rows(x, v, c, p)
    assert feasible.tolist() == [True, True, False, True, True]
    assert torch.equal(delta[2], torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("p", NORMS)
def test_points_on_the_faces_of_the_box(p):
    """Coordinates at lo or hi: no room in the helpful direction (it may not move), full
    room in the other; a row entirely on the faces with no room at all."""
    x = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0, 0.5],
            [0.0, 1.0, 0.0, 1.0, 0.5],
            [0.0, 1.0, 0.0, 1.0, 0.0],
            [1.0, 0.0, 1.0, 0.0, 1.0],
        ],
        dtype=torch.float64,
    )
    v = torch.tensor(
        [
            [1.0, -1.0, 2.0, -2.0, 1.0],  # helpful moves all blocked but the last
            [-1.0, 1.0, -2.0, 2.0, 1.0],  # every coordinate has its full room
            [1.0, -1.0, 1.0, -1.0, 1.0],  # no room at all: capacity 0
            [1.0, -1.0, 3.0, -3.0, 0.5],
        ],
        dtype=torch.float64,
    )
    c = torch.tensor([-0.4, -3.5, -0.1, -4.0], dtype=torch.float64)
    delta, _, feasible = check_rows(x, v, c, p)
    assert feasible.tolist() == [True, True, False, True]
    assert torch.all(delta[0, :4] == 0) and torch.all(delta[2] == 0)


@pytest.mark.parametrize("p", NORMS)
def test_infeasible_rows_and_right_hand_sides_at_capacity(p):
    g = torch.Generator().manual_seed(11)
    x = torch.rand(6, 9, generator=g, dtype=torch.float64)
    v = torch.randn(6, 9, generator=g, dtype=torch.float64)
    cap = BoxProblem.build(x, v, p).capacity
    c = rhs(cap, [1.0, 1.0 + 1e-13, 1.0 + 1e-6, 1.5, 100.0, 1.0 - 1e-9])
    _, _, feasible = check_rows(x, v, c, p)
    assert feasible.tolist() == [True, True, False, False, False, True]


@pytest.mark.parametrize("p", NORMS)
def test_single_coordinate_rows(p):
    x = torch.tensor([[0.3], [0.3], [0.0], [1.0], [0.3], [0.3]], dtype=torch.float64)
    v = torch.tensor([[2.0], [-2.0], [2.0], [2.0], [0.0], [2.0]], dtype=torch.float64)
    c = torch.tensor([-0.4, -1.0, -0.1, -1.0, -0.1, -0.7], dtype=torch.float64)
    delta, _, feasible = check_rows(x, v, c, p)
    assert feasible.tolist() == [True, True, False, True, False, False]
    assert delta[0, 0] == pytest.approx(-0.2) and delta[1, 0] == pytest.approx(0.5)
    assert delta[3, 0] == pytest.approx(-0.5)


@pytest.mark.parametrize("p", NORMS)
def test_other_boxes(p):
    """A box other than [0, 1]: the projection uses lo and hi, never 0 and 1 (in the box up
    to the rounding of ``x - (x - lo)``, which is exact only for lo = 0)."""
    g = torch.Generator().manual_seed(12)
    lo, hi = -1.0, 2.5
    x = lo + (hi - lo) * torch.rand(20, 7, generator=g, dtype=torch.float64)
    x[:5, :3] = lo
    x[5:10, 3:] = hi
    v = torch.randn(20, 7, generator=g, dtype=torch.float64)
    cap = BoxProblem.build(x, v, p, lo, hi).capacity
    c = -torch.rand(20, generator=g, dtype=torch.float64) * 1.2 * cap
    check_rows(x, v, c, p, lo, hi)


@pytest.mark.parametrize("p", NORMS)
def test_float32_rows_stay_in_the_box_and_agree_with_float64(p):
    """In float32 the solution is the float64 one up to float32 rounding, and still lies
    exactly in the box."""
    g = torch.Generator().manual_seed(13)
    x = torch.rand(300, 50, generator=g, dtype=torch.float64).float().double()
    x[torch.rand(300, 50, generator=g) < 0.2] = 0.0
    v = torch.randn(300, 50, generator=g, dtype=torch.float64).float().double()
    v[torch.rand(300, 50, generator=g) < 0.2] = 0.0
    cap = BoxProblem.build(x, v, p).capacity
    t = (torch.rand(300, generator=g, dtype=torch.float64) * 0.98 * cap).float().double()
    d64, _, f64 = BoxProblem.build(x, v, p).solve(t)
    d32, _, f32 = BoxProblem.build(x.float(), v.float(), p).solve(t.float())
    assert d32.dtype == torch.float32 and torch.equal(f32, f64)
    xf = x.float()
    assert torch.all(xf + d32 >= 0) and torch.all(xf + d32 <= 1)
    n64 = torch.linalg.vector_norm(d64, ord=p, dim=1)
    n32 = torch.linalg.vector_norm(d32.double(), ord=p, dim=1)
    assert torch.allclose(n32, n64, rtol=1e-4, atol=1e-6)
    decrease = -(v * d32.double()).sum(1)
    assert torch.allclose(decrease, t, rtol=1e-4, atol=1e-5)
    one32, one_f32 = project_box(x.float(), v.float(), -t.float(), p)
    assert one32.dtype == torch.float32 and torch.equal(one_f32, f64)
    assert torch.all(xf + one32 >= 0) and torch.all(xf + one32 <= 1)
    n_one = torch.linalg.vector_norm(one32.double(), ord=p, dim=1)
    assert torch.allclose(n_one, n64, rtol=1e-4, atol=1e-6)
    assert torch.allclose(-(v * one32.double()).sum(1), t, rtol=1e-4, atol=1e-5)
