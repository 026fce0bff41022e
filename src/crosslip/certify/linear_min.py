r"""Lower bounds on the minimum of a linear function over a ball, or a ball inside the box.

The certificates that bound ``f_c - f_j`` from below by a linear (or quadratic) function of
the perturbation ``v = y - x`` (:mod:`.relaxation`, :mod:`.curvature`) need, for the
real vector ``a`` of which only a computed ``a_hat`` (m, d) is known,

    phi(r) = min { a^T v : ||v||_p <= r, (box) 0 <= x + v <= 1 }        for 0 <= r <= R.

Every function here returns a :class:`QuadLower`, coefficients with
``phi(r) >= -(const + lin r + quad r^2)`` for every ``0 <= r <= R``, rounding included, so a
certificate ``beta + phi(r) > 0`` holds for every ``r`` below :func:`quad_radius`'s root.

* **Ball** (any p, dual norm q): ``phi(r) = -r ||a||_q`` exactly; ``||a||_q <=
  ||a_hat||_q + e_q`` with ``e_q`` a bound on ``||a - a_hat||_q`` given by the caller.
* **Ball ∩ box**, the dual of the exact box-constrained projection of
  :mod:`crosslip.attacks.projections` (Section 4): for p = 2 and any ``mu >= 0`` weak
  duality gives ``phi(r) >= A(mu) - mu r^2 / 2`` with the separable
  ``A(mu) = sum_i min_{l_i <= v_i <= h_i} (a_i v_i + mu v_i^2 / 2)``; for p = 1,
  ``phi(r) >= B(mu) - mu r`` with ``B(mu) = -sum_i (|a_i| - mu)_+ cap_i``; for p = inf the
  minimum is separable, ``phi(r) = -sum_i |a_i| min(r, cap_i) >= -sum_{cap_i < R} |a_i|
  cap_i - r sum_{cap_i >= R} |a_i|`` for ``r <= R``. Here ``cap_i`` is how far ``v_i`` may
  move against the sign of ``a_i`` inside the box: ``x_i`` where ``a_i > 0``, ``1 - x_i``
  where ``a_i < 0``. Any ``mu`` is sound; the one chosen is optimal at ``r = R`` (the
  breakpoints sorted once per row, as the exact projections do), so the bound is tight where
  the search needs it. The box bound never replaces the ball bound: both are returned and
  the certificate keeps the larger radius.

*Rounding* (constants of :mod:`.rounding`). ``cap_i`` is rounded up (``1 - x_i`` by
``1 + 4u``), sums of non-negative terms are inflated by ``1 + gamma_{d+3}``, each term that
may cancel is bounded by a tangent of the convex one-dimensional problem at the computed
point (valid at any point, so a computed optimum that is slightly off costs tightness only)
minus ``4 gamma_{d+8}`` times the magnitudes involved, and ``||a - a_hat||`` enters as
``e_q r``, which for the quadratic form is taken at ``r = R`` (valid for every smaller r).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .rounding import UNIT, gamma


@dataclass
class QuadLower:
    """``phi(r) >= -(const + lin r + quad r^2)`` for ``0 <= r <= R`` (all (m,), ``lin`` and
    ``quad`` >= 0, rounded up; ``const`` rounded up, of any sign)."""

    const: torch.Tensor
    lin: torch.Tensor
    quad: torch.Tensor


def quad_radius(beta: torch.Tensor, lower: QuadLower, quad_extra: torch.Tensor | float = 0.0):
    """The largest ``rho`` (m,), rounded down, with ``beta - const - lin r - (quad +
    quad_extra) r^2 > 0`` for every ``0 <= r < rho``: ``rho = 2 b / (lin + sqrt(lin^2 + 4 c
    b))`` with ``b = beta - const``, ``c = quad + quad_extra`` (0 where ``b <= 0``, ``inf``
    where ``lin = c = 0 < b``). ``beta`` (m,) is a lower bound on the margin term.

    Rounding: ``fl(beta - const) (1 - 2u)`` is below the real ``b``; the discriminant is
    rounded up by ``1 + 8u``, the square root and the sum by ``1 + 2u`` each, and the
    quotient is multiplied by ``1 - 2u`` (which, with its own rounding, stays below the
    real quotient). A NaN in any input gives 0."""
    b = (beta - lower.const).mul_(1 - 2 * UNIT)
    c = lower.quad + quad_extra
    lin = lower.lin
    disc = torch.addcmul(lin * lin, c, b.clamp_min(0), value=4.0).mul_(1 + 8 * UNIT)
    den = (lin + disc.sqrt().mul_(1 + 2 * UNIT)).mul_(1 + 2 * UNIT)
    rho = (2 * b / den).mul_(1 - 2 * UNIT)
    # den = 0 exactly: no term can decrease the bound (lin = c = 0), every radius holds; a
    # NaN anywhere (den, b, rho) gives 0, never a radius
    rho = torch.where(den > 0, rho, torch.where(den == 0, torch.inf, 0.0))
    return torch.where(b > 0, rho.nan_to_num(nan=0.0, posinf=torch.inf), torch.zeros_like(rho))


def dual_norm_lower(a_hat: torch.Tensor, err: torch.Tensor, q: float) -> QuadLower:
    """The ball: ``phi(r) >= -r (||a_hat||_q + e_q)``. ``err`` (m,): ``e_q >= ||a -
    a_hat||_q``. The computed q-norm is within ``gamma_{d+2}`` relative (a sum of d
    non-negative terms, a square root or a maximum)."""
    d = a_hat.shape[-1]
    norm = torch.linalg.vector_norm(a_hat, ord=q, dim=-1)
    lin = (norm * (1 + 2 * gamma(d + 2)) + err).mul_(1 + 2 * UNIT)
    zero = torch.zeros_like(lin)
    return QuadLower(zero, lin, zero)


def capacities(a_hat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``cap_i`` (m, d), rounded up: ``x_i`` where ``a_i > 0`` (``v_i >= -x_i``), ``1 - x_i``
    where ``a_i <= 0`` (``v_i <= 1 - x_i``): the room to decrease ``a^T v`` in the box."""
    return torch.where(a_hat > 0, x, (1 - x) * (1 + 4 * UNIT))


def box_lower(
    a_hat: torch.Tensor, err: torch.Tensor, x: torch.Tensor, r: torch.Tensor, p: float
) -> QuadLower:
    """Ball ∩ box for the p-norm ball (module docstring); ``a_hat, x`` (m, d), ``x`` in the
    box; ``err`` (m,) bounds ``||a - a_hat||_q``; ``r`` (m,) the radius R up to which the
    bound must hold."""
    if p == 2:
        return _box_l2(a_hat, err, x, r)
    if p == 1:
        return _box_l1(a_hat, err, x, r)
    if math.isinf(p):
        return _box_linf(a_hat, err, x, r)
    raise ValueError(f"p = {p}: only the 1-, 2- and inf-norms are supported")


def _box_linf(a_hat, err, x, r) -> QuadLower:
    d = a_hat.shape[-1]
    mag = a_hat.abs()
    cap = capacities(a_hat, x)
    small = cap < r[:, None]
    up = 1 + gamma(d + 3)
    const = (mag * cap).masked_fill_(~small, 0.0).sum(-1).mul_(up)
    lin = (mag.masked_fill(small, 0.0).sum(-1).mul_(up) + err).mul_(1 + 2 * UNIT)
    return QuadLower(const, lin, torch.zeros_like(lin))


def _box_l1(a_hat, err, x, r) -> QuadLower:
    d = a_hat.shape[-1]
    mag = a_hat.abs()
    cap = capacities(a_hat, x)
    # mu optimal at r = R: the |a_i| at which the budget R runs out, greedy by |a_i|
    order = mag.argsort(dim=-1, descending=True)
    filled = cap.gather(-1, order).cumsum(-1)
    k = (filled < r[:, None]).sum(-1, keepdim=True)  # coordinates filled before R runs out
    mu = mag.gather(-1, order).gather(-1, k.clamp_max(d - 1)).squeeze(-1)
    mu = torch.where(k.squeeze(-1) >= d, torch.zeros_like(mu), mu)  # the box runs out first
    # B(mu) = -sum (|a_i| - mu)_+ cap_i: non-negative terms, each difference within u
    const = ((mag - mu[:, None]).clamp_min_(0) * cap).sum(-1).mul_(1 + gamma(d + 3))
    lin = (mu + err).mul_(1 + 2 * UNIT)
    return QuadLower(const, lin, torch.zeros_like(lin))


def _box_l2(a_hat, err, x, r) -> QuadLower:
    d = a_hat.shape[-1]
    mag = a_hat.abs()
    cap = capacities(a_hat, x)
    mu = _l2_multiplier(mag, cap, r)
    # per coordinate, the step t in [0, cap] against sign(a_i): q(t) = -|a| t + mu t^2 / 2,
    # convex; its tangent at the computed optimum t_hat bounds it below on all of [0, cap]
    t = torch.minimum(mag / mu[:, None], cap).nan_to_num_(nan=0.0)
    t = torch.where(mu[:, None] > 0, t, cap)
    half_mu = 0.5 * mu[:, None]
    value = -mag * t + half_mu * t * t
    slope = -mag + mu[:, None] * t
    low = value + torch.minimum(-slope * t, slope * (cap - t)).clamp_max_(0.0)
    size = mag * t + mu[:, None] * t * t + (mag + mu[:, None] * t) * cap
    spare = 4 * gamma(d + 8) * size.sum(-1)
    # phi(r) >= A(mu) - mu r^2 / 2 - e r >= (A(mu) - e R) - mu r^2 / 2 for r <= R
    a_low = low.sum(-1) - spare
    const = (-a_low + err * r * (1 + 2 * UNIT)).mul_(1 + 2 * UNIT)
    quad = half_mu.squeeze(-1) * (1 + 2 * UNIT)
    return QuadLower(const, torch.zeros_like(const), quad)


def _l2_multiplier(mag: torch.Tensor, cap: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The multiplier ``mu`` (m,) of the ball constraint at the optimum of ``min a^T v`` over
    ``||v||_2 <= R`` in the box: coordinate i saturates (``t_i = cap_i``) when ``mu <=
    |a_i| / cap_i``; with the k largest of these saturated, ``||v||^2 = C_k + S_k / mu^2``
    (``C_k`` their ``cap^2``, ``S_k`` the other ``a^2``), so ``mu_k = sqrt(S_k / (R^2 -
    C_k))``, and the optimum is the k whose ``mu_k`` lies between the k-th and (k+1)-th
    breakpoint. 0 where the box lies inside the ball (then the box alone binds). Any value
    is sound (module docstring); this one makes the bound tight at R."""
    m = mag.shape[0]
    brk = (mag / cap).nan_to_num_(nan=0.0, posinf=torch.inf)  # 0/0: a coordinate never moves
    brk, order = brk.sort(dim=-1, descending=True)
    cap2 = cap.gather(-1, order).square()
    a2 = mag.gather(-1, order).square()
    zero = mag.new_zeros(m, 1)
    c_k = torch.cat([zero, cap2.cumsum(-1)], dim=-1)  # (m, d + 1): k saturated
    s_k = torch.cat([a2.flip(-1).cumsum(-1).flip(-1), zero], dim=-1)
    room = r[:, None].square() - c_k
    mu_k = (s_k / room).sqrt()
    upper = torch.cat([mag.new_full((m, 1), torch.inf), brk], dim=-1)  # breakpoint k
    lower = torch.cat([brk, zero], dim=-1)  # breakpoint k + 1
    ok = (room > 0) & (mu_k >= lower) & (mu_k <= upper)
    first = ok.to(torch.int8).argmax(-1, keepdim=True)
    mu = mu_k.gather(-1, first).squeeze(-1)
    return torch.where(ok.any(-1), mu, torch.zeros_like(mu)).nan_to_num_(nan=0.0)
