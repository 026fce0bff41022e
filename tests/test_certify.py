"""Soundness and exactness of the guarantees (Theorem 2.1, Proposition 2.3, interval and
global bounds, box-constrained ranges).

Every bound is attacked: gradient differences sampled in the ball (on its surface too) and
maximized by projected gradient ascent must stay below it; a projected-gradient attack on
the margin inside the certified ball must never change the decision. The same checks are
shown to catch a bound that is deliberately too small (scaled by 0.5).
"""

from __future__ import annotations

import math

import pytest
import torch

from crosslip.certify import (
    IntervalBound,
    MinBound,
    PreactivationRange,
    Prop23Bound,
    certify_softplus,
    global_bound,
    linear_lipschitz,
    margins,
    min_ratio,
    theorem21,
)
from crosslip.certify.reference import certify_prop23_reference, prop23_reference
from crosslip.certify.search import radius_search, ratios
from crosslip.models import class_gradients

from .helpers import random_net, random_points

CONFIGS = [  # (d, K, H, seed, weight scale)
    (2, 2, 3, 0, 1.0),
    (5, 3, 8, 1, 3.0),
    (10, 4, 16, 2, 1.0),
    (20, 10, 32, 3, 5.0),
    (8, 6, 64, 4, 0.5),
]
NORMS = [1.0, 2.0, math.inf]
DUAL = {1.0: math.inf, 2.0: 2.0, math.inf: 1.0}
RADII = (0.0, 0.01, 0.1, 0.5, 2.0)


# ----------------------------------------------------------------------------- helpers
def grad_diff(net, y, pred, q):
    """``||grad f_c(y) - grad f_j(y)||_q`` for all j, shape (m, K)."""
    g = class_gradients(net, y)
    return torch.linalg.vector_norm(g[torch.arange(len(y)), pred][:, None, :] - g, ord=q, dim=-1)


def project(delta, x, r, p, box):
    """A feasible point of ``B_p(0, r)`` (and ``x + delta`` in [0,1]^d if ``box``): exact
    projection for p = 2, inf; for p = 1 the sort-based Euclidean projection onto the ball.
    Clipping into the box only moves coordinates towards x, so it keeps the p-ball."""
    r = r[:, None]
    if p == 2:
        delta = delta * torch.clamp(r / delta.norm(dim=1, keepdim=True).clamp_min(1e-300), max=1)
    elif math.isinf(p):
        delta = torch.maximum(torch.minimum(delta, r), -r)
    else:
        a = delta.abs()
        mu = a.sort(dim=1, descending=True).values
        css = mu.cumsum(1) - r
        k = torch.arange(1, a.shape[1] + 1, dtype=a.dtype)
        rho = ((mu - css / k) > 0).sum(1, keepdim=True).clamp_min(1)
        theta = (css.gather(1, rho - 1) / rho).clamp_min(0)
        delta = delta.sign() * (a - theta).clamp_min(0)
    if box:
        delta = (x + delta).clamp(0, 1) - x
    return delta


def sample_set(x, r, count, p, box, gen):
    """``count`` points of ``B_p(x, r)`` (∩ [0,1]^d) per row of x; a third on the sphere."""
    n, d = x.shape
    if p == 2:
        u = torch.randn(n, count, d, generator=gen, dtype=x.dtype)
        u = u / u.norm(dim=-1, keepdim=True)
    elif p == 1:
        e = -torch.rand(n, count, d, generator=gen, dtype=x.dtype).log()
        sign = torch.randint(0, 2, (n, count, d), generator=gen, dtype=x.dtype) * 2 - 1
        u = sign * e / e.sum(-1, keepdim=True)
    else:
        u = torch.rand(n, count, d, generator=gen, dtype=x.dtype) * 2 - 1
        u[:, : count // 3] = u[:, : count // 3].sign()  # corners of the cube
    rad = torch.rand(n, count, 1, generator=gen, dtype=x.dtype)
    rad[:, : count // 3] = 1.0
    y = x[:, None, :] + rad * r[:, None, None] * u
    return y.clamp(0, 1) if box else y


def ascend(net, x, pred, radii, p, box, steps=60, restarts=3, seed=0):
    """Projected gradient ascent of ``||grad f_c - grad f_j||_q`` over the set ``B_p(x, R)``
    (in the box if ``box``), for every radius R of ``radii`` and every class j at once (one
    batch row per (R, point, j); each row takes the same steps as if alone); the best value
    per row, shape (len(radii), n, K)."""
    q = DUAL[p]
    n, d = x.shape
    k = net.W.shape[0]
    shape = (len(radii), n, k)
    xs = x[None, :, None, :].expand(*shape, d).reshape(-1, d)
    cs = pred[None, :, None].expand(shape).reshape(-1)
    js = torch.arange(k)[None, None, :].expand(shape).reshape(-1)
    rs = torch.tensor(radii, dtype=x.dtype)[:, None, None].expand(shape).reshape(-1)
    rows = torch.arange(len(xs))
    gen = torch.Generator().manual_seed(seed)
    best = torch.zeros(len(xs), dtype=torch.float64)
    for _ in range(restarts):
        delta = project(
            torch.randn(xs.shape, generator=gen, dtype=x.dtype) * rs[:, None], xs, rs, p, box
        )
        for _ in range(steps):
            delta.requires_grad_(True)
            g = class_gradients(net, xs + delta)
            obj = torch.linalg.vector_norm(g[rows, cs] - g[rows, js], ord=q, dim=-1)
            (step,) = torch.autograd.grad(obj.sum(), delta)
            with torch.no_grad():
                if math.isinf(p):
                    step = step.sign()
                else:
                    step = step / step.norm(dim=1, keepdim=True).clamp_min(1e-300)
                delta = project(delta + 0.2 * rs[:, None] * step, xs, rs, p, box)
        with torch.no_grad():
            best = torch.maximum(best, grad_diff(net, xs + delta, cs, q)[rows, js])
    return best.reshape(shape)


def bounds_for(net, x, pred, p, box, scale=1.0):
    """The bounds valid for (p, box), each as ``(name, fn(idx, R) -> (m, K))``."""
    rng = PreactivationRange(net, x, pred, p=p, box=box)
    out = [("interval", IntervalBound(rng))]
    if p == 2:
        glob = global_bound(net, pred)
        out += [
            ("prop23", Prop23Bound(rng)),
            ("min", MinBound(rng, glob)),
            ("global", lambda idx, r: glob[idx]),
        ]
    return [(name, lambda i, r, f=f: scale * f(i, r)) for name, f in out]


def worst_ratio(net, x, pred, p, box, scale=1.0, seed=0, ascent=True):
    """Largest ``actual / bound`` over sampled and ascended points, radii and bounds."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.arange(len(x))
    n, d = x.shape
    positive = [radius for radius in RADII if radius > 0]
    ascended = ascend(net, x, pred, positive, p, box, seed=seed) if ascent else None
    worst = 0.0
    for radius in RADII:
        r = torch.full((n,), radius, dtype=torch.float64)
        ys = sample_set(x, r, 90, p, box, gen)  # (n, 90, d)
        diffs = grad_diff(net, ys.reshape(-1, d), pred.repeat_interleave(ys.shape[1]), DUAL[p])
        actual = diffs.reshape(n, ys.shape[1], -1).max(1).values
        if ascended is not None and radius > 0:
            actual = torch.maximum(actual, ascended[positive.index(radius)])
        for _, fn in bounds_for(net, x, pred, p, box, scale):
            lip = fn(idx, r)
            other = torch.ones_like(lip, dtype=torch.bool)
            other[idx, pred] = False
            ratio = actual[other] / lip[other].clamp_min(1e-300)
            worst = max(worst, float(ratio.detach().max()))
    return worst


# ----------------------------------------------------------------------- soundness of L_j(R)
@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
@pytest.mark.parametrize("p", NORMS)
@pytest.mark.parametrize("box", [False, True])
def test_bounds_hold_on_sampled_and_ascended_points(d, k, h, seed, scale, p, box):
    net = random_net(d, k, h, seed, scale)
    x = random_points(6, d, seed)
    pred = net(x).argmax(1)
    assert worst_ratio(net, x, pred, p, box, seed=seed, ascent=d <= 10) <= 1 + 1e-9


@pytest.mark.parametrize("p", NORMS)
def test_the_soundness_check_catches_a_bound_scaled_by_half(p):
    """The same check must fail on a wrong bound: it is not vacuous."""
    net = random_net(5, 3, 8, 1, 3.0)
    x = random_points(6, 5, 1)
    pred = net(x).argmax(1)
    assert worst_ratio(net, x, pred, p, False, scale=0.5, seed=1) > 1.0


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_bounds_are_monotone_and_ordered(d, k, h, seed, scale):
    """Non-decreasing in R (the search relies on it); the box range is never wider than the
    ball; the minimum bound is the elementwise minimum of its parts."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(10, d, seed)
    pred = net(x).argmax(1)
    idx = torch.arange(len(x))
    radii = torch.linspace(0, 3, 25, dtype=torch.float64)
    for p in NORMS:
        for box in (False, True):
            prev = None
            for radius in radii:
                r = torch.full((len(x),), float(radius), dtype=torch.float64)
                lips = [fn(idx, r) for _, fn in bounds_for(net, x, pred, p, box)]
                if prev is not None:
                    for a, b in zip(prev, lips, strict=True):
                        assert torch.all(b >= a * (1 - 1e-12))
                prev = lips
    glob = global_bound(net, pred)
    for radius in (0.05, 0.5, 5.0):
        r = torch.full((len(x),), radius, dtype=torch.float64)
        ball = PreactivationRange(net, x, pred, p=2)
        box = PreactivationRange(net, x, pred, p=2, box=True)
        assert torch.all(Prop23Bound(box)(idx, r) <= Prop23Bound(ball)(idx, r) * (1 + 1e-12))
        assert torch.all(IntervalBound(box)(idx, r) <= IntervalBound(ball)(idx, r) * (1 + 1e-12))
        parts = torch.minimum(
            torch.minimum(Prop23Bound(ball)(idx, r), IntervalBound(ball)(idx, r)), glob
        )
        parts[idx, pred] = 0
        assert torch.allclose(MinBound(ball, glob)(idx, r), parts, rtol=1e-12, atol=0)


def test_no_single_bound_dominates_so_the_minimum_matters():
    """Proposition 2.3 can exceed the global constant: three unit rows of U at 120 degrees
    in the plane and ``w_1 - w_0 = (1, -1, 1)`` give, for large R (all units saturated),
    ``L^2 = (||U^T d||^2 + |d|^T |G| |d|) / 2 = (4 + 6) / 2 = 5`` against the global
    ``||d||^2 ||U||_2^2 = 3 * 3/2 = 4.5``. The interval bound beats Proposition 2.3 for small
    R on random nets, and loses for large R."""
    net = random_net(2, 2, 3, 0, bias=False)
    angles = torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3], dtype=torch.float64)
    with torch.no_grad():
        net.hidden_layer.weight.copy_(torch.stack([angles.cos(), angles.sin()], 1))
        net.output_layer.weight.copy_(torch.tensor([[0.0, 0, 0], [1.0, -1, 1]]))
    x = random_points(4, 2, 0)
    pred = torch.zeros(4, dtype=torch.long)
    idx = torch.arange(4)
    rng = PreactivationRange(net, x, pred)
    glob = global_bound(net, pred)
    big = torch.full((4,), 100.0, dtype=torch.float64)
    expect = torch.ones(4, dtype=torch.float64)
    assert torch.allclose(Prop23Bound(rng)(idx, big)[:, 1], 5**0.5 * expect)
    assert torch.allclose(glob[:, 1], 4.5**0.5 * expect)
    assert torch.allclose(MinBound(rng, glob)(idx, big)[:, 1], glob[:, 1])

    net = random_net(20, 10, 32, 3, 5.0)
    x = random_points(50, 20, 3)
    pred = net(x).argmax(1)
    idx = torch.arange(len(x))
    rng = PreactivationRange(net, x, pred)
    other = torch.ones(len(x), 10, dtype=torch.bool)
    other[idx, pred] = False
    for radius, interval_wins in ((0.01, True), (2.0, False)):
        r = torch.full((len(x),), radius, dtype=torch.float64)
        wins = IntervalBound(rng)(idx, r)[other] < Prop23Bound(rng)(idx, r)[other]
        assert bool(torch.any(wins)) == interval_wins


def test_prop23_closed_form_equals_the_papers_double_sum():
    net = random_net(20, 10, 32, 3, 5.0)
    x = random_points(12, 20, 5)
    pred = net(x).argmax(1)
    bound = Prop23Bound(PreactivationRange(net, x, pred))
    U, W, b = net.U.detach(), net.W.detach(), net.hidden_bias().detach()
    G = U @ U.T
    for radius in RADII:
        r = torch.full((len(x),), radius, dtype=torch.float64)
        lip = bound(torch.arange(len(x)), r)
        ref = torch.stack(
            [
                prop23_reference(U, W, b, net.alpha, G, x[i], int(pred[i]), radius)
                for i in range(len(x))
            ]
        )
        assert torch.allclose(lip, ref, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------- guarantees end to end
def margin_attack(net, x, pred, radius, p, box, restarts=10, steps=80, seed=0):
    """Projected gradient descent on ``f_c - max_{j != c} f_j`` inside ``B_p(x, radius)``
    (∩ box), several random restarts; returns the predictions at the final points."""
    gen = torch.Generator().manual_seed(seed)
    xr = x.repeat_interleave(restarts, 0)
    pr = pred.repeat_interleave(restarts)
    rr = radius.repeat_interleave(restarts)
    delta = project(
        torch.randn(xr.shape, generator=gen, dtype=xr.dtype) * rr[:, None], xr, rr, p, box
    )
    for _ in range(steps):
        delta.requires_grad_(True)
        out = net(xr + delta)
        other = out.scatter(1, pr[:, None], -math.inf).max(1).values
        marg = out.gather(1, pr[:, None]).squeeze(1) - other
        (grad,) = torch.autograd.grad(marg.sum(), delta)
        with torch.no_grad():
            if math.isinf(p):
                step = grad.sign()
            else:
                step = grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-300)
            delta = project(delta - 0.1 * rr[:, None] * step, xr, rr, p, box)
    with torch.no_grad():
        return net(xr + delta).argmax(1), pr


#: The paper's guarantee families (the certificates beyond it: tests/test_certify_beyond.py).
PAPER_KINDS = ("local", "global", "l2", "l1", "linf", "box")
COLUMNS = [
    ("guarantee_local", 2.0, False),
    ("guarantee_global", 2.0, False),
    ("guarantee_l2", 2.0, False),
    ("guarantee_l1", 1.0, False),
    ("guarantee_linf", math.inf, False),
    ("guarantee_l2_box", 2.0, True),
    ("guarantee_l1_box", 1.0, True),
    ("guarantee_linf_box", math.inf, True),
]


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_no_attack_inside_any_certified_ball_changes_the_decision(d, k, h, seed, scale):
    net = random_net(d, k, h, seed, scale)
    x = random_points(20, d, seed + 1)
    res = certify_softplus(net, x, rtol=1e-4, kinds=PAPER_KINDS)
    for col, p, box in COLUMNS:
        radius = res[col].clamp(max=1e6)
        assert torch.all(radius >= 0) and not torch.any(torch.isnan(radius)), col
        # a hair inside the ball: the boundary itself may be reached exactly by a tight bound
        adv, pred = margin_attack(net, x, res["pred"], radius * (1 - 1e-9), p, box, seed=seed)
        assert torch.all(adv == pred), col


@pytest.mark.parametrize("p", NORMS)
def test_the_attack_check_catches_guarantees_from_a_halved_bound(p):
    net = random_net(5, 3, 8, 1, 3.0)
    x = random_points(40, 5, 2)
    logits = net(x)
    pred = logits.argmax(1)
    bound = IntervalBound(PreactivationRange(net, x, pred, p=p))
    cert = theorem21(margins(logits, pred), lambda i, r: 0.5 * bound(i, r))
    adv, pr = margin_attack(net, x, pred, cert.guarantee.clamp(max=1e6), p, False)
    assert torch.any(adv != pr)


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_combined_guarantees_dominate_their_parts(d, k, h, seed, scale):
    net = random_net(d, k, h, seed, scale)
    res = certify_softplus(net, random_points(30, d, seed + 2), kinds=PAPER_KINDS)
    for part in ("guarantee_local", "guarantee_global"):
        assert torch.all(res["guarantee_l2"] >= res[part])
    for name in ("l2", "l1", "linf"):
        assert torch.all(res[f"guarantee_{name}_box"] >= res[f"guarantee_{name}"])


def test_batched_guarantees_equal_the_per_point_reference():
    net = random_net(20, 10, 32, 3, 5.0)
    x = random_points(25, 20, 9)
    res = certify_softplus(net, x, kinds=("local",), batch_size=7)
    ref = certify_prop23_reference(net, x)
    assert torch.allclose(res["guarantee_local"], ref, rtol=1e-9, atol=0)


def test_float32_model_and_points_give_the_float64_guarantees():
    net = random_net(10, 4, 16, 2, 1.0)
    x = random_points(20, 10, 4)
    a = certify_softplus(net, x, kinds=PAPER_KINDS)
    b = certify_softplus(net.float(), x.float(), kinds=PAPER_KINDS)
    for k in ("guarantee_local", "guarantee_l2", "guarantee_linf"):
        assert torch.allclose(a[k], b[k], rtol=1e-5)


# ------------------------------------------------------------------------ Theorem 2.1 search
@pytest.mark.parametrize("p", NORMS)
def test_linear_model_guarantee_is_exact_distance(p):
    q = DUAL[p]
    gen = torch.Generator().manual_seed(7)
    d, k, n = 12, 5, 200
    W = torch.randn(k, d, generator=gen, dtype=torch.float64)
    b = torch.randn(k, generator=gen, dtype=torch.float64)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    logits = x @ W.T + b
    pred = logits.argmax(1)
    cert = theorem21(margins(logits, pred), linear_lipschitz(W, pred, q), rtol=1e-6)
    diff = W[pred][:, None, :] - W[None]
    dist = (logits.gather(1, pred[:, None]) - logits) / torch.linalg.vector_norm(diff, q, dim=-1)
    dist = dist.scatter(1, pred[:, None], math.inf).min(1)
    assert torch.allclose(cert.guarantee, dist.values, rtol=1e-12)
    assert torch.equal(cert.bound_class, dist.indices)
    # the p-norm minimizer towards class j (dual direction of w_j - w_c) reaches the boundary
    v = -diff[torch.arange(n), dist.indices]  # move along w_j - w_c
    if p == 2:
        direction = v / v.norm(dim=1, keepdim=True)
    elif math.isinf(p):
        direction = v.sign()
    else:
        top = v.abs().argmax(1)
        direction = torch.zeros_like(v)
        direction[torch.arange(n), top] = v[torch.arange(n), top].sign()
    beyond = x + (1 + 1e-6) * cert.guarantee[:, None] * direction
    inside = x + (1 - 1e-6) * cert.guarantee[:, None] * direction
    assert torch.all((beyond @ W.T + b).argmax(1) != pred)
    assert torch.all((inside @ W.T + b).argmax(1) == pred)


def prop23_setup(net, x):
    """Predictions, margins (n, K) and the Proposition 2.3 bound of ``net`` at ``x``."""
    logits = net(x)
    pred = logits.argmax(1)
    return pred, margins(logits, pred), Prop23Bound(PreactivationRange(net, x, pred))


def test_search_reports_only_evaluated_alpha_and_is_near_optimal():
    net = random_net(10, 4, 16, 11, 2.0)
    x = random_points(40, 10, 11)
    _, m, bound = prop23_setup(net, x)
    rtol = 1e-3
    cert = theorem21(m, bound, rtol=rtol)
    idx = torch.arange(len(x))
    g = min_ratio(m, bound(idx, cert.radius))[0]
    assert torch.allclose(cert.guarantee, torch.minimum(g, cert.radius), rtol=1e-12)
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)[1:]
    best = torch.zeros(len(x), dtype=torch.float64)
    top = cert.radius.clamp_min(1e-12) * 4
    for t in grid:
        r = top * t
        best = torch.maximum(best, torch.minimum(min_ratio(m, bound(idx, r))[0], r))
    assert torch.all(cert.guarantee >= best * (1 - 2 * rtol))
    assert torch.all(cert.guarantee <= best * (1 + 2 * rtol) + 1e-15)
    assert cert.evaluations.float().mean() < 9  # bisection needs ~12 for rtol = 1e-3


def test_an_origin_estimate_changes_the_path_never_what_is_reported():
    """``radius_search``'s ``origin`` opens the bracket only: an estimate far above the
    radii at R = 0 still reaches the optimum, one below caps the result at it, and every
    reported value is ``alpha`` at an R the real function evaluated."""
    net = random_net(10, 4, 16, 11, 2.0)
    x = random_points(30, 10, 12)
    _, m, bound = prop23_setup(net, x)
    idx = torch.arange(len(x))

    def rho(i, r, need):
        return ratios(m[i], bound(i, r))

    plain = radius_search(rho, m, 1e-4, prune=False)
    cases = {"above": 1e3, "below": 0.5}
    for name, factor in cases.items():
        cert = radius_search(
            rho, m, 1e-4, prune=False, origin=lambda i, r, need, f=factor: rho(i, r, need) * f
        )
        g = min_ratio(m, bound(idx, cert.radius))[0]
        assert torch.allclose(cert.guarantee, torch.minimum(g, cert.radius), rtol=1e-12), name
        assert torch.all(cert.guarantee <= plain.guarantee * (1 + 2e-4)), name
        if name == "above":
            assert torch.all(cert.guarantee >= plain.guarantee * (1 - 2e-4))
        else:
            g0 = min_ratio(m, bound(idx, torch.zeros(len(x), dtype=torch.float64)))[0]
            assert torch.all(cert.guarantee <= 0.5 * g0 * (1 + 1e-12))


def test_a_search_with_a_start_skips_r_zero_and_still_reaches_the_optimum():
    """Given a first R, the search evaluates nothing at ``R = 0``, reports only ``alpha``
    at evaluated R, and ends within its tolerance of the search opened at ``g(0)``, from a
    start just above the optimum, far below it or far above it."""
    net = random_net(10, 4, 16, 11, 2.0)
    x = random_points(30, 10, 13)
    _, m, bound = prop23_setup(net, x)
    idx = torch.arange(len(x))
    tried = []

    def rho(i, r, need):
        tried.append(r)
        return ratios(m[i], bound(i, r))

    plain = radius_search(rho, m, 1e-4)
    for factor in (1 + 1e-4 / 4, 0.01, 50.0):
        tried.clear()
        cert = radius_search(rho, m, 1e-4, start=plain.guarantee * factor)
        assert all(bool((r > 0).all()) for r in tried), factor
        g = min_ratio(m, bound(idx, cert.radius))[0]
        assert torch.allclose(cert.guarantee, torch.minimum(g, cert.radius), rtol=1e-12)
        assert torch.allclose(cert.guarantee, plain.guarantee, rtol=3e-4), factor


def test_class_pruning_changes_nothing():
    net = random_net(20, 10, 32, 3, 5.0)
    x = random_points(60, 20, 4)
    pred, m, bound = prop23_setup(net, x)
    asked, offered = [], []  # classes j != c evaluated, and those there were

    def counted(idx, r, need=None):
        others = torch.ones(len(idx), 10, dtype=torch.bool)
        others[torch.arange(len(idx)), pred[idx]] = False
        asked.append(int((others if need is None else others & need).sum()))
        offered.append(int(others.sum()))
        return bound(idx, r, need)

    counted.supports_mask = True
    pruned = theorem21(m, counted)
    full = theorem21(m, lambda i, r: bound(i, r))
    assert torch.equal(pruned.guarantee, full.guarantee)
    assert torch.equal(pruned.radius, full.radius)
    assert torch.equal(pruned.bound_class, full.bound_class)
    assert asked[:2] == offered[:2]  # nothing is known before the first two evaluations
    assert sum(asked) < 0.8 * sum(offered)  # later ones skip classes that cannot matter


def test_non_monotone_bound_costs_tightness_not_soundness():
    """A bound that is not monotone in R may mislead the search, but what is reported is
    still alpha(R) at an evaluated R."""
    m = torch.tensor([[math.inf, 1.0, 2.0]] * 5, dtype=torch.float64)
    seen = []

    def wobbly(idx, r):
        seen.append(r.clone())
        return (1.0 + torch.sin(20 * r))[:, None].expand(len(idx), 3) + 0.1

    cert = theorem21(m, wobbly)
    alpha_at = torch.minimum(1.0 / (1.1 + torch.sin(20 * cert.radius)), cert.radius)
    assert torch.allclose(cert.guarantee, alpha_at, rtol=1e-12)
    assert any(torch.any(torch.isclose(s, cert.radius[0])) for s in seen)


def test_zero_margin_and_constant_model():
    m = torch.tensor([[math.inf, 0.0, 1.0], [math.inf, 2.0, 3.0]], dtype=torch.float64)
    lip = torch.ones(2, 3, dtype=torch.float64)
    cert = theorem21(m, lambda idx, r: lip[idx])
    assert cert.guarantee[0] == 0
    assert cert.guarantee[1] == pytest.approx(2.0)
    seen = []

    def zeros(idx, r):
        seen.append(r.clone())
        return torch.zeros(len(idx), 3, dtype=torch.float64)

    # a bound that is 0 wherever it is evaluated certifies the largest R evaluated, never inf
    zero = theorem21(m[1:], zeros)
    big = torch.finfo(torch.float64).max
    assert zero.guarantee[0] == big and zero.radius[0] == big
    assert any(float(s.max()) == big for s in seen)
    # +inf needs a proof from the weights that the gradient difference vanishes everywhere
    vanish = torch.tensor([[True, True, True]])
    proved = theorem21(m[1:], zeros, vanishes=vanish)
    assert math.isinf(proved.guarantee[0]) and proved.bound_class[0] == -1
    capped = theorem21(m[1:], zeros, r_max=5.0)
    assert capped.guarantee[0] == pytest.approx(5.0)
    assert theorem21(m[1:], zeros, r_max=5.0, vanishes=vanish).guarantee[0] == 5.0
    # a vanishing class does not count, the others do
    partly = theorem21(m[1:], lambda idx, r: lip[idx], vanishes=torch.tensor([[True, True, False]]))
    assert partly.guarantee[0] == pytest.approx(3.0)


def test_unknown_kind_and_points_outside_the_box_are_rejected():
    net = random_net(5, 3, 8, 1)
    with pytest.raises(ValueError, match="unknown guarantee kinds"):
        certify_softplus(net, random_points(3, 5, 0), kinds=("l3",))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        certify_softplus(net, random_points(3, 5, 0) + 2, kinds=("l2", "box"))
