"""The L-inf curvature constant through a diagonal scaling, proved once per pair of classes
(:mod:`crosslip.certify.linf_curvature`): at least ``v^T K v`` at every vertex of the cube
for every row its pair covers, at the real scaled eigenvalue, never above the cheap
constant where it is taken, and sound against attacks inside its balls."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from crosslip.certify import linf_curvature
from crosslip.certify.curvature import CurvatureBound
from crosslip.certify.engine import certify_softplus
from crosslip.certify.linf_curvature import LinfCurvatureBound, pair_constants
from crosslip.certify.secant import max_second_derivative
from crosslip.certify.softplus_bounds import NetTerms

from .helpers import random_net, random_points
from .test_certify import margin_attack
from .test_certify_beyond import CONFIGS, pieces

DT = torch.float64


def pair_kappa(net, c: int, j: int) -> torch.Tensor:
    """The largest curvature of each unit for the pair (c, j): ``|w_c - w_j|`` times the
    largest ``sigma''`` on the units where ``w_c < w_j`` (0 elsewhere)."""
    w = net.W.detach().to(DT)
    delta = w[c] - w[j]
    cap = max_second_derivative(torch.zeros(1, dtype=DT), torch.zeros(1, dtype=DT), net.alpha)
    return torch.where(delta < 0, delta.abs() * cap, 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_pair_constant_bounds_every_vertex_of_the_cube(seed):
    """For a 6-input net, brute force over the 64 vertices: each pair's constant is at
    least ``max_v v^T K v`` of its largest curvature (hence of every row it covers) and
    at most the scaled eigenvalue's value, ``lambda_max(D K D) sum y``, to 2e-4 (its search
    grows by 1e-4)."""
    net = random_net(6, 4, 12, seed, 2.0)
    terms = NetTerms(net)
    lam = pair_constants(terms)
    u = net.U.detach().to(DT)
    cube = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=6)), dtype=DT)
    col2 = u.square().sum(0)
    y = col2 + linf_curvature.FLOOR * col2.mean()
    for c, j in itertools.permutations(range(4), 2):
        K = (u.T * pair_kappa(net, c, j)) @ u
        vertex = torch.einsum("vd,de,ve->v", cube, K, cube).max()
        scaled = torch.linalg.eigvalsh(K / (y.sqrt()[:, None] * y.sqrt()[None, :]))[-1] * y.sum()
        assert lam[c, j] >= vertex, (c, j)
        assert lam[c, j] <= scaled * (1 + 2e-4), (c, j)
    assert torch.all(torch.isinf(lam.diagonal()))
    assert pair_constants(terms) is lam  # once per network


def test_every_row_is_covered_by_its_pair_and_takes_the_smaller_constant():
    """The rows of a search step (any point, any R) have ``kappa`` at most their pair's,
    entrywise, and their radii are at least the cheap constant's."""
    net = random_net(8, 5, 24, 3, 3.0)
    x = random_points(10, 8, 4)
    rng, m, _, _ = pieces(net, x, math.inf, False)
    bound = LinfCurvatureBound(rng, m)
    cheap = CurvatureBound(rng, m)
    idx = torch.arange(len(x))
    need = torch.ones_like(m, dtype=torch.bool)
    for r in (0.01, 0.1, 1.0, 10.0):
        rr = torch.full((len(x),), r, dtype=DT)
        rows = bound.row_bounds(idx, rr, need)
        pairs = zip(rng.pred[rows.point], rows.cls, strict=True)
        caps = torch.stack([pair_kappa(net, int(a), int(b)) for a, b in pairs])
        assert torch.all(rows.kappa <= caps * (1 + 1e-12))
        got, base = bound(idx, rr, need), cheap(idx, rr, need)
        assert torch.all(got >= base)
    assert torch.any(bound(idx, torch.full((10,), 0.3, dtype=DT), need) > base)


def test_only_linf_ranges_are_accepted():
    net = random_net(4, 3, 8, 0, 1.0)
    x = random_points(2, 4, 1)
    rng, m, _, _ = pieces(net, x, 2.0, False)
    with pytest.raises(ValueError, match="L-inf"):
        LinfCurvatureBound(rng, m)


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_no_attack_inside_an_linf_curvature_ball_changes_the_decision(d, k, h, seed, scale):
    net = random_net(d, k, h, seed, scale)
    x = random_points(12, d, seed + 1)
    res = certify_softplus(net, x, kinds=("linf", "box", "curvature"), rtol=1e-4)
    for col, box in (("guarantee_linf_curvature", False), ("guarantee_linf_curvature_box", True)):
        radius = res[col].clamp(max=1e6)
        assert torch.all(radius >= 0) and not torch.any(torch.isnan(radius)), col
        adv, pred = margin_attack(net, x, res["pred"], radius * (1 - 1e-7), math.inf, box, seed)
        assert torch.all(adv == pred), col
