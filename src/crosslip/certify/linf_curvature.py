r"""The L-inf curvature constant through a diagonal scaling, its largest eigenvalue proved
once per pair of classes.

:mod:`.curvature` bounds the second-order term over the L-inf ball by ``Lambda_inf r^2 / 2``
with ``Lambda_inf >= max_{||v||_inf <= 1} v^T K v``, ``K = U^T diag(kappa) U``, and takes the
smaller of ``sum_l kappa_l ||u_l||_1^2`` and ``d`` times a cheap bound on ``lambda_max(K)``
(the spectral-norm or Schur test, often several times ``lambda_max``).

*The scaling.* For any ``y > 0`` (d,), ``K <= t diag(y)`` gives ``v^T K v <= t sum_i y_i
v_i^2 <= t (sum_i y_i) ||v||_inf^2``, and ``K <= t diag(y)`` holds for ``t >= lambda_max(D K
D)``, ``D = diag(y)^{-1/2}``: so ``Lambda_inf = t sum_i y_i``. ``y = 1`` is ``d lambda_max(K)``;
the scaling here, ``y_i = ||U_{:,i}||^2 + FLOOR mean_i ||U_{:,i}||^2``, charges the input
coordinates that the hidden layer barely reads (an image's border) little of the curvature.

*Once per pair of classes.* ``kappa_l = |w_cl - w_jl| sup Q_l`` on the units with ``w_cl <
w_jl`` (:mod:`.curvature`), and ``sup Q_l`` is capped by the largest ``sigma''``,
``alpha / 4`` (rounded up as :func:`.secant.max_second_derivative` rounds it): so every row
of the pair (c, j), at every point and radius, has ``kappa`` at most ``kappa^(c,j)``, that cap
times ``|w_c - w_j|`` (computed with the same roundings, so the computed values are ordered
too), and ``K <= U^T diag(kappa^(c,j)) U``. Its ``t`` is proved as the trust region proves
its ``mu`` (:class:`.trust_region.ConcavePart`): ``lambda_max(D U^T S^2 U D) = lambda_max(S
G~ S)`` with ``G~ = U~ U~^T``, ``U~ = U D``, a Cholesky factorisation of ``t I - S fl(G~) S``
on the top units that runs to completion, with its backward error, and the rest's trace;
``K (K - 1)`` factorisations per network, kept for every batch of points. Each row takes
the smaller of its own cheap constant and its pair's. The scaled rows are computed,
``fl(U_li s_i)`` (``s_i = y_i^{-1/2}`` taken as exact numbers), within ``u`` (relative) of
``U_li s_i``: their Gram matrix is then within ``(gamma_d + 3u)(1 + u)^2 ||u~_r|| ||u~_m||``
of the real one, covered by taking ``gamma_{d+3}`` for ``gamma_d``, and their norms are
rounded up by ``1 + gamma_{d+4}``; ``sum_i y_i = sum_i 1 / s_i^2`` is rounded up.

On the record's full-MNIST networks (10 points) the L-inf curvature certificate rose by 1%
(Cross-Lipschitz 1e-2) and 4% (no regularization; their rows' ``sup Q`` is far below
``alpha / 4``) to 74% (the certified margin's network, whose units stay near 0).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from .curvature import CurvatureBound, Rows
from .rounding import UNIT, gamma
from .softplus_bounds import NetTerms, PreactivationRange
from .trust_region import FACTOR_ROWS, TAIL_SHARE, UnitGram

#: The floor of the scaling ``y``, a share of the mean squared column norm.
FLOOR = 0.3

#: Each network's constants per pair of classes (module docstring), computed once.
_PAIRS: weakref.WeakKeyDictionary[NetTerms, torch.Tensor] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Scaling:
    """The diagonal scaling of the input coordinates (module docstring, *The scaling*):
    ``s`` (d,) with ``y_i = 1 / s_i^2`` taken as exact numbers, ``y_sum`` >= ``sum_i y_i``,
    the scaled rows ``fl(U_li s_i)`` (H, d) and their Gram matrix with its error bound
    (:class:`.trust_region.UnitGram`, ``gamma_{d+3}`` for ``gamma_d``)."""

    s: torch.Tensor
    y_sum: float
    rows: torch.Tensor
    units: UnitGram


def column_weights(U: torch.Tensor, exponent: float, floor: float) -> torch.Tensor:
    """``y_i = ||U_{:,i}||_2^exponent + floor mean_i ||U_{:,i}||_2^exponent`` (d,), positive:
    the weight of each input coordinate by how much the hidden layer ``U`` (H, d) reads it."""
    col2 = U.square().sum(0)
    col = col2 if exponent == 2 else col2.pow(exponent / 2)
    return col + floor * col.mean().clamp_min(torch.finfo(U.dtype).tiny)


def scaling(U: torch.Tensor, y: torch.Tensor) -> Scaling:
    """The :class:`Scaling` of the hidden layer's rows ``U`` (H, d) by the weights ``y``
    (d,; any positive numbers: ``s = y^{-1/2}`` computed, then taken as exact)."""
    d = U.shape[1]
    s = y.rsqrt()
    y_sum = float(s.square().reciprocal().sum()) * (1 + gamma(d + 4))
    scaled = U * s
    norm_up = scaled.norm(dim=1).mul_(1 + gamma(d + 4))
    units = UnitGram(scaled @ scaled.T, norm_up, norm_up.square().mul_(1 + 2 * UNIT), d + 3)
    return Scaling(s, y_sum, scaled, units)


def pair_constants(terms: NetTerms) -> torch.Tensor:
    """``Lambda_inf`` (K, K) of every pair (c, j) of the net's classes (module docstring),
    rounded up; ``inf`` on the diagonal and where the proof fails. Computed once per
    :class:`~.softplus_bounds.NetTerms`."""
    if terms in _PAIRS:
        return _PAIRS[terms]
    U, W = terms.U, terms.W
    k = W.shape[0]
    scaled = scaling(U, column_weights(U, 2.0, FLOOR))
    units, y_sum = scaled.units, scaled.y_sum
    c, j = (~torch.eye(k, dtype=torch.bool, device=W.device)).nonzero(as_tuple=True)
    cap = terms.alpha / 4 * (1 + 4 * UNIT)  # max_second_derivative's cap
    delta = W[c] - W[j]
    kappa = torch.where(delta < 0, delta.abs() * cap, 0.0).mul_(1 + 4 * UNIT)
    t = torch.cat(
        [
            units.largest(kappa[i : i + FACTOR_ROWS], None, TAIL_SHARE)
            for i in range(0, len(kappa), FACTOR_ROWS)
        ]
    )
    out = torch.full((k, k), math.inf, dtype=U.dtype, device=U.device)
    out[c, j] = (t * y_sum).mul_(1 + 2 * UNIT)
    out = out.masked_fill(torch.isnan(out), math.inf)
    _PAIRS[terms] = out
    return out


class LinfCurvatureBound(CurvatureBound):
    """Per-class certified radii of the L-inf curvature bound at R, each row's constant the
    smaller of :class:`.CurvatureBound`'s and its pair's proved one (module docstring), a
    radius function for :func:`~.search.radius_search`. ``rng``: L-inf pre-activation
    ranges (ball or box); ``m`` (n, K): lower bounds on the margins (``+inf`` at c)."""

    def __init__(
        self, rng: PreactivationRange, m: torch.Tensor, expansions: int = 0, ascents: int = 0
    ) -> None:
        if not math.isinf(rng.p):
            raise ValueError(f"the scaled curvature constant is an L-inf one, not p = {rng.p}")
        super().__init__(rng, m, expansions, ascents)
        self.pairs = pair_constants(rng.terms)

    def constant(self, idx: torch.Tensor, rows: Rows) -> torch.Tensor:
        pair = self.pairs[self.rng.pred[idx][rows.point], rows.cls]
        return torch.minimum(self.curvature(rows.kappa), pair)
