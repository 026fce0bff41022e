r"""Linear-relaxation certificates of the one-hidden-layer net (CROWN in closed form).

For the predicted class c and another class j, with ``delta = w_c - w_j`` (H,) and
``z(y) = U y + b``,

    g(y) = f_c(y) - f_j(y) = sum_l delta_l sigma(z_l(y)) + (c_c - c_j).

Over the set ``S(R)`` (the ball ``B_p(x, R)``, or the ball inside ``[0, 1]^d``)
:class:`~.softplus_bounds.PreactivationRange` gives every ``z_l(y)`` an interval
``[lo_l, hi_l]``. The softplus is convex, so

* where ``delta_l > 0``, a *tangent* at any point ``t_l`` is a lower bound on all of R:
  ``delta_l sigma(z) >= delta_l (sigma(t_l) + sigma'(t_l) (z - t_l))``;
* where ``delta_l < 0``, ``delta_l sigma`` is concave, and the *chord* of ``sigma`` on
  ``[lo_l, hi_l]`` is above ``sigma`` there, so ``delta_l`` times the chord is below
  ``delta_l sigma`` on the interval (and no linear function below a concave one on an
  interval lies above this one: the chord is the best choice).

Summed (Zhang et al., NeurIPS 2018, "Efficient Neural Network Robustness Certification with
General Activation Functions", for one hidden layer), with the slopes ``lambda_l`` and the
relaxation's loss at x, ``loss_l >= 0``:

    g(y) >= beta + (U^T lambda)^T (y - x),   beta = g(x) - sum_l loss_l     on S(R),

and its minimum over ``S(r)``, ``r <= R``, is ``beta - r ||U^T lambda||_q`` on the ball (its
box form: :mod:`.linear_min`). Class j therefore cannot overtake c within the radius where
that stays positive, ``rho_j = beta / ||U^T lambda||_q`` (the search takes
``min(rho_j, R)``): the contract of :func:`~.search.radius_search`, which finds the best
R. Unlike Theorem 2.1 with Proposition 2.3, the bound keeps the signs of ``delta_l``
across units: units whose gradients cancel in ``U^T lambda`` cancel in the certificate
too.

*Tangent points* (:class:`LinearRelaxation` ``tangent_steps``). Any ``t_l`` is sound.
``t = z(x)`` (no loss at x) is the default. A few fixed-point steps move ``t_l`` to the
pre-activation at the minimizer of the current linear bound at the certified radius (where
a tangent is exact), clipped into ``[lo_l, hi_l]``: the optimum of alpha-CROWN for one
hidden layer satisfies exactly this condition. Each step's radius is sound; the best one
(``t = z(x)`` included) is kept, so steps never make a certificate worse.

*Rounding* (:mod:`.rounding`: ``u``, ``FN_REL``, ``gamma_n``). What is certified is the
real function of the float64 weights at the float64 point. With ``zh`` the computed
pre-activations (the real ones within ``pad``, :meth:`~.softplus_bounds.NetTerms.pad`) the
relaxation is written about ``zh`` and every slope ``lambda_l`` is the float actually
computed, so each unit needs a real ``loss_l`` with

    delta_l sigma(z) >= delta_l sigma(zh_l) - loss_l + lambda_l (z - zh_l)  on [lo_l, hi_l]:

* chord units: the right-hand side minus the left is convex in z, so its maximum is at an
  endpoint: ``loss_l = max_{z in {lo, hi}} |delta_l| (sigma(z) - sigma(zh)) + lambda_l (z -
  zh)``, evaluated, whatever the computed slope (any slope is sound);
* tangent units: convexity at ``t`` with the real ``sigma'(t)`` gives ``loss_l = delta_l
  (sigma(zh) - sigma(t)) - lambda_l (zh - t) + e_l (hi - lo)``, ``e_l >= |delta_l sigma'(t)
  - lambda_l|`` (``8 FN_REL |lambda_l|`` plus an underflow term; ``t = zh`` makes the
  first part exactly 0);
* each evaluated expression is off by at most ``16 FN_REL`` times the sum of the
  magnitudes it combines (each softplus within ``2 FN_REL sigma + u |z|``, the
  1-Lipschitz softplus absorbing the rounding of its argument) plus ``8 |delta|
  2^-1000``; ``loss_l`` is that bound added and then clamped at 0.
* The relaxation about ``zh`` instead of the real ``z(x)`` costs ``sum (|delta| +
  |lambda|) pad`` (``sigma`` is 1-Lipschitz), the computed ``delta = fl(w_c - w_j)`` costs
  ``2 u sum |delta| (hi - lo)``; these and the losses are non-negative sums, inflated by
  ``1 + gamma_{H+4}``. At ``t = zh`` each unit's loss and spare are ``|delta_l|`` times a
  quantity of its point (:meth:`LinearRelaxation._losses`), so the sums are one matrix
  product of the pairs' ``|delta|`` with the points' quantities, inflated by ``1 +
  gamma_{3H+8}``; only the slopes ``lambda`` and ``U^T lambda`` are formed per row.
  ``g(x)`` enters as the rigorous lower bound of :func:`~.search.margins_lower` (for a
  PyTorch softplus net, minus its threshold gap).
* ``||U^T lambda - fl(U^T lambda)||_q <= gamma_{H+2} sum_l |lambda_l| ||u_l||_q`` plus the
  underflow floor ``tau`` of :class:`~.softplus_bounds.NetTerms`; :mod:`.linear_min` and
  :func:`.linear_min.quad_radius` take it from there.
* The interval ``[lo, hi]`` is ``zh -+ (pad + shift)`` widened by ``8 u (|zh| + pad +
  shift) + 2^-1000``, which covers the three roundings of its evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.softplus import softplus
from .linear_min import QuadLower, box_lower, dual_norm_lower, quad_radius
from .rounding import FN_REL, UNDERFLOW, UNIT, gamma
from .softplus_bounds import PreactivationRange


def tangent_units(delta: torch.Tensor) -> torch.Tensor:
    """Which units get a tangent (``delta_l > 0``, where ``delta_l sigma`` is convex); the
    others get the chord. (One place, so that the tests can show that swapping the choice
    is caught.)"""
    return delta > 0


class LinearRelaxation:
    """Per-class certified radii of the linear relaxation at R (module docstring), a radius
    function for :func:`~.search.radius_search`.

    ``rng``: the pre-activation ranges of the set (its ``p`` and ``box`` choose the norm and
    whether the box constrains); ``m`` (n, K): lower bounds on the margins ``f_c(x) -
    f_j(x)`` (``+inf`` at c); ``tangent_steps``: fixed-point steps on the tangent points
    (0: ``t = z(x)``). Calling ``(idx, R, need)`` returns (m, K) radii, ``+inf`` at c and
    where ``need`` is False.
    """

    def __init__(self, rng: PreactivationRange, m: torch.Tensor, tangent_steps: int = 0) -> None:
        self.rng, self.m = rng, m
        self.steps = tangent_steps
        terms = rng.terms
        self.U, self.W, self.alpha = terms.U, terms.W, terms.alpha
        h = terms.dims[0]
        self.unorm_q = terms.row_norms(rng.q)
        self.tau = terms.underflow_floor
        self.g_h = gamma(h + 2)
        self.sum_up = 1 + gamma(h + 4)
        # |delta| of every pair (c, j) on its tangent units, and on its chord units by the
        # sign of delta: (K, K, 3H), so that a row's losses at t = z(x) are one product
        diff = self.W[:, None, :] - self.W[None, :, :]  # fl(w_c - w_j), as each row has it
        dabs, tangent = diff.abs(), tangent_units(diff)
        chord = ~tangent
        self.pairs = torch.cat(
            [dabs * tangent, dabs * (chord & (diff < 0)), dabs * (chord & (diff > 0))], -1
        )
        self.pair_up = 1 + gamma(3 * h + 8)

    # ------------------------------------------------------------------ per point at R
    def __call__(self, idx: torch.Tensor, r: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        rng = self.rng
        zh, pad, lo, hi = rng.intervals(idx, r)
        a = self.alpha
        s_lo, s_hi, s_z = softplus(lo, a), softplus(hi, a), softplus(zh, a)
        d_lo, d_hi = torch.sigmoid(a * lo), torch.sigmoid(a * hi)
        width = hi - lo
        chord = ((s_hi - s_lo) / width).nan_to_num_(nan=0.0)
        chord = torch.minimum(torch.maximum(chord, d_lo), d_hi)  # between the end slopes
        slope = torch.sigmoid(a * zh)  # the tangents' at t = zh
        c = rng.pred[idx]
        sel = rng.not_pred[c] & need
        point, cls = sel.nonzero(as_tuple=True)
        delta = self.W[c[point]] - self.W[cls]  # (nr, H)
        tangent = tangent_units(delta)
        lam = delta * torch.where(tangent, slope[point], chord[point])
        # t = zh: every unit's loss is |delta_l| times a quantity of its point
        total, err = self._losses(
            c, point, cls, zh, pad, lo, hi, width, s_lo, s_hi, s_z, chord, slope
        )
        m_rows = self.m[idx[point], cls]
        x_rows = rng.x[idx[point]] if rng.box else None
        r_rows = r[point]
        rho, a_hat = self._bound(m_rows - total, lam, err, x_rows, r_rows)
        if self.steps:
            row = _Row(
                delta,
                tangent,
                *(v[point] for v in (zh, pad, lo, hi, width, s_lo, s_hi, s_z, chord)),
            )
            best = rho
            for _ in range(self.steps):
                t = self._next_tangents(row, a_hat, torch.minimum(rho, r_rows), x_rows)
                rho, a_hat = self._radius(row, t, m_rows, x_rows, r_rows)
                best = torch.maximum(best, rho)
            rho = best
        out = torch.full_like(self.m[idx], torch.inf)
        out[point, cls] = rho
        return out

    def _losses(self, c, point, cls, zh, pad, lo, hi, width, s_lo, s_hi, s_z, chord, slope):
        """``sum_l loss_l + spare_l`` of the module docstring (rounded up) and the bound on
        ``||U^T lambda - fl(U^T lambda)||_q`` of every row at ``t = zh`` (each (nr,)), from
        the points' quantities (m, H).

        With ``t = zh`` a unit's loss and spare are ``|delta_l|`` times a quantity of its
        point: ``A_l`` for a tangent (the slope error, ``8 FN_REL sigma'(zh)`` with room for
        the computed ``|lambda| <= |delta| sigma'(1 + u)``, times the width, ``2^-1000``
        terms and ``(1 + sigma') pad + 2u width``), and ``B_l`` for a chord, where
        ``lambda_l = fl(delta_l chord_l) = sign(delta_l) |delta_l| chord_l (1 + e)``, ``|e|
        <= u``: ``max_{z in {lo, hi}} (sigma(z) - sigma(zh)) + sign(delta_l) chord_l (z -
        zh)``, plus ``16 FN_REL`` times its magnitudes (which cover ``e``), ``8 2^-1000``,
        clamped at 0, plus ``(1 + chord) pad + 2u width``. So each row's sums are the
        products of its pair's ``|delta|`` on each kind of unit with its point's vectors
        (:attr:`pairs`): sums of ``3H`` non-negative products, inflated by ``1 +
        gamma_{3H+8}``; the computed slopes inside ``|lambda|`` and ``|lambda| ||u_l||_q`` by
        ``1 + 4u``."""
        spare_up = 1 + 4 * UNIT
        mag = s_lo + s_hi + 2 * s_z + lo.abs() + hi.abs() + 2 * zh.abs()
        reach = 2 * zh.abs() + lo.abs() + hi.abs()
        chord_up = chord * spare_up
        size = (mag + chord_up * reach).mul_(16 * FN_REL).add_(8 * UNDERFLOW)
        spare_c = (1 + chord_up) * pad + (2 * UNIT) * width
        ends = [(s_lo - s_z, lo - zh), (s_hi - s_z, hi - zh)]
        down = torch.maximum(*(rise - chord * run for rise, run in ends))
        up = torch.maximum(*(rise + chord * run for rise, run in ends))
        chord_neg = (down + size).clamp_min_(0.0) + spare_c
        chord_pos = (up + size).clamp_min_(0.0) + spare_c
        slope_up = slope * spare_up
        tangent = (slope_up * (8 * FN_REL)).add_(2 * UNDERFLOW).mul_(width).add_(8 * UNDERFLOW)
        tangent += (1 + slope_up) * pad + (2 * UNIT) * width
        unorm = self.unorm_q * spare_up
        vec_loss = torch.cat([tangent, chord_neg, chord_pos], -1)  # (m, 3H)
        vec_err = torch.cat([slope_up * unorm, chord_up * unorm, chord_up * unorm], -1)
        per_pair = torch.empty(2, len(c), self.pairs.shape[0], dtype=zh.dtype, device=zh.device)
        for k in c.unique():
            on = c == k
            per_pair[:, on] = torch.stack([vec_loss[on], vec_err[on]]) @ self.pairs[k].T
        per_pair.mul_(self.pair_up)
        total, lam_q = per_pair[:, point, cls]
        return total, lam_q.mul_(self.g_h).add_(self.tau)

    def _bound(self, beta, lam, err, x_rows, r_rows):
        """Certified radii (nr,) of the rows whose relaxation is ``beta + lam^T (z -
        zh)``, with ``||U^T lam - fl(U^T lam)||_q <= err`` (each (nr,)), and ``fl(U^T
        lambda)`` (nr, d)."""
        a_hat = lam @ self.U  # (nr, d)
        lowers: list[QuadLower] = [dual_norm_lower(a_hat, err, self.rng.q)]
        if x_rows is not None:
            lowers.append(box_lower(a_hat, err, x_rows, r_rows, self.rng.p))
        rho = torch.stack([quad_radius(beta, low) for low in lowers]).max(0).values
        return rho, a_hat

    # --------------------------------------------------------------------- per row
    def _radius(self, row: _Row, t, m_rows, x_rows, r_rows):
        """Certified radii (nr,) of the rows with tangent points ``t`` (nr, H), evaluated
        row by row, and ``fl(U^T lambda)`` (nr, d)."""
        a = self.alpha
        delta, dabs = row.delta, row.delta.abs()
        slope_t = torch.sigmoid(a * t)
        lam = delta * torch.where(row.tangent, slope_t, row.chord)
        lam_abs = lam.abs()
        # chord units: the worse end of the interval
        ends = []
        for z, s in ((row.lo, row.s_lo), (row.hi, row.s_hi)):
            ends.append(dabs * (s - row.s_z) + lam * (z - row.zh))
        chord_loss = torch.maximum(*ends)
        size = dabs * (row.s_lo + row.s_hi + 2 * row.s_z + row.lo.abs() + row.hi.abs())
        size += (dabs + lam_abs) * 2 * row.zh.abs() + lam_abs * (row.lo.abs() + row.hi.abs())
        chord_loss += size.mul_(16 * FN_REL)
        # tangent units: delta * Bregman distance, plus the slope error
        slope_err = (lam_abs * (8 * FN_REL)).add_(dabs, alpha=2 * UNDERFLOW)
        tangent_loss = slope_err * row.width
        s_t = softplus(t, a)
        gap = delta * (row.s_z - s_t) - lam * (row.zh - t)
        size = dabs * (row.s_z + s_t + row.zh.abs() + t.abs())
        size += lam_abs * (row.zh.abs() + t.abs())
        tangent_loss += gap + size.mul_(16 * FN_REL)
        loss = torch.where(row.tangent, tangent_loss, chord_loss).add_(dabs, alpha=8 * UNDERFLOW)
        loss.clamp_min_(0.0)
        spare = (dabs + lam_abs) * row.pad + dabs * row.width * (2 * UNIT)
        total = (loss.sum(-1) + spare.sum(-1)).mul_(self.sum_up)
        err = (lam_abs @ self.unorm_q).mul_(self.g_h).add_(self.tau)
        return self._bound(m_rows - total, lam, err, x_rows, r_rows)

    def _next_tangents(
        self, row: _Row, a_hat: torch.Tensor, r: torch.Tensor, x_rows: torch.Tensor | None
    ) -> torch.Tensor:
        """Tangent points at the pre-activations of the linear bound's minimizer over the
        ball of radius ``r`` (nr,) (clipped into the box when it constrains): the points
        where the tangents would be exact there, kept inside ``[lo, hi]``."""
        p = self.rng.p
        if p == 2:
            v = -a_hat / torch.linalg.vector_norm(a_hat, dim=-1, keepdim=True).clamp_min(1e-300)
        elif p == 1:
            v = torch.zeros_like(a_hat)
            k = a_hat.abs().argmax(-1, keepdim=True)
            v.scatter_(-1, k, -a_hat.gather(-1, k).sign())
        else:
            v = -a_hat.sign()
        v = v * r[:, None]
        if x_rows is not None:
            v = (x_rows + v).clamp_(0.0, 1.0) - x_rows
        z_star = row.zh + v @ self.U.T
        t = torch.minimum(torch.maximum(z_star, row.lo), row.hi)
        return torch.where(row.tangent, t, row.zh)


@dataclass
class _Row:
    """The per-row (point, class) quantities of one evaluation, each (nr, H): ``delta =
    w_c - w_j``, which units get a tangent, the computed pre-activations and their error,
    the interval ``[lo, hi]`` and its width, softplus at its ends and at ``zh``, and the
    chord's slope."""

    delta: torch.Tensor
    tangent: torch.Tensor
    zh: torch.Tensor
    pad: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    width: torch.Tensor
    s_lo: torch.Tensor
    s_hi: torch.Tensor
    s_z: torch.Tensor
    chord: torch.Tensor
