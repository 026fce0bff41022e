"""The certified-margin regularizer (crosslip.training.certified_margin), tried hard.

* Its bounds against an independent computation (autograd input gradients, dense
  eigenvalues), and as what they claim to be: lower bounds of the margin over the ball, which
  an attack inside the ball cannot undercut.
* Its gradient against finite differences; the power iteration against a dense
  eigendecomposition; at radius 0 it is the cross-entropy.
* The surrogate never claims more than the certificate that judges: a point whose bounds are
  all positive at r is certified to at least r by the curvature certificate.
* Networks trained with it: no attack inside any certified ball changes their decision, in
  every norm, with the trust region on.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from crosslip.certify.engine import certify_softplus
from crosslip.models.softplus import softplus
from crosslip.training import certified_margin as cm
from crosslip.training.core import TrainConfig
from crosslip.training.single import train

from .helpers import random_net, random_points, toy_dataset
from .test_certify_beyond import assert_no_attack_inside

DT = torch.float64


def exact_curvature(net) -> torch.Tensor:
    """``lambda_max(U^T diag(alpha/4 (w_j - w_c)_+) U)`` of every pair (K, K), dense."""
    u, w = net.U.detach(), net.W.detach()
    kappa = cm.concave_curvature(w, net.alpha)  # (K, K, H)
    mats = torch.einsum("hd,cjh,he->cjde", u, kappa, u)
    return torch.linalg.eigvalsh(mats)[..., -1]


def bounds_by_autograd(net, x, y, radius: float) -> torch.Tensor:
    """``m_j - r ||grad (f_y - f_j)(x)|| - kappa_yj r^2 / 2`` point by point and class by
    class, gradients by autograd: (n, K-1) in the order of ``other_classes``."""
    kappa = exact_curvature(net)
    k = net.W.shape[0]
    out = torch.empty(len(x), k - 1, dtype=DT)
    for i in range(len(x)):
        xi = x[i : i + 1].clone().requires_grad_(True)
        logits = net(xi)[0]
        for col, j in enumerate(cm.other_classes(y[i : i + 1], k)[0].tolist()):
            g = logits[y[i]] - logits[j]
            (grad,) = torch.autograd.grad(g, xi, retain_graph=True)
            bound = g - radius * grad.norm() - 0.5 * kappa[y[i], j] * radius**2
            out[i, col] = bound.detach()
    return out


def lower_bounds(net, x, y, radius, curvature=None) -> torch.Tensor:
    logits, z = net.logits_and_preactivation(x)
    curv = exact_curvature(net) if curvature is None else curvature
    return cm.margin_lower_bounds(z, logits, y, net.U, net.W, net.alpha, radius, curv)


@pytest.mark.parametrize("d,k,h,seed,scale", [(6, 3, 10, 0, 1.0), (9, 5, 20, 1, 3.0)])
def test_bounds_equal_an_independent_computation(d, k, h, seed, scale):
    net = random_net(d, k, h, seed, scale)
    x = random_points(7, d, seed + 1)
    y = torch.arange(7) % k
    with torch.no_grad():
        fast = lower_bounds(net, x, y, 0.3)
    torch.testing.assert_close(fast, bounds_by_autograd(net, x, y, 0.3), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("d,k,h,seed,scale", [(4, 3, 12, 2, 1.0), (8, 4, 30, 3, 4.0)])
def test_no_attack_inside_the_ball_undercuts_a_bound(d, k, h, seed, scale):
    """g(x + v) >= B_j(x, r) for every ||v|| <= r: projected gradient descent on each
    ``f_y - f_j`` inside the ball, from random starts, never goes below the bound."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(6, d, seed + 1)
    y = torch.arange(6) % k
    r = 0.4
    with torch.no_grad():
        bound = lower_bounds(net, x, y, r)
    others = cm.other_classes(y, k)
    gen = torch.Generator().manual_seed(seed)
    for col in range(k - 1):
        j = others[:, col]
        v = torch.randn(8, *x.shape, generator=gen, dtype=DT)
        v = r * v / v.norm(dim=-1, keepdim=True)
        for _ in range(100):
            v.requires_grad_(True)
            out = net((x + v).reshape(-1, d)).reshape(8, len(x), k)
            g = out.gather(-1, y.expand(8, -1)[..., None]) - out.gather(
                -1, j.expand(8, -1)[..., None]
            )
            (grad,) = torch.autograd.grad(g.sum(), v)
            with torch.no_grad():
                v = v - 0.05 * r * grad / grad.norm(dim=-1, keepdim=True).clamp_min(1e-300)
                v = v * (r / v.norm(dim=-1, keepdim=True)).clamp(max=1.0)
        with torch.no_grad():
            out = net((x + v).reshape(-1, d)).reshape(8, len(x), k)
            g = out.gather(-1, y.expand(8, -1)[..., None]) - out.gather(
                -1, j.expand(8, -1)[..., None]
            )
        lowest = g.squeeze(-1).min(0).values
        assert torch.all(lowest >= bound[:, col] - 1e-12)
        with torch.no_grad():
            at_x = net(x).gather(-1, y[:, None]) - net(x).gather(-1, j[:, None])
        assert torch.all(lowest < at_x.squeeze(-1))  # the attack did lower the margin


def test_the_penalty_gradient_matches_finite_differences():
    net = random_net(5, 3, 8, 4, 2.0)
    x = random_points(6, 5, 5)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    vectors = torch.nn.functional.normalize(torch.randn(3, 3, 5, dtype=DT), dim=-1)
    u0, w0 = net.U.detach().clone(), net.W.detach().clone()

    def penalty(u, w):
        z = x @ u.T
        logits = softplus(z, net.alpha) @ w.T
        curv = cm.rayleigh_quotients(u, w, net.alpha, vectors)
        bounds = cm.margin_lower_bounds(z, logits, y, u, w, net.alpha, 0.7, curv)
        return cm.robust_cross_entropy(bounds)

    assert torch.autograd.gradcheck(
        penalty, (u0.requires_grad_(), w0.requires_grad_()), eps=1e-6, atol=1e-7
    )


def test_power_iteration_finds_the_largest_eigenvalue():
    net = random_net(12, 4, 40, 6, 2.0)
    vecs = cm.CurvatureVectors(net.U.detach(), net.W.detach(), net.alpha, torch.Generator())
    for _ in range(400):
        quotients = vecs.rayleigh(net.U.detach(), net.W.detach())
    exact = exact_curvature(net)
    off = ~torch.eye(4, dtype=bool)
    torch.testing.assert_close(quotients[off], exact[off], rtol=1e-8, atol=1e-12)
    # never above the eigenvalue, whatever the vector
    anywhere = torch.nn.functional.normalize(torch.randn(4, 4, 12, dtype=DT), dim=-1)
    below = cm.rayleigh_quotients(net.U.detach(), net.W.detach(), net.alpha, anywhere)
    assert torch.all(below <= exact + 1e-12)


def test_at_radius_zero_the_penalty_is_the_cross_entropy():
    net = random_net(6, 4, 9, 7, 1.5)
    x = random_points(10, 6, 8)
    y = torch.arange(10) % 4
    logits, z = net.logits_and_preactivation(x)
    pen = cm.robust_cross_entropy(
        cm.margin_lower_bounds(z, logits, y, net.U, net.W, net.alpha, 0.0, exact_curvature(net))
    )
    torch.testing.assert_close(pen, F.cross_entropy(logits, y), rtol=1e-12, atol=0)


def test_the_radius_grows_linearly_over_the_warmup():
    updates = torch.tensor([0, 5, 10, 20])
    got = cm.scheduled_radius(updates, 1.5, 10, torch.float32)
    assert got.dtype == torch.float32 and got.tolist() == [0.0, 0.75, 1.5, 1.5]
    assert cm.scheduled_radius(updates, 1.5, 0, DT).tolist() == [1.5] * 4
    assert cm.warmup_updates(0.3, 1000) == 300


def test_a_grid_of_networks_gets_each_networks_own_bounds():
    nets = [random_net(5, 3, 7, seed, 2.0, bias=False) for seed in range(3)]
    x, y = random_points(4, 5, 9), torch.tensor([0, 2, 1, 2])
    radius = torch.tensor([0.1, 0.5, 0.9], dtype=DT)
    u = torch.stack([n.U.detach() for n in nets])
    w = torch.stack([n.W.detach() for n in nets])
    curv = torch.stack([exact_curvature(n) for n in nets])
    z = x @ u.mT
    logits = softplus(z, nets[0].alpha) @ w.mT
    stacked = cm.margin_lower_bounds(z, logits, y, u, w, nets[0].alpha, radius, curv)
    for g, net in enumerate(nets):
        with torch.no_grad():
            alone = lower_bounds(net, x, y, float(radius[g]))
        torch.testing.assert_close(stacked[g], alone, rtol=1e-12, atol=1e-12)


def clustered(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points in ``[0, 1]^d`` around ``k`` random centres, with their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.2, 0.8, size=(k, d))
    y = rng.integers(0, k, size=n)
    x = np.clip(centres[y] + rng.normal(0, 0.12, size=(n, d)), 0, 1)
    return x.astype(np.float64), y.astype(np.int64)


def trained(seed: int, radius: float, d: int = 10, k: int = 3, h: int = 24):
    """A small network trained with the certified margin on clustered points."""
    x, y = clustered(300, d, k, seed)
    cfg = TrainConfig(
        regularizer="certified_margin",
        lam=1.0,
        lr=0.5,
        epochs=15,
        hidden=h,
        batch_size=16,
        seed=seed,
        init="pytorch",
        certified_radius=radius,
        certified_warmup=0.3,
    )
    prev = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    try:
        return train(cfg, toy_dataset(x, y, k, 50, checked=False)).model, x
    finally:
        torch.set_default_dtype(prev)


@pytest.mark.parametrize("seed,radius", [(0, 0.3), (1, 0.6)])
def test_the_surrogate_never_claims_more_than_the_certificate(seed, radius):
    """Where every bound is positive at r (exact curvature), the curvature certificate with
    the trust region certifies at least r (within the search's tolerance)."""
    net, x = trained(seed, radius)
    xt = torch.as_tensor(x[:80])
    with torch.no_grad():
        pred = net(xt).argmax(1)
        lowest = lower_bounds(net, xt, pred, radius).min(1).values
    res = certify_softplus(net, xt, rtol=1e-4, kinds=("l2", "curvature"), trust_region_steps=8)
    claimed = lowest > 0
    assert claimed.sum() >= 10  # the training did make the surrogate certify points
    assert torch.all(res["guarantee_l2_curvature"][claimed] >= radius * (1 - 1e-3))


@pytest.mark.parametrize("seed,radius", [(2, 0.4), (3, 1.0)])
def test_no_attack_inside_any_certified_ball_of_a_trained_network(seed, radius):
    """Networks trained for the certificate are where an unsound certificate would pay
    off: every certificate, every norm, box or not, trust region on."""
    net, x = trained(seed, radius)
    xt = torch.as_tensor(x[:12])
    res = certify_softplus(net, xt, rtol=1e-4, tangent_steps=2, trust_region_steps=8)
    assert_no_attack_inside(net, xt, res, seed)
    assert res["guarantee_l2_best"].median() > 0.3 * radius  # certificates of some size


def test_certified_margin_needs_the_one_hidden_layer_network():
    from crosslip.errors import ConfigError

    with pytest.raises(ConfigError, match=r"certified_margin.*mlp"):
        TrainConfig(regularizer="certified_margin", lam=1.0, arch="resnet")
    assert math.isclose(TrainConfig().certified_radius, 1.58)
