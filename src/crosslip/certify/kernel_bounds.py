r"""Local cross-Lipschitz bound of Proposition 2.2 for Gaussian-kernel classifiers (p = q = 2).

Setting (Section 2.2). ``f_j(y) = sum_r alpha_jr k(x_r, y)`` with ``k(x, y) = exp(-gamma
||x - y||^2)`` (:class:`crosslip.models.kernels.GaussianKernelModel`), predicted class
``c`` at ``x``, ``beta_r = alpha_jr - alpha_cr``. Theorem 2.1 needs, for every ``j != c``, an upper
bound ``L_j(R) >= max_{y in B_2(x, R)} ||grad f_j(y) - grad f_c(y)||_2``.

Derivation, step by step
------------------------
1. ``grad_y k(x_r, y) = -2 gamma (y - x_r) k(x_r, y)``, hence (paper, eq. for the kernel case)
   ``||grad f_j(y) - grad f_c(y)||^2 = sum_{r,s} beta_r beta_s <grad k_r, grad k_s>``
   ``= 4 gamma^2 sum_{r,s} beta_r beta_s a_rs(y) e_rs(y)`` with the inner product
   ``a_rs(y) = <y - x_r, y - x_s>`` and the exponential product
   ``e_rs(y) = k(x_r, y) k(x_s, y) > 0``.

2. Lemma 2.1. Write ``y = x + h``, ``||h|| <= R``, ``v = 2x - x_r - x_s``, ``S = ||v||``,
   ``P = <x - x_r, x - x_s>``, ``D = ||x - x_r||^2 + ||x - x_s||^2``. Expanding,
   ``a_rs(x + h) = P + phi(h)`` and ``e_rs(x + h) = exp(-gamma (D + 2 phi(h)))`` with the
   same ``phi(h) = <h, v> + ||h||^2``. For ``||h|| = rho`` Cauchy-Schwarz gives
   ``phi in [rho^2 - rho S, rho^2 + rho S]``, both ends attained at ``h = -+ rho v / S`` (any
   ``h`` of norm ``rho`` if ``S = 0``). Over ``rho in [0, R]`` the upper end is largest at
   ``rho = R`` and the lower end ``rho^2 - rho S`` (a convex parabola) is smallest at
   ``rho = M = min(S / 2, R)``. So ``max phi = R S + R^2``, ``min phi = M^2 - M S`` and, as
   ``a`` increases and ``e`` decreases with ``phi``::

       a_hi = P + R S + R^2                       (max of a, at h = +R v/S)
       a_lo = P - M S + M^2                       (min of a, at h = -M v/S)
       e_hi = exp(-gamma (D - 2 M S + 2 M^2))     (max of e, at h = -M v/S)
       e_lo = exp(-gamma (D + 2 R S + 2 R^2))     (min of e, at h = +R v/S)

   (:func:`lemma21`). Each bound is attained, but ``a`` and ``e`` are extremal at opposite
   ``h``, so the product bounds below are not attained jointly in general.

3. Proposition 2.2: bound each term ``beta_r beta_s a e`` separately over the ball, four cases.
   If ``beta_r beta_s >= 0`` we need an upper bound of ``a e``:

   * (i) ``a_hi >= 0``: ``a e <= max(a, 0) e <= a_hi e <= a_hi e_hi`` (``e > 0``,
     ``0 <= max(a, 0) <= a_hi``, then ``a_hi >= 0`` and ``e <= e_hi``);
   * (ii) ``a_hi < 0``: ``a <= a_hi < 0``, so ``a e <= a_hi e <= a_hi e_lo`` (``a_hi < 0``
     and ``e >= e_lo``).

   Together ``a e <= T+ := max(a_hi, 0) e_hi + min(a_hi, 0) e_lo``; multiplying by
   ``beta_r beta_s >= 0`` keeps the direction. If ``beta_r beta_s < 0`` we need a *lower*
   bound of ``a e`` (multiplying by a negative number reverses it):

   * (iii) ``a_lo >= 0``: ``a e >= a_lo e >= a_lo e_lo`` (``a >= a_lo >= 0``, ``e >= e_lo``);
   * (iv) ``a_lo < 0``: ``a e >= a_lo e >= a_lo e_hi`` (``a >= a_lo``, ``e > 0``; then
     ``a_lo < 0`` and ``e <= e_hi``).

   Together ``a e >= T- := max(a_lo, 0) e_lo + min(a_lo, 0) e_hi``, so
   ``beta_r beta_s a e <= beta_r beta_s T-``. Summing over all pairs,
   ``||grad f_j(y) - grad f_c(y)||^2 <= 4 gamma^2 (sum_{bb >= 0} beta_r beta_s T+
   + sum_{bb < 0} beta_r beta_s T-)`` for every ``y`` in the ball, and
   ``L_j(R) = 2 gamma sqrt(...)``: exactly the paper's formula (the four cases are its four
   max/min terms). The sum bounds a non-negative quantity, so it is ``>= 0`` up to rounding;
   we clamp it at 0 before the square root. At ``R = 0`` all four bounds equal ``a(x), e(x)``
   and ``L_j(0) = ||grad f_j(x) - grad f_c(x)||`` exactly.

4. Monotonicity in R. ``R S + R^2`` grows with R; ``M`` is non-decreasing and
   ``M^2 - M S`` is non-increasing in ``M`` on ``[0, S/2]``; hence ``a_hi`` and ``e_hi`` are
   non-decreasing and ``a_lo`` and ``e_lo`` non-increasing in R. ``T+`` is ``a_hi e_hi``
   (product of non-negative non-decreasing functions) where ``a_hi >= 0`` and ``a_hi e_lo``
   (a negative factor moving towards 0 times a shrinking positive one: its magnitude
   shrinks) where ``a_hi < 0``; both vanish at ``a_hi = 0``, so ``T+`` is continuous and
   non-decreasing. Symmetrically ``T-`` is non-increasing. Each summand ``beta_r beta_s T+``
   (``bb >= 0``) or ``beta_r beta_s T-`` (``bb < 0``) is non-decreasing, hence so is
   ``L_j(R)``, as :func:`crosslip.certify.theorem21` requires.

Batched evaluation (midpoint form)
----------------------------------
With the midpoint ``mu_rs = (x_r + x_s) / 2``, ``delta_rs = ||x_r - x_s|| / 2`` and
``H_rs = ||x - mu_rs|| = S / 2``, the identities ``<y - x_r, y - x_s> = ||y - mu||^2 - delta^2``
and ``||y - x_r||^2 + ||y - x_s||^2 = 2 ||y - mu||^2 + 2 delta^2`` turn the four bounds into
functions of ``||y - mu|| in [t, H + R]``, ``t = max(H - R, 0) = H - M``::

    a_hi = (H + R)^2 - delta^2         e_hi = exp(-2 gamma (t^2 + delta^2))
    a_lo = t^2 - delta^2               e_lo = exp(-2 gamma ((H + R)^2 + delta^2))

which are *algebraically identical* to the paper's (``P = H^2 - delta^2``, ``S = 2H``,
``D = 2 H^2 + 2 delta^2``, ``H^2 - 2 M H + M^2 = t^2``). ``delta^2`` is shared by all points
(one (n, n) array), only ``H`` (n, n) is per point, and every exponent is ``<= 0`` (no
overflow whatever ``gamma`` and the data scale). With ``beta = b+ - b-`` (positive and
negative parts), ``sum_{bb>=0} bb T+ + sum_{bb<0} bb T- = b+^T T+ b+ + b-^T T+ b-
- 2 b+^T T- b-`` (``T-`` is symmetric). Per evaluation :class:`KernelProp22Bound` runs, for
the tiles ``r in I, s in J`` with ``I <= J`` of the (symmetric) pair matrix and all points
and classes at once, about 15 elementwise passes into reusable cache-sized buffers and two
batched matmuls. :func:`prop22_reference` evaluates the paper's formula literally, as an
oracle.

Memory. The pair arrays (``delta^2``, its two rounded-outward copies, ``4 gamma delta^2``
and ``||mu_rs - mean||^2``: five (n, n) arrays) and ``H`` ((n, n) per point) are kept only
where they fit the budget (:func:`crosslip.kernel_memory.certify_plan`); otherwise each tile
recomputes them from the centres (one (block, d) x (d, block) product) and from ``v`` (m, n)
per point, so that certification with all 60,000 MNIST training points as centres holds
O(n (d + K m)) plus the tile scratch. A recomputed tile may round differently from the
stored array; the rounding terms below hold for any evaluation of the same formulas, and
without a stored ``H`` the smallest ``H`` of a point enters them only through a lower bound
of the *real* ``H`` (``sqrt(max(min_rs H_hat^2 - e, 0))``, one pass over the tiles).

Rounding
--------
The bound must hold for the real function of the float64 centres and coefficients at the
float64 point, although every quantity above is computed in float64 (model of arithmetic
and constants ``u``, ``gamma_n``, ``FN_REL``: :mod:`.rounding`). Write ``rho`` for
``max_r ||x_r - mean||`` and ``xc = x - mean`` (any ``mean`` works: ``H`` and ``delta``
do not depend on it).

* ``H^2`` is computed in expanded form, ``||mu - mean||^2 + ||xc||^2/2 - <xc, x_r - mean>
  + ...``, with absolute error ``e <= 2 gamma_{d+6} (||xc|| + rho)^2`` (dot products and
  three additions). Since ``|H_hat - H| = |H_hat^2 - H^2| / (H_hat + H)``, every ``H`` of a
  point is within ``eps_H = min(sqrt(e), e / min_rs H_hat) + 2u (||xc|| + 2 rho)`` of the
  computed one (the last term: the centering and the square root). Using ``R + eps_H`` for
  ``R`` widens ``[t, H + R]`` to contain the real ``[t, H + R]``: cost, one addition.
* ``delta^2`` is within ``eps_d = 2 gamma_{d+8} rho^2`` of the computed one. ``a_hi`` uses
  ``delta^2 - eps_d`` and ``a_lo`` uses ``delta^2 + eps_d`` (two precomputed arrays); with
  the exponents ``-4 gamma delta^2 - 2 gamma a`` as before, ``e_lo`` then becomes smaller and
  ``e_hi`` larger than their real values, so ``T+`` can only grow and ``T-`` only shrink
  (``T+`` increases with ``a_hi``, ``e_hi`` and decreases with ``e_lo``; ``T-`` increases
  with ``a_lo``, ``e_lo`` and decreases with ``e_hi``).
* The rest is the rounding of the tile computations on these inputs. Each ``T`` is off by
  at most ``(8u + FN_REL) A e_hi`` with ``A = (H + R)^2 + delta^2`` (the exponent's
  rounding is relative ``12 u gamma A`` and ``gamma A e^{-gamma A} <= 1/e``, which costs
  half of the exponent), and ``|T| <= A e_hi``. With ``H_max = ||xc|| + rho``, ``t_min =
  max(min_rs H_rs - R - eps_H, 0)`` and ``M = ((H_max + R + eps_H)^2 + rho^2)
  e^{2 gamma eps_d} e^{-gamma t_min^2}`` every such term is at most ``M``; the sums over
  the pairs, tiles and the four parts add ``gamma_{2n + tiles + 6}``. So the computed sum
  is within ``(4 (n + tiles + 16) u + 2 FN_REL) M ||beta||_1^2`` of the real one (plus
  ``2^-1000 (1 + ||beta||_1^2)(1 + M)`` for underflow). We add that before the square
  root and round ``2 gamma sqrt(.)`` up by ``1 + 4u``.

The margins come with the forward error of the logits (:func:`logit_errors`). The error
terms are relative ``n u M ||beta||_1^2 / L^2``: small unless the ``beta_r beta_s T_rs``
cancel to ~1e-10 of their magnitude, and never below the real bound.
"""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import torch

from ..config.schema import default as config_default
from ..device import host_tensor
from ..kernel_memory import CertifyPlan, budget_bytes, certify_plan
from ..models.kernels import GaussianKernelModel
from ..progress import Progress
from .rounding import FN_REL, UNDERFLOW, UNIT, gamma
from .search import certificate_columns, margins, margins_lower, theorem21

DTYPE = torch.float64

#: Elements of one tile buffer (k points x block x block) targeted by the automatic block
#: size: 2**18 float64 = 2 MiB, so that the seven tile buffers stay in a 32 MiB L3 cache.
TILE_ELEMENTS = 2**18


def lemma21(
    P: np.ndarray,
    S: np.ndarray,
    sq_r: np.ndarray,
    sq_s: np.ndarray,
    R: float,
    gamma: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four bounds of Lemma 2.1, literally as in the paper (broadcasting numpy arrays).

    ``P = <x - x_r, x - x_s>``, ``S = ||2x - x_r - x_s||``, ``sq_r = ||x - x_r||^2``,
    ``sq_s = ||x - x_s||^2``, ``M = min(S / 2, R)``. Returns ``(inner_max, inner_min,
    exp_max, exp_min)``: the max and min over ``y in B_2(x, R)`` of ``<y - x_r, y - x_s>``
    and of ``exp(-gamma ||x_r - y||^2) exp(-gamma ||x_s - y||^2)``.
    """
    M = np.minimum(S / 2.0, R)
    inner_max = P + R * S + R**2
    inner_min = P - M * S + M**2
    exp_max = np.exp(-gamma * (sq_r + sq_s - 2.0 * M * S + 2.0 * M**2))
    exp_min = np.exp(-gamma * (sq_r + sq_s + 2.0 * R * S + 2.0 * R**2))
    return inner_max, inner_min, exp_max, exp_min


class _Workspace:
    """Named scratch buffers that grow on demand and are reused across calls and chunks
    (fresh multi-MB allocations cost page faults on every call)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._store: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = int(np.prod(shape))
        buf = self._store.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = torch.empty(numel, dtype=dtype, device=self.device)
            self._store[name] = buf
        return buf[:numel].view(shape)


class Prop22Shared:
    """Point-independent data of the bound for one model, computed once and shared by the
    chunks: the centers relative to their mean ``Xc`` (n, d), ``-delta^2`` and
    ``-4 gamma delta^2`` with ``delta^2 = ||x_r - x_s||^2 / 4`` (n, n), the rounded-outward
    ``-(delta^2 -+ eps_d)`` (module docstring) for ``a_hi`` and ``a_lo``,
    ``||mu_rs - mean||^2`` (n, n), ``rho = max_r ||x_r - mean||`` rounded up, the
    coefficients in float64 and the scratch buffers. Memory: five (n, n) float64 arrays (six
    while built). Without ``cache`` only the centres' squared norms ``g`` (n,) are kept and
    :meth:`pair_tile` recomputes a tile of the arrays by the same formulas when asked."""

    def __init__(self, model: GaussianKernelModel, cache: bool = True) -> None:
        self.gamma = float(model.gamma)
        X = model.centers.detach().to(DTYPE)
        self.device = X.device
        self.mean = X.mean(0)
        self.Xc = X - self.mean
        self.coef = model.coef.detach().to(DTYPE)
        self.n = X.shape[0]
        d = X.shape[1]
        self.dim = d
        self.cached = cache
        self.workspace = _Workspace(self.device)
        if not cache:
            self.g = (self.Xc * self.Xc).sum(1)
            self._rounding_terms(self.g)
            return
        gram = self.Xc @ self.Xc.T
        gram = 0.5 * (gram + gram.T)  # exactly symmetric, so everything below is too
        g = gram.diagonal().clone()
        g_sum = g[:, None] + g[None, :]
        # -delta^2 = -(g_r + g_s - 2 G_rs) / 4 (exactly 0 on the diagonal)
        self.neg_delta2 = torch.sub(gram, g_sum, alpha=0.5).mul_(0.5).clamp_max_(0.0)
        self.neg_exp4 = (4.0 * self.gamma) * self.neg_delta2
        self.mid_sq = g_sum.add_(gram, alpha=2.0).mul_(0.25)  # (g_r + g_s + 2 G_rs) / 4
        del gram
        self._rounding_terms(g)
        self.neg_delta2_hi = self.neg_delta2 + self.eps_delta2  # -(delta^2 - eps): for a_hi
        self.neg_delta2_lo = self.neg_delta2 - self.eps_delta2  # -(delta^2 + eps): for a_lo

    def _rounding_terms(self, g: torch.Tensor) -> None:
        """``rho`` (rounded up) and ``eps_d`` from the computed squared norms ``g`` (n,)."""
        d = self.dim
        self.rho = float(g.max().clamp_min(0).sqrt()) * (1 + 2 * gamma(d + 2)) if self.n else 0.0
        self.eps_delta2 = 2 * gamma(d + 8) * self.rho**2

    def pair_tile(
        self, i0: int, i1: int, j0: int, j1: int, rigorous: bool
    ) -> tuple[torch.Tensor, ...]:
        """``(-(delta^2 - eps_d), -(delta^2 + eps_d), -4 gamma delta^2, ||mu - mean||^2)``
        for the pairs ``r in [i0, i1)``, ``s in [j0, j1)``, each (i1 - i0, j1 - j0); without
        ``rigorous`` the first two are ``-delta^2``. Views of the cached arrays, or computed
        into scratch buffers (valid until the next call) by the same formulas."""
        if self.cached:
            nd2 = self.neg_delta2[i0:i1, j0:j1]
            hi = self.neg_delta2_hi[i0:i1, j0:j1] if rigorous else nd2
            lo = self.neg_delta2_lo[i0:i1, j0:j1] if rigorous else nd2
            return hi, lo, self.neg_exp4[i0:i1, j0:j1], self.mid_sq[i0:i1, j0:j1]
        ws, shape = self.workspace, (i1 - i0, j1 - j0)
        gram = torch.mm(self.Xc[i0:i1], self.Xc[j0:j1].T, out=ws.get("p_gram", shape, DTYPE))
        g_sum = torch.add(
            self.g[i0:i1, None], self.g[None, j0:j1], out=ws.get("p_mid", shape, DTYPE)
        )
        nd2 = torch.sub(gram, g_sum, alpha=0.5, out=ws.get("p_nd2", shape, DTYPE))
        nd2.mul_(0.5).clamp_max_(0.0)
        if i0 == j0:  # delta_rr = 0 exactly, as in the cached arrays
            nd2.diagonal().zero_()
        ne4 = torch.mul(nd2, 4.0 * self.gamma, out=ws.get("p_ne4", shape, DTYPE))
        mid = g_sum.add_(gram, alpha=2.0).mul_(0.25)
        if not rigorous:
            return nd2, nd2, ne4, mid
        hi = torch.add(nd2, self.eps_delta2, out=ws.get("p_hi", shape, DTYPE))
        lo = torch.sub(nd2, self.eps_delta2, out=ws.get("p_lo", shape, DTYPE))
        return hi, lo, ne4, mid


class KernelProp22Bound:
    """Proposition 2.2 for a chunk of points: ``(idx, r) -> L (k, K)`` for theorem21.

    ``x`` (m, d), ``pred`` (m,). ``idx`` (k,) indexes the rows of ``x``; ``r`` (k,) are the
    radii. Returns ``L_j(r)`` of shape (k, K), float64 (0 at ``j = pred``), rounding included
    (module docstring; :meth:`formula` is the same sum without the rounding terms, for
    comparisons with the literal formula). Precomputes the R-independent
    ``H_rs = ||x - (x_r + x_s)/2||`` for the chunk (m, n, n), the positive and negative
    parts of ``beta = coef_j - coef_c`` (m, K, n), and per point the rounding terms
    ``eps_H``, ``H_max`` and ``||beta||_1^2``.

    Each call walks the tiles ``(I, J)``, ``I <= J``, of a ``block``-partition of the pair
    matrix (the summands are symmetric in r, s: an off-diagonal tile counts twice), all
    ``k`` points at once per tile: half the work of the full matrix, and tile buffers that
    stay in cache. ``block=None`` picks ``sqrt(tile_elements / m)`` (at least 64).
    Memory: ``8 m n^2`` bytes for ``H`` plus about ``50 k block^2`` bytes of scratch and the
    shared data (:class:`Prop22Shared`). With ``store_h=False`` (or shared data without the
    cached pair arrays) ``H`` is not stored: each tile recomputes it from ``v`` (m, n),
    ``H_rs = sqrt(||mu_rs - mean||^2 + v_r + v_s)``.
    """

    def __init__(
        self,
        model: GaussianKernelModel,
        x: torch.Tensor,
        pred: torch.Tensor,
        shared: Prop22Shared | None = None,
        block: int | None = None,
        store_h: bool = True,
        tile_elements: int = TILE_ELEMENTS,
    ) -> None:
        self.shared = Prop22Shared(model) if shared is None else shared
        sh = self.shared
        self.gamma = sh.gamma
        x = x.detach().to(device=sh.device, dtype=DTYPE)
        pred = pred.to(sh.device)
        self.m, n = x.shape[0], sh.n
        self.K = sh.coef.shape[0]
        xc = x - sh.mean
        v = 0.5 * (xc * xc).sum(1)[:, None] - xc @ sh.Xc.T  # (m, n)
        self.v, self.H = v, None
        if store_h and sh.cached:
            H = torch.empty(self.m, n, n, dtype=DTYPE, device=sh.device)
            torch.add(sh.mid_sq, v[:, :, None], out=H)
            H.add_(v[:, None, :]).clamp_min_(0.0).sqrt_()  # ||x - mu_rs||, (m, n, n)
            self.H = H
        beta = sh.coef[None, :, :] - sh.coef[pred][:, None, :]  # (m, K, n)
        bp, bn = beta.clamp_min(0.0), (-beta).clamp_min(0.0)
        self.bpn = torch.cat([bp, bn], dim=1)  # (m, 2K, n): [b+; b-]
        self.bnp = torch.cat([bn, bp], dim=1)  # [b-; b+]
        self._all = torch.arange(self.m, device=sh.device)
        if block is None:
            block = max(64, int((tile_elements / max(self.m, 1)) ** 0.5))
        blocks = list(itertools.pairwise([*range(0, n, block), n]))
        self.tiles = [(a, b, c, e) for i, (a, b) in enumerate(blocks) for c, e in blocks[i:]]
        # rounding terms (module docstring), per point
        d, rho = sh.dim, sh.rho
        nx = torch.linalg.vector_norm(xc, dim=1) * (1 + 2 * gamma(d + 2))
        e_h2 = 2 * gamma(d + 6) * (nx + rho) ** 2
        if self.H is not None:
            h_min = self.H.flatten(1).amin(1) * (1 - 2 * UNIT) if n else torch.zeros_like(nx)
        else:  # a lower bound of the real H, valid for any evaluation of H_hat (docstring)
            h_min = (self._min_h_squared() - e_h2).clamp_min(0.0).sqrt() * (1 - 4 * UNIT)
        self.h_min = h_min
        eps = torch.minimum(e_h2.sqrt(), e_h2 / h_min)  # e / 0 = inf: sqrt(e)
        self.eps_h = (eps + 2 * UNIT * (nx + 2 * rho)) * (1 + 4 * UNIT)
        self.h_max = (nx + rho) * (1 + 4 * UNIT)
        self.beta_l1_sq = ((bp + bn).sum(-1) ** 2) * (1 + 2 * gamma(n + 2))  # (m, K)
        self.err = 4 * (n + len(self.tiles) + 16) * UNIT + 2 * FN_REL
        self.m_factor = math.exp(2 * self.gamma * sh.eps_delta2) * (1 + 8 * UNIT)

    def _min_h_squared(self) -> torch.Tensor:
        """``min_rs H_hat_rs^2`` per point (m,), computed as the tiles compute it (one pass)."""
        sh, out = self.shared, torch.full((self.m,), math.inf, dtype=DTYPE, device=self.v.device)
        for i0, i1, j0, j1 in self.tiles:
            mid = sh.pair_tile(i0, i1, j0, j1, rigorous=False)[3]
            sq = torch.add(mid, self.v[:, i0:i1, None]).add_(self.v[:, None, j0:j1])
            out = torch.minimum(out, sq.flatten(1).amin(1))
        return out.clamp_min(0.0)

    def __call__(self, idx: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """Rigorous upper bounds ``L_j(r)`` (k, K) for the real function."""
        idx = idx.to(self.shared.device)
        r = r.detach().to(device=self.shared.device, dtype=DTYPE)
        rp = r + self.eps_h[idx]
        total = self._sums(idx, rp, rigorous=True)
        big_m = ((self.h_max[idx] + rp) ** 2 + self.shared.rho**2) * self.m_factor  # (k,)
        t_min = (self.h_min[idx] - rp).clamp_min(0.0)  # every ||y - mu_rs|| is at least this
        big_m = big_m * torch.exp(-self.gamma * t_min * t_min)
        s = self.beta_l1_sq[idx]  # (k, K)
        err = s * (self.err * big_m)[:, None] + UNDERFLOW * (1 + s) * (1 + big_m)[:, None]
        total = total + torch.where(s > 0, err, 0.0)  # beta = 0: the sum is exactly 0
        return (2.0 * self.gamma * (1 + 4 * UNIT)) * total.clamp_min(0.0).sqrt()

    def formula(self, idx: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """Proposition 2.2 as printed, evaluated in float64 without rounding terms (k, K): an
        estimate, not a bound; compared with :func:`prop22_reference` in the tests."""
        idx = idx.to(self.shared.device)
        r = r.detach().to(device=self.shared.device, dtype=DTYPE)
        total = self._sums(idx, r, rigorous=False)
        return 2.0 * self.gamma * total.clamp_min(0.0).sqrt()

    def _sums(self, idx: torch.Tensor, r: torch.Tensor, rigorous: bool) -> torch.Tensor:
        """``sum_{bb>=0} bb T+ + sum_{bb<0} bb T-`` (k, K) at the radii ``r`` (k,)."""
        sh, ws = self.shared, self.shared.workspace
        k, K, g = idx.numel(), self.K, self.gamma
        full = k == self.m and torch.equal(idx, self._all)
        bpn, bnp = (self.bpn, self.bnp) if full else (self.bpn[idx], self.bnp[idx])
        v = self.v if full else self.v[idx]
        R = r[:, None, None]
        total = torch.zeros(k, K, dtype=DTYPE, device=sh.device)
        for i0, i1, j0, j1 in self.tiles:
            shape = (k, i1 - i0, j1 - j0)
            nd2_hi, nd2_lo, ne4, mid = sh.pair_tile(i0, i1, j0, j1, rigorous)
            if self.H is None:  # ||x - mu_rs|| = sqrt(||mu_rs - mean||^2 + v_r + v_s)
                H = torch.add(mid, v[:, i0:i1, None], out=ws.get("sel", shape, DTYPE))
                H.add_(v[:, None, j0:j1]).clamp_min_(0.0).sqrt_()
            else:
                H = self.H[:, i0:i1, j0:j1]
                if not full:
                    H = torch.index_select(H, 0, idx, out=ws.get("sel", shape, DTYPE))
            e_lo, a_hi, e_hi, a_lo, t_plus = (ws.get(f"b{i}", shape, DTYPE) for i in range(5))
            mask = ws.get("mask", shape, torch.bool)
            # ||y - mu|| ranges over [t, H + R] with t = max(H - R, 0); the exponents are
            # -2 gamma (a + 2 delta^2) = -2 gamma (||y - mu||^2 + delta^2).
            u = torch.add(H, R, out=e_lo)  # H + R
            torch.addcmul(nd2_hi, u, u, out=a_hi)  # a_hi = (H + R)^2 - delta^2
            torch.add(ne4, a_hi, alpha=-2.0 * g, out=e_lo).exp_()  # e_lo
            t = torch.sub(H, R, out=e_hi).clamp_min_(0.0)  # t
            torch.addcmul(nd2_lo, t, t, out=a_lo)  # a_lo = t^2 - delta^2
            torch.add(ne4, a_lo, alpha=-2.0 * g, out=e_hi).exp_()  # e_hi
            # T+ = max(a_hi,0) e_hi + min(a_hi,0) e_lo; T- = max(a_lo,0) e_lo + min(a_lo,0) e_hi
            torch.gt(a_hi, 0.0, out=mask)
            torch.where(mask, e_hi, e_lo, out=t_plus).mul_(a_hi)
            torch.gt(a_lo, 0.0, out=mask)
            t_minus = a_hi  # a_hi is no longer needed
            torch.where(mask, e_lo, e_hi, out=t_minus).mul_(a_lo)
            # Pairs (r in I, s in J): sum (b+_r b+_s + b-_r b-_s) T+_rs
            # - sum (b+_r b-_s + b-_r b+_s) T-_rs; an off-diagonal tile also stands for its
            # mirror image (T+-, and both coefficient matrices, are symmetric): weight 2.
            b_i = bpn[:, :, i0:i1]
            s_plus = (torch.bmm(b_i, t_plus) * bpn[:, :, j0:j1]).sum(-1)  # (k, 2K)
            s_minus = (torch.bmm(b_i, t_minus) * bnp[:, :, j0:j1]).sum(-1)
            part = s_plus[:, :K] + s_plus[:, K:] - s_minus[:, :K] - s_minus[:, K:]
            total.add_(part, alpha=1.0 if i0 == j0 else 2.0)
        return total


def logit_errors(model: GaussianKernelModel, x: torch.Tensor, kern: torch.Tensor) -> torch.Tensor:
    """Bounds (m, K) on the forward error of the logits ``kern @ coef^T`` computed from the
    kernel values ``kern`` (m, n) at the float64 points ``x`` (m, d).

    ``||x - x_r||^2`` is computed expanded, within ``e = gamma_{d+3} (||x|| + max_r
    ||x_r||)^2`` absolute, and ``fl(-gamma sq)`` adds ``u gamma sq``: so ``exp`` sees an
    argument within ``gamma e' = gamma (e + 2 u (||x|| + max ||x_r||)^2)`` and returns
    ``k`` within the factor ``kappa = exp(gamma e') (1 + 2 FN_REL) - 1`` of the real one
    (plus 2^-1060 where it underflows); the sum over the n centres adds ``gamma_{n+1}``.
    Hence ``|f_j,hat - f_j| <= (gamma_{n+1} + kappa) (|coef| k)_j + 2^-1000 ||coef_j||_1``,
    doubled for its own rounding.
    """
    X, coef = model.centers.detach().to(DTYPE), model.coef.detach().to(DTYPE)
    n, d = X.shape
    scale = torch.linalg.vector_norm(x, dim=1) + float(torch.linalg.vector_norm(X, dim=1).max())
    e = (gamma(d + 3) + 2 * UNIT) * (scale * (1 + 2 * gamma(d + 2))) ** 2
    kappa = torch.expm1(model.gamma * e * (1 + 4 * UNIT)) * (1 + 2 * FN_REL) + 2 * FN_REL
    rel = (gamma(n + 1) + kappa)[:, None]  # (m, 1)
    l1 = coef.abs().sum(1)  # (K,)
    return 2.0 * rel * (kern @ coef.abs().T) + UNDERFLOW * (1 + l1)[None, :]


def plan_for(
    model: GaussianKernelModel, memory_gb: float | None = None, device: torch.device | str = "cpu"
) -> CertifyPlan:
    """How :func:`certify_kernel` evaluates the bound of ``model`` within ``memory_gb`` GiB
    (default: the schema's ``kernel.memory_gb``) on ``device``
    (:func:`crosslip.kernel_memory.certify_plan`)."""
    memory_gb = config_default("kernel.memory_gb") if memory_gb is None else memory_gb
    n, d = model.centers.shape
    k = model.coef.shape[0]
    return certify_plan(n, d, k, budget_bytes(memory_gb), torch.device(device).type)


def _empty_result() -> dict[str, torch.Tensor]:
    f = torch.zeros(0, dtype=DTYPE, device="cpu")  # the results are CPU tensors
    i = torch.zeros(0, dtype=torch.long, device="cpu")
    keys = ("pred", "margin", "guarantee_local", "radius_local", "bound_class", "evaluations")
    return dict(zip(keys, (i, f, f, f, i, i), strict=True))


def _as64(model: GaussianKernelModel) -> GaussianKernelModel:
    if model.centers.dtype == DTYPE and model.coef.dtype == DTYPE:
        return model
    return copy.deepcopy(model).to(DTYPE)


def certify_kernel(
    model: GaussianKernelModel,
    x: torch.Tensor,
    rtol: float = 1e-3,
    chunk: int | None = None,
    memory_gb: float | None = None,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """L2 guarantees (Theorem 2.1 + Proposition 2.2) of a Gaussian-kernel model at ``x``.

    ``x`` (n, d). Works in float64 on ``device`` (default: the model's), within
    ``memory_gb`` GiB of it (:func:`plan_for`: the pair arrays and ``H`` where they fit, else
    recomputed per tile), ``chunk`` points at a time (default: the plan's). Returns per-point CPU
    tensors of shape (n,): ``pred``, ``margin`` (``f_c - max_{j != c} f_j``),
    ``guarantee_local``, ``radius_local`` (the R attaining it), ``bound_class`` and
    ``evaluations`` (number of R evaluated). The guarantees hold for the real function of the
    float64 centres and coefficients at the float64 points, rounding included (module
    docstring); ``margin`` is the computed one. A class with ``coef_j = coef_c`` is never
    reached (``f_c - f_j = 0`` identically: it ties everywhere or nowhere). Progress (points
    done, rate) goes to the ``"crosslip"`` logger (:mod:`crosslip.progress`).
    """
    model = _as64(model)
    if device is not None and torch.device(device) != model.centers.device:
        model = copy.deepcopy(model).to(device)
    if len(x) == 0:
        return _empty_result()
    plan = plan_for(model, memory_gb, model.centers.device)
    shared = Prop22Shared(model, cache=plan.cache_pairs)
    chunk = plan.points if chunk is None else chunk
    coef = model.coef.detach()
    vanish = ~(coef[:, None, :] != coef[None, :, :]).any(-1)  # (K, K): beta = 0 exactly
    out: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad(), Progress("certify", len(x), "points") as progress:
        for i in range(0, len(x), chunk):
            xb = x[i : i + chunk].to(device=shared.device, dtype=DTYPE)
            kern = model.kernel(xb)
            logits = kern @ model.coef.T
            pred = logits.argmax(1)
            m_hat, m = margins_lower(logits, logit_errors(model, xb, kern), pred)
            bound = KernelProp22Bound(
                model, xb, pred, shared, store_h=plan.store_h, tile_elements=plan.tile_elements
            )
            cert = theorem21(m, bound, rtol=rtol, vanishes=vanish[pred])
            for key, val in certificate_columns(pred, m_hat, cert).items():
                out.setdefault(key, []).append(val.cpu())
            progress.update(len(xb))
            del bound, kern, cert  # before the next chunk builds its own (the plan's count)
    return {key: torch.cat(val) for key, val in out.items()}


def prop22_reference(
    model: GaussianKernelModel, x: torch.Tensor, pred: int | torch.Tensor, r: float
) -> torch.Tensor:
    """Proposition 2.2 for ONE point, literally: explicit (n, n) numpy arrays, the four cases
    selected with ``np.where`` on the sign of ``beta_r beta_s`` and the max/min terms as
    printed, one class at a time. ``x`` (d,), ``pred`` the class c, ``r`` the radius.
    Returns ``L_j(r)`` for all j, shape (K,), float64 (0 at ``j = c``). Oracle and baseline.
    """
    X = model.centers.detach().to(DTYPE).cpu().numpy()
    A = model.coef.detach().to(DTYPE).cpu().numpy()
    gamma, R, c = float(model.gamma), float(r), int(pred)
    xv = host_tensor(x).detach().to(DTYPE).cpu().numpy().reshape(-1)
    diff = xv[None, :] - X  # rows x - x_r, (n, d)
    P = diff @ diff.T  # <x - x_r, x - x_s>
    sq = np.diag(P).copy()  # ||x - x_r||^2
    S = np.sqrt(np.maximum(sq[:, None] + sq[None, :] + 2.0 * P, 0.0))  # ||2x - x_r - x_s||
    a_hi, a_lo, e_hi, e_lo = lemma21(P, S, sq[:, None], sq[None, :], R, gamma)
    same_sign = np.maximum(a_hi, 0.0) * e_hi + np.minimum(a_hi, 0.0) * e_lo
    opposite = np.maximum(a_lo, 0.0) * e_lo + np.minimum(a_lo, 0.0) * e_hi
    out = np.zeros(A.shape[0])
    for j in range(A.shape[0]):
        if j == c:
            continue
        beta = A[j] - A[c]
        bb = np.outer(beta, beta)
        total = np.sum(np.where(bb >= 0, bb * same_sign, bb * opposite))
        out[j] = 2.0 * gamma * np.sqrt(max(total, 0.0))
    return torch.from_numpy(out)


def certify_kernel_reference(
    model: GaussianKernelModel, x: torch.Tensor, rtol: float = 1e-3
) -> dict[str, torch.Tensor]:
    """Same as :func:`certify_kernel` (same :func:`theorem21` search), one point at a time
    with :func:`prop22_reference` as the bound and the computed margins: the baseline and an
    end-to-end oracle. It evaluates the formulas as printed, without the rounding terms of
    :func:`certify_kernel` (which lower its guarantees by far less than ``rtol``)."""
    model = _as64(model)
    if len(x) == 0:
        return _empty_result()
    out: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for i in range(len(x)):
            xi = x[i : i + 1].to(DTYPE)
            logits = model(xi)
            pred = logits.argmax(1)
            m = margins(logits, pred)

            def lip(idx, r, xi=xi, c=int(pred[0])):
                return prop22_reference(model, xi[0], c, float(r[0]))[None].to(r)

            cert = theorem21(m, lip, rtol=rtol)
            for key, val in certificate_columns(pred, m, cert).items():
                out.setdefault(key, []).append(val.cpu())
    return {key: torch.cat(val) for key, val in out.items()}
