"""Soundness and exactness of the guarantees (Theorem 2.1, Proposition 2.3, global bound)."""

from __future__ import annotations

import math

import pytest
import torch

from crosslip.certify import (
    Prop23Bound,
    certify_softplus,
    global_bound,
    linear_lipschitz,
    margins,
    theorem21,
)
from crosslip.models import class_gradients

from .helpers import random_net, random_points

CONFIGS = [  # (d, K, H, seed, weight scale)
    (2, 2, 3, 0, 1.0),
    (5, 3, 8, 1, 3.0),
    (10, 4, 16, 2, 1.0),
    (20, 10, 32, 3, 5.0),
    (8, 6, 64, 4, 0.5),
]


def grad_diff_norms(net, y, pred):
    """||grad f_c(y) - grad f_j(y)||_2 for all j, shape (m, K)."""
    g = class_gradients(net, y)
    return (g[torch.arange(len(y)), pred][:, None, :] - g).norm(dim=-1)


def sample_ball(x, r, count, gen):
    """``count`` points in B_2(x, r) per row of x: uniform directions, radii in [0, r],
    a third of them exactly on the sphere."""
    n, d = x.shape
    u = torch.randn(n, count, d, generator=gen, dtype=x.dtype)
    u = u / u.norm(dim=-1, keepdim=True)
    rad = torch.rand(n, count, 1, generator=gen, dtype=x.dtype) ** (1 / d)
    rad[:, : count // 3] = 1.0
    return x[:, None, :] + rad * r[:, None, None] * u


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_prop23_bounds_sampled_gradient_differences(d, k, h, seed, scale):
    net = random_net(d, k, h, seed, scale)
    x = random_points(16, d, seed)
    pred = net(x).argmax(1)
    bound = Prop23Bound(net, x, pred)
    gen = torch.Generator().manual_seed(seed)
    for r_val in (0.0, 0.01, 0.1, 0.5, 2.0, 10.0):
        r = torch.full((len(x),), r_val, dtype=torch.float64)
        lip = bound(torch.arange(len(x)), r)
        ys = sample_ball(x, r, 200, gen)
        for i in range(len(x)):
            actual = grad_diff_norms(net, ys[i], pred[i].repeat(len(ys[i]))).max(0).values
            assert torch.all(actual <= lip[i] * (1 + 1e-9) + 1e-12), (r_val, i)


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS[:3])
def test_prop23_bound_survives_gradient_ascent_in_ball(d, k, h, seed, scale):
    """Maximize ||grad f_c(y) - grad f_j(y)|| over the ball by projected gradient ascent."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(6, d, seed + 100)
    pred = net(x).argmax(1)
    r = torch.full((len(x),), 0.3, dtype=torch.float64)
    lip = Prop23Bound(net, x, pred)(torch.arange(len(x)), r)
    for j in range(k):
        y = (x + 0.01 * torch.randn_like(x)).requires_grad_(True)
        for _ in range(100):
            g = class_gradients(net, y)
            obj = (g[torch.arange(len(x)), pred] - g[:, j]).norm(dim=-1).sum()
            (step,) = torch.autograd.grad(obj, y)
            with torch.no_grad():
                y += 0.05 * step / step.norm(dim=1, keepdim=True).clamp_min(1e-12)
                delta = y - x
                y.copy_(
                    x + delta * torch.clamp(r[:, None] / delta.norm(dim=1, keepdim=True), max=1)
                )
        final = grad_diff_norms(net, y.detach(), pred)[:, j]
        assert torch.all(final <= lip[:, j] * (1 + 1e-9) + 1e-12)


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_global_bound_holds_everywhere(d, k, h, seed, scale):
    net = random_net(d, k, h, seed, scale)
    x = random_points(8, d, seed)
    pred = net(x).argmax(1)
    glob = global_bound(net, pred)
    far = (
        torch.randn(8, 500, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        * 5
    )
    for i in range(len(x)):
        actual = grad_diff_norms(net, far[i], pred[i].repeat(500)).max(0).values
        assert torch.all(actual <= glob[i] * (1 + 1e-9))


def test_linear_model_guarantee_is_exact_distance():
    gen = torch.Generator().manual_seed(7)
    d, k, n = 12, 5, 200
    W = torch.randn(k, d, generator=gen, dtype=torch.float64)
    b = torch.randn(k, generator=gen, dtype=torch.float64)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    logits = x @ W.T + b
    pred = logits.argmax(1)
    cert = theorem21(margins(logits, pred), linear_lipschitz(W, pred), rtol=1e-6)
    # exact distance to the decision boundary of a linear classifier
    diff = W[pred][:, None, :] - W[None]
    dist = (logits.gather(1, pred[:, None]) - logits) / diff.norm(dim=-1)
    dist = dist.scatter(1, pred[:, None], math.inf).min(1)
    assert torch.allclose(cert.guarantee, dist.values, rtol=1e-12)
    assert torch.equal(cert.bound_class, dist.indices)
    # the point at that distance towards class j is on the boundary: slightly beyond flips
    j = dist.indices
    direction = -(diff[torch.arange(n), j]) / diff[torch.arange(n), j].norm(dim=1, keepdim=True)
    beyond = x + (1 + 1e-6) * cert.guarantee[:, None] * direction
    inside = x + (1 - 1e-6) * cert.guarantee[:, None] * direction
    assert torch.all((beyond @ W.T + b).argmax(1) != pred)
    assert torch.all((inside @ W.T + b).argmax(1) == pred)


def test_search_reports_only_evaluated_alpha_and_is_near_optimal():
    net = random_net(10, 4, 16, 11, 2.0)
    x = random_points(40, 10, 11)
    logits = net(x)
    pred = logits.argmax(1)
    m = margins(logits, pred)
    bound = Prop23Bound(net, x, pred)
    rtol = 1e-3
    cert = theorem21(m, bound, rtol=rtol)
    idx = torch.arange(len(x))
    # reported value is alpha(R) at the reported R
    g = (m / bound(idx, cert.radius)).min(1).values
    assert torch.allclose(cert.guarantee, torch.minimum(g, cert.radius), rtol=1e-12)
    # and within rtol of the best alpha on a fine grid of R
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)[1:]
    best = torch.zeros(len(x), dtype=torch.float64)
    top = cert.radius.clamp_min(1e-12) * 4
    for t in grid:
        r = top * t
        alpha = torch.minimum((m / bound(idx, r)).min(1).values, r)
        best = torch.maximum(best, alpha)
    assert torch.all(cert.guarantee >= best * (1 - 2 * rtol))
    assert torch.all(cert.guarantee <= best * (1 + 2 * rtol) + 1e-15)


def test_zero_margin_and_constant_model():
    m = torch.tensor([[math.inf, 0.0, 1.0], [math.inf, 2.0, 3.0]], dtype=torch.float64)
    lip = torch.ones(2, 3, dtype=torch.float64)
    cert = theorem21(m, lambda idx, r: lip[idx])
    assert cert.guarantee[0] == 0
    assert cert.guarantee[1] == pytest.approx(2.0)
    zero = theorem21(m[1:], lambda idx, r: torch.zeros(len(idx), 3, dtype=torch.float64))
    assert math.isinf(zero.guarantee[0])  # no gradient difference anywhere: never changes
    capped = theorem21(
        m[1:], lambda idx, r: torch.zeros(len(idx), 3, dtype=torch.float64), r_max=5.0
    )
    assert capped.guarantee[0] == pytest.approx(5.0)


@pytest.mark.parametrize("d,k,h,seed,scale", CONFIGS)
def test_no_attack_inside_certified_ball_changes_the_decision(d, k, h, seed, scale):
    """Projected gradient descent on the margin, many restarts, inside B_2(x, guarantee)."""
    net = random_net(d, k, h, seed, scale)
    x = random_points(30, d, seed + 1)
    res = certify_softplus(net, x.float(), rtol=1e-4)
    pred, radius = res["pred"], res["guarantee_local"].clamp(max=1e6)
    assert torch.all(res["guarantee_local"] >= 0)
    gen = torch.Generator().manual_seed(seed)
    restarts = 20
    xr = x.repeat_interleave(restarts, 0)
    pr = pred.repeat_interleave(restarts)
    rr = radius.repeat_interleave(restarts)[:, None]
    init = torch.randn(xr.shape, generator=gen, dtype=torch.float64)
    delta = (
        init
        / init.norm(dim=1, keepdim=True)
        * rr
        * torch.rand(len(xr), 1, generator=gen, dtype=torch.float64)
    )
    for _ in range(100):
        delta.requires_grad_(True)
        out = net(xr + delta)
        other = out.scatter(1, pr[:, None], -math.inf).max(1).values
        marg = out.gather(1, pr[:, None]).squeeze(1) - other
        (grad,) = torch.autograd.grad(marg.sum(), delta)
        with torch.no_grad():
            delta = delta - 0.1 * rr * grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-12)
            delta = delta * torch.clamp(
                rr / delta.norm(dim=1, keepdim=True).clamp_min(1e-30), max=1
            )
    with torch.no_grad():
        out = net(xr + delta)
    assert torch.all(out.argmax(1) == pr)
