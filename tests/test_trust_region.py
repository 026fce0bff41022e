"""The curvature certificates minimised over the ball, L2 (:mod:`crosslip.certify.trust_region`)
and L-inf through the diagonal dual (:mod:`crosslip.certify.linf_trust_region`): sound
against attacks inside every certified ball and against the exact distance on the plane,
caught when their curvature is mis-signed, never below the curvature forms (with the units
expanded about the point), the L-inf dual below a brute-force minimum of its quadratic over
the cube, and a verified ``mu`` that is never below the real ``lambda_max``."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from crosslip.certify import expansion, trust_region
from crosslip.certify.curvature import CurvatureBound
from crosslip.certify.engine import certify_softplus
from crosslip.certify.linear_min import quad_radius
from crosslip.certify.linf_trust_region import LinfTrustRegionBound
from crosslip.certify.search import radius_search
from crosslip.certify.secant import secant_curvature

from .helpers import random_net, random_points
from .test_certify import margin_attack
from .test_certify_beyond import CONFIGS, PLANE, exact_distance, pieces

#: The norms with a curvature certificate minimised over the ball: L2 and L-inf (the
#: diagonal dual of crosslip.certify.linf_trust_region).
NORMS = {"l2": 2.0, "linf": math.inf}


def trust(net, x, norm: str = "l2", steps: int = 8, **kw) -> dict:
    kinds = (norm, "box", "curvature")
    return certify_softplus(net, x, kinds=kinds, trust_region_steps=steps, **kw)


def columns(norm: str) -> tuple[str, str]:
    return f"guarantee_{norm}_curvature", f"guarantee_{norm}_curvature_box"


#: (moves, ascent steps) of the expansion points (.expansion): about the point, moved, and
#: moved then optimised by gradient ascent.
EXPANSIONS = [(0, 0), (3, 0), (2, 4)]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("expansions", EXPANSIONS)
@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_no_attack_inside_a_trust_region_ball_changes_the_decision(
    d, k, h, seed, scale, expansions, norm
):
    net = random_net(d, k, h, seed, scale)
    x = random_points(12, d, seed + 1)
    moves, ascents = expansions
    res = trust(net, x, norm, rtol=1e-4, expansion_steps=moves, expansion_ascent_steps=ascents)
    for col in columns(norm):
        radius = res[col].clamp(max=1e6)
        assert torch.all(radius >= 0) and not torch.any(torch.isnan(radius)), col
        box = col.endswith("_box")
        adv, pred = margin_attack(
            net, x, res["pred"], radius * (1 - 1e-7), NORMS[norm], box, seed=seed
        )
        assert torch.all(adv == pred), col


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("expansions", EXPANSIONS)
@pytest.mark.parametrize("d,k,h,seed,scale", PLANE)
def test_no_trust_region_certificate_exceeds_the_exact_distance_on_the_plane(
    d, k, h, seed, scale, expansions, norm
):
    net = random_net(d, k, h, seed, scale)
    x = random_points(6, d, seed + 100)
    moves, ascents = expansions
    res = trust(net, x, norm, rtol=1e-5, expansion_steps=moves, expansion_ascent_steps=ascents)
    for col in columns(norm):
        exact = exact_distance(net, x, res["pred"], NORMS[norm], col.endswith("_box"))
        assert torch.all(res[col] <= exact), (col, res[col], exact)


@pytest.mark.parametrize("norm", NORMS)
def test_ignoring_the_concave_units_curvature_is_caught(monkeypatch, norm):
    """Charging the concave units no curvature (``kappa = 0``) certifies past the exact
    distance somewhere on the plane: the check above is not vacuous."""
    real = trust_region.secant_curvature

    def no_concave_curvature(z, pad, lo, hi, alpha, **kw):
        return torch.zeros_like(lo), real(z, pad, lo, hi, alpha, **kw)[1]

    monkeypatch.setattr(trust_region, "secant_curvature", no_concave_curvature)
    caught = False
    for d, k, h, seed, scale in [*PLANE, (2, 2, 6, 5, 1.0), (2, 3, 6, 6, 3.0)]:
        net = random_net(d, k, h, seed, scale)
        x = random_points(6, d, seed + 100)
        res = trust(net, x, norm, rtol=1e-5)
        exact = exact_distance(net, x, res["pred"], NORMS[norm], False)
        caught |= bool(torch.any(res[columns(norm)[0]] > exact))
    assert caught


def test_the_exact_minimum_is_never_below_the_lambda_max_form_and_often_above():
    net = random_net(10, 4, 32, 3, 2.0)
    x = random_points(20, 10, 4)
    plain = certify_softplus(net, x, kinds=("l2", "curvature"), trust_region_steps=0)
    exact = certify_softplus(net, x, kinds=("l2", "curvature"), trust_region_steps=10)
    assert torch.all(exact["guarantee_l2_curvature"] >= plain["guarantee_l2_curvature"])
    assert torch.mean(exact["guarantee_l2_curvature"] / plain["guarantee_l2_curvature"]) > 1.05


@pytest.mark.parametrize(
    "p,kind", [(2.0, trust_region.TrustRegionBound), (math.inf, LinfTrustRegionBound)]
)
def test_the_radius_function_alone_is_sound_at_every_radius_it_reports(p, kind):
    """Straight through :func:`radius_search` (no maximum with the column): attacked."""
    net = random_net(8, 5, 24, 12, 4.0)
    x = random_points(16, 8, 13)
    rng, m, unbounded, pred = pieces(net, x, p, False)
    bound = kind(rng, m, 6, expansions=2, ascents=3)
    for origin in (None, bound.origin):  # the unverified estimate at R = 0 only opens it
        cert = radius_search(bound, m, 1e-4, unbounded=unbounded, origin=origin)
        radius = cert.guarantee.clamp(max=1e6)
        assert torch.all(radius > 0)
        adv, same = margin_attack(net, x, pred, radius * (1 - 1e-7), p, False, seed=5)
        assert torch.all(adv == same)


def every_row_minimised(bound, idx, r, need, verify: bool = True) -> torch.Tensor:
    """The reference for :meth:`TrustRegionBound.radii`: every needed row minimised over
    the ball, and the larger of that and the ``lambda_max`` form's radius per row."""
    rho_c = CurvatureBound.__call__(bound, idx, r, need)
    zh, pad, lo, hi = bound.rng.intervals(idx, r)
    s2_hi, s2_lo = secant_curvature(zh, pad, lo, hi, bound.alpha)
    c = bound.rng.pred[idx]
    point, cls = (bound.rng.not_pred[c] & need).nonzero(as_tuple=True)
    delta, grad, err, kappa, margin = bound.rows(idx[point], c[point], cls, s2_hi[point])
    convex = bound.convex(delta, s2_lo[point])
    found = quad_radius(margin, bound.lower(grad, err, convex, kappa, margin, verify))
    out = torch.full_like(rho_c, math.inf)
    out[point, cls] = torch.maximum(found, rho_c[point, cls])
    return out


@pytest.mark.parametrize("d,k,h,seed,scale", [(10, 6, 32, 3, 2.0), (8, 10, 48, 5, 4.0)])
def test_few_rows_are_minimised_and_the_radii_are_those_of_every_row(d, k, h, seed, scale):
    """Rows that the ``lambda_max`` form certifies to R, and rows that cannot undercut the
    first round's radius, are not minimised over the ball: the search gives the radii of
    every needed row minimised (to the dual's float32 rounding), for fewer rows."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(30, d, seed + 1)
    rng, m, unbounded, _ = pieces(net, x, 2.0, False)
    bound = trust_region.TrustRegionBound(rng, m, 6)
    rows = [0]
    real = bound.lower

    def counted(grad, *args, **kwargs):
        rows[0] += len(grad)
        return real(grad, *args, **kwargs)

    bound.lower = counted
    near = radius_search(CurvatureBound(rng, m), m, 1e-4, unbounded=unbounded).guarantee

    def search(fn, origin):
        rows[0] = 0
        cert = radius_search(fn, m, 1e-4, unbounded=unbounded, start=1.5 * near, origin=origin)
        return cert.guarantee, rows[0]

    got, few = search(bound, bound.origin)
    # the same estimate opens both searches (it only sets their paths)
    want, every = search(partial(every_row_minimised, bound), bound.origin)
    # the dual point is searched in float32 (trust_region.DUAL_DTYPE), whose products round
    # differently in chunks of other sizes: radii agree to about 1e-6
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    assert torch.any(got > near * 1.01)  # minimised over the ball somewhere
    assert few < 0.7 * every


def concave_rows(rows: int, every: int, seed: int):
    """A trust-region bound of a random 12-40-3 net, ``rows`` random curvature rows
    ``kappa`` (rows, 40) with every ``every``-th unit convex (0), and the real largest
    eigenvalue of each row's ``U^T diag(kappa) U``."""
    net = random_net(12, 3, 40, 21, 3.0)
    x = random_points(2, 12, 22)
    rng, m, _, _ = pieces(net, x, 2.0, False)
    bound = trust_region.TrustRegionBound(rng, m)
    gen = torch.Generator().manual_seed(seed)
    kappa = torch.rand(rows, 40, generator=gen, dtype=torch.float64) * 3
    kappa[:, ::every] = 0.0
    U = bound.U
    lam = torch.stack([torch.linalg.eigvalsh((U.T * k) @ U)[-1] for k in kappa])
    return bound, kappa, lam


def test_a_verified_mu_is_at_least_the_real_largest_eigenvalue():
    bound, kappa, lam = concave_rows(6, every=3, seed=0)
    est = bound.concave_part(kappa).estimate()
    assert torch.all(est <= lam * (1 + 1e-9))
    ok = bound.verified_mu(kappa, lam * (1 + 1e-6))
    assert torch.all(torch.isfinite(ok)) and torch.all(ok >= lam)
    assert torch.all(torch.isinf(bound.verified_mu(kappa, lam * 0.99)))
    # the smallest units left to their trace (a tail of up to 30% of lambda_max here):
    # still never below the real lambda_max, and found by the estimate plus the tail
    parts = bound.concave_part(kappa, lam)
    parts_tail = bound.concave_part(kappa, lam * 30)
    assert parts_tail.sgs.shape[1] < parts.sgs.shape[1] <= 40 and torch.all(parts_tail.tail > 0)
    start = (parts_tail.estimate() + parts_tail.tail) * (1 + 1e-6)
    found = parts_tail.verify(start * 1.01)
    assert torch.all(torch.isfinite(found)) and torch.all(found >= lam)


def signed_rows(rows: int, seed: int):
    """A trust-region bound of a random 12-40-3 net and ``rows`` rows of mixed curvature:
    each unit concave (``kappa`` in [0.5, 3]) or convex (``convex`` in [0.5, 3], half of
    them), the smallest eigenvalue of each row's ``U^T diag(convex - kappa) U`` and the
    largest of its concave part ``U^T diag(kappa) U``."""
    bound, _, _ = concave_rows(1, every=3, seed=seed)
    gen = torch.Generator().manual_seed(seed + 7)
    size = (rows, 40)
    value = 0.5 + 2.5 * torch.rand(size, generator=gen, dtype=torch.float64)
    is_convex = torch.rand(size, generator=gen) < 1 / 2
    kappa, convex = value.masked_fill(is_convex, 0.0), value.masked_fill(~is_convex, 0.0)
    U = bound.U
    low = torch.linalg.eigvalsh(torch.einsum("hd,mh,he->mde", U, convex - kappa, U))[:, 0]
    high = torch.linalg.eigvalsh(torch.einsum("hd,mh,he->mde", U, kappa, U))[:, -1]
    return bound, kappa, convex, low, high


def test_the_direct_proof_reaches_the_real_smallest_eigenvalue_and_never_passes_it(
    monkeypatch,
):
    """``mu I + U^T diag(q) U >= 0`` proved with the convex units (the Schur complement of
    :class:`SignedPart`), against a dense eigendecomposition: every ``mu`` just above the
    real ``-lambda_min`` is proved (within 1e-5, every unit factorised), none 0.1% below;
    the concave part alone would need ``lambda_max(U^T diag(kappa) U)``, well above it."""
    monkeypatch.setattr(trust_region, "SIGNED_TAIL_SHARE", 0.0)  # no unit left to its trace
    monkeypatch.setattr(trust_region, "TAIL_SHARE", 0.0)
    bound, kappa, convex, low, high = signed_rows(8, seed=3)
    need = -low
    assert torch.all(need > 0) and torch.all(need < 0.97 * high)  # the convex units help
    assert torch.any(need < 0.8 * high)
    mu = need * (1 + 1e-6)
    got = bound.signed_part(kappa, convex, mu).verify(mu)
    assert torch.all(torch.isfinite(got)) and torch.all(got >= need)
    assert torch.all(got <= need * (1 + 1e-5))
    below = need * (1 - 1e-3)
    assert torch.all(torch.isinf(bound.signed_part(kappa, convex, below).verify(below)))
    # through verified(): where the concave part alone fails, the direct proof passes
    cheap = bound.curvature(kappa)
    via = bound.verified(kappa, mu, cheap, convex)
    assert torch.all(via >= need) and torch.all(via <= need * (1 + 1e-5))
    without = bound.verified(kappa, mu, cheap)
    assert torch.all(without >= high)


def test_the_direct_proof_with_units_left_out_stays_sound():
    """With the default tail (concave units left to their trace) and small convex units
    left out, a verified ``mu`` is never below the real ``-lambda_min``, for ``mu`` from
    far below it to above it."""
    bound, kappa, convex, low, _ = signed_rows(6, seed=11)
    convex[:, ::5] *= 1e-5  # convex units below CONVEX_SHARE: left out
    kappa[:, 1::7] *= 1e-4  # concave units for the tail
    U = bound.U
    low = torch.linalg.eigvalsh(torch.einsum("hd,mh,he->mde", U, convex - kappa, U))[:, 0]
    for factor in (0.3, 0.9, 0.999, 1.001, 1.1, 2.0):
        mu = -low * factor
        got = bound.signed_part(kappa, convex, mu).verify(mu)
        proved = torch.isfinite(got)
        assert torch.all(got[proved] >= -low[proved]), factor
        assert factor < 1 or proved.any(), factor
        assert factor < 1.1 or proved.all(), factor  # units left out cost less than 10%


def test_a_mu_is_verified_cheaply_where_it_can_be_and_never_below_the_real_eigenvalue():
    """Rows whose ``mu`` is at least the cheap curvature bound keep it (no factorisation);
    the others come back verified by a factorisation, from ``mu`` or from the estimate
    when ``mu`` is below the real ``lambda_max``: every result is at least both."""
    bound, kappa, lam = concave_rows(9, every=4, seed=1)
    cheap = bound.curvature(kappa)
    assert torch.all(cheap >= lam) and torch.all(cheap > 1.05 * lam)  # room between them
    factors = torch.tensor([0.5, 0.9, 0.999])  # below the real eigenvalue
    mid = 0.5 * (lam + cheap)  # above it, below the cheap bound
    mu = torch.cat([lam[:3] * factors, mid[3:6], cheap[6:] * 1.01])
    got = bound.verified(kappa, mu)
    assert torch.all(torch.isfinite(got)) and torch.all(got >= lam) and torch.all(got >= mu)
    assert torch.equal(got[6:], mu[6:])  # the cheap bound sufficed
    assert torch.all(got[3:6] < cheap[3:6])  # factorised: tighter than the cheap bound


def test_each_norms_ranges_only_are_accepted():
    net = random_net(4, 3, 8, 0, 1.0)
    x = random_points(2, 4, 1)
    rng, m, _, _ = pieces(net, x, math.inf, False)
    with pytest.raises(ValueError, match="L2"):
        trust_region.TrustRegionBound(rng, m)
    rng, m, _, _ = pieces(net, x, 2.0, False)
    with pytest.raises(ValueError, match="Linf"):
        LinfTrustRegionBound(rng, m)


def test_the_setting_reaches_the_certificate_through_the_dispatch():
    """``crosslip.certify.certify`` (what the certify stage calls) passes
    ``trust_region_steps`` on: the L2 and L-inf curvature columns rise where the minimum over
    the ball is larger (:mod:`crosslip.certify.linf_trust_region`), and the L1 ones do not
    change."""
    from crosslip.certify import certify

    net = random_net(10, 4, 32, 3, 2.0)
    x = random_points(8, 10, 4)
    kinds = ("l2", "l1", "linf", "box", "curvature")
    off = certify(net, x, kinds=kinds, trust_region_steps=0).columns
    on = certify(net, x, kinds=kinds, trust_region_steps=6).columns
    assert torch.all(on["guarantee_l2_curvature"] >= off["guarantee_l2_curvature"])
    for norm in ("l2", "linf"):
        col = f"guarantee_{norm}_curvature"
        assert torch.any(on[col] > off[col]), norm
        assert torch.all(on[col + "_box"] >= on[col]), norm
    assert torch.equal(on["guarantee_l1_curvature"], off["guarantee_l1_curvature"])


@pytest.mark.parametrize("d,k,h,seed,scale", [(10, 6, 32, 3, 2.0), (8, 10, 48, 5, 4.0)])
def test_the_search_finds_the_same_radius_from_below_and_from_above(d, k, h, seed, scale):
    """A row that the ``lambda_max`` form certifies to R says only that (``+inf``): were it
    to report its own radius, a search started below the optimum would take it for the
    certificate's end and stop there."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(30, d, seed + 1)
    rng, m, unbounded, _ = pieces(net, x, 2.0, False)
    bound = trust_region.TrustRegionBound(rng, m, 6)
    near = radius_search(CurvatureBound(rng, m), m, 1e-4, unbounded=unbounded).guarantee
    got = {
        f: radius_search(
            bound, m, 1e-4, unbounded=unbounded, start=f * near, origin=bound.origin
        ).guarantee
        for f in (0.5, 1.0, 2.0)
    }
    torch.testing.assert_close(got[0.5], got[2.0], rtol=3e-4, atol=0)
    torch.testing.assert_close(got[1.0], got[2.0], rtol=3e-4, atol=0)


def test_a_row_whose_cheaply_verified_bound_suffices_is_not_factorised():
    """``lower(..., enough)``: a row whose dual ``mu`` is below the cheap eigenvalue bound
    keeps the bound with ``mu`` raised to it where that reaches ``enough`` (no
    factorisation), a sound radius below the factorised one; other rows are factorised."""
    net = random_net(10, 6, 32, 3, 2.0)
    x = random_points(30, 10, 4)
    rng, m, _, _ = pieces(net, x, 2.0, False)
    bound = trust_region.TrustRegionBound(rng, m, 6)
    idx = torch.arange(len(x))
    r = torch.full((len(x),), 0.5, dtype=torch.float64)
    zh, pad, lo, hi = rng.intervals(idx, r)
    s2_hi, s2_lo = secant_curvature(zh, pad, lo, hi, bound.alpha)
    c = rng.pred
    point, cls = rng.not_pred[c].nonzero(as_tuple=True)
    delta, grad, err, kappa, margin = bound.rows(point, c[point], cls, s2_hi[point])
    convex = bound.convex(delta, s2_lo[point])
    factorised = [0]
    real = bound.factorised

    def counted(kappa, mu, convex=None):
        factorised[0] += len(mu)
        return real(kappa, mu, convex)

    bound.factorised = counted

    def radius(enough):
        factorised[0] = 0
        low = bound.lower(grad, err, convex, kappa, margin, enough=enough)
        return quad_radius(margin, low), factorised[0]

    full, every = radius(None)
    assert every > 0
    loose, none = radius(torch.zeros_like(margin))
    assert none == 0 and torch.all(loose <= full)
    assert torch.any(loose < full * 0.999)  # looser where it was factorised
    half = torch.where(
        torch.rand(len(margin), generator=torch.Generator().manual_seed(0)) < 0.5, 0.0, torch.inf
    )
    mixed, some = radius(half.to(margin))
    assert 0 < some < every
    # the factorised rows as before (a batch's top units follow its largest row: 1e-2)
    torch.testing.assert_close(mixed[half > 0], full[half > 0], rtol=1e-2, atol=0)


def test_later_moves_of_the_expansion_points_are_damped(monkeypatch):
    """The first move expands about the last bound's minimiser; each later one goes
    ``EXPANSION_DAMPING`` of the way from the last points to the new minimiser (a full move
    overshoots); and more damped moves never lower the mean certificate."""
    calls: list[tuple[str, torch.Tensor]] = []
    bound = trust_region.TrustRegionBound
    minimiser, expanded = bound.minimiser, bound.expanded

    def seen_minimiser(self, dual, r, points=None):
        out = minimiser(self, dual, r, points)
        calls.append(("minimiser", out.clone()))
        return out

    def seen_expanded(self, intervals, point, delta, offset, margin):
        calls.append(("offset", offset.clone()))
        return expanded(self, intervals, point, delta, offset, margin)

    monkeypatch.setattr(bound, "minimiser", seen_minimiser)
    monkeypatch.setattr(bound, "expanded", seen_expanded)
    net = random_net(10, 4, 32, 3, 2.0)
    x = random_points(12, 10, 4)
    many = trust(net, x, expansion_steps=3)["guarantee_l2_curvature"]
    firsts = damped = 0
    for i in range(2, len(calls)):
        (k0, o0), (k1, m1), (k2, o1) = calls[i - 2 : i + 1]
        if (k0, k1, k2) != ("offset", "minimiser", "offset"):
            continue
        if torch.equal(o1, m1):  # a first move (of these rows): all the way
            firsts += 1
        elif o0.shape == o1.shape:  # a later move of the same rows (none left between)
            step = expansion.EXPANSION_DAMPING
            assert torch.allclose(o1, o0 + step * (m1 - o0), rtol=1e-12, atol=1e-12)
            damped += 1
    assert firsts > 0 and damped > 0
    monkeypatch.undo()
    one = trust(net, x, expansion_steps=1)["guarantee_l2_curvature"]
    assert one.mean() <= many.mean() * (1 + 1e-9)


def made_up_rows(bound, rows: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """``rows`` made-up rows of ``bound``'s net: a gradient, no error, convex and concave
    units at random (about half each), margin 2."""
    h, d = bound.U.shape
    f64 = torch.float64
    grad = torch.randn(rows, d, generator=gen, dtype=f64)
    concave = torch.rand(rows, h, generator=gen) < 0.5
    kappa = torch.rand(rows, h, generator=gen, dtype=f64) * concave
    convex = torch.rand(rows, h, generator=gen, dtype=f64) * (kappa == 0)
    margin = torch.full((rows,), 2.0, dtype=f64)
    return grad, torch.zeros(rows, dtype=f64), convex, kappa, margin


@pytest.mark.parametrize("seed", range(4))
def test_the_diagonal_dual_is_below_the_quadratics_minimum_over_the_cube(seed):
    """:meth:`LinfTrustRegionBound.lower` on made-up rows of a net in 3 dimensions: its
    ``-(C + B r + quad r^2)`` is below ``a^T v + 1/2 sum_l q_l (u_l^T v)^2`` at every
    vertex and on a fine grid of the cube of radius r, for the dual point it finds and, at
    its verified ``mu``, for a perturbed ``w`` (any ``w`` is sound)."""
    gen = torch.Generator().manual_seed(seed)
    net = random_net(3, 3, 12, seed, 2.0)
    x = random_points(2, 3, seed + 7)
    rng, m, _, _ = pieces(net, x, math.inf, False)
    bound = LinfTrustRegionBound(rng, m, 3)
    grad, err, convex, kappa, margin = made_up_rows(bound, 5, gen)
    U, q = bound.U, convex - kappa
    mu, span = bound.dual(grad, q, margin)
    mu_ok = bound.verified(kappa, mu.to(grad.dtype), convex=convex)
    w = bound.dual_vector(span, mu_ok)
    w = w + 0.3 * w.abs().amax(1, keepdim=True) * torch.randn(w.shape, generator=gen, dtype=w.dtype)
    lows = [bound.lower(grad, err, convex, kappa, margin)]
    lows.append(bound.evaluate(grad, err, q, convex, kappa, w, mu_ok))
    axis = torch.linspace(-1, 1, 41, dtype=torch.float64)
    cube = torch.cartesian_prod(axis, axis, axis)  # includes every vertex
    for low in lows:
        for r in (0.05, 0.3, 1.0):
            v = cube * r
            value = grad @ v.T + 0.5 * (q[:, None, :] * (v @ U.T)[None].square()).sum(-1)
            floor = -(low.const + low.lin * r + low.quad * r * r)
            assert torch.all(torch.isfinite(floor))
            assert torch.all(floor[:, None] <= value + 1e-12), (r, floor, value.min(1).values)


def on_the_faces(x: torch.Tensor) -> torch.Tensor:
    """``x`` with a third of its coordinates at 0 and a third at 1, as an image's pixels."""
    x = x.clone()
    x[:, 0::3] = 0.0
    x[:, 1::3] = 1.0
    return x


@pytest.mark.parametrize("seed", range(4))
def test_the_diagonal_dual_in_the_box_is_below_the_quadratics_minimum_there(seed):
    """The box's form of :meth:`LinfTrustRegionBound.lower` (rows of points with
    coordinates on the box's faces, ``at``: the points and R): its ``-(C + B r + quad
    r^2)`` is below ``a^T v + 1/2 sum_l q_l (u_l^T v)^2`` on a fine grid of the cube of
    radius r in the box, for every r up to R, for the dual point about the centre it finds
    and, at its verified ``mu``, for a perturbed ``w``; and at R it is above the cube's own
    form (the box only removes room)."""
    gen = torch.Generator().manual_seed(seed)
    net = random_net(3, 3, 12, seed, 2.0)
    x = random_points(2, 3, seed + 7)
    x[0, 0], x[1, 1], x[1, 2] = 0.0, 1.0, 0.0
    rng, m, _, _ = pieces(net, x, math.inf, True)
    bound = LinfTrustRegionBound(rng, m, 3)
    grad, err, convex, kappa, margin = made_up_rows(bound, 6, gen)
    points, big_r = torch.arange(6) % 2, torch.full((6,), 0.6, dtype=torch.float64)
    U, q, at = bound.U, convex - kappa, (points, big_r)
    mu, span = bound.dual(grad, q, margin, at)
    mu_ok = bound.verified(kappa, mu.to(grad.dtype), convex=convex)
    w = bound.dual_vector(span, mu_ok)
    w = w + 0.3 * w.abs().amax(1, keepdim=True) * torch.randn(w.shape, generator=gen, dtype=w.dtype)
    lows = [bound.lower(grad, err, convex, kappa, margin, at=at)]
    lows.append(bound.evaluate(grad, err, q, convex, kappa, w, mu_ok, at))
    cube_form = bound.evaluate(grad, err, q, convex, kappa, w, mu_ok)
    axis = torch.linspace(-1, 1, 41, dtype=torch.float64)
    cube = torch.cartesian_prod(axis, axis, axis)
    xs = rng.x[points]
    for low in lows:
        for r in (0.05, 0.3, 0.6):
            v = torch.minimum(torch.maximum(cube[None] * r, -xs[:, None]), 1 - xs[:, None])
            hv = v @ U.T
            value = (grad[:, None] * v).sum(-1) + 0.5 * (q[:, None, :] * hv.square()).sum(-1)
            floor = -(low.const + low.lin * r + low.quad * r * r)
            assert torch.all(torch.isfinite(floor))
            assert torch.all(floor[:, None] <= value + 1e-12), (r, floor, value.min(1).values)
    r = 0.6
    in_box = -(lows[1].const + lows[1].lin * r + lows[1].quad * r * r)
    assert torch.all(in_box >= -(cube_form.const + cube_form.lin * r + cube_form.quad * r * r))


def test_the_box_dual_certifies_more_where_coordinates_sit_on_the_faces():
    """The L-inf box column with its own dual (about the centre of the cube in the box) is
    never below the ball's column and, on points with two thirds of their coordinates on
    the box's faces, far above it on the mean; its radius function alone, attacked in the
    box, holds."""
    net = random_net(12, 4, 48, 3, 2.0)
    x = on_the_faces(random_points(20, 12, 4))
    res = trust(net, x, "linf", rtol=1e-5, expansion_steps=2)
    ball, box = columns("linf")
    assert torch.all(res[box] >= res[ball])
    assert torch.mean(res[box] / res[ball]) > 1.1, res[box] / res[ball]
    rng, m, unbounded, pred = pieces(net, x, math.inf, True)
    bound = LinfTrustRegionBound(rng, m, 8, expansions=2)
    cert = radius_search(bound, m, 1e-4, unbounded=unbounded)
    radius = cert.guarantee.clamp(max=1e6)
    assert torch.all(radius > 0)
    adv, same = margin_attack(net, x, pred, radius * (1 - 1e-7), math.inf, True, seed=5)
    assert torch.all(adv == same)


def test_the_diagonal_dual_is_never_below_the_curvature_form_and_above_it_on_the_mean():
    """Against the L-inf curvature form alone (``trust_region_steps: 0``): with the units
    expanded about the point, every row reports at least that form's radius at the same R,
    so the column is never below it by more than the search's precision; with moved
    expansion points (each form moves them its own way) it is above it on the mean."""
    net = random_net(12, 4, 48, 3, 2.0)
    x = random_points(20, 12, 4)
    for moves, least in ((0, 1 - 1e-4), (3, 0.9)):
        kw = {"kinds": ("linf", "curvature"), "expansion_steps": moves, "rtol": 1e-5}
        plain = certify_softplus(net, x, trust_region_steps=0, **kw)
        exact = certify_softplus(net, x, trust_region_steps=10, **kw)
        ratio = exact["guarantee_linf_curvature"] / plain["guarantee_linf_curvature"]
        assert torch.all(ratio >= least) and torch.mean(ratio) > 1.03, (moves, ratio)
