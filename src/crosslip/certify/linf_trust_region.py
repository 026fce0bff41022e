r"""The curvature certificate in L-inf minimised over the ball through a diagonal dual.

:mod:`.trust_region` minimises the second-order lower bound

    g(x + v) >= m + a^T v + 1/2 sum_l q_l h_l^2,    h_l = u_l^T v,

over the L2 ball by its Lagrangian dual, with one multiplier ``mu`` for ``||v||^2 <= r^2``.
Over the L-inf ball every coordinate has a constraint ``v_i^2 <= r^2`` of its own, and a
multiplier each, ``mu y_i``, gives the diagonal (Shor) dual: for any ``mu >= 0``, any ``y >
0`` (d,) and any ``w``, if ``M = mu diag(y) + U^T diag(q) U`` is positive semi-definite,

    1/2 sum_l q_l h_l^2 = 1/2 v^T M v - mu/2 sum_i y_i v_i^2 >= 1/2 v^T M v - mu r^2/2 sum_i y_i,
    a^T v + 1/2 v^T M v >= -1/2 w^T M w + (a - M w)^T v >= -1/2 w^T M w - ||a - M w||_1 r,

so ``g(x + v) >= m - C - B r - mu (sum_i y_i) r^2 / 2`` with ``C = w^T M w / 2`` and ``B =
||a - M w||_1``: :mod:`.trust_region`'s bound with the L1 norm for the linear term and
``mu sum_i y_i`` for ``mu``. ``y = 1`` is the L2 trust region on the ball of radius ``r
sqrt(d)`` that holds the cube, but with the cube's own linear term; the ``y`` here,
``||U_{:,i}||_2`` plus :data:`DUAL_FLOOR` times their mean
(:func:`.linf_curvature.column_weights`), charges the coordinates that the hidden layer
barely reads (an image's border) little of the curvature.

*Everything in the scaled coordinates.* With ``D = diag(s)``, ``y_i = 1 / s_i^2`` (taken as
exact numbers), ``D M D = mu I + Ũ^T diag(q) Ũ`` with ``Ũ = U D``: the positive
semi-definiteness is :mod:`.trust_region`'s, proved on the scaled rows' Gram matrix
(:class:`.trust_region.UnitGram` with the scaling's error, :mod:`.linf_curvature`), the cheap
bound on ``lambda_max`` is the Schur or spectral test of the scaled rows (``||U D||_2 <=
||U||_2 max_i s_i``), and the dual point is searched there: Lanczos on ``Ũ^T diag(q) Ũ``
from ``D a``, ``w = D w~`` (any ``w`` is sound; ``mu`` is the same in both coordinates).
The units' values at its minimiser ``-w``, where the expansion points move
(:mod:`.expansion`), are ``-U w = -Ũ w~``.

*The first form.* Each row first gets the curvature form of :mod:`.curvature` in L-inf,
``m - (||a||_1 + err) r - Lambda r^2 / 2``, with ``Lambda`` the smallest of
:class:`.LinfCurvatureBound`'s (``sum_l kappa_l ||u_l||_1^2``, ``d`` times the cheap bound on
``lambda_max(K)``, the pair's constant) and ``t sum_i y_i``, ``t`` the cheap bound on
``lambda_max(D K D)`` (``K <= t diag(y)``); as in L2, a row that this form certifies to R is
done, and every row reports the larger of its two radii, so that with the units expanded
about the point only the column is never below the curvature form's at the same R. The
moves differ: the curvature form moves to the cube's corner ``-s sign(a)``, the dual to its
minimiser clipped to the cube.

*The box.* With a box-constrained range (``x + v`` in ``[0, 1]^d`` as well), the same bound
is minimised over the cube in the box: before the last step, ``g(x + v) >= m - w^T M w / 2
+ b^T v - mu/2 sum_i y_i v_i^2`` (``b = a - M w``) is separable, and each coordinate's
``b_i t - mu y_i t^2 / 2`` is concave, so its minimum over ``[-min(r, x_i), min(r, 1 -
x_i)]`` is at an end. For every ``r <= R`` each coordinate costs the smaller of the cube's
``|b_i| r + mu y_i r^2 / 2`` and its loss at R (the interval only grows with r), chosen per
coordinate at R, so the bound is exact at R and keeps the form ``-(C + B r + quad r^2)``. The
dual point is searched about the centre ``c`` of the cube in the box at R (``x_i = 0`` gives
``v_i`` in ``[0, R]``, centre ``R/2`` and half-width ``R/2``, a quarter of the cube's
``mu y_i R^2 / 2``): ``q(c + s)`` has the linear term ``a + U^T diag(q) U c``, Lanczos runs
from it, and ``w`` is that problem's minus ``c`` (``-w`` is then its minimiser plus ``c``; the
same ``M``, so the same proof). The first form takes the box's linear term too
(:func:`.linear_min.box_lower`, as :class:`.LinfCurvatureBound` does), and the moved
expansion points are clipped to the box.

*Rounding* as in :mod:`.trust_region`, with L1 norms for the linear term: ``||U^T z||_1 <=
sum_l |z_l| ||u_l||_1`` bounds the effect of the error of ``t = U w`` and of the product
``U^T (q t)``; the residual's elementwise rounding (``y``, ``y w``, ``mu y w`` and two
subtractions) is within ``8u (|a| + mu y |w| + |U^T (q t)|)``; ``sum_i y_i w_i^2`` is rounded
up by ``1 + gamma_{d+8}`` and ``sum_i y_i`` as the scaling rounds it. In the box each end's
value ``-b_i t + mu y_i t^2 / 2`` is padded by ``4u`` times its terms' size, ``mu y_i / 2``
rounded up by ``1 + 6u``, ``1 - x_i`` by ``1 + 4u``, and the error of ``b`` enters as its L1
bound times r (``|v_i| <= r``). The gradient's error
``err`` is in the L1 norm (the L-inf set's dual norm, :meth:`.CurvatureBound.rows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .curvature import CurvatureBound, largest_eigenvalue
from .linf_curvature import column_weights, pair_constants, scaling
from .rounding import UNIT, gamma
from .softplus_bounds import PreactivationRange
from .trust_region import DUAL_DTYPE, KrylovSpan, TrustRegionBound, UnitGram, krylov_dual

#: The dual's scaling: ``y_i = ||U_{:,i}||_2 + DUAL_FLOOR mean_i ||U_{:,i}||_2``. On 20-30 points
#: of each of the record's 200-epoch networks (one move) it certified 2.0-4.4% more on the
#: mean than the per-pair constant's (squared norms, floor 0.3); ``y = 1`` 20% less.
DUAL_FLOOR = 0.03


@dataclass
class ShiftedSpan(KrylovSpan):
    """A :class:`.trust_region.KrylovSpan` of the problem about a centre: ``offset`` (m, d),
    the centre in the scaled coordinates, is taken off each solution, so that the bound's
    minimiser ``-w`` is the centred problem's plus the centre."""

    offset: torch.Tensor

    def solve(self, mu: torch.Tensor) -> torch.Tensor:
        """The centred problem's ``w`` at ``mu`` (m,) minus the centre (m, d)."""
        return super().solve(mu) - self.offset


class LinfTrustRegionBound(TrustRegionBound):
    """Per-class certified radii of the L-inf curvature bound minimised over the ball at R
    through the diagonal dual (module docstring), a radius function for
    :func:`~.search.radius_search`. ``rng``: the L-inf pre-activation ranges (with a box's,
    the bound is minimised over the cube in the box: module docstring, *The box*); ``m``
    (n, K): lower bounds on the margins (``+inf`` at c); ``steps``: Lanczos steps;
    ``expansions``: moves of the expansion points (:mod:`.expansion`)."""

    p = math.inf
    boxed = True

    def __init__(
        self,
        rng: PreactivationRange,
        m: torch.Tensor,
        steps: int = 16,
        expansions: int = 0,
        ascents: int = 0,
    ) -> None:
        U = rng.terms.U
        self.scaled = scaling(U, column_weights(U, 1.0, DUAL_FLOOR))
        super().__init__(rng, m, steps, expansions, ascents)
        scaled = self.scaled
        self.y = scaled.s.square().reciprocal()  # within 3u of the exact 1 / s_i^2
        units = scaled.units
        # the cheap bound on lambda_max of the scaled rows: ||U D||_2 <= ||U||_2 max_i s_i
        self.scaled_gram = units.gram.abs()
        s_max2 = float(scaled.s.max().square()) if len(scaled.s) else 0.0  # inf past float's range
        # (U = 0: U D = 0, whatever D; never 0 * inf)
        self.scaled_spec2 = self.spec2 * s_max2 * (1 + 4 * UNIT) if self.spec2 else 0.0
        self.unorm1_up = rng.terms.row_norms_up(1)
        self.pairs = pair_constants(rng.terms)

    def psd_rows(self) -> tuple[torch.Tensor, UnitGram]:
        """The scaled rows ``U D`` and their :class:`.trust_region.UnitGram` (module
        docstring, *Everything in the scaled coordinates*)."""
        return self.scaled.rows, self.scaled.units

    def curvature(self, kappa: torch.Tensor) -> torch.Tensor:
        """An upper bound on ``lambda_max(D U^T diag(kappa) U D)`` (nr,), rounded up."""
        units = self.units
        return largest_eigenvalue(
            kappa, self.scaled_gram, units.norm_up, self.scaled_spec2, gamma(units.d)
        )

    def first_curvature(
        self, idx: torch.Tensor, cls: torch.Tensor, kappa: torch.Tensor, cheap: torch.Tensor
    ) -> torch.Tensor:
        """``Lambda`` (nr,) of the L-inf curvature form (module docstring, *The first
        form*): the smallest of the ball's constants and ``cheap sum_i y_i``, ``cheap`` the
        scaled cheap bound."""
        lam = CurvatureBound.curvature(self, kappa)  # the unscaled constant of the ball
        lam = torch.minimum(lam, (cheap * self.scaled.y_sum).mul_(1 + 2 * UNIT))
        return torch.minimum(lam, self.pairs[self.rng.pred[idx], cls])

    def dual(
        self,
        grad: torch.Tensor,
        q: torch.Tensor,
        margin: torch.Tensor,
        at: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, KrylovSpan]:
        """:func:`.trust_region.krylov_dual` in the scaled coordinates, from ``D a``; with a
        box-constrained range (``at``: the rows' points and R) about the centre ``c`` of the
        cube in the box (module docstring, *The box*)."""
        dt, s = DUAL_DTYPE, self.scaled.s
        if at is None or not self.rng.box:
            a = (grad * s).to(dt)
            return krylov_dual(a, q.to(dt), self.u_dual, margin.clamp_min(0.0).to(dt), self.steps)
        c = self.centre(*at)
        uc = c @ self.U.T
        a = ((grad + (q * uc) @ self.U) * s).to(dt)
        shifted = margin + (grad * c).sum(1) + 0.5 * (q * uc * uc).sum(1)
        mu, span = krylov_dual(a, q.to(dt), self.u_dual, shifted.clamp_min(0.0).to(dt), self.steps)
        return mu, ShiftedSpan(span.basis, span.theta, span.Z, span.b, (c / s).to(dt))

    def centre(self, points: torch.Tensor, big_r: torch.Tensor) -> torch.Tensor:
        """The centre (m, d) of the cube of radius R (m,) about the rows' ``points`` (m,)
        inside the box, as an offset from the point."""
        x, big_r = self.rng.x[points], big_r[:, None]
        return 0.5 * (torch.minimum(1 - x, big_r) - torch.minimum(x, big_r))

    def dual_vector(self, span: KrylovSpan, mu: torch.Tensor) -> torch.Tensor:
        """``w = D w~`` (m, d) at ``mu`` (m,), in the input's coordinates."""
        return span.solve(mu.to(DUAL_DTYPE)).to(self.U.dtype) * self.scaled.s

    def minimiser(
        self,
        dual: tuple[torch.Tensor, KrylovSpan],
        r: torch.Tensor,
        points: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The units' values ``U v*`` (m, H) at the dual's minimiser ``-w`` clipped to the
        cube of radius ``r`` (m,) (the diagonal dual's ``-w`` may lie outside it), and with
        a box-constrained range to the box of the rows' ``points`` (m,): where
        :mod:`.expansion` moves the expansion points. Any value is sound; a NaN row's is 0."""
        mu, span = dual
        v = -self.dual_vector(span, mu.to(self.U.dtype))
        lo, hi = -r[:, None], r[:, None]
        if self.rng.box and points is not None:
            x = self.rng.x[points]
            lo, hi = torch.maximum(lo, -x), torch.minimum(hi, 1 - x)
        v = torch.minimum(torch.maximum(v, lo), hi)
        return (v @ self.U.T).nan_to_num_(0.0, 0.0, 0.0)

    def metric(self, w: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        """``mu sum_i y_i w_i^2`` (m,), rounded up: the part ``mu diag(y)`` of ``w^T M w``."""
        ww = (self.y * w * w).sum(1).mul_(1 + gamma(w.shape[1] + 8))
        return (mu * ww).mul_(1 + 2 * UNIT)

    def residual_parts(
        self,
        grad: torch.Tensor,
        err: torch.Tensor,
        w: torch.Tensor,
        mu: torch.Tensor,
        qe: torch.Tensor,
        qt: torch.Tensor,
        z: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The computed ``a - M w`` (m, d) and a bound (m,) on the L1 norm of its error
        (module docstring, *Rounding*): ``qe`` (m, H) the bound on the error of ``q t``,
        ``qt`` the computed ``q t`` and ``z`` the computed ``U^T (q t)`` (m, d)."""
        h, d = self.U.shape
        myw = mu[:, None] * (self.y * w)
        res = grad - myw - z
        e1 = (qe @ self.unorm1_up).mul_(1 + gamma(h + 2))
        e2 = (qt.abs() @ self.unorm1_up).mul_(gamma(h + 1) * (1 + gamma(h + 2)))
        norms = grad.abs().sum(1) + myw.abs().sum(1) + z.abs().sum(1)
        e3 = 8 * UNIT * norms * (1 + gamma(d + 2))
        return res, (err + e1 + e2 + e3).mul_(1 + 2 * UNIT)

    def norm_up(self, res: torch.Tensor, spare: torch.Tensor) -> torch.Tensor:
        """``B >= ||res||_1 + spare`` (m,) for ``res`` (m, d), rounded up."""
        d = res.shape[1]
        return (res.abs().sum(1) * (1 + gamma(d + 2)) + spare).mul_(1 + 4 * UNIT)

    def set_terms(
        self,
        res: torch.Tensor,
        spare: torch.Tensor,
        mu: torch.Tensor,
        at: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``-min (b^T v - mu/2 sum_i y_i v_i^2) <= const + lin r + quad r^2`` (each (m,),
        rounded up) for ``r <= R``: ``res`` (m, d) the computed ``b = a - M w``, ``spare``
        (m,) a bound on the L1 norm of its error; over the cube the base's terms, with a
        box-constrained range and ``at`` (the rows' points and R) over the cube in the box
        (module docstring, *The box*)."""
        if at is None or not self.rng.box:
            return super().set_terms(res, spare, mu, at)
        d = res.shape[1]
        points, big_r = at
        x, big_r = self.rng.x[points], big_r[:, None]
        down = torch.minimum(x, big_r)  # v_i >= -down_i
        up = torch.minimum((1 - x).mul_(1 + 4 * UNIT), big_r)  # v_i <= up_i, rounded up
        half = (0.5 * mu[:, None] * self.y).mul_(1 + 6 * UNIT)  # >= mu y_i / 2 (y within 3u)
        mag = res.abs()
        # coordinate i's loss on [-down_i, up_i]: the convex -b_i t + half_i t^2 is largest
        # at an end, and 0 at t = 0; each end's value within 4u of its two terms' size
        far = torch.maximum(down, up)
        size = mag * far + half * far * far
        ends = torch.maximum(res * down + half * down * down, half * up * up - res * up)
        loss = ends.clamp_min(0.0) + 4 * UNIT * size
        # where it is below the cube's |b_i| R + half_i R^2 at R, the coordinate costs that
        # constant for every r <= R; elsewhere |b_i| r + half_i r^2
        capped = loss < mag * big_r + half * big_r * big_r
        const = loss.masked_fill(~capped, 0.0).sum(1).mul_(1 + gamma(d + 3))
        lin = self.norm_up(mag.masked_fill(capped, 0.0), spare)
        quad = half.masked_fill(capped, 0.0).sum(1).mul_(1 + gamma(d + 3))
        return const, lin, quad

    def quadratic(self, mu: torch.Tensor) -> torch.Tensor:
        """The coefficient ``mu (sum_i y_i) / 2`` (m,) of ``r^2``, rounded up."""
        return (0.5 * mu * self.scaled.y_sum).mul_(1 + 2 * UNIT)
