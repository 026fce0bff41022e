r"""The secant curvature of a softplus unit over its range: what the curvature certificates
charge a unit in place of the largest ``sigma''`` on its interval.

The curvature certificates (:mod:`.curvature`, :mod:`.trust_region`) expand each unit about
the real pre-activation ``z = z_l(x)``: with ``h = u_l^T v``,

    sigma(z + h) = sigma(z) + sigma'(z) h + D(h),    D(h) = h^2 Q(h) / 2,
    Q(h) = 2 int_0^1 (1 - t) sigma''(z + t h) dt,

exactly (Taylor's theorem with the integral remainder). They need ``Q`` bounded over the
range of h, ``z + h`` in the unit's interval ``[lo, hi]``. The largest ``sigma''`` on the
interval bounds ``Q`` from above (and the smallest from below), but ``Q(h)`` is a weighted
mean of ``sigma''`` over the segment from z to ``z + h`` only, and for a wide range it
falls like ``1 / |h|`` where ``sigma''`` is small: on the 200-epoch Cross-Lipschitz network
of the record the ranges are many times ``1 / alpha`` wide, and the largest ``sigma''``
over the interval is mostly ``alpha / 4`` while ``sup Q`` is far below.

*Bound on sup Q.* The side ``h > 0`` is split at ``e_0 < e_1 < ... < e_N`` (a near piece
``(0, e_0]`` and geometric pieces up to the range's end ``E``); the side ``h < 0`` is the
same problem for ``-z`` (``sigma(-y) = sigma(y) - y`` gives ``D_z(-e) = D_{-z}(e)``). On the
near piece ``Q`` is at most the largest ``sigma''`` on ``[z - e_0, z + e_0]``. On a piece
``[e_1, e_2]``, ``D`` is convex with ``D'(e) = sigma'(z + e) - sigma'(z)`` increasing, so
with ``s_2 = sigma'(z + e_2) - sigma'(z)``, ``D(e) <= D(e_1) + (e - e_1) s_2``. That over
``e^2 / 2`` is ``2 (c + s_2 e) / e^2`` with ``c = D(e_1) - e_1 s_2 <= 0``: it rises up to
``e* = -2c / s_2`` and falls after, so its largest value on the piece is at ``e_1`` (``e*
<= e_1``), at ``e_2`` (``e* >= e_2``), or ``s_2^2 / (-2c)`` (its largest value anywhere).
It is also capped by the largest ``sigma''`` on the interval, so it is never looser than
that. Only the side heading towards 0 is split: on the other, ``sigma''`` only falls, so
``Q <= sigma''(z)``, which the near piece already covers (and a unit within ``e_0`` of 0 is
charged ``alpha / 4`` by it). The computation is that side's, on the units whose range
reaches past the near piece. On it, ``Q`` rises while ``z + h <= 0`` (next paragraph), so
up to ``h = |z|`` its largest value is at the end: ``Q(|z|)`` (less the pad) from above
covers that part, and the pieces cover only the rest (a unit whose range stops short of 0
needs no pieces; on MNIST the largest-eigenvalue certificate 30% faster and its mean 0.09%
higher than with pieces from ``e_0``).

*Bound on inf Q: Q rises, then falls.* On a side ``h > 0`` (any real z), ``Q'(h) = 2
phi(h) / h^3`` with ``phi = h D' - 2 D``, ``phi(0) = 0`` and ``phi'(h) = h sigma''(z + h) -
int_0^h sigma''(z + s) ds = h k(h)``, ``k`` the excess of ``sigma''(z + h)`` over its mean
on ``[z, z + h]``. While ``z + h <= 0``, ``sigma''`` rises towards 0, so ``k > 0``; past 0
``sigma''`` falls, and ``k' = sigma'''(z + h) - k / h < 0`` wherever ``k = 0``, so ``k``
changes sign at most once, from + to -. So ``phi`` rises, then falls (it crosses 0 at most
once), and ``Q`` rises, then falls: its smallest value over ``(0, E]`` is at an end,
``min(sigma''(z), Q(E))``. The near piece's smallest ``sigma''`` covers the first; ``Q(E) =
2 D(E) / E^2`` is bounded from below from the computed ``D(E)``: one evaluation per side,
the value at the end itself (pieces, as for ``sup Q``, gave chords below it).

*Rounding.* ``sigma''(y) = alpha sigmoid(alpha y) sigmoid(-alpha y)`` (no cancellation) is
taken where it is largest on an interval (``clamp(0, lo, hi)``: it falls with ``|y|``) and
multiplied by ``1 + 8 FN_REL`` plus ``2^-1000``, capped at ``alpha / 4 (1 + 4u)``, or where it
is smallest (the end farthest from 0) and multiplied by ``1 - 8 FN_REL`` less ``2^-1000``.
``sigma`` is ``logaddexp(alpha y, 0) / alpha`` and ``sigma'`` is
``sigmoid(alpha y)``, each within ``FN_REL`` (relative) plus ``2^-1000``; ``D(e_1)`` is
computed as ``sigma(z + e_1) - sigma(z) - sigma'(z) e_1`` at the computed ``z^`` and is off
by at most ``4 FN_REL`` times the sum of the three terms' magnitudes (their own rounding
and the subtractions' included), ``4u (|z^ + e_1| + |z^|)(1 + alpha e_1)`` for the
arguments, and ``alpha pad e_1 / 2``
for the real z within ``pad`` of ``z^`` (``|dD/dz| <= alpha e / 2``); ``s_i`` likewise with
``alpha pad / 2``. The ends ``e_i`` are exact numbers chosen here (the range's end is
rounded outward), every quotient and product is rounded outward by a relative ``8u``, and
the branch on ``e*`` is taken on an interval that contains the computed ``c``'s real
value (``4u`` of its two terms' magnitudes).
"""

from __future__ import annotations

import torch

from .rounding import FN_REL, UNDERFLOW, UNIT

#: Geometric pieces per side between the near piece and the end of the range.
PIECES = 24
#: The near piece: ``|h| <= NEAR / alpha`` (``sigma''`` changes little over it).
NEAR = 0.5
#: Relative outward rounding of each product and quotient.
ROUND = 8 * UNIT


def max_second_derivative(lo: torch.Tensor, hi: torch.Tensor, alpha: float) -> torch.Tensor:
    """Upper bounds on ``max_{[lo, hi]} sigma''`` (same shape): ``sigma''`` is largest at 0
    and falls on either side, so it is taken at ``clamp(0, lo, hi)`` (module docstring,
    *Rounding*)."""
    z = torch.minimum(torch.maximum(torch.zeros_like(lo), lo), hi)
    s2 = alpha * torch.sigmoid(alpha * z) * torch.sigmoid(-alpha * z)
    s2 = s2.mul_(1 + 8 * FN_REL).add_(UNDERFLOW)
    return s2.clamp_max_(alpha / 4 * (1 + 4 * UNIT))


def min_second_derivative(lo: torch.Tensor, hi: torch.Tensor, alpha: float) -> torch.Tensor:
    """Lower bounds on ``min_{[lo, hi]} sigma''`` (same shape): ``sigma''`` falls with
    ``|z|``, so it is taken at the endpoint farthest from 0 (module docstring,
    *Rounding*)."""
    z = torch.where(lo.abs() > hi.abs(), lo, hi)
    s2 = alpha * torch.sigmoid(alpha * z) * torch.sigmoid(-alpha * z)
    return s2.mul_(1 - 8 * FN_REL).sub_(UNDERFLOW).clamp_min_(0.0)


def _softplus(y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.logaddexp(alpha * y, torch.zeros_like(y)) / alpha


def _remainder(
    sp_e: torch.Tensor,
    sp_z: torch.Tensor,
    sl_z: torch.Tensor,
    e: torch.Tensor,
    w: torch.Tensor,
    az: torch.Tensor,
    base_d: torch.Tensor,
    d_pad: torch.Tensor,
    alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``D(e)`` computed as ``sigma(z + e) - sigma(z) - sigma'(z) e`` (``sp_e``, ``sp_z``,
    ``sl_z``: the computed ``sigma(w)``, ``sigma(z)``, ``sigma'(z)``, ``w = fl(z + e)``,
    ``az = |z|``) and a bound on its distance to the real ``D(e)`` at the real z (module
    docstring, *Rounding*; ``base_d``: ``sigma(z)``'s part, ``d_pad``: ``alpha pad / 2``)."""
    d = sp_e - sp_z - sl_z * e
    err = (sp_e.abs() + sl_z * e).mul_(4 * FN_REL).add_(base_d)
    err += (w.abs() + az).mul_(4 * UNIT * (1 + alpha * e)) + d_pad * e
    return d, err


def _bases(z: torch.Tensor, pad: torch.Tensor, alpha: float):
    """``sigma(z)``, ``sigma'(z)``, ``|z|``, ``alpha pad / 2`` and ``sigma(z)``'s part of
    :func:`_remainder`'s error, for the units at ``z`` (computed, within ``pad``)."""
    az = z.abs()
    sp_z = _softplus(z, alpha)
    sl_z = torch.sigmoid(alpha * z)
    d_pad = alpha * pad / 2  # |dD/dz| <= alpha e / 2 and |d sigma'/dz| <= alpha / 4
    base_d = sp_z.abs().mul_(4 * FN_REL).add_(UNDERFLOW)
    return sp_z, sl_z, az, d_pad, base_d


def _remainder_at(
    z: torch.Tensor, e: torch.Tensor, alpha: float, bases: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_remainder` at ``e`` for the units at ``z`` with their :func:`_bases`."""
    sp_z, sl_z, az, d_pad, base_d = bases
    w = z + e
    return _remainder(_softplus(w, alpha), sp_z, sl_z, e, w, az, base_d, d_pad, alpha)


def remainder(y: torch.Tensor, s: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``D_y(s) = sigma(y + s) - sigma(y) - sigma'(y) s`` for units expanded about the exact
    numbers ``y`` at steps ``s`` of either sign (same shape), and a bound on the computed
    value's distance to the real one (module docstring, *Rounding*, with no pad): the side
    ``s < 0`` as ``D_{-y}(-s)`` (``sigma(-y) = sigma(y) - y``)."""
    flip = s < 0
    about = torch.where(flip, -y, y)
    return _remainder_at(about, s.abs(), alpha, _bases(about, torch.zeros_like(y), alpha))


def _at_end(z: torch.Tensor, pad: torch.Tensor, end: torch.Tensor, alpha: float) -> torch.Tensor:
    """A lower bound on ``Q(end) = 2 D(end) / end^2`` (same shape as ``z``) for the units at
    ``z`` (computed, within ``pad``): with ``sigma''(z)``, the smallest ``Q`` over ``h`` in
    ``(0, end]`` (module docstring, *Bound on inf Q*). 0 where ``D`` overflows far out."""
    d, err = _remainder_at(z, end, alpha, _bases(z, pad, alpha))
    q = (2 * (d - err).clamp_min_(0.0) / end.square()).mul_(1 - ROUND)
    return q.nan_to_num_(nan=0.0)  # inf - inf: 0 is a bound


def _side(
    z: torch.Tensor,
    pad: torch.Tensor,
    end: torch.Tensor,
    alpha: float,
    pieces: int,
) -> torch.Tensor:
    """A bound on ``sup Q`` over ``h`` in ``[NEAR / alpha, end]`` (same shape as ``z``) for
    the units at ``z < -pad`` (computed, within ``pad``: the side heading towards 0);
    ``-inf`` where that part of the range is empty. While ``z + h <= 0``, ``Q`` rises
    (module docstring, *Bound on inf Q*), so up to ``start = |z| - pad`` (rounded down) its
    largest value is ``Q(start)``; the pieces cover ``[start, end]`` (``[NEAR / alpha,
    end]`` where ``start`` is below it). ``sigma`` and ``sigma'`` at a piece's far end are
    carried to the next piece."""
    e0 = NEAR / alpha
    rise = (z.abs() - pad).mul_(1 - 4 * UNIT)
    start = torch.minimum(rise.clamp_min(e0), end)
    bases = _bases(z, pad, alpha)
    d, err = _remainder_at(z, start, alpha, bases)
    at_start = (2 * (d + err) / start.square()).mul_(1 + ROUND)
    bound = torch.where((start > e0) & (end > e0), at_start, -torch.inf)
    far = (end > start).nonzero(as_tuple=True)  # the pieces, past where Q surely rises
    if not len(far[0]):
        return bound
    z, pad, end, e1 = z[far], pad[far], end[far], start[far]
    sp_z, sl_z, az, d_pad, base_d = (b[far] for b in bases)
    ratio = (end / e1).pow(1.0 / pieces)
    piece_max = torch.full_like(z, -torch.inf)
    base_s = (2 * FN_REL) * 2 * sl_z + d_pad + UNDERFLOW + alpha * UNIT * az
    w1 = z + e1
    sp1, sl1 = _softplus(w1, alpha), torch.sigmoid(alpha * w1)
    for i in range(pieces):
        # the last piece ends at the range's end, whatever the rounding of the ratio
        e2 = end if i == pieces - 1 else torch.minimum(e1 * ratio, end)
        live = e1 < end
        w2 = z + e2
        sp2, sl2 = _softplus(w2, alpha), torch.sigmoid(alpha * w2)
        d1, d_err = _remainder(sp1, sp_z, sl_z, e1, w1, az, base_d, d_pad, alpha)
        s_err = (sl1 + sl2).mul_(2 * FN_REL).add_(base_s)
        s_err += (w1.abs() + w2.abs()).mul_(alpha / 2 * UNIT)
        # 2 (d1 + (e - e1) s2) / e^2 on [e1, e2], largest at e* = -2c / s2
        d1_up = d1 + d_err
        s2_up = (sl2 - sl_z + s_err).clamp_min_(0.0)
        at_e1 = 2 * d1_up / e1.square()
        at_e2 = 2 * (d1_up + (e2 - e1) * s2_up) / e2.square()
        neg_c = e1 * s2_up - d1_up  # -c, computed
        c_err = (e1 * s2_up + d1_up).mul_(4 * UNIT)
        neg_lo, neg_hi = neg_c - c_err, neg_c + c_err
        s2_safe = s2_up.clamp_min(UNDERFLOW)
        falls = (neg_hi <= 0) | (2 * neg_hi / s2_safe * (1 + 4 * UNIT) < e1)
        rises = 2 * neg_lo / s2_safe * (1 - 4 * UNIT) > e2
        peak = torch.where(
            neg_lo > 0, s2_up.square_() / (2 * neg_lo.clamp_min(UNDERFLOW)), torch.inf
        )
        piece = torch.where(falls, at_e1, torch.where(rises, at_e2, peak)).mul_(1 + ROUND)
        piece_max = torch.where(live, torch.maximum(piece_max, piece), piece_max)
        e1, w1, sp1, sl1 = e2, w2, sp2, sl2
    bound[far] = torch.maximum(bound[far], piece_max)
    return bound


def secant_curvature(
    z: torch.Tensor,
    pad: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    alpha: float,
    pieces: int = PIECES,
    lower: bool = True,
    up_units: torch.Tensor | None = None,
    down_units: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Upper and lower bounds (each (m, H)) on ``Q(h) = 2 D(h) / h^2`` over every ``h`` with
    ``z + h`` in ``[lo, hi]`` (module docstring), for the units at the computed
    pre-activations ``z`` (m, H), within ``pad`` of the real ones; ``alpha``: the softplus
    sharpness. Each is at least as tight as the largest (smallest) ``sigma''`` on ``[lo,
    hi]``; an unbounded side of the range gets that bound. ``lower=False`` skips the lower
    bound (None). ``up_units``, ``down_units`` (m, H) bool, optional: the units whose upper
    (lower) bound is used; the others get the largest (smallest) ``sigma''`` on ``[lo, hi]``
    without the secant's work (sound, looser)."""
    e0 = NEAR / alpha
    widen = (z.abs() + pad + e0).mul_(4 * UNIT).add_(UNDERFLOW)
    near_lo = torch.maximum(lo, z - pad - e0 - widen)
    near_hi = torch.minimum(hi, z + pad + e0 + widen)
    up = max_second_derivative(near_lo, near_hi, alpha)
    # sup Q: only the side heading towards 0 can exceed the near piece (away from 0,
    # sigma'' only falls, so Q <= sigma''(z)); units within e_0 of 0 have alpha / 4 already
    toward = torch.where(z > 0, z - lo + pad, hi - z + pad).mul_(1 + 4 * UNIT).add_(UNDERFLOW)
    if up_units is not None:  # the others: the whole interval's bound, as unbounded below
        toward = torch.where(up_units, toward, torch.inf)
    need = ((toward > e0) & (z.abs() > pad + e0) & torch.isfinite(toward)).nonzero(as_tuple=True)
    if len(need[0]):
        s_up = _side(-z[need].abs(), pad[need], toward[need], alpha, pieces)
        up[need] = torch.maximum(up[need], s_up)
    # an unbounded side towards 0 gets the whole interval's largest sigma''
    up = torch.where(torch.isfinite(toward), up, torch.inf)
    up = torch.minimum(up, max_second_derivative(lo, hi, alpha))
    if not lower:
        return up, None
    down = min_second_derivative(near_lo, near_hi, alpha)
    ends = (hi - z + pad, z - lo + pad)  # h > 0 at z, and h < 0 as h > 0 at -z
    for zz, end in zip((z, -z), ends, strict=True):
        end = end.mul(1 + 4 * UNIT).add_(UNDERFLOW)
        if down_units is not None:  # the others: the whole interval's bound, as unbounded
            end = torch.where(down_units, end, torch.inf)
        # an unbounded side has no secant bound from below but 0; a side within the near
        # piece has none to add (and at R = 0 no unit's range leaves it)
        down = torch.where(torch.isfinite(end), down, 0.0)
        far = (torch.isfinite(end) & (end > e0)).nonzero(as_tuple=True)
        if len(far[0]):  # Q rises, then falls: inf Q over the side at one of its ends
            down[far] = torch.minimum(down[far], _at_end(zz[far], pad[far], end[far], alpha))
    return up, torch.maximum(down.clamp_min(0.0), min_second_derivative(lo, hi, alpha))
