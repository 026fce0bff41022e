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

Rounding (constants in :mod:`.rounding`: ``u = 2^-53``, ``gamma_n``, ``FN_REL``). Every
bound is an upper bound for the *real* function of the float64 weights at the float64 point,
although it is computed in float64:

* *Pre-activations.* ``fl(U x + b)`` is within ``ez_r = gamma_{d+1} (||x||_2 ||u_r||_2 +
  |b_r|)`` of ``z_r`` (Cauchy-Schwarz on ``sum_i |u_ri x_i|``). The ranges (*) are taken
  from ``z - pad`` and ``z + pad``, ``pad = 2 ez + 8 u |z| + 2^-1000``
  (:meth:`NetTerms.pad`), which also absorbs the three roundings on the way to the
  argument ``alpha (z +- D)``; the shifts ``D`` are inflated by ``1 + 2 gamma_{d+4}`` (row
  norms; the box's products as :meth:`PreactivationRange.shifts` says). ``sigmoid`` is then
  multiplied by ``1 +- 2 FN_REL``, values below ``2^-990`` are raised to it (upper ends) or
  set to 0 (lower ends), and upper ends are capped at 1 (``sigma' < 1``). So ``[s-, s+]`` contains
  every real ``sigma'(z_r(y))``, and each formula below, evaluated *exactly* on these
  inputs, is a valid bound.
* *The formulas' own rounding* is bounded by a multiple of
  ``nu_q = sum_r |d_r| s+_r ||u_r||_q``, which dominates every term that cancels:
  Proposition 2.3 adds ``16 (d + H + 8) u nu_2^2`` to ``2 L^2`` (:class:`Prop23Bound`), the
  interval bound adds ``kappa nu_q`` with ``kappa = 2 gamma_{d+H+8}``
  (:class:`IntervalBound`), and the global bound uses a verified ``||U||_2``
  (:func:`~.rounding.spectral_norm_upper`).
* *Underflow* adds at most ``tau`` (:meth:`NetTerms.underflow_floor`, about 1e-150 for the
  paper's nets) to any bound. Classes whose gradient difference vanishes identically
  (:attr:`NetTerms.vanishing`) are recognized from the weights and get ratio ``inf`` in the
  search, whatever the (then only rounding-sized) bound.

The relative error terms are about ``(d + H) u nu^2 / L^2``: below 1e-9 relative for the
paper's nets, far below the search tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

from ..models import SoftplusNet
from ..models.softplus import softplus
from ..norms import dual_exponent
from .rounding import FN_REL, SIGMA_FLOOR, UNDERFLOW, UNIT, gamma, spectral_norm_upper


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
    """The point-independent quantities of a net in float64, each computed when first
    needed and then shared by every batch and every range: ``U`` (H, d), ``W`` (K, H), ``b``,
    the output bias ``c`` (K,), ``|U|``, ``|W|``, the positive and negative parts of
    ``U^T``, ``|U U^T|``, the row norms ``||u_r||_q`` (and inflated ones that cover their
    rounding), a verified upper bound on the spectral norm ``||U||_2``, the classes whose
    gradient differences vanish identically, and the underflow floor."""

    def __init__(self, net: SoftplusNet, dtype: torch.dtype = torch.float64) -> None:
        self.U = net.U.detach().to(dtype)
        self.W = net.W.detach().to(dtype)
        self.b = net.hidden_bias().detach().to(dtype)
        bias = net.output_layer.bias
        self.c = (
            torch.zeros(self.W.shape[0], dtype=dtype, device=self.W.device)
            if bias is None
            else bias.detach().to(dtype)
        )
        self.alpha = net.alpha
        #: PyTorch's softplus threshold of a
        #: :class:`~crosslip.models.torch_softplus.TorchSoftplusNet` (None for crosslip's exact
        #: softplus nets).
        self.threshold: float | None = getattr(net, "threshold", None)
        self._row_norms: dict[float, torch.Tensor] = {}
        self._row_norms_up: dict[float, torch.Tensor] = {}

    @property
    def dims(self) -> tuple[int, int]:
        """``(H, d)``."""
        return self.U.shape[0], self.U.shape[1]

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """``z = U x + b`` (n, H) for ``x`` (n, d) in the terms' dtype."""
        return x @ self.U.T + self.b

    def pad(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``pad = 2 ez + 8 u |z| + 2^-1000`` (n, H): covers the forward error
        ``ez_r = gamma_{d+1} (||x||_2 ||u_r||_2 + |b_r|)`` of the computed ``z = fl(U x + b)``
        (Higham's bound, with ``sum_i |u_ri x_i| <= ||u_r||_2 ||x||_2``), the rounding of
        ``alpha (z +- D)`` and underflow (module docstring)."""
        d = self.dims[1]
        ez = torch.outer(torch.linalg.vector_norm(x, dim=1), self.row_norms(2))
        ez.add_(self.b.abs()).mul_(2 * gamma(d + 1))
        return ez.add_(z.abs(), alpha=8 * UNIT).add_(UNDERFLOW)

    def logits(
        self, x: torch.Tensor, z: torch.Tensor, pad: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``f(x)`` (n, K) from the pre-activations ``z`` (n, H) and bounds ``e``
        (n, K) on their forward error, ``|logits_j - f_j(x)| <= e_j`` for the real function.

        ``sigma_r = softplus(z_r)`` is 1-Lipschitz, so the error of ``z`` and of
        ``fl(alpha z)`` moves it by at most ``ez_r + u |z_r| <= pad_r``; ``logaddexp`` and
        the division by alpha add ``2 FN_REL sigma_r`` relative and 2^-1000 absolute; the
        output layer adds ``gamma_{H+1} (sum_r |w_jr| sigma_r + |c_j|)``. Hence
        ``e_j = (|W| ((gamma_{H+1} + 2 FN_REL) sigma + pad + 2^-1000))_j + gamma_{H+1}
        |c_j|``, doubled for the rounding of its own evaluation (nonnegative terms, relative
        error ``gamma_{H+2}``). Cost: one (n, H) x (H, K) product more than the logits.
        """
        h, _ = self.dims
        pad = self.pad(x, z) if pad is None else pad
        sig = softplus(z, self.alpha)
        logits = torch.addmm(self.c, sig, self.W.T)
        g = gamma(h + 1)
        spread = (sig * (g + 2 * FN_REL)).add_(pad).add_(UNDERFLOW)
        err = torch.addmm(self.c.abs() * g, spread, self.abs_w.T).mul_(2.0).add_(UNDERFLOW)
        return logits, err

    def row_norms(self, q: float) -> torch.Tensor:
        """``||u_r||_q`` (H,), as computed."""
        if q not in self._row_norms:
            self._row_norms[q] = torch.linalg.vector_norm(self.U, ord=q, dim=1)
        return self._row_norms[q]

    def row_norms_up(self, q: float) -> torch.Tensor:
        """``||u_r||_q (1 + 2 gamma_{d+4})`` (H,): at least the real norm, with room for the
        roundings of ``R ||u_r||_q`` and of the sums it enters (module docstring)."""
        if q not in self._row_norms_up:
            self._row_norms_up[q] = self.row_norms(q) * (1 + 2 * gamma(self.dims[1] + 4))
        return self._row_norms_up[q]

    @cached_property
    def abs_u(self) -> torch.Tensor:
        return self.U.abs()

    @cached_property
    def abs_w(self) -> torch.Tensor:
        return self.W.abs()

    @cached_property
    def box_parts_t(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``|U|^T, U^T`` (d, H), contiguous for the box ranges' products."""
        return self.abs_u.T.contiguous(), self.U.T.contiguous()

    @cached_property
    def gram(self) -> torch.Tensor:
        """``fl(U U^T)`` (H, H), within ``gamma_d ||u_r|| ||u_m||`` of ``U U^T``."""
        return self.U @ self.U.T

    @cached_property
    def abs_gram(self) -> torch.Tensor:
        """``|U U^T|`` (H, H)."""
        return self.gram.abs()

    @cached_property
    def spectral_norm(self) -> torch.Tensor:
        """A verified upper bound on ``||U||_2`` (:func:`~.rounding.spectral_norm_upper`)."""
        return spectral_norm_upper(self.U).to(self.U.device)

    @cached_property
    def vanishing(self) -> torch.Tensor:
        """(K, K) bool: ``[c, j]`` is True when ``grad f_c(y) - grad f_j(y) = U^T (d *
        sigma'(z(y)))`` is zero for *every* y because ``d_r = w_jr - w_cr`` is zero wherever
        ``u_r != 0`` (exact comparisons of the weights: tied output weights, ``U = 0``, or
        both). Then ``f_c - f_j`` is constant and no bound needs evaluating."""
        live = (self.U != 0).any(1)  # (H,)
        differ = self.W[:, None, :] != self.W[None, :, :]  # (K, K, H)
        return ~(differ & live).any(-1)

    @cached_property
    def threshold_gap(self) -> torch.Tensor:
        """(K, K): ``[c, j]`` is an upper bound on ``|(g_c - g_j)(y) - (f_c - f_j)(y)|`` for
        every y, where ``f`` is the exact softplus net of the weights (what every bound here
        is about) and ``g`` the same weights with PyTorch's thresholded softplus (the
        function a :class:`~crosslip.models.torch_softplus.TorchSoftplusNet` computes); 0 for
        crosslip's own nets (no threshold).

        ``nn.Softplus(beta, threshold)`` returns ``z`` where ``beta z > threshold`` and the
        exact softplus elsewhere, and ``softplus(z) - z = log1p(exp(-beta z)) / beta`` falls
        with z, so ``0 <= sigma(z_r) - sigma_torch(z_r) <= eps = log1p(exp(-threshold)) /
        beta`` for every unit and every y (whichever side of the switch it is). Hence
        ``(g_c - g_j) - (f_c - f_j) = sum_r (w_cr - w_jr)(sigma_torch - sigma)(z_r)`` is at
        most ``eps ||w_c - w_j||_1`` in absolute value; output biases cancel.

        Rounding: ``exp``, ``log1p`` each within ``FN_REL`` relative (``log1p`` is concave
        with ``log1p(0) = 0``, so a relative error of its argument passes through at most
        unchanged) and the division within ``u``: ``eps (1 + 4 FN_REL) + 2^-1000`` is above
        the real ``eps`` (the absolute term covers ``exp`` underflowing for huge
        thresholds). The 1-norm of the computed differences (each within ``u``, summed
        within ``gamma_H``) and the product are covered by ``1 + 2 gamma_{H+3}``. An
        ``exp`` that overflows (threshold below about -709) gives ``inf``: no certificate.
        """
        k = self.W.shape[0]
        if self.threshold is None:
            return torch.zeros(k, k, dtype=self.W.dtype, device=self.W.device)
        h = self.dims[0]
        eps = math.log1p(math.exp(-self.threshold)) if self.threshold > -709 else math.inf
        eps = eps / self.alpha * (1 + 4 * FN_REL) + UNDERFLOW
        l1 = (self.W[:, None, :] - self.W[None, :, :]).abs().sum(-1)  # (K, K)
        gap = l1 * (eps * (1 + 2 * gamma(h + 3)))
        return gap.fill_diagonal_(0.0)

    @cached_property
    def underflow_floor(self) -> float:
        """``tau = 2^-520 sqrt(8 (d + 1) H^2 (1 + D)^2 (1 + V)^2 (1 + G))`` with ``D = 2
        max|W|``, ``V = max|U|``, ``G = max_r ||u_r||_2^2``: added to every bound, it covers
        the absolute errors (each below ``2^-1074``) of the products that may underflow.

        Each bound is the square root (or a q-norm) of sums of products of at most four
        factors bounded by ``D``, ``V``, ``G`` or ``s <= 1``; an underflow error ``eta`` in
        one product reaches ``2 L^2`` multiplied by at most ``2 d H (1 + D)(1 + V)^2`` (via
        ``||U^T (d s)||^2``) or ``H (1 + D)(1 + G)`` (via the ``|G|`` terms), and there are
        fewer than ``(d + 1) H^2`` such products, so the total is below ``C eta`` with the
        ``C`` above and ``L`` grows by at most ``sqrt(C eta) < tau``. The same ``tau``
        dominates the q-norms of the interval bound (``sqrt(d eta)`` or ``d H (1 + V)
        eta``). For the paper's nets ``tau`` is about 1e-150."""
        h, d = self.dims
        dmax = 2 * float(self.W.abs().max()) if self.W.numel() else 0.0
        vmax = float(self.U.abs().max()) if self.U.numel() else 0.0
        gmax = float(self.row_norms(2).max() ** 2) if self.U.numel() else 0.0
        big = 8.0 * (d + 1) * h * h * (1 + dmax) ** 2 * (1 + vmax) ** 2 * (1 + gmax)
        return 2.0**-520 * math.sqrt(big)


class PreactivationRange:
    """The ranges ``[s-, s+]`` of (*) for a batch of points (module docstring), rounded
    outward so that they contain every real ``sigma'(z_r(y))``.

    ``net``: the net or its :class:`NetTerms` (pass the terms to share their point-independent
    products between ranges); ``x`` (n, d), ``pred`` (n,); ``z`` (n, H), the pre-activations
    ``U x + b``, and ``pad`` (n, H), :meth:`NetTerms.pad`, may be passed in when already
    computed. ``box=True`` intersects the ball with ``[0, 1]^d`` (the points must lie in the
    box). Calling ``(idx, R, need)`` with ``idx, R`` (m,) returns the :class:`Rows` of the
    classes ``j != c`` that ``need`` (m, K) asks for (all if None).
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
        pad: torch.Tensor | None = None,
    ) -> None:
        self.terms = terms = net if isinstance(net, NetTerms) else NetTerms(net, dtype)
        self.U, self.W, self.alpha = terms.U, terms.W, terms.alpha
        self.p, self.q = p, dual_exponent(p)
        self.unorm = terms.row_norms_up(self.q)  # (H,), rounded up
        self.x = x.to(terms.U.dtype)
        z = terms.preactivation(self.x) if z is None else z  # (n, H)
        pad = terms.pad(self.x, z) if pad is None else pad
        self.z, self.pad = z, pad  # computed pre-activations and how far the real ones lie
        self.z_lo, self.z_hi = z - pad, z + pad  # the real z lies in between
        self.pred = pred
        self.num_classes = k = self.W.shape[0]
        self.not_pred = torch.ones(k, k, dtype=torch.bool, device=pred.device)
        self.not_pred.fill_diagonal_(False)  # row c: the classes j != c
        self.box = box
        if box:
            if torch.any(self.x < 0) or torch.any(self.x > 1):
                raise ValueError("box-constrained bounds need points inside [0, 1]^d")
            self.abs_t, self.u_t = terms.box_parts_t
            self.box_up = 1 + 4 * gamma(terms.dims[1] + 2)

    def shifts(self, idx: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``D-, D+`` (m, H): how far each pre-activation can fall / rise over the set
        (rounded up).

        In the box, with the largest steps up ``a = min(R, 1 - x)`` and down ``b = min(R,
        x)`` of each coordinate (both >= 0), ``D+ = a^T U+ + b^T U-`` and ``D- = a^T U- +
        b^T U+`` (``U+``, ``U-`` the positive and negative parts), which are ``(S +- T) /
        2`` with ``S = (a + b)^T |U|`` and ``T = (a - b)^T U``: two products instead of four.
        *Rounding*: ``fl(1 - x)`` is within ``u`` relative of ``1 - x``; ``S`` (non-negative
        terms) is within ``gamma_{d+2}`` relative, and ``T`` within ``gamma_{d+2} S`` of its
        real value (``|a - b| <= a + b``), so ``2 D+- <= T' + (1 + 3 gamma_{d+2}) S'`` for
        the computed ``S'``, ``T'``. ``S'`` is multiplied by ``1 + 4 gamma_{d+2}``; the sum,
        non-negative in real arithmetic, by ``1 + 4u`` for its own rounding and the
        product's; 2^-1000 is added for underflow."""
        ball = r[:, None] * self.unorm[None, :]
        if not self.box:
            return ball, ball
        x = self.x[idx]
        a = torch.minimum(r[:, None], 1 - x)  # (m, d) largest coordinate step up
        b = torch.minimum(r[:, None], x)  # largest step down
        spread = ((a + b) @ self.abs_t).mul_(self.box_up)
        tilt = (a - b) @ self.u_t
        up = (spread + tilt).mul_(0.5 * (1 + 4 * UNIT)).add_(UNDERFLOW)
        down = (spread - tilt).mul_(0.5 * (1 + 4 * UNIT)).add_(UNDERFLOW)
        return torch.minimum(ball, down), torch.minimum(ball, up)

    def intervals(
        self, idx: torch.Tensor, r: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``zh, pad, lo, hi`` (m, H) of the points ``idx`` at radii ``r`` (m,): the computed
        pre-activations, their error, and an interval that contains every real ``z_l(y)``
        for y in the set, its ends widened by the rounding of their own sums (the linear
        relaxation's and the curvature bound's unit ranges)."""
        down, up = self.shifts(idx, r)
        zh, pad = self.z[idx], self.pad[idx]
        widen = (zh.abs() + pad + torch.maximum(down, up)).mul_(8 * UNIT).add_(UNDERFLOW)
        return zh, pad, zh - pad - down - widen, zh + pad + up + widen

    def __call__(
        self, idx: torch.Tensor, r: torch.Tensor, need: torch.Tensor | None = None
    ) -> Rows:
        down, up = self.shifts(idx, r)
        s_lo = torch.sigmoid(self.alpha * (self.z_lo[idx] - down)).mul_(1 - 2 * FN_REL)
        s_lo = s_lo.masked_fill_(s_lo < SIGMA_FLOOR, 0.0)
        s_hi = torch.sigmoid(self.alpha * (self.z_hi[idx] + up)).mul_(1 + 2 * FN_REL)
        s_hi = s_hi.clamp_(SIGMA_FLOOR, 1.0)
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
    by (*) and ``sigma' >= 0`` each term is at most ``beta s+ s+`` if ``beta >= 0`` and at most
    ``beta s- s-`` if ``beta < 0`` (valid for any ``0 <= s- <= sigma' <= s+``).

    Evaluation without any (H, H) tensor per point: write ``max(beta, 0) = (beta + |beta|)/2``,
    ``min(beta, 0) = (beta - |beta|)/2``, ``|beta_rm| = |d_r| |d_m| |G_rm|`` with
    ``G = U U^T``, and ``sum_rm beta_rm a_r a_m = ||U^T (d * a)||^2``. Then

        2 L_j^2 = ||U^T (d s+)||^2 + (|d| s+)^T |G| (|d| s+)
                + ||U^T (d s-)||^2 - (|d| s-)^T |G| (|d| s-)  =:  A + B + C - D,

    i.e. per evaluation two (rows, H) x (H, H) and two (rows, H) x (H, d) products, one row
    per point and class j != c still needed by the search (``supports_mask``).
    ``|G|`` does not depend on the point: computed once per :class:`NetTerms`.

    *Rounding.* With ``nu = sum_r |d_r| s+_r ||u_r||_2``: ``||U^T (d s)||_2 <= nu`` and
    ``|G_rm| <= ||u_r|| ||u_m||`` give ``A, B, C, D <= nu^2``. The computed ``U^T (d s)``
    is within ``gamma_{H+2} |U|^T (|d| s)`` (2-norm ``<= gamma_{H+2} nu``) of the real one,
    so ``|A_hat - A| <= (gamma_d + 2 gamma_{H+2}) nu^2``; ``fl(G)`` is within
    ``gamma_d ||u_r|| ||u_m||`` of ``G`` and the two nested sums of non-negative terms add
    ``gamma_{2H+5}``, so ``|B_hat - B| <= (gamma_{2H+5} + gamma_d) nu^2``; the same for C and
    D, and the three additions add ``12 u nu^2``. In all ``|2 L^2_hat - 2 L^2| <=
    (4 d + 8 H + 30) u nu^2 (1 + O(u))``; we add ``16 (d + H + 8) u nu_hat^2`` (a factor
    ~2 to spare for the rounding of ``nu_hat`` and of the sum), take the square root, round
    it up by ``1 + 4u`` and add the underflow floor ``tau``.
    """

    supports_mask = True

    def __init__(self, rng: PreactivationRange) -> None:
        if rng.p != 2:
            raise ValueError("Proposition 2.3 is the p = 2 bound")
        self.rng = rng
        self.Gabs = rng.terms.abs_gram
        self.unorm2 = rng.terms.row_norms(2)
        h, d = rng.terms.dims
        self.err = 16.0 * (d + h + 8) * UNIT
        self.tau = rng.terms.underflow_floor

    def parts(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``2 L^2`` as computed (nr,), ``U^T (d s+)``, ``U^T (d s-)`` (nr, d), which
        :class:`IntervalBound` reuses, and ``nu`` (nr,)."""
        dabs = rows.d.abs()
        ga, gb = (rows.d * rows.s_hi) @ self.rng.U, (rows.d * rows.s_lo) @ self.rng.U
        ea, eb = dabs * rows.s_hi, dabs * rows.s_lo
        twice = (
            (ga * ga).sum(-1)
            + ((ea @ self.Gabs) * ea).sum(-1)
            + (gb * gb).sum(-1)
            - ((eb @ self.Gabs) * eb).sum(-1)
        )
        return twice, ga, gb, ea @ self.unorm2

    def upper(self, twice: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
        """``L`` (nr,) from the computed ``2 L^2`` and ``nu``, rounding errors included."""
        total = torch.addcmul(twice, nu, nu, value=self.err).mul_(0.5).clamp_min_(0)
        return total.sqrt_().mul_(1 + 4 * UNIT).add_(self.tau)

    def __call__(self, idx: torch.Tensor, r: torch.Tensor, need=None) -> torch.Tensor:
        rows = self.rng(idx, r, need)
        twice, _, _, nu = self.parts(rows)
        return self.rng.full(rows, self.upper(twice, nu))


class IntervalBound:
    """Coordinate-wise interval bound, any p (dual norm q).

    By eq. 5, ``g_i = sum_r d_r u_ri sigma'_r`` with ``sigma'_r in [s-_r, s+_r]`` (*).
    Write ``sigma'_r = m_r + t_r e_r``, ``m = (s+ + s-)/2``, ``e = (s+ - s-)/2 >= 0``,
    ``|t_r| <= 1``. Then ``g_i = (U^T (d m))_i + sum_r d_r u_ri e_r t_r`` and

        |g_i| <= |(U^T (d m))_i| + (|U|^T (|d| e))_i =: B_i,

    so ``||grad f_j - grad f_c||_q <= ||B||_q`` (the q-norm is monotone in |g_i|). Two
    (rows, H) x (H, d) products per evaluation (one when Proposition 2.3 is computed at
    the same R, whose ``U^T (d s+-)`` give ``U^T (d m)`` for free).

    *Rounding.* Any centre works if the half-width covers the range around it, so the
    computed ``m`` (off by ``u m``) costs at most ``u (|U|^T (|d| s+))_i``; the computed
    centre is within ``gamma_{H+3} (|U|^T (|d| s+))_i`` of ``U^T (d m)``, the spread (sums
    of non-negative terms) within ``gamma_{H+2}`` relative, the q-norm within ``gamma_{d+1}``
    relative, and ``||(|U|^T (|d| s+))||_q <= nu_q = sum_r |d_r| s+_r ||u_r||_q``. So the
    real ``||B||_q <= (||B||_q,hat + kappa nu_q)(1 + kappa)`` with ``kappa = 2
    gamma_{d+H+8}``; we add the underflow floor ``tau``.
    """

    supports_mask = True

    def __init__(self, rng: PreactivationRange) -> None:
        self.rng = rng
        self.Uabs = rng.terms.abs_u
        self.unorm_q = rng.terms.row_norms(rng.q)
        h, d = rng.terms.dims
        self.kappa = 2 * gamma(d + h + 8)
        self.tau = rng.terms.underflow_floor

    def from_centre(
        self, centre: torch.Tensor, rows: Rows, nu: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The bound (nr,), rounding included, given ``U^T (d m)`` (nr, d) as computed and
        ``nu_q`` (nr,) (computed here when None)."""
        dabs = rows.d.abs()
        spread = dabs * (0.5 * (rows.s_hi - rows.s_lo))
        bound = centre.abs() + spread @ self.Uabs
        norm = torch.linalg.vector_norm(bound, ord=self.rng.q, dim=-1)
        if nu is None:
            nu = (dabs * rows.s_hi) @ self.unorm_q
        return norm.add_(nu, alpha=self.kappa).mul_(1 + self.kappa).add_(self.tau)

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
    """Global cross-Lipschitz constants ``||w_c - w_j||_2 ||U||_2`` (Section 5), (n, K),
    rounded up.

    Valid for every y because ``0 < sigma' <= 1``: ``||U^T (d sigma')||_2 <=
    ||U||_2 ||d sigma'||_2 <= ||U||_2 ||d||_2``. ``spectral_norm``, an upper bound on
    ``||U||_2``, may be passed in so that it is computed once (default: the verified bound
    :func:`~.rounding.spectral_norm_upper`). Rounding: ``||d||_2`` is computed within
    ``gamma_{H+2}`` relative and, where squares underflow, ``sqrt(H) 2^-537`` absolute; we
    add ``sqrt(H) 2^-530`` and multiply by ``1 + 2 gamma_{H+4}``.
    """
    W = net.W.detach().to(dtype)
    spec = spectral_norm
    if spec is None:
        spec = spectral_norm_upper(net.U).to(W.device)
    h = W.shape[1]
    dnorm = (W[pred][:, None, :] - W[None, :, :]).norm(dim=-1)
    return (dnorm + math.sqrt(h) * 2.0**-530) * (spec * (1 + 2 * gamma(h + 4)))


class MinBound:
    """The tightest L2 bound we can prove: ``min(Prop. 2.3, interval, global)`` per class.

    Each is a valid upper bound on the same maximum, so their minimum is one too; each is
    non-decreasing in R, so the minimum is. Proposition 2.3 and the interval bound share
    their products (three (H, d) and two (H, H) products per row and evaluation in all) and
    ``nu``. ``interval=False`` leaves the interval bound out (one (H, d) product less).
    """

    supports_mask = True

    def __init__(
        self, rng: PreactivationRange, global_lip: torch.Tensor, interval: bool = True
    ) -> None:
        self.prop23 = Prop23Bound(rng)
        self.interval = IntervalBound(rng) if interval else None
        self.rng = rng
        self.global_lip = global_lip  # (n, K)

    def __call__(self, idx: torch.Tensor, r: torch.Tensor, need=None) -> torch.Tensor:
        rows = self.rng(idx, r, need)
        twice, ga, gb, nu = self.prop23.parts(rows)
        local = self.prop23.upper(twice, nu)
        glob = self.global_lip[idx][rows.point, rows.cls]
        if self.interval is not None:
            local = torch.minimum(local, self.interval.from_centre(0.5 * (ga + gb), rows, nu))
        return self.rng.full(rows, torch.minimum(local, glob))
