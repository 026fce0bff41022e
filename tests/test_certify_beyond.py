"""The certificates beyond the paper's bounds (linear relaxation, curvature, Theorem 2.1
integrated along the ray), tried hard.

* Soundness: attacks inside every certified ball (radius x (1 - 1e-7)) on random nets,
  saturated units, huge and tiny weights, in every norm, box or not; and, for nets on the
  plane, the exact minimal adversarial distance from a dense sweep of rays, which every
  certificate must not exceed. Swapping the tangent/chord choice is caught by the sweep.
* Tightness: a net whose units all stay in their linear regime is certified to its exact
  distance; tangent steps never lower a certificate; ``_best`` is never below any method.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from crosslip.certify import curvature, relaxation, secant, trust_region
from crosslip.certify.curvature import CurvatureBound, radius_of
from crosslip.certify.engine import certify_softplus
from crosslip.certify.integrated import SPAN, integrated
from crosslip.certify.linear_min import box_lower, dual_norm_lower, quad_radius
from crosslip.certify.search import (
    margins_lower,
    radius_search,
    ratios,
    theorem21,
    unbounded_points,
)
from crosslip.certify.secant import max_second_derivative
from crosslip.certify.softplus_bounds import IntervalBound, NetTerms, PreactivationRange

from .helpers import random_net, random_points
from .test_certify import margin_attack, project
from .test_certify_corners import net_with

DT = torch.float64
P = {"l2": 2.0, "l1": 1.0, "linf": math.inf}
METHODS = ("linear", "curvature", "integrated", "best")
CONFIGS = [  # (d, K, H, seed, weight scale)
    (2, 2, 3, 0, 1.0),
    (5, 3, 8, 1, 3.0),
    (10, 4, 16, 2, 1.0),
    (8, 6, 64, 4, 0.5),
    (4, 3, 32, 7, 8.0),  # large weights: many saturated units, sharp transitions
    (6, 3, 24, 9, 0.05),  # tiny weights: every unit near its linear regime
]


def columns(res: dict) -> list[tuple[str, float, bool]]:
    """``(column, p, box)`` of every certificate beyond the paper in ``res``."""
    out = []
    for name, p in P.items():
        for method in METHODS:
            for box in (False, True):
                col = f"guarantee_{name}_{method}" + ("_box" if box else "")
                if col in res:
                    out.append((col, p, box))
    return out


def pieces(net, x, p: float, box: bool):
    """What a radius function needs: the ranges, margins' lower bounds, unbounded points."""
    terms = NetTerms(net)
    z = terms.preactivation(x)
    pad = terms.pad(x, z)
    logits, err = terms.logits(x, z, pad)
    pred = logits.argmax(1)
    _, m = margins_lower(logits, err, pred)
    rng = PreactivationRange(terms, x, pred, p=p, box=box, z=z, pad=pad)
    return rng, m, unbounded_points(m, terms.vanishing[pred]), pred


# ------------------------------------------------------------------------ soundness
@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_no_attack_inside_any_certified_ball_changes_the_decision(d, k, h, seed, scale):
    net = random_net(d, k, h, seed, scale)
    x = random_points(12, d, seed + 1)
    assert_no_attack_inside(net, x, certify_softplus(net, x, rtol=1e-4, tangent_steps=2), seed)


def assert_no_attack_inside(net, x, res: dict, seed: int) -> None:
    """No attack inside any certified ball of ``res`` (every certificate beyond the paper,
    every norm, box or not: 24 columns) changes the decision."""
    cols = columns(res)
    assert len(cols) == 24
    for p, box in {(p, box) for _, p, box in cols}:  # one attack on a norm's balls at once
        group = [col for col, q, b in cols if (q, b) == (p, box)]
        radius = torch.cat([res[col].clamp(max=1e6) for col in group])
        assert torch.all(radius >= 0) and not torch.any(torch.isnan(radius)), group
        xs, preds = x.repeat(len(group), 1), res["pred"].repeat(len(group))
        adv, pred = margin_attack(net, xs, preds, radius * (1 - 1e-7), p, box, seed=seed)
        held = (adv == pred).reshape(len(group), -1).all(1)
        assert held.all(), [col for col, ok in zip(group, held, strict=True) if not ok]


@torch.no_grad()
def exact_distance(net, x, pred, p: float, box: bool, rays=720, r_max=2.5, steps=250):
    """For points on the plane: the smallest p-norm distance at which a dense sweep of rays
    from each point (``rays`` directions, ``steps`` radii, refined by bisection) meets
    another class (inside the box if ``box``). Sampling only finds points of another
    class, so this is at least the true minimal distance (up to the bisection's 1e-12)."""
    th = torch.linspace(0, 2 * math.pi, rays + 1, dtype=DT)[:-1]
    dirs = torch.stack([th.cos(), th.sin()], 1)
    t = torch.linspace(0, r_max, steps + 1, dtype=DT)[1:]
    out = []
    for i in range(len(x)):
        y = x[i] + t[:, None, None] * dirs[None]  # (steps, rays, 2)
        inside = ((y >= 0) & (y <= 1)).all(-1) if box else torch.ones(y.shape[:2], dtype=bool)
        flip = (net(y.reshape(-1, 2)).argmax(1).reshape(y.shape[:2]) != pred[i]) & inside
        hit = flip.any(0)
        if not hit.any():
            out.append(torch.tensor(math.inf, dtype=DT))
            continue
        first = flip.to(torch.int8).argmax(0)  # first flipping radius per ray
        lo = torch.where(first > 0, t[(first - 1).clamp_min(0)], torch.zeros_like(t[first]))
        hi = t[first]
        ok = hi.clone()
        for _ in range(40):  # bisect between the last same-class and the first other point
            mid = 0.5 * (lo + hi)
            ym = x[i] + mid[:, None] * dirs
            other = net(ym).argmax(1) != pred[i]
            if box:
                other &= ((ym >= 0) & (ym <= 1)).all(-1)
            hi, lo = torch.where(other, mid, hi), torch.where(other, lo, mid)
            ok = torch.where(other, mid, ok)
        ends = x[i] + ok[:, None] * dirs
        dist = torch.linalg.vector_norm(ends - x[i], ord=p, dim=-1)
        out.append(torch.where(hit, dist, torch.inf).min())
    return torch.stack(out)


PLANE = [(2, 2, 3, 0, 1.0), (2, 3, 6, 1, 3.0), (2, 2, 8, 2, 8.0), (2, 3, 4, 3, 1.5)]


@pytest.mark.parametrize("d,k,h,seed,scale", PLANE)
def test_no_certificate_exceeds_the_exact_distance_on_the_plane(d, k, h, seed, scale):
    net = random_net(d, k, h, seed, scale)
    x = random_points(6, d, seed + 100)
    res = certify_softplus(net, x, rtol=1e-5, tangent_steps=3)
    exact = {}  # (p, box) -> the exact distances, which the columns of one norm share
    for col, p, box in columns(res):
        if (p, box) not in exact:
            exact[p, box] = exact_distance(net, x, res["pred"], p, box)
        assert torch.all(res[col] <= exact[p, box]), (col, res[col], exact[p, box])


def test_swapping_tangent_and_chord_is_caught(monkeypatch):
    """The exact sweep above fails a relaxation that puts the tangent on the concave units
    and the chord on the convex ones: the check is not vacuous."""
    monkeypatch.setattr(relaxation, "tangent_units", lambda delta: delta < 0)
    caught = False
    for d, k, h, seed, scale in [*PLANE, (2, 2, 6, 5, 1.0), (2, 3, 6, 6, 3.0)]:
        net = random_net(d, k, h, seed, scale)
        x = random_points(6, d, seed + 100)
        res = certify_softplus(net, x, rtol=1e-5, kinds=("l2", "linear"))
        exact = exact_distance(net, x, res["pred"], 2.0, False)
        caught |= bool(torch.any(res["guarantee_l2_linear"] > exact))
    assert caught


def test_saturated_units_get_finite_certificates_below_a_flipping_perturbation():
    """Both units saturated off at x (every gradient and sigma'' underflows there); a
    perturbation of norm 0.41 flips the class."""
    net = net_with(
        [[200.0, 0.0], [0.0, 200.0]], [-180.0, -180.0], [[0.0, 0.0], [1.0, 1.0]], [0.5, 0.0]
    )
    x = torch.tensor([[0.5, 0.5]], dtype=DT)
    res = certify_softplus(net, x)
    for col, _, _ in columns(res):
        g = float(res[col][0])
        assert math.isfinite(g) and g < 0.41, col


def test_huge_weights_and_large_radii_stay_sound():
    net = random_net(6, 3, 16, 11, 60.0)
    x = random_points(10, 6, 12)
    res = certify_softplus(net, x, rtol=1e-4)
    for col, p, box in columns(res):
        radius = res[col].clamp(max=1e6)
        adv, pred = margin_attack(net, x, res["pred"], radius * (1 - 1e-7), p, box, seed=3)
        assert torch.all(adv == pred), col


# ------------------------------------------------------------------------- tightness
def test_linear_regime_is_certified_to_the_exact_distance():
    """All units far in their linear regime (``sigma(z) = z`` to 1e-400 over the ball): the
    net is linear there, its distance to the boundary ``m / ||U^T (w_c - w_j)||_q`` is
    exact, and the linear relaxation reaches it within the search's tolerance."""
    gen = torch.Generator().manual_seed(0)
    d, h = 5, 12
    U = torch.randn(h, d, generator=gen, dtype=DT)
    W = torch.randn(2, h, generator=gen, dtype=DT)
    b = torch.full((h,), 1000.0, dtype=DT)  # z = 1000 + O(10) on every ball below
    net = net_with(U, b, W, [3.0 - float((W[0] - W[1]) @ b), 0.0])  # g(y) = delta^T U y + 3
    x = random_points(8, d, 1) * 0.1
    res = certify_softplus(net, x, rtol=1e-6, kinds=("l2", "l1", "linf", "linear"))
    pred = res["pred"]
    for name, q in (("l2", 2.0), ("l1", math.inf), ("linf", 1.0)):
        grad = (W[pred] - W[1 - pred]) @ U
        logits = net(x).detach()
        margin = logits.gather(1, pred[:, None]).squeeze(1) - logits.gather(
            1, (1 - pred)[:, None]
        ).squeeze(1)
        exact = margin / torch.linalg.vector_norm(grad, ord=q, dim=1)
        got = res[f"guarantee_{name}_linear"]
        assert torch.all(got <= exact) and torch.all(got >= exact * (1 - 1e-5)), name


@pytest.mark.parametrize("p", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("box", [False, True])
def test_tangent_steps_never_lower_the_radius(p, box):
    net = random_net(10, 4, 32, 5, 3.0)
    x = random_points(20, 10, 6)
    rng, m, _, _ = pieces(net, x, p, box)
    idx = torch.arange(len(x))
    need = torch.ones_like(m, dtype=torch.bool)
    for radius in (0.05, 0.3, 1.0):
        r = torch.full((len(x),), radius, dtype=DT)
        plain = relaxation.LinearRelaxation(rng, m, 0)(idx, r, need)
        moved = relaxation.LinearRelaxation(rng, m, 4)(idx, r, need)
        assert torch.all(moved >= plain)


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
@pytest.mark.parametrize("p,box", [(2.0, False), (1.0, True), (math.inf, False)])
def test_losses_per_point_equal_the_row_by_row_relaxation_at_the_point(
    d, k, h, seed, scale, p, box
):
    """At ``t = z(x)`` the relaxation takes every row's losses as products of its pair's
    ``|delta|`` with its point's quantities (one matrix product, not (rows, H) work); the
    radii equal the row-by-row evaluation of the same bound (``_radius``) to its rounding
    slack, for every pair (c, j), so no pair or sign is mixed up."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(12, d, seed + 50)
    rng, m, _, _ = pieces(net, x, p, box)
    relax = relaxation.LinearRelaxation(rng, m, 0)
    idx = torch.arange(len(x))
    need = torch.ones_like(m, dtype=torch.bool)
    for radius in (0.02, 0.4, 3.0):
        r = torch.full((len(x),), radius, dtype=DT)
        fast = relax(idx, r, need)
        zh, pad, lo, hi = rng.intervals(idx, r)
        a = rng.alpha
        s_lo, s_hi = relaxation.softplus(lo, a), relaxation.softplus(hi, a)
        chord = ((s_hi - s_lo) / (hi - lo)).nan_to_num(nan=0.0)
        chord = chord.clamp(torch.sigmoid(a * lo), torch.sigmoid(a * hi))
        point, cls = rng.not_pred[rng.pred].nonzero(as_tuple=True)
        delta = rng.W[rng.pred[point]] - rng.W[cls]
        per_point = (zh, pad, lo, hi, hi - lo, s_lo, s_hi, relaxation.softplus(zh, a), chord)
        row = relaxation._Row(
            delta, relaxation.tangent_units(delta), *(v[point] for v in per_point)
        )
        x_rows = rng.x[point] if box else None
        slow, _ = relax._radius(row, row.zh, m[point, cls], x_rows, r[point])
        # the row-by-row form carries a slack for the moved tangents' gap (0 here)
        assert torch.allclose(fast[point, cls], slow, rtol=1e-9, atol=1e-9), radius
        assert torch.all(torch.isinf(fast[idx, rng.pred]))


def test_best_is_the_largest_and_never_below_the_papers():
    net = random_net(20, 10, 32, 3, 5.0)
    x = random_points(30, 20, 4)
    res = certify_softplus(net, x)
    for name in P:
        for box in ("", "_box"):
            parts = [res[f"guarantee_{name}{box}"]]
            parts += [res[f"guarantee_{name}_{m}{box}"] for m in METHODS[:-1]]
            if box:
                parts.append(res[f"guarantee_{name}_best"])
            assert torch.equal(res[f"guarantee_{name}_best{box}"], torch.stack(parts).max(0).values)
    assert torch.all(res["guarantee_l2_best"] >= res["guarantee_local"])
    assert torch.all(res["guarantee_l2_integrated"] >= res["guarantee_l2"])
    # on these nets the relaxation beats Proposition 2.3 on average
    assert res["guarantee_l2_linear"].mean() > res["guarantee_local"].mean()


def test_one_node_is_theorem_21():
    net = random_net(10, 4, 16, 2, 1.0)
    x = random_points(20, 10, 3)
    one = certify_softplus(net, x, kinds=("l2", "integrated"), integration_nodes=1)
    assert torch.equal(one["guarantee_l2_integrated"], one["guarantee_l2"])
    more = certify_softplus(net, x, kinds=("l2", "integrated"), integration_nodes=16)
    assert torch.all(more["guarantee_l2_integrated"] >= one["guarantee_l2_integrated"])
    assert torch.any(more["guarantee_l2_integrated"] > one["guarantee_l2_integrated"])


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS[1:])
def test_integrated_evaluates_few_classes_and_equals_every_class_evaluated(d, k, h, seed, scale):
    """The integrated radius with its two rounds of classes at the inner nodes (the worst
    class at the last node, then those that can still undercut it) equals the same Riemann
    sum taken over every class that the last node leaves open, computed here point by point
    and class by class; and the rounds evaluate fewer rows."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(40, d, seed + 1)
    rng, m, _, pred = pieces(net, x, 2.0, False)
    van = NetTerms(net).vanishing[pred]
    bound = IntervalBound(rng)
    paper = theorem21(m, bound, rtol=1e-4, vanishes=van)
    rows: list[int] = []

    def counted(idx, r, need):
        rows.append(int(need.sum()))
        return bound(idx, r, need)

    counted.supports_mask = True
    nodes = 6
    got = integrated(m, counted, paper, nodes, van)
    want = paper.guarantee.clone()
    a = paper.guarantee
    ok = torch.isfinite(a) & (a > 0) & (m > 0).all(1)
    idx = torch.arange(len(x))[ok]
    r1 = SPAN * a[idx]
    s = [r1 / nodes * t for t in range(nodes + 1)]  # (n_ok,) each
    lips = [bound(idx, r, torch.ones_like(m[idx], dtype=torch.bool)) for r in s[1:]]
    rho = ratios(m[idx], lips[-1], van[idx]).minimum(r1[:, None])
    every = 0
    for i, point in enumerate(idx.tolist()):
        radius = float(r1[i])
        for j in range(m.shape[1]):
            if not rho[i, j] < r1[i]:
                continue
            every += 1
            best, total = 0.0, 0.0
            for t in range(nodes):  # piece t: from s[t] to s[t + 1] with L(s[t + 1])
                lj, lo, hi = float(lips[t][i, j]), float(s[t][i]), float(s[t + 1][i])
                left = float(m[point, j]) - total
                if left > 0:
                    best = max(best, min(lo + left / lj if lj > 0 else math.inf, hi))
                total += (hi - lo) * lj
            radius = min(radius, best)
        want[point] = max(float(a[point]), radius)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert torch.any(got > paper.guarantee)
    # the last node takes every class; the inner ones only the rounds' few (with two
    # classes besides the predicted one, both may be needed)
    inner = sum(rows[1:])
    assert inner < (nodes - 1) * every if k >= 4 else inner <= (nodes - 1) * every
    # within a round, a class whose upper sum has reached its margin takes no further node
    # (with 6 nodes that is mostly past the last inner one: 12 here; on a net of tiny
    # weights L hardly grows and the sum reaches the margin only at Theorem 2.1's radius)
    rows.clear()
    integrated(m, counted, paper, 12, van)
    assert min(rows[2:12]) < rows[1] or scale < 0.1


# ----------------------------------------------------------------------- the pieces
@pytest.mark.parametrize("p", [2.0, 1.0, math.inf])
def test_linear_minimum_bounds_hold_on_sampled_points(p):
    """``phi(r) >= -(const + lin r + quad r^2)`` on random and projected-extreme points of
    the ball and of the ball inside the box, for every r up to R."""
    gen = torch.Generator().manual_seed(int(p) if math.isfinite(p) else 7)
    m, d = 30, 9
    a = torch.randn(m, d, generator=gen, dtype=DT) * torch.rand(m, 1, generator=gen, dtype=DT)
    x = torch.rand(m, d, generator=gen, dtype=DT)
    x[:, :3] = torch.tensor([0.0, 1.0, 0.5])  # pixels on the box's faces
    big_r = torch.rand(m, generator=gen, dtype=DT) * 3
    err = torch.zeros(m, dtype=DT)
    for frac in (1.0, 0.5, 0.1):
        r = big_r * frac
        for box in (False, True):
            low = (
                box_lower(a, err, x, big_r, p)
                if box
                else dual_norm_lower(a, err, {2.0: 2.0, 1.0: math.inf}.get(p, 1.0))
            )
            bound = -(low.const + low.lin * r + low.quad * r * r)
            v = torch.randn(m, 400, d, generator=gen, dtype=DT)
            v = torch.cat(
                [
                    v,
                    -a[:, None, :].expand(m, 50, d).sign()
                    * torch.rand(m, 50, 1, generator=gen, dtype=DT),
                ],
                1,
            )
            ys = project(
                v.reshape(-1, d) * r.repeat_interleave(450)[:, None],
                x.repeat_interleave(450, 0),
                r.repeat_interleave(450),
                p,
                box,
            )
            phi = (ys.reshape(m, 450, d) * a[:, None, :]).sum(-1).min(1).values
            assert torch.all(phi >= bound - 1e-12), (p, box, frac)


def test_quad_radius_is_the_root_rounded_down():
    zero = torch.zeros(4, dtype=DT)
    from crosslip.certify.linear_min import QuadLower

    beta = torch.tensor([1.0, 2.0, -1.0, 1.0], dtype=DT)
    low = QuadLower(
        zero,
        torch.tensor([2.0, 0.0, 1.0, 0.0], dtype=DT),
        torch.tensor([0.0, 0.5, 0.0, 0.0], dtype=DT),
    )
    rho = quad_radius(beta, low)
    assert rho[0] <= 0.5 and rho[0] > 0.5 * (1 - 1e-14)
    assert rho[1] <= 2.0 and rho[1] > 2.0 * (1 - 1e-14)
    assert rho[2] == 0 and rho[3] == math.inf


def test_second_derivative_bound_covers_the_interval():
    lo = torch.tensor([-3.0, -0.2, 0.1, -5.0], dtype=DT)
    hi = torch.tensor([-1.0, 0.3, 2.0, -4.9], dtype=DT)
    bound = max_second_derivative(lo, hi, 10.0)
    for i in range(4):
        z = torch.linspace(float(lo[i]), float(hi[i]), 2001, dtype=DT)
        s = torch.sigmoid(10 * z)
        assert float((10 * s * (1 - s)).max()) <= float(bound[i])


@pytest.mark.parametrize("d,k,h,seed,scale", [(10, 6, 32, 3, 2.0), (8, 10, 48, 5, 4.0)])
def test_the_secant_on_the_units_of_the_needed_rows_only_changes_no_radius(
    monkeypatch, d, k, h, seed, scale
):
    """The curvature certificates ask :func:`.secant.secant_curvature` only for the units
    that enter a needed row of the point (``delta < 0``; ``delta > 0`` too for the convex
    part of the trust region): their radii equal those with every unit's secant computed."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(30, d, seed + 1)
    cols = ("guarantee_l2_curvature", "guarantee_l2_curvature_box", "guarantee_linf_curvature")

    def columns() -> dict:
        kinds = ("l2", "linf", "box", "curvature")
        return certify_softplus(net, x, rtol=1e-4, kinds=kinds, trust_region_steps=6)

    got = columns()
    real = secant.secant_curvature

    def every_unit(*args, up_units=None, down_units=None, **kw):
        return real(*args, **kw)

    monkeypatch.setattr(curvature, "secant_curvature", every_unit)
    monkeypatch.setattr(trust_region, "secant_curvature", every_unit)
    want = columns()
    for col in cols:
        torch.testing.assert_close(got[col], want[col], rtol=1e-12, atol=0, msg=col)


def test_curvature_needs_the_curvature_of_the_concave_units_only():
    """A net whose output differences use only positive weights (convex g) is certified by
    the curvature bound to its first-order distance m / ||grad g(x)||: K = 0."""
    gen = torch.Generator().manual_seed(2)
    U = torch.randn(6, 4, generator=gen, dtype=DT)
    W = torch.stack([torch.rand(6, generator=gen, dtype=DT) + 0.5, torch.zeros(6, dtype=DT)])
    net = net_with(U, torch.zeros(6), W, [0.0, 0.0])
    x = random_points(5, 4, 2)
    rng, m, unbounded, pred = pieces(net, x, 2.0, False)
    assert torch.all(pred == 0)
    cert = radius_search(CurvatureBound(rng, m), m, rtol=1e-8, unbounded=unbounded)
    grad = net.class_gradients(x)[:, 0] - net.class_gradients(x)[:, 1]
    first = m[:, 1] / torch.linalg.vector_norm(grad, dim=1)
    assert torch.all(cert.guarantee <= first) and torch.all(cert.guarantee > first * (1 - 1e-6))


def test_l1_curvature_is_the_exact_maximum_and_linf_bounds_every_vertex():
    """``Lambda_1`` is ``max_i K_ii`` (the maximum of the convex ``v^T K v`` over the L1
    ball is at a vertex); ``Lambda_inf`` is at least ``v^T K v`` at every vertex of the cube
    (where its maximum over the cube is) and at most the per-unit bound it improves on."""
    import itertools

    net = random_net(6, 3, 10, 11, 2.0)
    x = random_points(3, 6, 12)
    kappa = torch.rand(7, 10, dtype=DT, generator=torch.Generator().manual_seed(3))
    kappa[0] = 0.0
    u = net.U.detach()
    mats = torch.einsum("hd,mh,he->mde", u, kappa, u)
    rng1, m, _, _ = pieces(net, x, 1.0, False)
    lam1 = CurvatureBound(rng1, m).curvature(kappa)
    exact1 = mats.diagonal(dim1=1, dim2=2).max(-1).values
    assert torch.all(lam1 >= exact1) and torch.all(lam1 <= exact1 * (1 + 1e-12))
    rng_inf, m, _, _ = pieces(net, x, math.inf, False)
    lam_inf = CurvatureBound(rng_inf, m).curvature(kappa)
    cube = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=6)), dtype=DT)
    exact_inf = torch.einsum("vd,mde,ve->mv", cube, mats, cube).max(-1).values
    per_unit = kappa @ torch.linalg.vector_norm(u, ord=1, dim=1).square()
    assert torch.all(lam_inf >= exact_inf)
    assert torch.all(lam_inf <= per_unit * (1 + 1e-12))
    assert lam1[0] == 0 and lam_inf[0] == 0


def test_l1_vertex_radius_is_the_concave_models_exact_radius():
    """The L1 vertex form (``CurvatureBound.vertex_radius``) is the exact radius of its
    concave model ``m - err r + a^T v - v^T K v / 2``: positive at every sampled point and
    every vertex of the L1 ball just inside it, zero or below at a vertex just outside."""
    net = random_net(6, 4, 16, 13, 2.0)
    x = random_points(5, 6, 14)
    rng, m, _, _ = pieces(net, x, 1.0, False)
    bound = CurvatureBound(rng, m)
    idx = torch.arange(len(x))
    r = torch.full((len(x),), 0.5, dtype=DT)
    rows = bound.row_bounds(idx, r, torch.ones_like(m, dtype=torch.bool))
    rho = bound.vertex_radius(rows)
    u = net.U.detach().to(DT)
    gen = torch.Generator().manual_seed(5)
    d = u.shape[1]
    vertices = torch.cat([torch.eye(d, dtype=DT), -torch.eye(d, dtype=DT)])
    for i in range(len(rho)):
        K = (u.T * rows.kappa[i]) @ u
        model = partial(concave_model, rows.margin[i], rows.err[i], rows.grad[i], K)

        inside = rho[i] * (1 - 1e-9)
        v = torch.randn(2000, d, generator=gen, dtype=DT)
        v = v / v.abs().sum(1, keepdim=True) * inside * torch.rand(2000, 1, generator=gen)
        assert torch.all(model(v, inside) > 0)
        assert torch.all(model(vertices * inside, inside) > 0)
        outside = rho[i] * (1 + 1e-6)
        assert model(vertices * outside, outside).min() <= 0
    old = radius_of(rows.margin, rows.lowers, bound.curvature(rows.kappa))
    assert torch.all(rho >= old * (1 - 1e-12)) and torch.any(rho > old * 1.001)


def concave_model(margin, err, a, K, v, s):
    """The L1 curvature bound's model at the points ``v`` (n, d) of the ball of radius s."""
    return margin - err * s + v @ a - 0.5 * ((v @ K) * v).sum(-1)
