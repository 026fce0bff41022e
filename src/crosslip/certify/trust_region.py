r"""The curvature certificate in L2 minimised exactly over the ball (a trust-region dual).

:mod:`.curvature` bounds the second-order term of ``g = f_c - f_j`` by ``Lambda_2 r^2 / 2``,
the largest eigenvalue of ``K`` (or a bound on it) times the squared radius. That charges
every direction the curvature of the worst one. Here the second-order lower bound is
minimised over the ball itself. With ``a = grad g(x)``, the real pre-activations ``z_l(x)``
and ``h_l = u_l^T v``, Taylor's theorem with the integral remainder per unit
(:mod:`.secant`: ``sigma(z + h) = sigma(z) + sigma'(z) h + Q(h) h^2 / 2``) gives, for
``||v||_2 <= r <= R`` (every ``z_l(x) + h_l`` in the unit's interval ``[lo_l, hi_l]`` of
:class:`~.softplus_bounds.PreactivationRange` at R),

    g(x + v) >= m + a^T v + 1/2 sum_l q_l h_l^2,

    q_l = delta_l inf Q_l   (delta_l > 0: convex units help),
    q_l = -kappa_l = -|delta_l| sup Q_l   (delta_l < 0),

``inf`` and ``sup`` over the unit's range, bounded by :func:`.secant.secant_curvature`.

Write ``M = mu I + U^T diag(q) U`` for any ``mu >= 0``. Then ``1/2 sum q_l h_l^2 = 1/2 v^T
M v - mu ||v||^2 / 2``, and for any vector ``w``, if ``M`` is positive semi-definite,

    a^T v + 1/2 v^T M v = 1/2 (v + w)^T M (v + w) - 1/2 w^T M w + (a - M w)^T v
                        >= -1/2 w^T M w - ||a - M w||_2 r,

so ``g(x + v) >= m - C - B r - mu r^2 / 2`` with ``C = w^T M w / 2``, ``B = ||a - M w||_2``:
the root of that quadratic (:func:`.linear_min.quad_radius`) is a radius within which j
cannot overtake c, for :func:`~.search.radius_search` (it takes ``min(rho_j, R)``). This is
the Lagrangian dual of the trust-region problem ``min_{||v|| <= r} a^T v + v^T M_0 v / 2``
(``M_0 = U^T diag(q) U``), which has no duality gap: at the best ``(mu, w)`` the bound is
that minimum, where :mod:`.curvature` takes ``-||a|| r - Lambda_2 r^2 / 2``.

*Choosing (mu, w)* changes only the tightness, never the soundness: ``k`` steps of Lanczos
on ``M_0`` from ``a`` (fully re-orthogonalised) span a Krylov space in which ``M`` is
inverted exactly through its tridiagonal matrix's eigenvectors (Gould, Lucidi, Roma and
Toint, SIAM J. Optim. 1999, "Solving the trust-region subproblem using the Lanczos
method"), ``w = M^{-1} a`` there, and ``mu`` is the one whose bound has the largest root,
not the best bound at R: the search needs radii that do not collapse at ``R = 0``. That
search runs in float32 (:data:`DUAL_DTYPE`; half the time of float64's products), and the
radii move by about 1e-6 relative: ``w`` and ``mu`` are then taken as float64 numbers and
everything the bound reports is computed from them in float64, as below.

*Positive semi-definiteness, verified.* The units with ``delta_l > 0`` add a positive
semi-definite part, so ``M >= mu I - U^T diag(kappa) U`` and it suffices that ``mu`` is at
least ``lambda_max(U^T diag(kappa) U)``. The units are split: the ``k_top`` with the largest
``kappa_l ||u_l||^2`` (as many as it takes to leave a rest of at most :data:`TAIL_SHARE`
of the ``mu`` sought) and the rest, whose part has ``lambda_max <= sum kappa_l ||u_l||^2``
(its trace; Weyl's inequality adds the two). For the top units, ``lambda_max(U^T S^2 U) =
lambda_max(S G S)`` with ``G = U U^T`` restricted to them and ``S = diag(s)``, ``s_l^2 >=
kappa_l``; a floating-point Cholesky factorisation of ``A^ = fl(mu_top I - S fl(G) S)``
that runs to completion proves ``A^ + Delta = L L^T`` with ``|Delta| <= gamma_{k+1} |L|
|L^T|`` (Higham, "Accuracy and Stability of Numerical Algorithms", Thm. 10.3; any order
of the sums, as in blocked or GPU factorisations; Rump, BIT 2006, "Verification of positive
definiteness"), so ``||Delta||_2 <= gamma_{k+1} / (1 - gamma_{k+1}) trace(A^)``. With
``E`` the error of forming ``A^`` (``|fl(G) - G| <= gamma_d ||u_r|| ||u_m||``, two products
and a subtraction: ``||E||_2 <= (gamma_d + 5u)(1 + gamma_d) ||t||^2 + u mu_top``, ``t_l = s_l
||u_l||``), the real ``(mu_top + c) I - S G S`` is positive semi-definite for ``c =
||Delta|| + ||E||`` plus ``4 (k + 2)^2 2^-1000`` for underflow. ``mu`` is then ``mu_top + c +
tail``, rounded up. Where the dual's ``mu`` is already at least the cheap bound on
``lambda_max`` of :meth:`.CurvatureBound.curvature` (spectral norm or Schur test, rigorous),
it stands without a factorisation. Otherwise the dual's ``mu`` is factorised first (it
passes on most rows); where it fails, from a Lanczos estimate of ``lambda_max`` from
below, then grown by :data:`RETRY_GROWTH`; after the last the row gets radius 0. In the
second of the two rounds over a point's rows (:func:`~.search.undercutting_rounds`), where
only radii below the first round's matter, such a row first takes ``mu`` at the cheap bound
(verified as it is, with ``w`` for that ``mu``): only where that radius falls short of the
first round's is it factorised (on MNIST, the search 15-20% faster, the same radii).

*The convex units.* Where the concave part alone fails at the dual's ``mu``, the proof takes
the convex units in too, so that ``mu`` need only reach ``-lambda_min(U^T diag(q) U)``, not
``lambda_max`` of the concave part. With ``V_P = R U_P`` (the top convex units, ``r_l^2 <=
q_l``; the others only add a positive semi-definite part and are left out), ``V_N = S U_N``
(the top concave units) and ``mu_top = mu - tail > 0``, ``A = mu_top I + V_P^T V_P`` is
positive definite, and ``A - V_N^T V_N >= 0`` if and only if ``mu_top V_N A^{-1} V_N^T <=
mu_top I``. By the Woodbury identity ``mu_top V_N A^{-1} V_N^T = S G_NN S - C^T Y^{-1} C``
with ``C = R G_PN S`` and ``Y = mu_top I + R G_PP R``: the condition is ``X = mu_top I - S
G_NN S + C^T Y^{-1} C >= 0``, a matrix of the concave units' size. For any ``W``, ``(Y^{-1}
C - W)^T Y (Y^{-1} C - W) >= 0`` gives ``C^T Y^{-1} C >= C^T W + W^T C - W^T Y W``: ``W``
is a floating-point solve of ``Y W = C`` (any ``W`` is sound), and ``X_W = mu_top I - S G_NN
S + C^T W + W^T C - W^T Y W``, formed by products only, is factorised as above. Its forming
error is bounded in the spectral norm by Frobenius norms: the products' ``gamma_p |A| |B|``
(``||A||_F ||B||_F``), the blocks' errors from ``fl(G)`` (``C``'s is at most ``(gamma_d +
4u)(1 + gamma_d) a b^T`` with ``a_l = r_l ||u_l||``, ``b_l = s_l ||u_l||``, a rank-one
bound), ``Y``'s ``(gamma_d + 4u)(1 + gamma_d) ||a||^2 + u mu_top`` times ``||W||^2``, and
``5u`` times the four terms' norms for the sums; the sum of these is doubled for the rounding
of the bound itself. A factorisation that runs to completion proves ``X + c I >= 0`` (``c``:
that error plus the Cholesky backward error of its trace, as above), so ``mu_top V_N
A^{-1} V_N^T <= (mu_top + c) I``, ``V_N^T V_N <= (1 + c / mu_top) A`` and ``A - V_N^T V_N
>= -c ||V_N||^2 / mu_top I``: ``mu`` is then ``mu_top + c ||t||^2 / mu_top + tail``, rounded
up. The try starts from the larger of the dual's ``mu`` and a Lanczos estimate of
``-lambda_min`` from below, and grows by :data:`SIGNED_GROWTH`; then the concave units alone
are factorised, as above.

*The search* (:func:`~.search.radius_search`) opens its bracket at ``R = 0`` with
:meth:`TrustRegionBound.origin`: the dual's ``mu`` unverified, an estimate that is never
reported, so no factorisation is spent there.

*Rounding of C and B.* ``t^ = fl(U w)`` is within ``e = gamma_d (1 + 2 gamma_d) |U| |w| +
2^-1000`` of ``U w``. ``w^T M w = mu ||w||^2 + sum q_l t_l^2`` is bounded above with
``(|t^| + e)^2`` on the convex units and ``max(|t^| - e, 0)^2`` on the others.
``a - M w = a - mu w - U^T (q t)``: against the computed vector, the gradient's error
(:class:`.curvature.CurvatureBound`), ``||U||_2 ||q e||_2`` (the verified spectral norm),
``gamma_{H+1} sum_l |q_l t^_l| ||u_l||`` (the product) and ``3u`` times the norms of the
three terms (the subtractions and ``mu w``). ``m`` is :func:`~.search.margins_lower`'s.
Everything else follows :mod:`.curvature`: the same ``kappa``, and the convex units'
``inf Q`` bounded from below with its rounding covered (:mod:`.secant`), times ``|delta|``
rounded down by ``1 - 4u``.

The ball's radius holds in the box too. The L-inf ball has its own form, a multiplier per
coordinate (:mod:`.linf_trust_region`, a subclass that changes the coordinates the proof and
the dual work in, the first form and the linear term's norm, and has a form of its own over
the cube in the box: :attr:`TrustRegionBound.boxed`); the L1 ball none (its
constraint is not quadratic: the L2 ball of the same radius holds it, and the vertex form of
:mod:`.curvature` is exact for the concave model there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .curvature import CurvatureBound, signed_units
from .expansion import ASCENT_STEP, ascent_direction, ascent_trial, damped_move, next_step
from .linear_min import QuadLower, box_lower, dual_norm_lower, quad_radius
from .rounding import UNDERFLOW, UNIT, gamma
from .search import undercutting_rounds
from .secant import secant_curvature
from .softplus_bounds import PreactivationRange

#: Units whose curvature is verified by a Cholesky factorisation at most (the rest by
#: their trace).
TOP_UNITS = 4096
#: The rest's trace may be at most this share of the ``mu`` sought: on the record run's
#: networks 1% leaves 370-570 of 500-660 concave units in the factorisation (its cost goes
#: with the cube), while the smallest half's trace alone is of the order of ``lambda_max``.
#: 3% made the certificate 1.35x faster than 1% on CL 1e-2 and lowered its mean by 0.01%
#: (30 points; none: unchanged); 30% lowered it by 0.9%.
TAIL_SHARE = 3e-2
#: Convex units whose ``q_l ||u_l||^2`` is below this share of the ``mu`` sought are left out
#: of the direct proof (they only help, and little).
CONVEX_SHARE = 1e-3
#: Factors by which ``mu`` grows after a failed proof with the convex units (then the
#: concave units alone are factorised).
SIGNED_GROWTH = (1 + 1e-4, 1 + 1e-3, 1 + 3e-3)
#: The concave units' tail in the proof with the convex units, a share of ``mu`` (it is
#: tried where ``mu`` is within a few per cent of the real ``-lambda_min``).
SIGNED_TAIL_SHARE = 3e-3
#: Factors by which ``mu`` grows after a failed verification (then the row gets radius 0).
RETRY_GROWTH = (1 + 1e-4, 1 + 1e-3, 1.01, 1.1, 1.5)
#: The precision of the dual point's search (Lanczos, ``mu``, ``w``): any dual point is sound,
#: since :meth:`TrustRegionBound.evaluate` bounds its own ``C`` and ``B`` in float64.
DUAL_DTYPE = torch.float32
#: Rows (point, class) per chunk of the dual (Lanczos on ``(rows, H)`` products).
CHUNK_ROWS = 256
#: Rows per factorisation batch: each holds a (k, k) matrix of its concave units (k <= H),
#: so a small batch stays in cache (on a 2-core CPU 8 rows ran 2x faster than 64).
FACTOR_ROWS = 8


def lanczos(
    apply: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor, steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` Lanczos steps (at most the dimension) of the symmetric map ``apply`` on the
    rows of ``start`` (m, n), fully re-orthogonalised (twice): the orthonormal basis
    (m, k, n) and the tridiagonal matrix (m, k, k). A row whose space closes early gets
    zero vectors."""
    m, n = start.shape
    k = max(1, min(steps, n))
    basis = start.new_zeros(m, k, n)
    T = start.new_zeros(m, k, k)
    tiny = torch.finfo(start.dtype).tiny
    scale = start.norm(dim=1)
    v = start / scale.clamp_min(tiny)[:, None]
    for i in range(k):
        basis[:, i] = v
        mv = apply(v)
        T[:, i, i] = (mv * v).sum(1)
        done = basis[:, : i + 1]
        for _ in range(2):
            mv = mv - torch.einsum("mk,mkd->md", torch.einsum("mkd,md->mk", done, mv), done)
        beta = mv.norm(dim=1)
        if i + 1 < k:
            live = beta > 1e-12 * T[:, : i + 1, : i + 1].abs().amax((1, 2)).clamp_min(tiny)
            v = torch.where(live[:, None], mv / beta.clamp_min(tiny)[:, None], 0.0)
            T[:, i, i + 1] = T[:, i + 1, i] = torch.where(live, beta, 0.0)
    return basis, T


@dataclass
class KrylovSpan:
    """An orthonormal Krylov basis (m, k, d) of ``M_0`` from ``a`` and the eigenvalues
    ``theta`` (m, k) and vectors ``Z`` (m, k, k) of its tridiagonal matrix; ``b = Z^T ||a||
    e_1`` (m, k)."""

    basis: torch.Tensor
    theta: torch.Tensor
    Z: torch.Tensor
    b: torch.Tensor

    def solve(self, mu: torch.Tensor) -> torch.Tensor:
        """``w`` (m, d) with ``(mu I + M_0) w = a`` in the span; 0 where ``mu`` is inf."""
        finite = torch.isfinite(mu)
        shift = self.theta + torch.where(finite, mu, 1.0)[:, None]
        coef = torch.einsum("mkj,mj->mk", self.Z, self.b / shift)
        w = torch.einsum("mk,mkd->md", coef, self.basis)
        return torch.where(finite[:, None], w, 0.0)


#: Halvings of :func:`krylov_dual`'s interval of ``log(mu - mu_0)`` (width 65): 48 leave
#: 2.3e-13, where ``r`` is flat to rounding (its maximum is smooth).
DUAL_BISECTIONS = 48


def krylov_dual(
    a: torch.Tensor, q: torch.Tensor, U: torch.Tensor, margin: torch.Tensor, steps: int
) -> tuple[torch.Tensor, KrylovSpan]:
    """A dual point for the rows ``a`` (m, d), ``q`` (m, H), ``margin`` (m,): ``steps``
    Lanczos steps (at most ``H + 1``, the dimension of any Krylov space of ``M_0`` from
    ``a``) on ``M_0 = U^T diag(q) U`` from ``a``, and in their span the ``mu`` whose bound
    ``margin - a^T M^{-1} a / 2 - mu r^2 / 2`` (``M = mu I + M_0``, ``w = M^{-1} a``) has the
    largest root ``r``. In the span's eigenbasis ``r^2 = f(mu) = (margin - c(mu)) / mu`` with
    ``c(mu) = sum_j b_j^2 / (2 (theta_j + mu))``; ``mu^2 f'(mu) = h(mu) = c(mu) + mu
    sum_j b_j^2 / (2 (theta_j + mu)^2) - margin`` and ``h'(mu) = -mu sum_j b_j^2 /
    (theta_j + mu)^3 <= 0``, so ``f`` rises while ``h > 0`` and the root of ``h`` is its
    maximum: bisection on the sign of ``h`` over ``log(mu - mu_0)`` in [-40, 25] (``mu_0``
    the smallest ``mu`` with ``M`` positive definite in the span; :data:`DUAL_BISECTIONS`
    halvings). Returns ``(mu, span)``; :meth:`KrylovSpan.solve` gives ``w`` at any ``mu``.
    Heuristic: any result is sound in :class:`TrustRegionBound`."""
    norm_a = a.norm(dim=1)
    basis, T = lanczos(lambda v: ((v @ U.T) * q) @ U, a, min(steps, U.shape[0] + 1))
    theta, Z = torch.linalg.eigh(T)
    b = Z[:, 0, :] * norm_a[:, None]  # Z^T (||a|| e_1)
    b2 = 0.5 * b.square()
    mu0 = (-theta[:, 0]).clamp_min(0.0)
    scale = theta.abs().amax(1).clamp_min(1.0) + norm_a
    lo = torch.full_like(mu0, -40.0)
    hi = torch.full_like(mu0, 25.0)
    for _ in range(DUAL_BISECTIONS):
        mid = 0.5 * (lo + hi)
        mu = mu0 + scale * torch.exp(mid)
        den = theta + mu[:, None]
        rising = (b2 / den * (1 + mu[:, None] / den)).sum(1) > margin  # h(mu) > 0
        lo, hi = torch.where(rising, mid, lo), torch.where(rising, hi, mid)
    mu = mu0 + scale * torch.exp(0.5 * (lo + hi))
    return mu, KrylovSpan(basis, theta, Z, b)


@dataclass
class ConcavePart:
    """The concave units' curvature ``U^T diag(kappa) U`` of m rows: ``sgs`` (m, k, k) =
    ``S fl(G) S`` on each row's top units, ``tail`` (m,) the rest's trace (rounded up),
    ``t2`` (m,) ``||t||^2`` (rounded up), ``d`` the input dimension (module docstring);
    ``top`` (m, k) the top units and ``s`` (m, k) their ``s_l`` (the diagonal of S)."""

    sgs: torch.Tensor
    tail: torch.Tensor
    t2: torch.Tensor
    d: int
    top: torch.Tensor
    s: torch.Tensor

    def estimate(self, steps: int = 12) -> torch.Tensor:
        """``lambda_max`` of each row's ``S G S`` (m,): the largest Ritz value of ``steps``
        Lanczos steps, from below: where to start looking for a verified ``mu``, not a
        bound."""
        m, k = self.sgs.shape[:2]
        if k == 0:
            return self.sgs.new_zeros(m)
        _, T = lanczos(
            lambda v: torch.bmm(self.sgs, v[:, :, None])[:, :, 0], self.sgs.new_ones(m, k), steps
        )
        # a NaN row estimates 0 (its proof then fails on the NaN itself)
        return torch.linalg.eigvalsh(T.nan_to_num(0.0, 0.0, 0.0))[:, -1].clamp_min(0.0)

    def select(self, rows: torch.Tensor) -> ConcavePart:
        """The part of the ``rows`` (m',) only."""
        return ConcavePart(
            self.sgs[rows], self.tail[rows], self.t2[rows], self.d, self.top[rows], self.s[rows]
        )

    def verify(self, mu: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``mu'`` >= ``mu`` (m',) for the ``rows`` (default all), rounded up, with ``mu' I
        - U^T diag(kappa) U`` positive semi-definite (a Cholesky factorisation that runs to
        completion, module docstring); ``inf`` where it fails."""
        part = self if rows is None else self.select(rows)
        sgs, tail, t2 = part.sgs, part.tail, part.t2
        k = sgs.shape[1]
        mu_top = mu - tail
        finite = torch.isfinite(mu_top)
        A = -sgs
        A.diagonal(dim1=1, dim2=2).add_(torch.where(finite, mu_top, 0.0)[:, None])
        info = torch.linalg.cholesky_ex(A)[1] if k else torch.zeros_like(mu, dtype=torch.int32)
        g_k = gamma(k + 1)
        trace = k * mu_top.clamp_min(0.0) * (1 + UNIT)
        form = (gamma(self.d) + 5 * UNIT) * (1 + gamma(self.d)) * t2 + UNIT * mu_top.abs()
        slack = g_k / (1 - g_k) * trace + form + 4 * (k + 2) ** 2 * UNDERFLOW
        verified = (mu_top + slack + tail).mul_(1 + 4 * UNIT).add_(UNDERFLOW)
        ok = (info == 0) & finite & (mu_top > 0) & torch.isfinite(verified)
        # a NaN in the matrix can let a factorisation run to completion: it proves nothing
        ok &= torch.isfinite(sgs).flatten(1).all(1) & torch.isfinite(tail) & torch.isfinite(t2)
        return torch.where(ok, torch.maximum(verified, mu), torch.inf)


@dataclass
class UnitGram:
    """The Gram matrix ``fl(G)`` (H, H) of the rows ``u_l`` of a weight matrix (d,) each,
    with ``|fl(G) - G| <= gamma_d ||u_r|| ||u_m||`` entrywise (``d`` may be taken larger
    to cover rows that are themselves rounded), and the rows' norms rounded up
    (``norm_up`` and ``norm_sq_up``, (H,)): what :class:`ConcavePart` is built from."""

    gram: torch.Tensor
    norm_up: torch.Tensor
    norm_sq_up: torch.Tensor
    d: int

    def ranking(
        self, kappa: torch.Tensor, scale: torch.Tensor | None = None, share: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The units of each row (``kappa`` (m, H)) by ``kappa_l ||u_l||^2``, largest first:
        their order and weights (m, H), and how many to keep (m,) so that the rest's trace
        is at most ``share`` (default :data:`TAIL_SHARE`) times ``scale`` (m,) (without it:
        every unit with ``kappa > 0``)."""
        share = TAIL_SHARE if share is None else share
        weight = kappa * self.norm_sq_up  # kappa_l ||u_l||^2
        order = weight.argsort(dim=1, descending=True)
        ranked = weight.gather(1, order)
        if scale is None:
            return order, ranked, (ranked > 0).sum(1)
        left = ranked.flip(1).cumsum(1).flip(1)  # suffix sums: what is left after i units
        return order, ranked, (left > share * scale[:, None]).sum(1)

    def concave_part(
        self, kappa: torch.Tensor, scale: torch.Tensor | None = None, share: float | None = None
    ) -> ConcavePart:
        """``U^T diag(kappa) U`` (rows (m, H)) split for :meth:`ConcavePart.verify`: the
        units by ``kappa_l ||u_l||^2``, largest first, as many as it takes to leave a tail
        of at most ``share`` (default :data:`TAIL_SHARE`) times ``scale`` (m,) (the ``mu``
        sought; without it, every unit with ``kappa > 0``)."""
        h = kappa.shape[1]
        order, ranked, keep = self.ranking(kappa, scale, share)
        k = min(TOP_UNITS, int(keep.max()) if kappa.numel() else 0)
        top = order[:, :k]
        tail = ranked[:, k:].sum(1).mul_(1 + gamma(h + 3))
        s = kappa.gather(1, top).sqrt().mul_(1 + 4 * UNIT)
        t2 = (s * self.norm_up[top]).square().sum(1).mul_(1 + gamma(k + 2))
        G = torch.take(self.gram, top[:, :, None] * h + top[:, None, :])  # (m, k, k)
        sgs = G.mul_(s[:, :, None]).mul_(s[:, None, :])
        return ConcavePart(sgs, tail, t2, self.d, top, s)

    def largest(
        self, kappa: torch.Tensor, scale: torch.Tensor | None = None, share: float | None = None
    ) -> torch.Tensor:
        """``mu`` (m,) with ``mu I - U^T diag(kappa) U`` positive semi-definite, proved by
        :meth:`ConcavePart.verify` (the units split as :meth:`concave_part` splits them;
        without ``scale``, every unit factorised): from a Lanczos estimate of ``lambda_max``
        from below plus the tail, grown by :data:`RETRY_GROWTH`; ``inf`` where every try
        fails."""
        parts = self.concave_part(kappa, scale, share)
        mu = (parts.estimate() + parts.tail) * (1 + 1e-6)
        return grown(parts.verify, mu, parts.verify(mu), RETRY_GROWTH)


def grown(
    verify: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    mu: torch.Tensor,
    mu_ok: torch.Tensor,
    growth: tuple[float, ...],
) -> torch.Tensor:
    """``mu_ok`` (m,) where every row that failed (``inf``) is tried again at ``mu`` (m,;
    changed) grown by each factor of ``growth`` in turn, ``verify(mu, rows)`` proving the
    ``rows``, until it passes; ``inf`` where every try fails."""
    for grow in growth:
        failed = (~torch.isfinite(mu_ok)).nonzero()[:, 0]
        if not len(failed):
            break
        mu[failed] *= grow
        mu_ok[failed] = verify(mu[failed], failed)
    return mu_ok


@dataclass
class SignedPart:
    """``mu I + U^T diag(q) U`` of m rows with their convex units too (module docstring,
    *The convex units*): the concave ``part``, ``rgr`` (m, p, p) = ``R fl(G) R`` and ``C``
    (m, p, k) = ``R fl(G) S`` on each row's top convex units, ``a`` (m, p) their
    ``r_l ||u_l||`` (rounded up) and ``a2`` (m,) ``||a||^2`` (rounded up)."""

    part: ConcavePart
    rgr: torch.Tensor
    C: torch.Tensor
    a: torch.Tensor
    a2: torch.Tensor

    def select(self, rows: torch.Tensor) -> SignedPart:
        """The part of the ``rows`` (m',) only."""
        return SignedPart(
            self.part.select(rows), self.rgr[rows], self.C[rows], self.a[rows], self.a2[rows]
        )

    def verify(self, mu: torch.Tensor) -> torch.Tensor:
        """``mu'`` >= ``mu`` (m,), rounded up, with ``mu' I + U^T diag(q) U`` positive
        semi-definite, proved through the Schur complement of the convex units (module
        docstring, *The convex units*); ``inf`` where the factorisation fails."""
        part = self.part
        sgs, tail, t2 = part.sgs, part.tail, part.t2
        k, p = sgs.shape[1], self.rgr.shape[1]
        mu_top = mu - tail
        finite = torch.isfinite(mu_top) & (mu_top > 0)
        mu_f = torch.where(finite, mu_top, 1.0)
        Y = self.rgr.clone()
        Y.diagonal(dim1=1, dim2=2).add_(mu_f[:, None])
        L, info_y = torch.linalg.cholesky_ex(Y)
        W = torch.cholesky_solve(self.C, L).nan_to_num_(0.0, 0.0, 0.0)  # any W is sound
        ctw = self.C.transpose(1, 2) @ W
        Z = Y @ W
        wyw = W.transpose(1, 2) @ Z
        X = ctw + ctw.transpose(1, 2) - wyw - sgs
        X.diagonal(dim1=1, dim2=2).add_(mu_f[:, None])
        info = torch.linalg.cholesky_ex(X)[1] if k else torch.zeros_like(info_y)

        def fro(A: torch.Tensor) -> torch.Tensor:
            return A.flatten(1).norm(dim=1)

        eps = (gamma(part.d) + 4 * UNIT) * (1 + gamma(part.d))
        g_p = gamma(p + 2)
        w_f = fro(W)
        aw = torch.einsum("mp,mpk->mk", self.a, W.abs()).norm(dim=1)
        form = (gamma(part.d) + 5 * UNIT) * (1 + gamma(part.d)) * t2 + UNIT * mu_f
        cross = 2 * (g_p * fro(self.C) * w_f + eps * t2.sqrt() * aw)
        quad = w_f.square() * (eps * self.a2 + UNIT * mu_f) + g_p * w_f * (fro(Y) * w_f + fro(Z))
        sums = 5 * UNIT * (mu_f + fro(sgs) + 2 * fro(ctw) + fro(wyw))
        g_k = gamma(k + 1)
        trace = X.diagonal(dim1=1, dim2=2).sum(1).clamp_min(0.0) * (1 + gamma(k + 1))
        c = 2 * (form + cross + quad + sums) + g_k / (1 - g_k) * trace
        c = c + 4 * (k + 2) ** 2 * UNDERFLOW
        # X + c I >= 0 gives mu_top I + U^T diag(q) U >= -c ||t||^2 / mu_top I
        slack = (c * t2 / mu_f).mul_(1 + 8 * UNIT)
        verified = (mu_top + slack + tail).mul_(1 + 4 * UNIT).add_(UNDERFLOW)
        ok = (info == 0) & (info_y == 0) & finite & torch.isfinite(verified)
        parts = (sgs, self.rgr, self.C)
        ok &= torch.stack([torch.isfinite(t).flatten(1).all(1) for t in parts]).all(0)
        ok &= torch.isfinite(tail) & torch.isfinite(t2) & torch.isfinite(self.a2)
        return torch.where(ok, torch.maximum(verified, mu), torch.inf)


@dataclass
class Ascent:
    """Where :meth:`TrustRegionBound.ascend` starts: the live rows (positions in the chunk,
    (nl,)), their last expansion points (offsets from ``zh``, (nl, H)), that bound's radius
    (nl,) and its dual point."""

    live: torch.Tensor
    offsets: torch.Tensor
    radius: torch.Tensor
    dual: tuple[torch.Tensor, KrylovSpan]


class TrustRegionBound(CurvatureBound):
    """Per-class certified radii of the L2 curvature bound minimised over the ball at R
    (module docstring), a radius function for :func:`~.search.radius_search`. ``rng``: the
    L2 pre-activation ranges (ball or box: the ball's bound holds in the box); ``m`` (n, K):
    lower bounds on the margins (``+inf`` at c); ``steps``: Lanczos steps; ``expansions``:
    times each minimised row is bounded again with its units expanded about the last
    minimiser (:mod:`.expansion`; 0: about the point only). A row reports the best of its
    bounds."""

    #: The norm of the ball (a subclass's, :class:`.linf_trust_region.LinfTrustRegionBound`).
    p: float = 2.0
    #: Whether it has a form of its own over the ball in the box (:meth:`set_terms` with
    #: ``at``), with which the engine searches the box column (else that column is the
    #: curvature form's own search in the box, and the ball's radius).
    boxed: bool = False

    def __init__(
        self,
        rng: PreactivationRange,
        m: torch.Tensor,
        steps: int = 16,
        expansions: int = 0,
        ascents: int = 0,
    ) -> None:
        if rng.p != self.p:
            raise ValueError(
                f"this trust-region certificate is an L{self.p:g} one, not p = {rng.p}"
            )
        super().__init__(rng, m, expansions, ascents)
        self.steps = steps
        terms = rng.terms
        self.abs_u = terms.abs_u
        self.spec = float(terms.spectral_norm) * (1 + 2 * UNIT)
        self.norm2_up = terms.row_norms_up(2)  # ||u_l||_2, rounded up
        # the rows whose Gram matrix the positive semi-definiteness is proved on, and their
        # copy in the dual's precision
        self.u_psd, self.units = self.psd_rows()
        self.u_dual = self.u_psd.to(DUAL_DTYPE)

    def psd_rows(self) -> tuple[torch.Tensor, UnitGram]:
        """The rows ``U`` (H, d) on which ``M`` is proved positive semi-definite and the
        dual point is searched, and their :class:`UnitGram`."""
        norm_sq_up = self.norm2_up.square().mul_(1 + 2 * UNIT)
        return self.U, UnitGram(self.rng.terms.gram, self.norm2_up, norm_sq_up, self.U.shape[1])

    def __call__(self, idx: torch.Tensor, r: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        return self.radii(idx, r, need, verify=True)

    def origin(self, idx: torch.Tensor, r: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        """An estimate of the per-class radii (the search's ``origin``): the dual point of
        :func:`krylov_dual` with its ``mu`` not verified, so not a certificate, and only
        for each point's needed class with the smallest margin (``+inf`` for the others);
        it opens the search's bracket without a factorisation and with one row per point
        (on MNIST the search then took 2% more evaluations, a fifth less time, and its mean
        moved by 6e-6)."""
        m = self.m[idx].masked_fill(~need, math.inf)
        first = torch.zeros_like(need).scatter_(1, m.argmin(1, keepdim=True), True)
        rows = first & need & torch.isfinite(m)
        est = self.radii(idx, r, rows, verify=False)
        if not self.expansions:
            return est
        # At R = 0 the ranges hold only the point, so no expansion point can move; moved
        # ones can certify past that estimate (the radii are no longer non-increasing in
        # R), which would cap the search: the estimate is also taken at R = that estimate,
        # with the expansions (where they reach above it, the search's bracket opens there).
        at = est.min(1).values
        at = torch.where(torch.isfinite(at), at, r)
        return torch.maximum(est, self.radii(idx, at, rows, verify=False, expand=True))

    def radii(
        self,
        idx: torch.Tensor,
        r: torch.Tensor,
        need: torch.Tensor,
        verify: bool,
        expand: bool = False,
    ) -> torch.Tensor:
        """Per-class radii (m, K) from :meth:`lower` (``verify``: its ``mu`` verified) on
        the rows (point, class) needed, in chunks of :data:`CHUNK_ROWS`; the moved
        expansion points (:mod:`.expansion`) where ``verify`` or ``expand``.

        Each row first gets the radius ``rho_c`` of the ``lambda_max`` form
        (:class:`.CurvatureBound`, the same ``kappa``; one (H, H) product per row). It is
        itself a certified per-class radius, so where it reaches R the row is done and
        reports ``+inf``: certified to R, all the search needs of it. Reporting ``rho_c``
        there would make the radii rise with R where a row passes from done to minimised,
        and a search started below the optimum would stop at a done row's ``rho_c`` (its
        ``hi``; a mean 5% lower on MNIST from 1.3 times the paper's radius). In an
        estimate, ``verify=False``, every row stays open. The open rows are minimised over
        the ball in the two rounds of :func:`~.search.undercutting_rounds` with ``rho_c`` as
        the key: first each point's row with the smallest ``rho_c``, whose result ``t``
        bounds the point's radius from above; then only the rows with ``rho_c < t`` (the
        others keep ``rho_c``). Every row minimised reports the larger of its two radii. The
        point's radius is the one of every needed row minimised; only the pruning of
        :func:`~.search.radius_search` may see smaller radii for the classes that cannot set
        it."""
        rng = self.rng
        c = rng.pred[idx]
        sel = rng.not_pred[c] & need
        point, cls = sel.nonzero(as_tuple=True)
        out = torch.full_like(self.m[idx], math.inf)
        if not len(point):
            return out
        intervals = rng.intervals(idx, r)
        zh, pad, lo, hi = intervals
        concave = signed_units(self.W, c[point], cls, point, len(idx), negative=True)
        s2_hi = secant_curvature(zh, pad, lo, hi, self.alpha, lower=False, up_units=concave)[0]
        rho = torch.empty(len(point), dtype=out.dtype, device=out.device)
        lam = torch.empty_like(rho)  # the cheap bounds on lambda_max, for the verification
        for start in range(0, len(point), CHUNK_ROWS):
            part = slice(start, start + CHUNK_ROWS)
            p = point[part]
            _, grad, err, kappa, margin = self.rows(idx[p], c[p], cls[part], s2_hi[p])
            lam[part] = self.curvature(kappa)
            args = (grad, err, kappa, margin, lam[part])
            rho[part] = self.first_radius(idx[p], cls[part], *args, big_r=r[p])
        out[point, cls] = rho
        open_ = rho < r[point] if verify else torch.ones_like(rho, dtype=torch.bool)
        # inf Q from below, only for the convex units of the open rows (0 elsewhere: Q > 0)
        s2_lo = torch.zeros_like(s2_hi)
        opened = open_.nonzero()[:, 0]
        if len(opened):
            pts, at = point[opened].unique(), point[opened]
            convex = signed_units(self.W, c[at], cls[opened], at, len(idx), negative=False)
            s2_lo[pts] = secant_curvature(
                zh[pts],
                pad[pts],
                lo[pts],
                hi[pts],
                self.alpha,
                up_units=torch.zeros_like(convex[pts]),
                down_units=convex[pts],
            )[1]

        def minimised(mask: torch.Tensor, enough: torch.Tensor) -> torch.Tensor:
            """The larger of the minimum over the ball and ``rho_c`` for the rows in
            ``mask`` (m, K); ``enough`` (m, 1): :meth:`lower`'s, per point."""
            rows = mask[point, cls].nonzero()[:, 0]
            got = torch.full_like(out, math.inf)
            for start in range(0, len(rows), CHUNK_ROWS):
                chunk = rows[start : start + CHUNK_ROWS]
                p, j = point[chunk], cls[chunk]
                delta, grad, err, kappa, margin = self.rows(idx[p], c[p], j, s2_hi[p])
                convex = self.convex(delta, s2_lo[p])
                moves = self.expansions if verify or expand else 0
                ascents = self.ascents if verify else 0  # not in an estimate
                at = (idx[p], r[p])
                dual = self.dual(grad, convex - kappa, margin, at) if moves or ascents else None
                args = (grad, err, convex, kappa, margin, verify, lam[chunk], enough[p, 0])
                low = self.lower(*args, dual=dual, at=at)
                now = quad_radius(margin, low)  # the live rows' last bound's own radius
                best = torch.maximum(now, rho[chunk])
                live = torch.arange(len(chunk), device=best.device)
                last = None  # the live rows' last expansion points (offsets from zh)
                for _ in range(moves):  # only rows short of a radius that suffices
                    keep = best[live] < enough[p[live], 0]
                    # the dual's rows are the live ones; over the ball of the radius reached
                    reached = torch.minimum(best[live], r[p[live]]).nan_to_num(0.0, 0.0, 0.0)
                    h_star = self.minimiser(dual, reached, idx[p[live]])
                    live = live[keep]
                    last = damped_move(None if last is None else last[keep], h_star[keep])
                    if not len(live):
                        break
                    q = p[live]
                    ex = self.expanded(intervals, q, delta[live], last, margin[live])
                    at = (idx[q], r[q])
                    dual = self.dual(ex.grad, ex.convex - ex.kappa, ex.margin, at)
                    args = (ex.grad, ex.err, ex.convex, ex.kappa, ex.margin, verify)
                    low = self.lower(*args, enough=enough[q, 0], dual=dual, at=at)
                    now = quad_radius(ex.margin, low)
                    best[live] = torch.maximum(best[live], now)
                if ascents and len(live):
                    if last is None:
                        last = torch.zeros_like(delta[live])
                    state = Ascent(live, last, now, dual)
                    self.ascend(state, ascents, intervals, idx, r, p, delta, margin, enough, best)
                got[p, j] = best
            return got

        rows_open = torch.zeros_like(out, dtype=torch.bool)
        rows_open[point, cls] = open_
        got = undercutting_rounds(out, rows_open, minimised)
        if not verify:
            return got
        settled = torch.zeros_like(rows_open)
        settled[point, cls] = ~open_
        return got.masked_fill(settled, math.inf)

    def ascend(
        self,
        state: Ascent,
        steps: int,
        intervals: tuple[torch.Tensor, ...],
        idx: torch.Tensor,
        r: torch.Tensor,
        p: torch.Tensor,
        delta: torch.Tensor,
        margin: torch.Tensor,
        enough: torch.Tensor,
        best: torch.Tensor,
    ) -> None:
        """Raise ``best`` (nr,), the radii of the rows at positions ``p`` (nr,) of the
        points ``idx``, by ``steps`` bounds about expansion points found by gradient ascent
        (:mod:`.expansion`, *Optimised expansion points*), from ``state``: the live rows,
        their last expansion points, that bound's radius and dual point. Each step moves
        every live row's points along :func:`.expansion.ascent_direction` at the minimiser
        of its last accepted bound (over the ball of the radius it reached), scaled so that
        the unit with the largest derivative moves ``step`` times the mean ``|h|``; a bound
        with a larger radius is accepted (its step grows), otherwise the step shrinks. Every
        bound is sound, so each row keeps the best; a row stops at a radius that suffices
        (``enough`` (m, 1), per point). ``r``: the points' R; ``delta``, ``margin``: the
        rows' (nr, H) and (nr,)."""
        live, off, cur = state.live, state.offsets, state.radius
        pos = p[live]
        reached = torch.minimum(cur, r[pos]).nan_to_num(0.0, 0.0, 0.0)
        h = self.minimiser(state.dual, reached, idx[pos])
        g = ascent_direction((*(t[pos] for t in intervals), delta[live]), off, h, self.alpha)
        step = torch.full_like(cur, ASCENT_STEP)
        for _ in range(steps):
            keep = best[live] < enough[p[live], 0]
            live, off, cur, h, g, step = (t[keep] for t in (live, off, cur, h, g, step))
            if not len(live):
                return
            pos = p[live]
            trial = ascent_trial(off, h, g, step)
            ex = self.expanded(intervals, pos, delta[live], trial, margin[live])
            at = (idx[pos], r[pos])
            dual = self.dual(ex.grad, ex.convex - ex.kappa, ex.margin, at)
            args = (ex.grad, ex.err, ex.convex, ex.kappa, ex.margin, True)
            got = quad_radius(ex.margin, self.lower(*args, enough=enough[pos, 0], dual=dual, at=at))
            best[live] = torch.maximum(best[live], got)
            better = got > cur  # False for NaN
            step = next_step(step, better)
            moved = better.nonzero()[:, 0]
            if not len(moved):
                continue
            reached = torch.minimum(got, r[pos]).nan_to_num(0.0, 0.0, 0.0)
            h_new = self.minimiser(dual, reached, idx[pos])[moved]
            off[moved], cur[moved], h[moved] = trial[moved], got[moved], h_new
            rows = (*(t[pos[moved]] for t in intervals), delta[live[moved]])
            g[moved] = ascent_direction(rows, off[moved], h_new, self.alpha)

    def first_radius(
        self,
        idx: torch.Tensor,
        cls: torch.Tensor,
        grad: torch.Tensor,
        err: torch.Tensor,
        kappa: torch.Tensor,
        margin: torch.Tensor,
        cheap: torch.Tensor,
        big_r: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The radii (nr,) of the rows (points ``idx``, classes ``cls``) by the curvature
        form ``m - (||a|| + err) r - Lambda r^2 / 2`` (dual norm), ``Lambda`` from
        :meth:`first_curvature` with ``cheap`` (nr,) the cheap bound on
        ``lambda_max(U^T diag(kappa) U)``; with a box-constrained range and ``big_r`` (nr,),
        the rows' R, the larger of it and the same form with the box's linear term
        (:func:`.linear_min.box_lower`, as :class:`.CurvatureBound` in the box)."""
        lam = 0.5 * self.first_curvature(idx, cls, kappa, cheap)
        rho = quad_radius(margin, dual_norm_lower(grad, err, self.rng.q), lam)
        if not self.rng.box or big_r is None:
            return rho
        box = box_lower(grad, err, self.rng.x[idx], big_r, self.p)
        return torch.maximum(rho, quad_radius(margin, box, lam))

    def first_curvature(
        self, idx: torch.Tensor, cls: torch.Tensor, kappa: torch.Tensor, cheap: torch.Tensor
    ) -> torch.Tensor:
        """``Lambda`` (nr,) of :meth:`first_radius`: the cheap bound itself in L2."""
        return cheap

    def dual(
        self,
        grad: torch.Tensor,
        q: torch.Tensor,
        margin: torch.Tensor,
        at: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, KrylovSpan]:
        """The rows' dual point ``(mu, span)`` of :func:`krylov_dual` for the bound with
        gradient ``grad`` (m, d), curvature ``q`` (m, H) and margin (m,), in
        :data:`DUAL_DTYPE`; ``mu`` unverified. ``at``: the rows' points and R (the ball's
        dual ignores them)."""
        dt = DUAL_DTYPE
        return krylov_dual(
            grad.to(dt), q.to(dt), self.u_dual, margin.clamp_min(0.0).to(dt), self.steps
        )

    def dual_vector(self, span: KrylovSpan, mu: torch.Tensor) -> torch.Tensor:
        """The dual's ``w`` (m, d) at ``mu`` (m,), in the input's coordinates and dtype."""
        return span.solve(mu.to(DUAL_DTYPE)).to(self.U.dtype)

    def minimiser(
        self,
        dual: tuple[torch.Tensor, KrylovSpan],
        r: torch.Tensor,
        points: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The units' ``h* = U v*`` (m, H) at the minimiser ``v* = -w`` of the bound whose
        :meth:`dual` point is ``dual`` (unverified) over the ball of radius ``r`` (m,; at
        the dual's ``mu``, ``-w`` is on its sphere): where :mod:`.expansion` moves the
        expansion points. Any value is sound there; a NaN row's is 0. ``points`` (m,): the
        rows' points (the ball's ignores them; :attr:`boxed` subclasses clip to the box)."""
        mu, span = dual
        h = -(span.solve(mu) @ self.u_dual.T)
        return h.to(self.U.dtype).nan_to_num_(0.0, 0.0, 0.0)

    def convex(self, delta: torch.Tensor, s2_lo: torch.Tensor) -> torch.Tensor:
        """The convex units' ``delta_l inf Q_l`` (m, H) of rows with ``delta`` (m, H) and the
        secant bounds on ``inf Q`` of their points' units ``s2_lo`` (m, H), rounded down."""
        return torch.where(delta > 0, delta.abs() * s2_lo, 0.0).mul_(1 - 4 * UNIT)

    def lower(
        self,
        grad: torch.Tensor,
        err: torch.Tensor,
        convex: torch.Tensor,
        kappa: torch.Tensor,
        margin: torch.Tensor,
        verify: bool = True,
        cheap: torch.Tensor | None = None,
        enough: torch.Tensor | None = None,
        dual: tuple[torch.Tensor, KrylovSpan] | None = None,
        at: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> QuadLower:
        """``QuadLower`` of ``a^T v + 1/2 sum q_l (u_l^T v)^2`` over ``||v|| <= r``
        (module docstring): a dual point from :func:`krylov_dual` (``dual``, where the
        caller has computed it already with :meth:`dual`), its ``mu`` verified
        (``verify=False``: taken as it is, positive definite in the Krylov span only; an
        estimate, not a bound). ``cheap`` (m,), optional: the rows' cheap bounds on
        ``lambda_max`` (:meth:`.CurvatureBound.curvature` of ``kappa``) where known.
        ``enough`` (m,), optional: radii that suffice. A row whose dual ``mu`` is below the
        cheap bound would need a factorisation; where the bound with ``mu`` raised to the
        cheap bound (verified as it is, a looser dual point) already reaches ``enough``,
        the row keeps that one. ``at`` (optional): the rows' points and the radius R up to
        which the bound must hold, for :meth:`evaluate`."""
        q = convex - kappa
        mu, span = self.dual(grad, q, margin, at) if dual is None else dual
        mu = mu.to(grad.dtype)

        def solve(mu: torch.Tensor) -> torch.Tensor:
            return self.dual_vector(span, mu)

        if not verify:
            return self.evaluate(grad, err, q, convex, kappa, solve(mu), mu, at)
        cheap = self.curvature(kappa) if cheap is None else cheap
        # rows that would need a factorisation and may not: first at the cheap bound
        easy = torch.zeros_like(mu, dtype=torch.bool) if enough is None else torch.isfinite(enough)
        easy &= mu < cheap
        mu_ok = self.verified(kappa, torch.where(easy, cheap, mu), cheap, convex)
        low = self.evaluate(grad, err, q, convex, kappa, solve(mu_ok), mu_ok, at)
        short = (easy & (quad_radius(margin, low) < enough)).nonzero()[:, 0] if easy.any() else []
        if len(short):  # that fell short: factorised after all
            mu_ok[short] = self.verified(kappa[short], mu[short], cheap[short], convex[short])
            args = (grad, err, q, convex, kappa, solve(mu_ok), mu_ok)
            part = None if at is None else (at[0][short], at[1][short])
            redo = self.evaluate(*(a[short] for a in args), at=part)
            low.const[short], low.lin[short], low.quad[short] = redo.const, redo.lin, redo.quad
        return low

    def verified(
        self,
        kappa: torch.Tensor,
        mu: torch.Tensor,
        cheap: torch.Tensor | None = None,
        convex: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``mu'`` (m,) at least ``mu`` with ``mu' I - U^T diag(kappa) U`` (``kappa`` (m, H))
        positive semi-definite: ``mu`` itself where it is at least the cheap bound on
        ``lambda_max`` of :meth:`.CurvatureBound.curvature`, otherwise verified by
        :meth:`ConcavePart.verify` (from ``mu``; with ``convex`` (m, H), the convex units'
        ``q``, then with them too, :meth:`with_convex`, which proves ``mu' I + U^T
        diag(convex - kappa) U`` positive semi-definite, all the bound needs; then from an
        estimate of ``lambda_max``, then after at most ``len(RETRY_GROWTH)`` growths);
        ``inf`` where every try fails.
        ``cheap`` (m,), optional: that bound where the caller has it already. The rows to
        factorise go in batches of :data:`FACTOR_ROWS` with similar numbers of top units,
        since a batch's matrices take the size of its largest."""
        mu = mu.clone()
        cheap = self.curvature(kappa) if cheap is None else cheap
        # not "mu < cheap": a NaN cheap bound (or mu) must send the row to the factorisation
        hard = (~(mu >= cheap)).nonzero()[:, 0]
        hard = hard[self.ranking(kappa[hard], mu[hard])[2].argsort()]
        for start in range(0, len(hard), FACTOR_ROWS):
            rows = hard[start : start + FACTOR_ROWS]
            mu[rows] = self.factorised(
                kappa[rows], mu[rows], None if convex is None else convex[rows]
            )
        return mu

    def factorised(
        self, kappa: torch.Tensor, mu: torch.Tensor, convex: torch.Tensor | None = None
    ) -> torch.Tensor:
        """:meth:`verified` by factorisations only (``mu`` (m,) is changed)."""
        parts = self.concave_part(kappa, mu)
        mu_ok = parts.verify(mu)  # the dual's mu passes as it is on most rows
        failed = (~torch.isfinite(mu_ok)).nonzero()[:, 0]
        if len(failed) and convex is not None:  # with the convex units (module docstring)
            mu_ok[failed] = self.with_convex(kappa[failed], convex[failed], mu[failed])
            failed = (~torch.isfinite(mu_ok)).nonzero()[:, 0]
        if len(failed):  # then start from an estimate of lambda_max from below
            sub = parts.select(failed)
            mu[failed] = torch.maximum(mu[failed], (sub.estimate() + sub.tail) * (1 + 1e-6))
            mu_ok[failed] = parts.verify(mu[failed], failed)
        return grown(parts.verify, mu, mu_ok, RETRY_GROWTH)

    def with_convex(
        self, kappa: torch.Tensor, convex: torch.Tensor, mu: torch.Tensor
    ) -> torch.Tensor:
        """``mu'`` >= ``mu`` (m,) with ``mu' I + U^T diag(convex - kappa) U`` positive
        semi-definite, proved by :meth:`SignedPart.verify`: from the larger of ``mu`` and an
        estimate of ``-lambda_min`` from below (:meth:`lowest`), then grown by
        :data:`SIGNED_GROWTH`; ``inf`` where every try fails."""
        est = self.lowest(convex - kappa)
        mu = torch.maximum(mu, est * (1 + 1e-6))
        signed = self.signed_part(kappa, convex, mu)
        return grown(
            lambda m, rows: signed.select(rows).verify(m), mu, signed.verify(mu), SIGNED_GROWTH
        )

    def lowest(self, q: torch.Tensor, steps: int = 24) -> torch.Tensor:
        """``-lambda_min(U^T diag(q) U)`` of each row ``q`` (m, H), from below (the smallest
        Ritz value of ``steps`` Lanczos steps from a fixed pseudo-random start): where to
        start looking for a verified ``mu``, not a bound; at least 0."""
        gen = torch.Generator(device="cpu").manual_seed(0)
        U = self.u_psd
        start = torch.rand(U.shape[1], generator=gen, dtype=q.dtype).add_(0.5).to(q.device)
        _, T = lanczos(lambda v: ((v @ U.T) * q) @ U, start.expand(len(q), -1), steps)
        # a NaN row estimates 0 (its proof then fails on the NaN itself)
        return (-torch.linalg.eigvalsh(T.nan_to_num(0.0, 0.0, 0.0))[:, 0]).clamp_min(0.0)

    def concave_part(
        self, kappa: torch.Tensor, scale: torch.Tensor | None = None, share: float | None = None
    ) -> ConcavePart:
        """:meth:`UnitGram.concave_part` of the hidden layer's rows."""
        return self.units.concave_part(kappa, scale, share)

    def signed_part(
        self, kappa: torch.Tensor, convex: torch.Tensor, mu: torch.Tensor
    ) -> SignedPart:
        """``mu I + U^T diag(convex - kappa) U`` (rows (m, H)) for :meth:`SignedPart.verify`:
        the concave units as :meth:`concave_part` splits them for a tail of at most
        :data:`SIGNED_TAIL_SHARE` of ``mu`` (m,), and the convex
        units whose ``q_l ||u_l||^2`` is at least :data:`CONVEX_SHARE` times ``mu`` (the
        others are left out: they only add a positive semi-definite part)."""
        h = kappa.shape[1]
        part = self.concave_part(kappa, mu, SIGNED_TAIL_SHARE)
        units = self.units
        weight = convex.clamp_min(0.0) * units.norm_sq_up
        order = weight.argsort(dim=1, descending=True)
        ranked = weight.gather(1, order)
        keep = (ranked >= CONVEX_SHARE * mu[:, None]) & (ranked > 0)
        p = min(TOP_UNITS, int(keep.sum(1).max()) if convex.numel() else 0)
        top, keep = order[:, :p], keep[:, :p]
        r = convex.gather(1, top).clamp_min(0.0).sqrt().mul_(1 - 4 * UNIT).mul_(keep)
        a = (r * units.norm_up[top]).mul_(1 + 4 * UNIT)
        a2 = a.square().sum(1).mul_(1 + gamma(p + 2))
        gp = torch.take(units.gram, top[:, :, None] * h + top[:, None, :])
        rgr = gp.mul_(r[:, :, None]).mul_(r[:, None, :])
        C = torch.take(units.gram, top[:, :, None] * h + part.top[:, None, :])
        C = C.mul_(r[:, :, None]).mul_(part.s[:, None, :])
        return SignedPart(part, rgr, C, a, a2)

    def ranking(
        self, kappa: torch.Tensor, scale: torch.Tensor | None = None, share: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`UnitGram.ranking` of the hidden layer's rows."""
        return self.units.ranking(kappa, scale, share)

    def verified_mu(self, kappa: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        """``mu'`` >= ``mu`` (rounded up) with ``mu' I - U^T diag(kappa) U`` positive
        semi-definite, proved by a Cholesky factorisation (module docstring); ``inf`` where
        the factorisation fails."""
        return self.concave_part(kappa).verify(mu)

    def evaluate(
        self,
        grad: torch.Tensor,
        err: torch.Tensor,
        q: torch.Tensor,
        convex: torch.Tensor,
        kappa: torch.Tensor,
        w: torch.Tensor,
        mu: torch.Tensor,
        at: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> QuadLower:
        """``C >= w^T M w / 2``, ``B >= ||a - M w||_2`` and ``mu / 2`` rounded up (module
        docstring): ``phi(r) >= -(C + B r + mu r^2 / 2)``. ``at``: the rows' points (m,)
        and the radius R (m,) up to which the bound must hold, for :meth:`set_terms` (the
        ball's terms ignore them)."""
        h, d = self.U.shape
        t = w @ self.U.T  # (m, H)
        e = (w.abs() @ self.abs_u.T).mul_(gamma(d) * (1 + 2 * gamma(d))).add_(UNDERFLOW)
        x_part = self.metric(w, mu)
        g_h = 1 + gamma(h + 3)
        p_part = (convex * (t.abs() + e).square()).sum(1).mul_(g_h)
        n_part = (kappa * (t.abs() - e).clamp_min(0.0).square()).sum(1).mul_(1 - 2 * gamma(h + 3))
        total = x_part + p_part + n_part
        const = 0.5 * ((x_part + p_part - n_part) + 4 * UNIT * total)
        qt = q * t
        res, spare = self.residual_parts(grad, err, w, mu, q.abs() * e, qt, qt @ self.U)
        extra, lin, quad = self.set_terms(res, spare, mu, at)
        const = const + extra
        bad = ~torch.isfinite(mu)
        lin = torch.where(bad, torch.inf, lin)
        const = torch.where(bad, torch.inf, const)
        quad = torch.where(bad, torch.inf, quad)
        return QuadLower(const=const, lin=lin, quad=quad)

    def set_terms(
        self,
        res: torch.Tensor,
        spare: torch.Tensor,
        mu: torch.Tensor,
        at: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``-min (b^T v - mu ||v||^2 / 2) <= const + lin r + quad r^2`` over the set of
        radius ``r <= R`` (each (m,), rounded up), ``b = a - M w`` computed as ``res`` (m,
        d) within ``spare`` (m,) in the norm (:meth:`residual_parts`): ``(0, B, mu / 2)``
        over the ball (:meth:`norm_up`, :meth:`quadratic`). ``at``: the rows' points and R,
        for a :attr:`boxed` subclass's own form in the box; the L2 ball keeps the ball's
        terms there (the box's linear term moved the record's L2 box column by 0.2% for
        1.7 times its time)."""
        return torch.zeros_like(spare), self.norm_up(res, spare), self.quadratic(mu)

    def metric(self, w: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        """``mu ||w||^2`` (m,), rounded up: the part ``mu I`` of ``w^T M w``."""
        ww = (w * w).sum(1).mul_(1 + gamma(w.shape[1] + 1))
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
        """The computed ``a - M w`` (m, d) and a bound (m,) on the L2 norm of its error
        (module docstring, *Rounding of C and B*): ``qe`` (m, H) the bound ``|q| e`` on the
        error of ``q t``, ``qt`` the computed ``q t`` and ``z`` the computed ``U^T (q t)``
        (m, d)."""
        h, d = self.U.shape
        res = grad - mu[:, None] * w - z
        e1 = self.spec * qe.norm(dim=1) * (1 + gamma(h + 2))
        e2 = (qt.abs() @ self.norm2_up).mul_(gamma(h + 1) * (1 + gamma(h + 2)))
        norms = grad.norm(dim=1) + mu * w.norm(dim=1) + z.norm(dim=1)
        e3 = 3 * UNIT * norms * (1 + gamma(d + 2))
        return res, (err + e1 + e2 + e3).mul_(1 + 2 * UNIT)

    def norm_up(self, res: torch.Tensor, spare: torch.Tensor) -> torch.Tensor:
        """``B >= ||res||_2 + spare`` (m,) for ``res`` (m, d), rounded up."""
        d = res.shape[1]
        return (res.norm(dim=1) * (1 + gamma(d + 2)) + spare).mul_(1 + 4 * UNIT)

    def quadratic(self, mu: torch.Tensor) -> torch.Tensor:
        """The coefficient ``mu / 2`` (m,) of ``r^2``, rounded up."""
        return (0.5 * mu).mul_(1 + UNIT)
