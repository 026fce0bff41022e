r"""The L2 trust-region certificate with each unit expanded about a moved point.

:mod:`.trust_region` expands every unit about the test point's pre-activation ``z_l``: with
``h_l = u_l^T v``, ``sigma(z + h) >= sigma(z) + sigma'(z) h + q h^2 / 2`` (per unit times
``delta_l``), ``q`` the secant bound of :mod:`.secant` over the unit's range. That lower
bound is exact at ``h = 0``, but the ball's minimum lies at ``||v|| = r``, where the units'
``h_l`` are far from 0 and the quadratic term charges each the worst curvature of its whole
range from 0 out. Taylor's theorem holds about any point ``y_l`` (an exact float64 number
here): with ``t = z + h - y``,

    delta sigma(z + h) >= delta sigma(y) + delta sigma'(y) t + q' t^2 / 2,

``q'`` the secant bound of ``delta Q_y`` over ``z + h`` in the unit's interval ``[lo, hi]``
(which must hold ``y``: :func:`expanded_terms` clamps it there)
(from above for ``delta < 0``, from below for ``delta > 0``; :func:`.secant.secant_curvature`
about ``y``). With ``e' = y - z`` (``t = h - e'``) and ``g(x + v) = g(x) + sum_l delta_l
(sigma(z_l + h_l) - sigma(z_l))``:

    g(x + v) >= m + sum_l c0_l + (sum_l c1_l u_l)^T v + 1/2 sum_l q'_l h_l^2,
    c1_l = delta_l sigma'(y_l) - q'_l e'_l,
    c0_l = -delta_l D_y(z_l - y_l) + q'_l e'_l^2 / 2,
    D_y(s) = sigma(y + s) - sigma(y) - sigma'(y) s,

the same form as the trust region's (margin, gradient, ``q``), so its dual, its proof of
positive semi-definiteness and its rounding analysis apply unchanged. Any ``y`` is sound.
:class:`.trust_region.TrustRegionBound` takes ``y_l = z_l + h*_l``, ``h*`` the units' values
at the minimiser of the previous bound (``v* = -w``, its dual point), so that each unit's
lower bound is exact where the ball's minimum was found: the alpha-CROWN idea of optimised
tangent points, for the curvature certificate.

*Damped moves.* Where the units' expansion points sit at a fixed point of that move (the
minimiser of the bound expanded about ``y`` is ``y`` itself), the bound equals the network at
a point of the ball, so it is the network's minimum there. Moving all the way to each new
minimiser overshoots: the minimiser of a bound with the worst curvature of each range jumps
between sides of the ball, and on a Cross-Lipschitz network a second full move raised the
mean by 0.1% or less. So only the first move is a full one; each later move (``expansion_steps
> 1``) goes :data:`EXPANSION_DAMPING` of the way from the last points to the new minimiser
(in the L1 and L-inf balls: to the new vertex or corner), and each row keeps its best bound.

*Optimised expansion points* (``expansion_ascent_steps``, after the moves). The bound is a
sum of one term per unit, ``phi_l(e_l; h_l) = c0_l + c1_l h_l + q'_l h_l^2 / 2``, so by the
envelope theorem the derivative of its minimum over the ball in the offsets ``e`` is
``d phi_l / d e_l`` at the minimiser's ``h*`` (:func:`ascent_direction`: central
differences, unit by unit). Moving every point to ``h*_l`` (the moves) maximises each
``phi_l`` at ``h*`` alone, but ignores how far each unit's bound is from the network
elsewhere; the derivative weighs the units: a unit whose secant curvature over its range
changes much with its point moves more. Each step moves the points along it, the unit
with the largest derivative by ``step`` times the mean ``|h*_l|``, and keeps the new bound
where its radius is larger (the step then grows by :data:`ASCENT_GROW`, else shrinks by
:data:`ASCENT_SHRINK`). Any points are sound, so each row keeps its best bound.

*Rounding.* ``y = fl(z^ + e)`` is exact as it stands; ``e^ = fl(y - z^)`` is within ``slack =
pad + 2u |e^|`` (plus ``2^-1000``) of the real ``e' = y - z`` (``z^`` within ``pad`` of the
real ``z``). ``q'`` is :func:`.secant.secant_curvature`'s about ``y`` with no pad, times
``|delta|`` rounded outward by ``4u`` (as in :mod:`.curvature`). ``c1``: ``sigma'(y)`` within
``4 FN_REL`` relative plus ``2^-1000``, ``|q'| slack`` for ``e'``, and ``4u`` of the two
products' magnitudes; the gradient ``sum c1_l u_l`` then as :meth:`.CurvatureBound.rows` bounds
its own (``gamma_{H+4}`` of ``sum |c1_l| ||u_l||``). ``c0``: ``D_y(s)`` at ``s^ = -e^`` by
:func:`.secant.remainder` (either sign of ``s^``), plus ``min(1, alpha (|s^| + slack) / 4)
slack`` for the real ``s`` (``|D_y'(s)| = |sigma'(y + s) - sigma'(y)|``), then ``D`` from above
where ``delta > 0`` and from below (and at least 0) where ``delta < 0``; ``e'^2`` from above
where ``q' < 0`` and from below where ``q' >= 0``; each product rounded outward by ``4u``, the
sum with the margin less ``gamma_{H+2}`` times the magnitudes. A NaN anywhere makes the margin
NaN, and :func:`.linear_min.quad_radius` gives such a row 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .rounding import FN_REL, UNDERFLOW, UNIT, gamma
from .secant import remainder, secant_curvature

#: After the first move of the expansion points (to the last bound's minimiser), each later
#: move goes this share of the way from the last expansion points to the new minimiser
#: (module docstring, *Damped moves*): on the record's 200-epoch CL 1e-2 network 4 moves of
#: 0.3 raised the mean L2 curvature certificate by 10.7% over one move (40 points), 4 full
#: moves by 0.5%; in L1 by 6.5% (30 points), 4 full moves by 0.7%.
EXPANSION_DAMPING = 0.3

#: The relative step (times ``1 + |h|``) of :func:`ascent_direction`'s central differences.
ASCENT_EPS = 1e-5
#: The ascent's first step (module docstring, *Optimised expansion points*), and the factors
#: by which an accepted step grows (up to :data:`ASCENT_MAX_STEP`) and a rejected one shrinks.
ASCENT_STEP = 0.5
ASCENT_GROW = 2.0
ASCENT_MAX_STEP = 4.0
ASCENT_SHRINK = 0.3


def damped_move(last: torch.Tensor | None, target: torch.Tensor) -> torch.Tensor:
    """The next expansion points (offsets from ``zh``, (nr, H)) of rows whose last ones are
    ``last`` (None: this is the first move) and whose new minimiser, vertex or corner is
    ``target``: all the way on the first move, :data:`EXPANSION_DAMPING` of the way after
    (module docstring, *Damped moves*). ``last`` is reused for the result."""
    return target if last is None else last.add_(target - last, alpha=EXPANSION_DAMPING)


class Expanded(NamedTuple):
    """The rows' terms about the moved points: the gradient of the lower bound (nr, d), its
    error bound in L2 (nr,), the concave units' ``kappa`` = ``-q'`` and the convex units'
    ``q'`` (each (nr, H), 0 elsewhere) and the lower bound on the margin plus ``sum c0``
    (nr,)."""

    grad: torch.Tensor
    err: torch.Tensor
    kappa: torch.Tensor
    convex: torch.Tensor
    margin: torch.Tensor


class UnitTerms(NamedTuple):
    """Each unit's terms about its expansion point (each (nr, H)), rounded as the module
    docstring says: ``c0`` (the constant), ``c1`` (the linear coefficient) and its error
    bound ``c1_err``, the concave units' ``kappa`` = ``-q'`` and the convex units' ``q'``."""

    c0: torch.Tensor
    c1: torch.Tensor
    c1_err: torch.Tensor
    kappa: torch.Tensor
    convex: torch.Tensor

    def at(self, h: torch.Tensor) -> torch.Tensor:
        """Each unit's lower bound ``c0 + c1 h + q' h^2 / 2`` (nr, H) on ``delta_l
        (sigma(z_l + h_l) - sigma(z_l))`` at its values ``h`` (nr, H) (rounding not
        covered: a value to compare, not a bound)."""
        return self.c0 + self.c1 * h + 0.5 * (self.convex - self.kappa) * h * h


def unit_terms(
    zh: torch.Tensor,
    pad: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    delta: torch.Tensor,
    offset: torch.Tensor,
    alpha: float,
) -> UnitTerms:
    """The per-unit terms of :func:`expanded_terms` (same arguments; each (nr, H))."""
    y = torch.minimum(torch.maximum(zh + offset, lo), hi)  # the secant bounds need y in range
    e_hat = y - zh
    slack = (pad + (2 * UNIT) * e_hat.abs()).add_(UNDERFLOW)
    up, down = secant_curvature(
        y,
        torch.zeros_like(y),
        lo,
        hi,
        alpha,
        up_units=delta < 0,
        down_units=delta > 0,
    )
    dabs = delta.abs()
    kappa = torch.where(delta < 0, dabs * up, 0.0).mul_(1 + 4 * UNIT)
    convex = torch.where(delta > 0, dabs * down, 0.0).mul_(1 - 4 * UNIT)
    q = convex - kappa
    # the linear coefficient
    slope = torch.sigmoid(alpha * y)
    c1 = delta * slope - q * e_hat
    c1_err = dabs * (slope * (4 * FN_REL) + UNDERFLOW) + q.abs() * slack
    c1_err += ((delta * slope).abs() + (q * e_hat).abs()).mul_(4 * UNIT)
    # the constant: -delta D_y(s) + q e'^2 / 2 at s = z - y = -e'
    s_hat = -e_hat
    d_hat, d_err = remainder(y, s_hat, alpha)
    lip = ((s_hat.abs() + slack) * (alpha / 4)).clamp_max_(1.0)
    d_err = d_err + lip * slack
    d_up = (d_hat + d_err).mul_(1 + 4 * UNIT)
    d_lo = (d_hat - d_err).clamp_min_(0.0).mul_(1 - 4 * UNIT)
    ea = e_hat.abs()
    e2_up = (ea + slack).square().mul_(1 + 4 * UNIT)
    e2_lo = (ea - slack).clamp_min_(0.0).square().mul_(1 - 4 * UNIT)
    c0 = torch.where(delta > 0, -(dabs * d_up).mul_(1 + 4 * UNIT), (dabs * d_lo).mul_(1 - 4 * UNIT))
    quad = torch.where(
        q < 0, (0.5 * q * e2_up).mul_(1 + 4 * UNIT), (0.5 * q * e2_lo).mul_(1 - 4 * UNIT)
    )
    return UnitTerms(c0 + quad, c1, c1_err, kappa, convex)


def expanded_terms(
    zh: torch.Tensor,
    pad: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    delta: torch.Tensor,
    offset: torch.Tensor,
    margin: torch.Tensor,
    U: torch.Tensor,
    unorm2: torch.Tensor,
    alpha: float,
    tau: float,
) -> Expanded:
    """The module docstring's terms for rows (nr) of units at the computed pre-activations
    ``zh`` (nr, H) within ``pad`` (nr, H), their intervals ``[lo, hi]`` (nr, H) over the
    ball, ``delta = w_c - w_j`` (nr, H), expanded about ``y = zh + offset`` (``offset``
    (nr, H), any finite numbers) clamped into ``[lo, hi]``; ``margin`` (nr,): lower bounds
    on ``g(x)``; ``U`` (H, d) the hidden layer, ``unorm2`` (H,) its rows' L2 norms rounded
    up, ``alpha`` the softplus sharpness, ``tau`` the underflow floor of a gradient's
    error."""
    h = U.shape[0]
    t = unit_terms(zh, pad, lo, hi, delta, offset, alpha)
    grad = t.c1 @ U
    g_h = gamma(h + 4)
    err = ((t.c1_err + t.c1.abs() * g_h) @ unorm2).mul_(1 + gamma(h + 2)).add_(tau)
    total = margin + t.c0.sum(1)
    loss = (margin.abs() + t.c0.abs().sum(1)).mul_(gamma(h + 2))
    return Expanded(grad, err, t.kappa, t.convex, total - loss)


def ascent_trial(
    offsets: torch.Tensor, h: torch.Tensor, direction: torch.Tensor, step: torch.Tensor
) -> torch.Tensor:
    """The expansion points' offsets (nr, H) moved along ``direction`` (nr, H), each row's
    unit with the largest derivative by ``step`` (nr,) times the mean ``|h|`` of its values
    ``h`` (nr, H) at the last minimiser (module docstring, *Optimised expansion points*)."""
    tiny = torch.finfo(step.dtype).tiny
    scale = step * h.abs().mean(1) / direction.abs().amax(1).clamp_min(tiny)
    return offsets + scale[:, None] * direction


def next_step(step: torch.Tensor, better: torch.Tensor) -> torch.Tensor:
    """The rows' next ascent steps (nr,): grown where the trial's radius was larger
    (``better``, (nr,) bool), shrunk elsewhere."""
    grown = torch.where(better, step * ASCENT_GROW, step * ASCENT_SHRINK)
    return grown.clamp_max_(ASCENT_MAX_STEP)


def ascent_direction(
    rows: tuple[torch.Tensor, ...], offset: torch.Tensor, h: torch.Tensor, alpha: float
) -> torch.Tensor:
    """The derivative (nr, H) of each unit's lower bound at its values ``h`` (nr, H) (the
    last bound's minimiser) in its expansion point's offset; ``rows``: the first five
    arguments of :func:`unit_terms` (``zh, pad, lo, hi, delta``, each (nr, H)). Central
    differences, each unit on its own (the bound is a sum of one term per unit): by the
    envelope theorem, the gradient of the bound's minimum over the ball in the offsets
    (module docstring, *Optimised expansion points*)."""
    eps = (1 + h.abs()).mul_(ASCENT_EPS)
    up = unit_terms(*rows, offset + eps, alpha).at(h)
    down = unit_terms(*rows, offset - eps, alpha).at(h)
    return ((up - down) / (2 * eps)).nan_to_num_(0.0, 0.0, 0.0)
