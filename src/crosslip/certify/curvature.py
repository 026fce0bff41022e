r"""Curvature certificates of the one-hidden-layer net (second order, after Singla & Feizi,
ICML 2020, "Second-Order Provable Defenses against Adversarial Attacks").

With ``g = f_c - f_j = sum_l delta_l sigma(z_l(y)) + const``, ``delta = w_c - w_j``, each
unit expanded about the real ``z_l(x)`` with the integral remainder (:mod:`.secant`) gives,
with ``h_l = u_l^T v``,

    g(x + v) = m + grad g(x)^T v + 1/2 sum_l delta_l Q_l(h_l) h_l^2,

``Q_l(h) = 2 int_0^1 (1 - t) sigma''(z_l + t h) dt > 0``. The units with ``delta_l > 0``
only add; the others are bounded over the set ``S(R)`` by ``kappa_l = |delta_l| sup Q_l``
over the unit's range (``z_l(x) + h`` in its pre-activation interval ``[lo_l, hi_l]`` of
:class:`~.softplus_bounds.PreactivationRange`), which :func:`.secant.secant_curvature`
bounds: never above the largest ``sigma''`` on the interval, and far below it on wide ones.
So, for ``||v||_p <= r <= R``,

    g(x + v) >= m + grad g(x)^T v - v^T K v / 2 >= m + phi(r) - Lambda_p r^2 / 2,
    K = U^T diag(kappa) U,

``m`` the margin at x, ``phi(r)`` the minimum of the linear term over the set
(:mod:`.linear_min`: ``-r ||grad g(x)||_q`` on the ball, its dual form in the box), and
``Lambda_p >= max_{||v||_p <= 1} v^T K v``:

* p = 2: ``lambda_max(K) = lambda_max(D G D)``, ``G = U U^T``, ``D = diag(sqrt(kappa))``;
  bounded by the smaller of ``max_l kappa_l ||U||_2^2`` (the verified spectral norm) and
  ``max_{l: kappa_l > 0} (|G| kappa)_l`` (the Perron-Frobenius/Schur test with the vector
  ``sqrt(kappa)`` on the units with ``kappa > 0``);
* p = 1: ``max_i sum_l kappa_l U_li^2``, exactly the maximum: ``v^T K v`` is convex, so
  its maximum over the L1 ball is at a vertex ``+-e_i``, where it is ``K_ii``;
* p = inf: the smaller of ``sum_l kappa_l ||u_l||_1^2`` (``(u_l^T v)^2 <= ||u_l||_1^2
  ||v||_inf^2``) and ``d`` times the bound on ``lambda_max(K)`` of p = 2 (``||v||_2^2 <= d
  ||v||_inf^2``).

Class j cannot overtake c within the root ``rho_j`` of ``m - const - lin r - quad r^2``
(:func:`.linear_min.quad_radius`; the search takes ``min(rho_j, R)``): a radius function for
:func:`~.search.radius_search`. The bound sees a unit's curvature only where it can be
negative, so a network whose units are saturated or in their linear regime over the ball
is certified nearly to its first-order distance ``m / ||grad g(x)||_q``.

*L1 at the vertices.* In the L1 ball the linear and the quadratic term are minimised
together: ``a^T v - v^T K v / 2`` (``a`` the computed gradient) is concave, so its minimum
over the ball of radius ``s`` is at a vertex ``+-s e_i``, ``-s |a_i| - s^2 K_ii / 2``, and
with the gradient's error ``g(x + v) >= m - max_i (r (|a_i| + err) + r^2 K_ii / 2)`` for
``||v||_1 <= r``. Its radius is the smallest over ``i`` of each vertex's root, never below
the form above, which pairs the largest ``|a_i|`` with the largest ``K_ii`` (on the record's
full-MNIST networks, 10 points: the L1 curvature certificate 6-11% larger). Not in the box,
whose set has other vertices.

*Moved expansion points* (``expansions``; ball only, L1 and L-inf): each row is bounded
again with the terms of :mod:`.expansion` (margin, gradient, ``kappa``) about the units'
values at the vertex ``-s sign(a_i) e_i`` that sets the L1 radius (the largest ``|a_i| +
s K_ii / 2``) or at the corner ``-s sign(a)`` in L-inf, ``s`` the radius reached (at most
R); the convex units' help, which these forms drop, stays dropped. Each row keeps its best.

*Rounding.* ``sup Q`` is bounded with its rounding covered (:mod:`.secant`); ``kappa``
(and each ``U_li^2``) by ``1 + 4u`` (``|delta|``
within ``2u`` of the real one). ``|fl(G)|`` is within ``gamma_d ||u_r|| ||u_m||`` of
``|G|``, and sums of non-negative terms are inflated by ``1 + gamma_{H+2}``. The gradient at
x is ``U^T (delta sigma'(z(x)))``; the computed one differs by at most ``sum_l |delta_l|
(Delta_l + gamma_{H+4} s_l) ||u_l||_q + tau`` in the q-norm, with ``s_l`` the computed
``sigma'`` and ``Delta_l = alpha pad_l / 4 + 4 FN_REL s_l + 2^-1000`` its distance to the
real ``sigma'(z_l(x))`` (``sigma'' <= alpha / 4``). The margin is the rigorous lower bound of
:func:`~.search.margins_lower`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .expansion import (
    ASCENT_STEP,
    Expanded,
    ascent_direction,
    ascent_trial,
    damped_move,
    expanded_terms,
    next_step,
)
from .linear_min import QuadLower, box_lower, dual_norm_lower, quad_radius
from .rounding import FN_REL, UNDERFLOW, UNIT, gamma
from .secant import secant_curvature
from .softplus_bounds import PreactivationRange

#: Rows per chunk of the L1 vertex form, whose work is (rows, d).
VERTEX_ROWS = 1024


class CurvatureBound:
    """Per-class certified radii of the curvature bound at R (module docstring), a radius
    function for :func:`~.search.radius_search`. ``rng``: the pre-activation ranges of the
    set (its ``p`` and ``box``); ``m`` (n, K): lower bounds on the margins (``+inf`` at c)."""

    def __init__(
        self, rng: PreactivationRange, m: torch.Tensor, expansions: int = 0, ascents: int = 0
    ) -> None:
        self.rng, self.m = rng, m
        self.expansions = expansions
        self.ascents = ascents
        terms = rng.terms
        self.U, self.W, self.alpha = terms.U, terms.W, terms.alpha
        h, d = terms.dims
        self.unorm_q = terms.row_norms(rng.q)
        self.tau = terms.underflow_floor
        self.g_h, self.g_d = gamma(h + 4), gamma(d)
        self.sum_up = 1 + gamma(h + 2)
        # sigma' at the computed pre-activations and its distance to the real sigma'(z(x))
        self.slope = torch.sigmoid(self.alpha * rng.z)
        spread = (self.slope * (4 * FN_REL)).add_(UNDERFLOW)
        self.slope_err = spread.add_(rng.pad, alpha=self.alpha / 4 * (1 + UNIT))
        self.d = d
        if rng.p != 1:  # the largest eigenvalue: L2's constant, and L-inf's second bound
            self.gram = terms.abs_gram
            self.unorm2 = terms.row_norms(2)
            self.spec2 = float(terms.spectral_norm) ** 2 * (1 + 4 * UNIT)
        if rng.p == 1:  # U_li^2, rounded up
            self.u_sq = self.U.square().mul_(1 + 4 * UNIT)
        elif rng.p != 2:
            self.unorm_q2 = self.unorm_q.square().mul_(1 + 4 * UNIT)

    def curvature(self, kappa: torch.Tensor) -> torch.Tensor:
        """``Lambda_p`` (nr,) from ``kappa`` (nr, H) (module docstring), rounded up."""
        if self.rng.p == 1:  # the largest diagonal entry of K: its maximum over the L1 ball
            return (kappa @ self.u_sq).max(-1).values.mul_(self.sum_up)
        lam = self.largest_eigenvalue(kappa)
        if self.rng.p == 2:
            return lam
        per_unit = (kappa @ self.unorm_q2).mul_(self.sum_up)
        return torch.minimum(per_unit, (lam * self.d).mul_(1 + 2 * UNIT))

    def largest_eigenvalue(self, kappa: torch.Tensor) -> torch.Tensor:
        """An upper bound on ``lambda_max(U^T diag(kappa) U)`` (nr,), rounded up: the smaller
        of the spectral-norm and the Schur bounds (module docstring)."""
        return largest_eigenvalue(kappa, self.gram, self.unorm2, self.spec2, self.g_d)

    def rows(
        self, x_idx: torch.Tensor, c: torch.Tensor, j: torch.Tensor, s2_hi: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows (point ``x_idx``, predicted class ``c``, class ``j``; each (nr,)) with
        the secant bounds on ``sup Q`` of their points' units ``s2_hi`` (nr, H): ``delta =
        w_c - w_j`` (nr, H), the computed gradient of ``g`` at x (nr, d), its error bound in
        the q-norm (nr,), ``kappa`` (nr, H) and the margins' lower bounds (nr,) (module
        docstring)."""
        delta = self.W[c] - self.W[j]
        dabs = delta.abs()
        kappa = torch.where(delta < 0, dabs * s2_hi, 0.0).mul_(1 + 4 * UNIT)
        slope = self.slope[x_idx]
        grad = (delta * slope) @ self.U
        gap = (self.slope_err[x_idx] + slope * self.g_h) * dabs
        err = (gap @ self.unorm_q).mul_(self.sum_up).add_(self.tau)
        return delta, grad, err, kappa, self.m[x_idx, j]

    def __call__(self, idx: torch.Tensor, r: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        rows = self.row_bounds(idx, r, need)
        out = torch.full_like(self.m[idx], math.inf)
        rho = self.row_radii(idx, rows)
        if self.expansions and not self.rng.box and self.rng.p != 2:
            rho = self.moved(idx, r, rows, rho)
        out[rows.point, rows.cls] = rho
        return out

    def row_radii(self, idx: torch.Tensor, rows: Rows) -> torch.Tensor:
        """The ``rows``' radii (nr,) of the points ``idx``."""
        if self.rng.p == 1 and not self.rng.box:  # at least the form below, one product less
            return self.vertex_radius(rows)
        return radius_of(rows.margin, rows.lowers, self.constant(idx, rows))

    def constant(self, idx: torch.Tensor, rows: Rows) -> torch.Tensor:
        """``Lambda_p`` (nr,) of the ``rows`` of the points ``idx``."""
        return self.curvature(rows.kappa)

    def expanded(
        self,
        intervals: tuple[torch.Tensor, ...],
        point: torch.Tensor,
        delta: torch.Tensor,
        offset: torch.Tensor,
        margin: torch.Tensor,
    ) -> Expanded:
        """The terms of :func:`.expansion.expanded_terms` for rows (nr) of the points at
        positions ``point`` (nr,) of ``intervals`` (``zh, pad, lo, hi`` of
        :meth:`.PreactivationRange.intervals`, each (m, H)), ``delta`` (nr, H), the units
        expanded about ``zh + offset`` (nr, H); ``margin`` (nr,) the rows' margins; the
        gradient's error in the ball's dual norm."""
        zh, pad, lo, hi = (t[point] for t in intervals)
        norm_up = self.rng.terms.row_norms_up(self.rng.q)
        return expanded_terms(
            zh, pad, lo, hi, delta, offset, margin, self.U, norm_up, self.alpha, self.tau
        )

    def moved(self, idx: torch.Tensor, r: torch.Tensor, rows: Rows, rho: torch.Tensor):
        """The radii ``rho`` (nr,) of the ball's ``rows`` raised by ``expansions`` bounds
        with the units expanded about their values at the last bound's minimiser
        (:mod:`.expansion`): the vertex ``-s sign(a_i) e_i`` that sets the L1 radius, the
        corner ``-s sign(a)`` in L-inf, ``s`` the radius reached (at most R); in L1 then by
        ``ascents`` bounds about points found by gradient ascent (:mod:`.expansion`,
        *Optimised expansion points*; each row keeps a trial's points where its radius is
        larger)."""
        intervals = self.rng.intervals(idx, r)
        p, c = rows.point, self.rng.pred[idx][rows.point]
        delta = self.W[c] - self.W[rows.cls]
        margin = rows.margin  # g(x)'s bound: each expansion adds its own constant to it
        best, last = rho, None

        def bound(offsets: torch.Tensor) -> tuple[Rows, torch.Tensor]:
            ex = self.expanded(intervals, p, delta, offsets, margin)
            lowers = [dual_norm_lower(ex.grad, ex.err, self.rng.q)]
            new = Rows(p, rows.cls, ex.kappa, ex.margin, lowers, ex.grad, ex.err)
            return new, self.row_radii(idx, new)

        for _ in range(self.expansions):
            last = damped_move(last, self.corner(rows, torch.minimum(rho, r[p])))
            rows, rho = bound(last)
            best = torch.maximum(best, rho)
        if not (self.ascents and self.rng.p == 1 and last is not None):
            return best
        h = self.corner(rows, torch.minimum(rho, r[p]))
        local = (*(t[p] for t in intervals), delta)
        direction = ascent_direction(local, last, h, self.alpha)
        step = torch.full_like(rho, ASCENT_STEP)
        for _ in range(self.ascents):
            trial = ascent_trial(last, h, direction, step)
            got_rows, got = bound(trial)
            best = torch.maximum(best, got)
            better = got > rho  # False for NaN
            step = next_step(step, better)
            moved = better.nonzero()[:, 0]
            if len(moved):
                last[moved], rho[moved] = trial[moved], got[moved]
                h[moved] = self.corner(got_rows, torch.minimum(got, r[p]))[moved]
                where = tuple(t[moved] for t in local)
                direction[moved] = ascent_direction(where, last[moved], h[moved], self.alpha)
        return best

    def corner(self, rows: Rows, reached: torch.Tensor) -> torch.Tensor:
        """The units' values ``U v`` (nr, H) at the point of the ball of the radius
        ``reached`` (nr,) where the ``rows``' bound is smallest: the vertex ``-s sign(a_i)
        e_i`` of the largest ``|a_i| + s K_ii / 2`` in L1, the corner ``-s sign(a)`` in
        L-inf (``s`` = ``reached``, NaN as 0)."""
        s = reached.nan_to_num(0.0, 0.0, 0.0)[:, None]
        sign = torch.sign(rows.grad)
        if self.rng.p == 1:
            score = rows.grad.abs() + 0.5 * s * (rows.kappa @ self.u_sq)
            i = score.argmax(1)
            return -(s[:, 0] * sign.gather(1, i[:, None])[:, 0])[:, None] * self.U.T[i]
        return -s * (sign @ self.U.T)

    def vertex_radius(self, rows: Rows) -> torch.Tensor:
        """L1 (module docstring, *L1 at the vertices*): the radii (nr,) of the ``rows``'
        concave lower bound minimised at the vertices of the ball, in chunks of
        :data:`VERTEX_ROWS` rows."""
        out = torch.empty_like(rows.margin)
        d = rows.grad.shape[1]
        for start in range(0, len(out), VERTEX_ROWS):
            part = slice(start, start + VERTEX_ROWS)
            lin = (rows.grad[part].abs() + rows.err[part, None]).mul_(1 + 2 * UNIT)
            diag = (rows.kappa[part] @ self.u_sq).mul_(self.sum_up)  # K_ii, rounded up
            low = QuadLower(torch.zeros_like(lin).flatten(), lin.flatten(), diag.flatten() * 0.5)
            rho = quad_radius(rows.margin[part].repeat_interleave(d), low)
            out[part] = rho.view(-1, d).min(1).values
        return out

    def row_bounds(self, idx: torch.Tensor, r: torch.Tensor, need: torch.Tensor) -> Rows:
        """The needed rows of the points ``idx`` (positions in ``idx``) at R = ``r``."""
        rng = self.rng
        c = rng.pred[idx]
        sel = rng.not_pred[c] & need
        point, cls = sel.nonzero(as_tuple=True)
        zh, pad, lo, hi = rng.intervals(idx, r)
        concave = signed_units(self.W, c[point], cls, point, len(idx), negative=True)
        s2 = secant_curvature(zh, pad, lo, hi, self.alpha, lower=False, up_units=concave)[0]
        rows = idx[point]  # the point of each row
        _, grad, err, kappa, m_rows = self.rows(rows, c[point], cls, s2[point])
        lowers = [dual_norm_lower(grad, err, rng.q)]
        if rng.box:
            lowers.append(box_lower(grad, err, rng.x[rows], r[point], rng.p))
        return Rows(point, cls, kappa, m_rows, lowers, grad, err)


class Rows(NamedTuple):
    """The (point, class) rows of :meth:`CurvatureBound.row_bounds`: their point and class
    (nr,), ``kappa`` (nr, H), the margins' lower bounds (nr,), the lower bounds on the
    linear term (the ball's, and the box's in a box set), the computed gradients of ``g``
    (nr, d) and their errors in the dual norm (nr,)."""

    point: torch.Tensor
    cls: torch.Tensor
    kappa: torch.Tensor
    margin: torch.Tensor
    lowers: list[QuadLower]
    grad: torch.Tensor
    err: torch.Tensor


def radius_of(m_rows: torch.Tensor, lowers: list[QuadLower], lam: torch.Tensor) -> torch.Tensor:
    """The rows' radii (nr,) with the curvature constants ``lam`` (nr,): the largest over
    the lower bounds on the linear term of :meth:`CurvatureBound.row_bounds`."""
    quad = lam * 0.5
    return torch.stack([quad_radius(m_rows, low, quad) for low in lowers]).max(0).values


def largest_eigenvalue(
    kappa: torch.Tensor, abs_gram: torch.Tensor, norms: torch.Tensor, spec2: float, g_d: float
) -> torch.Tensor:
    """An upper bound on ``lambda_max(V^T diag(kappa) V)`` (nr,) from ``kappa`` (nr, H),
    rounded up: the smaller of ``max_l kappa_l spec2`` (``spec2 >= ||V||_2^2``) and the Schur
    test ``max_{l: kappa_l > 0} (|G| kappa)_l`` on ``abs_gram`` (H, H), ``|fl(G)|`` of the rows
    of ``V``, within ``g_d ||v_r|| ||v_m||`` of ``|G|`` (``norms`` (H,): the rows' norms, at
    least)."""
    spectral = kappa.max(-1).values * spec2
    schur = (kappa @ abs_gram).masked_fill_(kappa == 0, 0.0).max(-1).values
    # |fl(G)| vs |G|: + g_d ||v_r|| sum_m ||v_m|| kappa_m, at most max_r ||v_r|| times it
    norm_max = float(norms.max()) if norms.numel() else 0.0
    slack = (kappa @ norms).mul_(g_d * norm_max)
    schur = (schur + slack).mul_(1 + gamma(len(norms) + 2))
    return torch.minimum(spectral, schur).mul_(1 + 2 * UNIT)


def signed_units(
    W: torch.Tensor,
    c: torch.Tensor,
    j: torch.Tensor,
    point: torch.Tensor,
    n: int,
    negative: bool,
    chunk: int = 4096,
) -> torch.Tensor:
    """(n, H) bool: the units where ``w_c - w_j`` is negative (``negative``; else positive)
    in at least one row (``c``, ``j``, of the point ``point``; each (nr,), points in
    ``range(n)``), from the output weights ``W`` (K, H), ``chunk`` rows at a time: the
    only units whose curvature bound from above (below) enters that point's rows
    (:func:`.secant.secant_curvature`'s ``up_units`` and ``down_units``)."""
    hits = torch.zeros(n, W.shape[1], dtype=torch.int32, device=W.device)
    for start in range(0, len(point), chunk):
        part = slice(start, start + chunk)
        d = W[c[part]] - W[j[part]]
        hits.index_add_(0, point[part], ((d < 0) if negative else (d > 0)).to(torch.int32))
    return hits > 0
