"""The trust region's units expanded about moved points (:mod:`crosslip.certify.expansion`):
the lower bound never exceeds the network anywhere in the ball, whatever the expansion
points, and is exact where they are; a NaN gives radius 0; through the engine, never below
the expansion about the point (attacks and the exact distance on the plane: with and
without moved points in tests/test_trust_region.py)."""

from __future__ import annotations

import math

import pytest
import torch

from crosslip.certify.engine import certify_softplus
from crosslip.certify.expansion import ascent_direction, expanded_terms
from crosslip.certify.linear_min import QuadLower, quad_radius

from .helpers import random_net, random_points
from .test_certify import margin_attack
from .test_certify_beyond import CONFIGS, PLANE, exact_distance, pieces


def rows_at(net, x, radius: float, offsets, p: float = 2.0):
    """Every (point, class) row of ``x`` at R = ``radius``: its network terms and its
    :func:`expanded_terms` about ``zh + offsets(h*)``, ``h*`` a sample of ``U v`` for one
    ``v`` in the ball per row (returned)."""
    rng, m, _, pred = pieces(net, x, p, False)
    terms = rng.terms
    n, k = m.shape
    idx = torch.arange(n)
    zh, pad, lo, hi = rng.intervals(idx, torch.full((n,), radius, dtype=torch.float64))
    point, cls = (torch.arange(k)[None, :] != pred[:, None]).nonzero(as_tuple=True)
    W = terms.W
    delta = W[pred[point]] - W[cls]
    g = torch.Generator().manual_seed(7)
    v0 = in_ball(len(point), x.shape[1], radius, p, g)
    ex = expanded_terms(
        zh[point],
        pad[point],
        lo[point],
        hi[point],
        delta,
        offsets(v0 @ terms.U.T, g),
        m[point, cls],
        terms.U,
        terms.row_norms_up(rng.q),
        terms.alpha,
        terms.underflow_floor,
    )
    return ex, point, cls, pred, m, v0, terms.U


def in_ball(n: int, d: int, radius: float, p: float, g: torch.Generator) -> torch.Tensor:
    """``n`` points (n, d) of the p-norm ball of ``radius``, every seventh on its sphere."""
    v = torch.randn(n, d, generator=g, dtype=torch.float64)
    if p == 1:  # Laplace directions: spread over the L1 sphere
        v = v.sign() * -torch.rand(n, d, generator=g, dtype=torch.float64).log()
    r = radius * torch.rand(n, 1, generator=g, dtype=torch.float64) ** (1 / d)
    r[::7] = radius
    return v / torch.linalg.vector_norm(v, ord=p, dim=1, keepdim=True) * r


def lower_at(ex, U, rows: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """The expanded lower bound on ``g`` at ``x + v`` (rows (s,), v (s, d)) in the p-norm
    ball (the gradient's error is in the dual norm)."""
    h = v @ U.T
    q = ex.convex[rows] - ex.kappa[rows]
    return (
        ex.margin[rows]
        - ex.err[rows] * torch.linalg.vector_norm(v, ord=p, dim=1)
        + (ex.grad[rows] * v).sum(1)
        + 0.5 * (q * h * h).sum(1)
    )


def network_gap(net, x, pred, cls, point, v) -> torch.Tensor:
    """``g(x + v) = f_c - f_j`` in float64 (rows (s,))."""
    out = net(x[point] + v)
    return out.gather(1, pred[point][:, None])[:, 0] - out.gather(1, cls[:, None])[:, 0]


OFFSETS = {
    "at a point of the ball": lambda h, g: h,
    "scaled out": lambda h, g: 3.0 * h,
    "random": lambda h, g: torch.randn(h.shape, generator=g, dtype=torch.float64) * 0.5,
}


@pytest.mark.parametrize("how", list(OFFSETS))
@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
@pytest.mark.parametrize("radius", [0.05, 0.6])
@pytest.mark.parametrize("p", [2.0, 1.0, math.inf])
def test_the_expanded_bound_never_exceeds_the_network_in_the_ball(
    d, k, h, seed, scale, how, radius, p
):
    net = random_net(d, k, h, seed, scale)
    x = random_points(3, d, seed + 1)
    ex, point, cls, pred, m, v0, U = rows_at(net, x, radius, OFFSETS[how], p)
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(len(point)).repeat_interleave(400)
    v = torch.cat([in_ball(len(rows), d, radius, p, g), v0])  # and the expansion points' v
    rows = torch.cat([rows, torch.arange(len(point))])
    truth = network_gap(net, x, pred, cls[rows], point[rows], v)
    low = lower_at(ex, U, rows, v, p)
    assert torch.all(low <= truth + 1e-12 * (1 + truth.abs())), (low - truth).max()
    if how == "at a point of the ball":  # exact at the expansion points, up to rounding
        at = torch.arange(len(rows) - len(point), len(rows))
        gap = (truth[at] - low[at]) - ex.err * torch.linalg.vector_norm(v0, ord=p, dim=1)
        assert torch.all(gap.abs() <= 1e-9 * (1 + truth[at].abs())), gap.abs().max()
        # the constant term matters: without it the bound passes the network somewhere
        wrong = low[at] + (m[point, cls] - ex.margin)
        assert torch.any(wrong > truth[at] + 1e-9)


def test_a_nan_in_the_expansion_points_gives_radius_zero_for_that_row_only():
    net = random_net(5, 3, 8, 1, 3.0)
    x = random_points(2, 5, 2)

    def with_nan(h, g):
        h = h.clone()
        h[1, 3] = torch.nan
        return h

    ex, *_ = rows_at(net, x, 0.3, with_nan)
    zero = torch.zeros_like(ex.margin)
    rho = quad_radius(ex.margin, QuadLower(zero, ex.err, zero + 1.0))
    assert rho[1] == 0 and torch.all(rho[torch.arange(len(rho)) != 1] > 0)


def with_expansions(net, x, steps: int, norm: str, **kw) -> torch.Tensor:
    kinds = (norm, "curvature")
    res = certify_softplus(net, x, kinds=kinds, expansion_steps=steps, **kw)
    return res[f"guarantee_{norm}_curvature"]


@pytest.mark.parametrize("norm,gain", [("l2", 1.01), ("l1", 1.0), ("linf", 1.0)])
def test_moved_expansion_points_never_lower_the_certificate_and_raise_it(norm, gain):
    net = random_net(10, 4, 64, 3, 2.0)
    x = random_points(20, 10, 4)
    base, moved = with_expansions(net, x, 0, norm), with_expansions(net, x, 2, norm)
    # each row keeps its best bound at every radius evaluated; the search stops within its
    # rtol (1e-3) of each function's optimum, so a point may land that much lower
    assert torch.all(moved >= base * (1 - 1e-3))
    assert torch.mean(moved / base) > gain


@pytest.mark.parametrize("norm", ["l1", "linf"])
def test_every_move_adds_its_constant_to_the_margin_at_the_point(monkeypatch, norm):
    """Each move of the L1 and L-inf balls' expansion points in the curvature form (in L-inf
    without the trust region, which moves its own) is a bound on ``g`` about new points: its
    constant is added to the rows' lower bound on ``g(x)``, never to the last expansion's
    constant (which would count an earlier expansion's terms again)."""
    from crosslip.certify.curvature import CurvatureBound

    margins: list[torch.Tensor] = []
    expanded = CurvatureBound.expanded

    def seen(self, intervals, point, delta, offset, margin):
        margins.append(margin.clone())
        return expanded(self, intervals, point, delta, offset, margin)

    monkeypatch.setattr(CurvatureBound, "expanded", seen)
    net = random_net(10, 4, 64, 3, 2.0)
    with_expansions(net, random_points(20, 10, 4), 3, norm, trust_region_steps=0)
    assert len(margins) >= 3
    for first, *later in zip(margins[::3], margins[1::3], margins[2::3], strict=False):
        for m in later:
            assert torch.equal(m, first)


def test_later_l1_moves_are_damped_towards_the_new_vertex(monkeypatch):
    """In the L1 ball the first move expands about the vertex ``-s sign(a_i) e_i`` that sets
    the radius (units at ``s U[:, i]`` up to sign); each later one goes ``EXPANSION_DAMPING``
    of the way from the last points to the new vertex: what is left of a later move's points
    after the last ones' share is a column of ``U``."""
    from crosslip.certify import expansion
    from crosslip.certify.curvature import CurvatureBound

    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    expanded = CurvatureBound.expanded

    def seen(self, intervals, point, delta, offset, margin):
        calls.append((offset.clone(), self.U))
        return expanded(self, intervals, point, delta, offset, margin)

    monkeypatch.setattr(CurvatureBound, "expanded", seen)
    net = random_net(10, 4, 64, 3, 2.0)
    with_expansions(net, random_points(20, 10, 4), 3, "l1")
    beta = expansion.EXPANSION_DAMPING

    def cosine_to_a_column(h: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        cos = (h @ U) / (h.norm(dim=1, keepdim=True) * U.norm(dim=0)).clamp_min(1e-300)
        return cos.abs().max(1).values

    assert len(calls) >= 3 and len(calls) % 3 == 0
    for k in range(0, len(calls), 3):
        (h0, U), (h1, _), (h2, _) = calls[k : k + 3]
        moved = h0.norm(dim=1) > 0
        assert torch.allclose(cosine_to_a_column(h0[moved], U), torch.ones(1, dtype=U.dtype))
        for last, now in ((h0, h1), (h1, h2)):
            rest = (now - (1 - beta) * last) / beta
            live = rest.norm(dim=1) > 1e-12
            cos = cosine_to_a_column(rest[live], U)
            assert torch.allclose(cos, torch.ones_like(cos), atol=1e-9)


def exact_ball_minimum(ex, U, row: int, radius: float) -> tuple[float, torch.Tensor]:
    """The minimum over the L2 ball of ``radius`` of the expanded quadratic of ``row`` (its
    gradient's error left out) and its minimiser (d,): the trust-region subproblem solved
    on the dense eigendecomposition (bisection on the multiplier; not the hard case)."""
    q = ex.convex[row] - ex.kappa[row]
    lam, V = torch.linalg.eigh(U.T @ (q[:, None] * U))
    b = V.T @ ex.grad[row]

    def length(mu: float) -> float:
        return float((b / (lam + mu)).norm())

    lo = max(0.0, -float(lam[0])) + 1e-14
    if lam[0] > 0 and length(0.0) <= radius:
        mu = 0.0
    else:
        hi = lo + 1.0
        while length(hi) > radius:
            hi *= 2
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if length(mid) > radius else (lo, mid)
        mu = hi
    y = -b / (lam + mu)
    return float(ex.margin[row] + b @ y + 0.5 * (lam * y * y).sum()), V @ y


def test_the_ascent_direction_is_the_gradient_of_the_balls_minimum_in_the_offsets():
    """The envelope theorem: the derivative of the minimum over the ball in the expansion
    offsets, along the direction itself, is the direction's squared length (central
    differences of the exact minimum), and a small step along it raises the minimum."""
    net = random_net(6, 3, 12, 5, 2.0)
    x = random_points(2, 6, 6)
    radius = 0.4
    rng, m, _, pred = pieces(net, x, 2.0, False)
    terms = rng.terms
    idx = torch.arange(len(x))
    zh, pad, lo, hi = rng.intervals(idx, torch.full((len(x),), radius, dtype=torch.float64))
    point, cls = (torch.arange(3)[None, :] != pred[:, None]).nonzero(as_tuple=True)
    delta = terms.W[pred[point]] - terms.W[cls]
    args = (zh[point], pad[point], lo[point], hi[point], delta)
    offsets = 0.3 * (hi[point] - zh[point])  # inside each range, off the point
    margin, U = m[point, cls], terms.U
    checked = 0
    for row in range(len(point)):
        sub = tuple(a[row : row + 1] for a in args)

        def minimum(off: torch.Tensor, sub=sub, row=row) -> tuple[float, torch.Tensor]:
            ex = expanded_terms(
                *sub,
                off,
                margin[row : row + 1],
                U,
                terms.row_norms_up(2),
                terms.alpha,
                terms.underflow_floor,
            )
            return exact_ball_minimum(ex, U, 0, radius)

        off = offsets[row : row + 1]
        low, v = minimum(off)
        g = ascent_direction(sub, off, (U @ v)[None], terms.alpha)
        norm2 = float(g.square().sum())
        if norm2 < 1e-12:
            continue
        eps = 1e-6 / norm2**0.5
        slope = (minimum(off + eps * g)[0] - minimum(off - eps * g)[0]) / (2 * eps)
        assert slope == pytest.approx(norm2, rel=0.05), (row, slope, norm2)
        assert minimum(off + 1e-3 / norm2**0.5 * g)[0] > low
        checked += 1
    assert checked >= len(point) - 1


@pytest.mark.parametrize("norm,gain", [("l2", 1.002), ("l1", 1.002)])
def test_ascent_on_the_expansion_points_never_lowers_the_certificate_and_raises_it(norm, gain):
    net = random_net(10, 4, 64, 3, 2.0)
    x = random_points(20, 10, 4)
    moved = with_expansions(net, x, 2, norm)
    ascended = with_expansions(net, x, 2, norm, expansion_ascent_steps=6)
    # each row keeps its best bound, the moves' among them; the search stops within its
    # rtol (1e-3) of each function's optimum
    assert torch.all(ascended >= moved * (1 - 1e-3))
    assert torch.mean(ascended / moved) > gain


def test_the_ascent_is_the_l2_and_l1_balls_only():
    net = random_net(10, 4, 64, 3, 2.0)
    x = random_points(20, 10, 4)
    for steps in (8, 0):  # the trust region's dual over the cube, and the curvature form
        linf = [
            with_expansions(net, x, 2, "linf", expansion_ascent_steps=a, trust_region_steps=steps)
            for a in (0, 6)
        ]
        assert torch.equal(*linf)


def ascended(net, x, norm: str, rtol: float) -> dict:
    """The curvature certificate of ``norm`` with two moves and four ascent steps."""
    kinds = (norm, "curvature")
    return certify_softplus(
        net, x, kinds=kinds, rtol=rtol, expansion_steps=2, expansion_ascent_steps=4
    )


@pytest.mark.parametrize("norm,p", [("l2", 2.0), ("l1", 1.0)])
@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_no_attack_inside_a_ball_certified_with_ascended_points_changes_the_decision(
    d, k, h, seed, scale, norm, p
):
    net = random_net(d, k, h, seed, scale)
    x = random_points(12, d, seed + 1)
    res = ascended(net, x, norm, 1e-4)
    radius = res[f"guarantee_{norm}_curvature"].clamp(max=1e6)
    assert torch.all(radius >= 0) and not torch.any(torch.isnan(radius))
    adv, pred = margin_attack(net, x, res["pred"], radius * (1 - 1e-7), p, False, seed=seed)
    assert torch.all(adv == pred)


@pytest.mark.parametrize("norm,p", [("l2", 2.0), ("l1", 1.0)])
@pytest.mark.parametrize("d,k,h,seed,scale", PLANE)
def test_no_certificate_with_ascended_points_exceeds_the_exact_distance_on_the_plane(
    d, k, h, seed, scale, norm, p
):
    net = random_net(d, k, h, seed, scale)
    x = random_points(6, d, seed + 100)
    res = ascended(net, x, norm, 1e-5)
    exact = exact_distance(net, x, res["pred"], p, False)
    assert torch.all(res[f"guarantee_{norm}_curvature"] <= exact)
