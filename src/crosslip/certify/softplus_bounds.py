"""Bounds on the local cross-Lipschitz constant of the one-hidden-layer softplus net.

Notation (Section 2.3): ``f_j(y) = sum_r w_jr sigma(<u_r, y> + b_r) + c_j`` with
``U`` (H, d) the rows ``u_r``, ``W`` (K, H), ``sigma' `` positive and increasing. For the
predicted class c and another class j let ``d = w_j - w_c`` (H,). Then

    grad f_j(y) - grad f_c(y) = U^T (d * sigma'(z(y))),   z(y) = U y + b.          (eq. 5)

Every bound here starts from a *pre-activation range*: over the set ``S`` of allowed y,
``z_r(y) in [z_r(x) - D-_r, z_r(x) + D+_r]``, hence, sigma' being increasing,

    sigma'(z_r(y)) in [s-_r, s+_r] = [sigma'(z_r - D-_r), sigma'(z_r + D+_r)].        (*)

* ``S = B_p(x, R)``: by Hoelder, ``|<u_r, y - x>| <= R ||u_r||_q``, so ``D+- = R ||u_r||_q``
  (attained for p = 2, as in the proof of Proposition 2.3).
* ``S = B_p(x, R) ∩ [0, 1]^d`` (perturbations that keep an image an image, Section 2.1's
  remark): additionally ``||y - x||_inf <= ||y - x||_p <= R``, so
  ``y_i - x_i in [l_i, h_i] = [max(-R, -x_i), min(R, 1 - x_i)]`` and
  ``D+_r <= sum_i max(u_ri h_i, u_ri l_i) = (U+ h - U- l)_r``,
  ``D-_r <= (U- h - U+ l)_r`` (``U+-`` the positive/negative parts). We take the smaller of
  this and ``R ||u_r||_q``. For p = inf this is exact.

Both ranges widen with R, so every bound below is non-decreasing in R, as
:func:`~crosslip.certify.search.theorem21` requires. Given (*), three bounds follow:

1. :class:`Prop23Bound` (p = q = 2), the paper's Proposition 2.3.
2. :class:`IntervalBound` (any p): coordinate-wise interval arithmetic on eq. 5.
3. :func:`global_bound` (p = 2): ``||w_c - w_j||_2 ||U||_2``, valid everywhere.

Their pointwise minimum is again a valid bound (:class:`MinBound`).
All bounds return shape (m, K) with 0 at ``j = c``; internally only the K - 1 other classes
are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

from ..models import SoftplusNet


def dual_exponent(p: float) -> float:
    """``q`` with ``1/p + 1/q = 1`` for p in {1, 2, inf}."""
    if p == 2:
        return 2.0
    if p == 1:
        return math.inf
    if math.isinf(p):
        return 1.0
    raise ValueError(f"p = {p}: only the 1-, 2- and inf-norms are supported")


@dataclass
class Rows:
    """The (point, class) pairs of one evaluation, flattened to rows.

    ``s_lo, s_hi`` (nr, H): the range (*) of the row's point; ``d`` (nr, H): ``w_j - w_c``;
    ``point`` (nr,) position of the row in the evaluated batch, ``cls`` (nr,) its class j;
    ``m`` the batch size.
    """

    s_lo: torch.Tensor
    s_hi: torch.Tensor
    d: torch.Tensor
    point: torch.Tensor
    cls: torch.Tensor
    m: int


class NetTerms:
    """The point-independent quantities of a net in one dtype, each computed when first
    needed and then shared by every batch and every range: ``U`` (H, d), ``W`` (K, H), ``b``,
    ``|U|``, the positive and negative parts of ``U^T``, ``|U U^T|``, the row norms
    ``||u_r||_q`` and the spectral norm ``||U||_2``."""

    def __init__(self, net: SoftplusNet, dtype: torch.dtype = torch.float64) -> None:
        self.U = net.U.detach().to(dtype)
        self.W = net.W.detach().to(dtype)
        self.b = net.hidden_bias().detach().to(dtype)
        self.alpha = net.alpha
        self._row_norms: dict[float, torch.Tensor] = {}

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """``z = U x + b`` (n, H) for ``x`` (n, d) in the terms' dtype."""
        return x @ self.U.T + self.b

    def row_norms(self, q: float) -> torch.Tensor:
        """``||u_r||_q`` (H,)."""
        if q not in self._row_norms:
            self._row_norms[q] = torch.linalg.vector_norm(self.U, ord=q, dim=1)
        return self._row_norms[q]

    @cached_property
    def abs_u(self) -> torch.Tensor:
        return self.U.abs()

    @cached_property
    def signed_parts_t(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U+)^T, (U-)^T`` (d, H), contiguous for the box ranges' products."""
        return self.U.clamp_min(0).T.contiguous(), (-self.U).clamp_min(0).T.contiguous()

    @cached_property
    def abs_gram(self) -> torch.Tensor:
        """``|U U^T|`` (H, H)."""
        return (self.U @ self.U.T).abs()

    @cached_property
    def spectral_norm(self) -> torch.Tensor:
        return torch.linalg.matrix_norm(self.U, ord=2)


class PreactivationRange:
    """The ranges ``[s-, s+]`` of (*) for a batch of points (module docstring).

    ``net``: the net or its :class:`NetTerms` (pass the terms to share their point-independent
    products between ranges); ``x`` (n, d), ``pred`` (n,); ``z`` (n, H), the pre-activations
    ``U x + b``, may be passed in when already computed. ``box=True`` intersects the ball
    with ``[0, 1]^d`` (the points must lie in the box). Calling ``(idx, R, need)`` with
    ``idx, R`` (m,) returns the :class:`Rows` of the classes ``j != c`` that ``need`` (m, K)
    asks for (all if None).
    """

    def __init__(
        self,
        net: SoftplusNet | NetTerms,
        x: torch.Tensor,
        pred: torch.Tensor,
        p: float = 2,
        box: bool = False,
        dtype: torch.dtype = torch.float64,
        z: torch.Tensor | None = None,
    ) -> None:
        self.terms = terms = net if isinstance(net, NetTerms) else NetTerms(net, dtype)
        self.U, self.W, self.alpha = terms.U, terms.W, terms.alpha
        self.p, self.q = p, dual_exponent(p)
        self.unorm = terms.row_norms(self.q)  # (H,)
        self.x = x.to(terms.U.dtype)
        self.z = terms.preactivation(self.x) if z is None else z  # (n, H)
        self.pred = pred
        self.num_classes = k = self.W.shape[0]
        self.not_pred = torch.ones(k, k, dtype=torch.bool, device=pred.device)
        self.not_pred.fill_diagonal_(False)  # row c: the classes j != c
        self.box = box
        if box:
            if torch.any(self.x < 0) or torch.any(self.x > 1):
                raise ValueError("box-constrained bounds need points inside [0, 1]^d")
            self.Up, self.Un = terms.signed_parts_t

    def shifts(self, idx: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``D-, D+`` (m, H): how far each pre-activation can fall / rise over the set."""
        ball = r[:, None] * self.unorm[None, :]
        if not self.box:
            return ball, ball
        x = self.x[idx]
        hi = torch.minimum(r[:, None], 1 - x)  # (m, d) largest coordinate step up
        lo = torch.maximum(-r[:, None], -x)  # most negative step
        up = hi @ self.Up - lo @ self.Un
        down = hi @ self.Un - lo @ self.Up
        return torch.minimum(ball, down), torch.minimum(ball, up)

    def __call__(
        self, idx: torch.Tensor, r: torch.Tensor, need: torch.Tensor | None = None
    ) -> Rows:
        down, up = self.shifts(idx, r)
        z = self.z[idx]
        s_lo = torch.sigmoid(self.alpha * (z - down))
        s_hi = torch.sigmoid(self.alpha * (z + up))
        c = self.pred[idx]
        sel = self.not_pred[c]
        if need is not None:
            sel = sel & need
        point, cls = sel.nonzero(as_tuple=True)
        d = self.W[cls] - self.W[c[point]]
        return Rows(s_lo[point], s_hi[point], d, point, cls, len(idx))

    def full(self, rows: Rows, values: torch.Tensor) -> torch.Tensor:
        """Scatter row values (nr,) into (m, K), 0 elsewhere (``j = c`` and skipped j)."""
        out = values.new_zeros(rows.m, self.num_classes)
        out[rows.point, rows.cls] = values
        return out


class Prop23Bound:
    """Proposition 2.3 (p = q = 2), evaluated exactly, with biases and any range (*).

    Paper: with ``beta_rm = d_r d_m <u_r, u_m>``,
    ``L_j(R)^2 = sum_rm max(beta_rm, 0) s+_r s+_m + min(beta_rm, 0) s-_r s-_m``.
    Proof sketch: eq. 5 gives ``||grad f_j - grad f_c||^2 = sum_rm beta_rm sigma'_r sigma'_m``;
    by (*) and ``sigma' > 0`` each term is at most ``beta s+ s+`` if ``beta >= 0`` and at most
    ``beta s- s-`` if ``beta < 0``.

    Evaluation without any (H, H) tensor per point: write ``max(beta, 0) = (beta + |beta|)/2``,
    ``min(beta, 0) = (beta - |beta|)/2``, ``|beta_rm| = |d_r| |d_m| |G_rm|`` with
    ``G = U U^T``, and ``sum_rm beta_rm a_r a_m = ||U^T (d * a)||^2``. Then

        2 L_j^2 = ||U^T (d s+)||^2 + (|d| s+)^T |G| (|d| s+)
                + ||U^T (d s-)||^2 - (|d| s-)^T |G| (|d| s-),

    i.e. per evaluation two (rows, H) x (H, H) and two (rows, H) x (H, d) products, one row
    per point and class j != c still needed by the search (``supports_mask``).
    ``|G|`` does not depend on the point: computed once per :class:`NetTerms`.
    """

    supports_mask = True

    def __init__(self, rng: PreactivationRange) -> None:
        if rng.p != 2:
            raise ValueError("Proposition 2.3 is the p = 2 bound")
        self.rng = rng
        self.Gabs = rng.terms.abs_gram

    def parts(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``2 L^2`` (nr,) and ``U^T (d s+)``, ``U^T (d s-)`` (nr, d), which
        :class:`IntervalBound` reuses."""
        dabs = rows.d.abs()
        ga, gb = (rows.d * rows.s_hi) @ self.rng.U, (rows.d * rows.s_lo) @ self.rng.U
        ea, eb = dabs * rows.s_hi, dabs * rows.s_lo
        twice = (
            (ga * ga).sum(-1)
            + ((ea @ self.Gabs) * ea).sum(-1)
            + (gb * gb).sum(-1)
            - ((eb @ self.Gabs) * eb).sum(-1)
        )
        return twice, ga, gb

    def __call__(self, idx: torch.Tensor, r: torch.Tensor, need=None) -> torch.Tensor:
        rows = self.rng(idx, r, need)
        return self.rng.full(rows, (0.5 * self.parts(rows)[0]).clamp_min(0).sqrt())


class IntervalBound:
    """Coordinate-wise interval bound, any p (dual norm q).

    By eq. 5, ``g_i = sum_r d_r u_ri sigma'_r`` with ``sigma'_r in [s-_r, s+_r]`` (*).
    Write ``sigma'_r = m_r + t_r e_r``, ``m = (s+ + s-)/2``, ``e = (s+ - s-)/2 >= 0``,
    ``|t_r| <= 1``. Then ``g_i = (U^T (d m))_i + sum_r d_r u_ri e_r t_r`` and

        |g_i| <= |(U^T (d m))_i| + (|U|^T (|d| e))_i =: B_i,

    so ``||grad f_j - grad f_c||_q <= ||B||_q`` (the q-norm is monotone in |g_i|). Two
    (rows, H) x (H, d) products per evaluation (one when Proposition 2.3 is computed at
    the same R, whose ``U^T (d s+-)`` give ``U^T (d m)`` for free).
    """

    supports_mask = True

    def __init__(self, rng: PreactivationRange) -> None:
        self.rng = rng
        self.Uabs = rng.terms.abs_u

    def from_centre(self, centre: torch.Tensor, rows: Rows) -> torch.Tensor:
        """``||B||_q`` (nr,) given ``U^T (d m)`` (nr, d)."""
        spread = rows.d.abs() * (0.5 * (rows.s_hi - rows.s_lo))
        bound = centre.abs() + spread @ self.Uabs
        return torch.linalg.vector_norm(bound, ord=self.rng.q, dim=-1)

    def __call__(self, idx: torch.Tensor, r: torch.Tensor, need=None) -> torch.Tensor:
        rows = self.rng(idx, r, need)
        centre = (rows.d * (0.5 * (rows.s_hi + rows.s_lo))) @ self.rng.U
        return self.rng.full(rows, self.from_centre(centre, rows))


def global_bound(
    net: SoftplusNet,
    pred: torch.Tensor,
    dtype: torch.dtype = torch.float64,
    spectral_norm: torch.Tensor | None = None,
) -> torch.Tensor:
    """Global cross-Lipschitz constants ``||w_c - w_j||_2 ||U||_2`` (Section 5), (n, K).

    Valid for every y because ``0 < sigma' <= 1``: ``||U^T (d sigma')||_2 <=
    ||U||_2 ||d sigma'||_2 <= ||U||_2 ||d||_2``. ``spectral_norm`` (``||U||_2``) may be
    passed in so that it is computed once.
    """
    W = net.W.detach().to(dtype)
    spec = spectral_norm
    if spec is None:
        spec = torch.linalg.matrix_norm(net.U.detach().to(dtype), ord=2)
    return (W[pred][:, None, :] - W[None, :, :]).norm(dim=-1) * spec


class MinBound:
    """The tightest L2 bound we can prove: ``min(Prop. 2.3, interval, global)`` per class.

    Each is a valid upper bound on the same maximum, so their minimum is one too; each is
    non-decreasing in R, so the minimum is. Proposition 2.3 and the interval bound share
    their products (three (H, d) and two (H, H) products per row and evaluation in all).
    """

    supports_mask = True

    def __init__(self, rng: PreactivationRange, global_lip: torch.Tensor) -> None:
        self.prop23 = Prop23Bound(rng)
        self.interval = IntervalBound(rng)
        self.rng = rng
        self.global_lip = global_lip  # (n, K)

    def __call__(self, idx: torch.Tensor, r: torch.Tensor, need=None) -> torch.Tensor:
        rows = self.rng(idx, r, need)
        twice, ga, gb = self.prop23.parts(rows)
        local = (0.5 * twice).clamp_min(0).sqrt()
        inter = self.interval.from_centre(0.5 * (ga + gb), rows)
        glob = self.global_lip[idx][rows.point, rows.cls]
        return self.rng.full(rows, torch.minimum(torch.minimum(local, inter), glob))
