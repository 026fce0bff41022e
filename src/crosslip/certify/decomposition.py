"""What a local guarantee of the one-hidden-layer net is made of, point by point.

Theorem 2.1 with Proposition 2.3 certifies ``alpha = max_R min(min_j m_j / L_j(R), R)``.
At the optimum ``R*`` (where ``m_j* / L_j*(R*)`` meets ``R*``, j* the class that binds) the
guarantee is, to the search's tolerance,

    alpha = m_j* / L_j*(R*) = [m_j* / L_j*(0)] * [L_j*(0) / L_j*(R*)],

so it is the product of a *first-order distance* ``m / L(0)`` (the margin over the gradient
difference at the point, ``L_j(0) = ||grad f_c(x) - grad f_j(x)||_2``, which is what
Cross-Lipschitz regularization penalizes at the training points) and a *growth factor*
``L(0) / L(R*)`` <= 1: how much Proposition 2.3's bound on the gradient difference grows over
the ball. Geometric means over points turn this product into a sum of logarithms, so a
model's mean guarantee splits exactly into margin, constant at the point and growth.

:func:`decompose` returns, per point, these terms and what makes the bound grow:

* the hidden units' state at x, ``sigma'(z_r) = sigmoid(alpha z_r)``: saturated off
  (< 0.05), saturated on (> 0.95) or in transition;
* the units whose pre-activation can cross zero inside the certified ball,
  ``|z_r| < R* ||u_r||_2`` (their ``sigma'`` can sweep most of [0, 1] there);
* a lower estimate of the real ``max_{y in B_2(x, R*)} ||grad f_c(y) - grad f_j*(y)||_2``
  by projected gradient ascent: between it and ``L(R*)`` lies the looseness of
  Proposition 2.3, between ``L(0)`` and it the real growth of the gradient difference.

These are diagnostics (the ascent's value is an estimate from below, no certificate); the
guarantee itself is :func:`~crosslip.certify.engine.certify_softplus`'s.
"""

from __future__ import annotations

import copy

import torch

from ..models import SoftplusNet
from .engine import certify_softplus
from .softplus_bounds import PreactivationRange, Prop23Bound

#: ``sigma'`` below this is a unit saturated off, above ``1 - SATURATED`` one saturated on.
SATURATED = 0.05


@torch.no_grad()
def ascend_gradient_difference(
    net: SoftplusNet,
    x: torch.Tensor,
    d: torch.Tensor,
    radius: torch.Tensor,
    steps: int = 30,
) -> torch.Tensor:
    """A lower estimate (n,) of ``max_{||y - x||_2 <= radius} ||U^T (d * sigma'(U y + b))||_2``
    by projected gradient ascent from x: ``steps`` normalized steps of a length falling
    linearly from ``radius / 2``, each projected back onto the ball; the largest value seen
    (at x included). ``x`` (n, d), ``d`` (n, H), ``radius`` (n,), finite and >= 0.

    The gradient is in closed form: with ``g = U^T (d s)``, ``phi = ||g||^2``,
    ``dphi/dz_r = 2 (U g)_r d_r sigma''(z_r)``, ``sigma'' = alpha s (1 - s)``."""
    U, a = net.U, net.alpha
    y = x.clone()
    best = x.new_zeros(len(x))
    r = radius[:, None]
    for k in range(steps + 1):
        s = net.sigma_prime(net.preactivation(y))
        g = (d * s) @ U
        best = torch.maximum(best, torch.linalg.vector_norm(g, dim=1))
        if k == steps:
            break
        dz = 2 * (g @ U.T) * d * (a * s * (1 - s))
        grad = dz @ U
        norm = torch.linalg.vector_norm(grad, dim=1, keepdim=True)
        step = r * (0.5 * (1 - k / steps))
        y = y + step * grad / norm.clamp_min(torch.finfo(y.dtype).tiny)
        delta = y - x
        dnorm = torch.linalg.vector_norm(delta, dim=1, keepdim=True)
        y = x + delta * torch.clamp(r / dnorm.clamp_min(torch.finfo(y.dtype).tiny), max=1.0)
    return best


@torch.no_grad()
def decompose(
    net: SoftplusNet,
    x: torch.Tensor,
    rtol: float = 1e-3,
    ascent_steps: int = 30,
) -> dict[str, torch.Tensor]:
    """The terms of the local L2 guarantee (module docstring) at the points ``x`` (n, d), in
    float64 on ``x``'s device; every column (n,) on the CPU:

    ``pred``, ``guarantee`` (Theorem 2.1 with Proposition 2.3, as certified), ``radius``
    (R*), ``bound_class`` (j*: the class that binds at R*; the runner-up where none does),
    ``margin`` (``f_c - f_j*``), ``lip_point`` (``L_j*(0)``, exact), ``lip_radius``
    (Proposition 2.3's ``L_j*(R*)``), ``growth`` (``L(R*) / L(0)``), ``first_order``
    (``min_j m_j / L_j(0)`` over every class), ``lip_ascent`` (the ascent's lower estimate
    of the real maximum over the ball), ``off``, ``on`` (the shares of hidden units
    saturated off and on at x), ``crossing`` (the share that can cross zero in the ball).
    Points with an unbounded guarantee (no finite R*) get NaN for the radius terms."""
    net = copy.deepcopy(net).to(dtype=torch.float64, device=x.device).eval()
    x = x.to(torch.float64)
    cert = certify_softplus(net, x, rtol=rtol, kinds=("local",))
    U, W = net.U, net.W
    z = net.preactivation(x)
    s = net.sigma_prime(z)
    logits = net(x)
    pred = cert["pred"].to(x.device)
    n, k = logits.shape
    rows = torch.arange(n, device=x.device)
    others = logits.scatter(1, pred[:, None], -torch.inf)
    j = cert["bound_class"].to(x.device)
    j = torch.where(j >= 0, j, others.argmax(1))
    # margins m_j = f_c - f_j and L_j(0) = ||grad f_c - grad f_j|| at x, (n, K) each
    grads = net.class_gradients(x)
    lips = torch.linalg.vector_norm(grads - grads[rows, pred][:, None], dim=2)
    margins = logits[rows, pred][:, None] - logits
    margin, lip0 = margins[rows, j], lips[rows, j]
    # the first-order distance over every class j != c
    first = (margins / lips).scatter(1, pred[:, None], torch.inf).amin(1)
    radius = cert["radius_local"].to(x.device)
    finite = torch.isfinite(radius)
    r = torch.where(finite, radius, torch.zeros_like(radius))
    need = torch.zeros(n, k, dtype=torch.bool, device=x.device)
    need[rows, j] = True
    bound = Prop23Bound(PreactivationRange(net, x, pred, p=2))
    lip_r = bound(rows, r, need)[rows, j]
    ascent = ascend_gradient_difference(net, x, W[j] - W[pred], r, steps=ascent_steps)
    crossing = (z.abs() < r[:, None] * torch.linalg.vector_norm(U, dim=1)).double().mean(1)
    nan = torch.full_like(r, torch.nan)
    columns = {
        "pred": pred,
        "guarantee": cert["guarantee_local"].to(x.device),
        "radius": radius,
        "bound_class": j,
        "margin": margin,
        "lip_point": lip0,
        "lip_radius": torch.where(finite, lip_r, nan),
        "growth": torch.where(finite, lip_r / lip0, nan),
        "first_order": first,
        "lip_ascent": torch.where(finite, ascent, nan),
        "off": (s < SATURATED).double().mean(1),
        "on": (s > 1 - SATURATED).double().mean(1),
        "crossing": torch.where(finite, crossing, nan),
    }
    return {name: v.cpu() for name, v in columns.items()}


def unit_sharpness(net: SoftplusNet) -> torch.Tensor:
    """``alpha ||u_r||_2`` (H,): a unit's ``sigma'`` goes from 0.05 to 0.95 over an input
    distance of ``2 log(19) / (alpha ||u_r||)`` along ``u_r``; the softplus's alpha and the
    weights' scale enter the function only through this product (``sigma_alpha(u.x) =
    sigma_1(alpha u.x) / alpha``)."""
    return net.alpha * torch.linalg.vector_norm(net.U.detach().double(), dim=1)
