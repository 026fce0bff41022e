"""No path from NaN to a radius: a NaN (or inf) injected at each step where a certificate is
formed gives 0 or the radius that holds without the poisoned step, never more; and any NaN
in a certificate's inputs (a weight, a coordinate of the point) gives 0.

The steps: the quadratic root of every linear, curvature and trust-region radius
(denominators), the node bounds of Theorem 2.1 integrated, the cheap bound on the largest
eigenvalue that lets the trust region skip its verification, the matrix that verification
factorises, and the secant curvature pieces.
"""

from __future__ import annotations

import math

import pytest
import torch

from crosslip.certify import curvature as curvature_module
from crosslip.certify import expansion as expansion_module
from crosslip.certify import trust_region as trust_region_module
from crosslip.certify.engine import certify_softplus
from crosslip.certify.integrated import SPAN, integrated
from crosslip.certify.linear_min import QuadLower, quad_radius
from crosslip.certify.search import theorem21
from crosslip.certify.trust_region import TrustRegionBound

from .helpers import random_net, random_points
from .test_certify_beyond import pieces

DT = torch.float64
NAN = math.nan


@pytest.mark.parametrize("field", ["const", "lin", "quad", "extra", "beta"])
@pytest.mark.parametrize("bad", [NAN, -math.inf])
def test_a_nan_in_the_quadratic_root_gives_zero(field, bad):
    beta = torch.tensor([1.0, 1.0], dtype=DT)
    low = QuadLower(
        const=torch.tensor([0.1, 0.1], dtype=DT),
        lin=torch.tensor([0.5, 0.5], dtype=DT),
        quad=torch.tensor([0.2, 0.2], dtype=DT),
    )
    extra = torch.zeros(2, dtype=DT)
    clean = quad_radius(beta.clone(), low, extra)
    target = {"beta": beta, "extra": extra}[field] if field in ("beta", "extra") else None
    target = getattr(low, field) if target is None else target
    target[0] = bad
    got = quad_radius(beta, low, extra)
    assert got[1] == clean[1] and 0 < clean[0] < math.inf
    if bad != bad or field in ("const", "beta"):  # NaN anywhere; -inf where it is a bound
        assert got[0] == 0


def test_nothing_to_lose_is_every_radius_and_nan_is_none():
    zero = torch.zeros(3, dtype=DT)
    low = QuadLower(const=zero.clone(), lin=zero.clone(), quad=torch.tensor([0, NAN, 0.0]))
    got = quad_radius(torch.tensor([1.0, 1.0, -1.0], dtype=DT), low)
    assert got.tolist() == [math.inf, 0.0, 0.0]


def test_a_nan_node_bound_adds_nothing_to_the_integrated_radius():
    """L(R) = 1 + R for one class with margin 1: Theorem 2.1 certifies (sqrt 5 - 1) / 2,
    the integral 1 - r - r^2/2 > 0 up to sqrt 3 - 1. A NaN at node 6 of 8 must leave the
    paper's radius, not claim the pieces around it."""
    m = torch.tensor([[math.inf, 1.0]], dtype=DT)

    def lip(idx, r):
        return (1.0 + r)[:, None].expand(len(idx), 2).clone()

    paper = theorem21(m, lip, rtol=1e-9)
    clean = integrated(m, lip, paper, nodes=8)
    assert clean[0] > paper.guarantee[0] * 1.05
    node6 = float(SPAN * paper.guarantee[0]) * 6 / 8

    def poisoned(idx, r):
        out = lip(idx, r)
        out[(r - node6).abs() < 1e-9 * node6] = NAN
        return out

    got = integrated(m, poisoned, paper, nodes=8)
    assert got[0] == paper.guarantee[0]


def test_a_nan_cheap_bound_never_skips_the_verification():
    """``mu`` below the largest eigenvalue, a NaN cheap bound: the verification must still
    raise ``mu`` to a proven bound (``mu < NaN`` is False)."""
    net = random_net(6, 3, 12, 3, 2.0)
    x = random_points(4, 6, 4)
    rng, m, _, _ = pieces(net, x, 2.0, False)
    bound = TrustRegionBound(rng, m, 4)
    u = net.U.detach()
    kappa = torch.rand(5, u.shape[0], dtype=DT, generator=torch.Generator().manual_seed(0))
    exact = torch.linalg.eigvalsh(torch.einsum("hd,mh,he->mde", u, kappa, u))[:, -1]
    mu = torch.zeros(5, dtype=DT)
    got = bound.verified(kappa, mu, cheap=torch.full((5,), NAN, dtype=DT))
    assert torch.all(got >= exact)


def test_a_nan_in_the_factorised_matrix_proves_nothing():
    net = random_net(6, 3, 12, 5, 2.0)
    x = random_points(4, 6, 6)
    rng, m, _, _ = pieces(net, x, 2.0, False)
    bound = TrustRegionBound(rng, m, 4)
    kappa = torch.rand(3, net.U.shape[0], dtype=DT, generator=torch.Generator().manual_seed(1))
    part = bound.concave_part(kappa)
    part.sgs[1, 0, 0] = NAN
    got = part.verify(torch.full((3,), 1e6, dtype=DT))
    assert math.isinf(got[1]) and torch.isfinite(got[[0, 2]]).all()


@pytest.mark.parametrize("block", ["rgr", "C"])
def test_a_nan_in_the_convex_units_proves_nothing(block):
    """The direct proof with the convex units (:class:`SignedPart`): a NaN in either of its
    blocks fails that row only."""
    net = random_net(6, 3, 12, 5, 2.0)
    x = random_points(4, 6, 6)
    rng, m, _, _ = pieces(net, x, 2.0, False)
    bound = TrustRegionBound(rng, m, 4)
    gen = torch.Generator().manual_seed(2)
    kappa = torch.rand(3, net.U.shape[0], dtype=DT, generator=gen)
    convex = torch.rand(3, net.U.shape[0], dtype=DT, generator=gen)
    kappa[:, ::2], convex[:, 1::2] = 0.0, 0.0
    mu = 2 * bound.curvature(kappa)  # above lambda_max of the concave part: provable
    part = bound.signed_part(kappa, convex, mu)
    assert part.rgr.shape[1] > 0
    getattr(part, block)[1, 0, 0] = NAN
    got = part.verify(mu)
    assert math.isinf(got[1]) and torch.isfinite(got[[0, 2]]).all()


@pytest.mark.parametrize("norm", ["l2", "linf"])
@pytest.mark.parametrize("where", ["sup", "inf"])
def test_a_nan_secant_piece_gives_zero_curvature_radii(monkeypatch, where, norm):
    """NaN secant bounds (each unit's curvature over its range: ``sup`` for the concave
    units of both forms, ``inf`` for the convex units of the trust region, L2's and
    L-inf's) give 0 in the form they enter and change nothing in the form they do not."""
    net = random_net(5, 4, 24, 7, 1.0)  # every point has concave and convex units
    x = random_points(6, 5, 8)
    kinds = (norm, "curvature")
    name = f"guarantee_{norm}_curvature"
    clean = {s: certify_softplus(net, x, kinds=kinds, trust_region_steps=s) for s in (0, 6)}
    assert all(torch.all(c[name] > 0) for c in clean.values())
    real = curvature_module.secant_curvature

    def poisoned(*args, **kwargs):
        up, down = real(*args, **kwargs)
        if where == "sup":
            up = torch.full_like(up, NAN)
        elif down is not None:
            down = torch.full_like(down, NAN)
        return up, down

    monkeypatch.setattr(curvature_module, "secant_curvature", poisoned)
    monkeypatch.setattr(trust_region_module, "secant_curvature", poisoned)
    monkeypatch.setattr(expansion_module, "secant_curvature", poisoned)  # the moved points'
    for steps in (0, 6):
        col = certify_softplus(net, x, kinds=kinds, trust_region_steps=steps)[name]
        if where == "sup":
            assert torch.all(col == 0), steps
        elif steps == 0 and norm == "l2":  # the largest-eigenvalue form reads no lower bound
            assert torch.equal(col, clean[0][name])
        elif steps == 0:  # L-inf's corner moves read it (in their constant): they add nothing
            assert torch.all(col > 0) and torch.all(col <= clean[0][name])
        elif norm == "l2":  # the dual gives 0, each row keeps the lambda_max form's radius
            torch.testing.assert_close(col, clean[0][name], rtol=2e-3, atol=0)
            assert torch.all(col <= clean[6][name])
        else:  # the same, L-inf's first form (whose moves differ from the curvature form's)
            assert torch.all(col > 0) and torch.all(col <= clean[6][name] * (1 + 1e-3))


@pytest.mark.parametrize("where", ["U", "W", "b", "c"])
def test_any_nan_weight_gives_zero_everywhere(where):
    net = random_net(6, 3, 10, 0, 1.0)
    with torch.no_grad():
        {
            "U": net.hidden_layer.weight,
            "W": net.output_layer.weight,
            "b": net.hidden_layer.bias,
            "c": net.output_layer.bias,
        }[where].view(-1)[1] = NAN
    res = certify_softplus(net, random_points(5, 6, 1), trust_region_steps=4, tangent_steps=1)
    cols = [k for k, v in res.items() if k.startswith("guarantee_") and v.is_floating_point()]
    assert len(cols) > 20
    for col in cols:
        assert torch.all(res[col] == 0), col


def test_a_nan_coordinate_gives_zero_at_its_point_only():
    net = random_net(6, 3, 10, 0, 1.0)
    x = random_points(5, 6, 1)
    x[2, 1] = NAN
    res = certify_softplus(net, x, trust_region_steps=4, tangent_steps=1)
    cols = [k for k, v in res.items() if k.startswith("guarantee_") and v.is_floating_point()]
    for col in cols:
        assert res[col][2] == 0, col
        assert torch.all(res[col][[0, 1, 3, 4]] > 0), col
