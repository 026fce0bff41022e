"""Robustness guarantees (lower bounds) of Theorem 2.1.

Theorem 2.1: for a classifier ``f`` predicting ``c`` at ``x`` and any ``R > 0``,
``alpha(R) = min{ min_{j != c} (f_c(x) - f_j(x)) / L_j(R), R }`` is a certified radius in the
p-norm whenever ``L_j(R) >= max_{y in B_p(x, R)} ||grad f_c(y) - grad f_j(y)||_q``.
The guarantee is ``max_R alpha(R)``.

The search over R (:func:`theorem21`) is generic: it takes the margins and a function
returning upper bounds ``L_j(R)`` that are non-decreasing in R. It is vectorized over all
points, and only ever reports ``alpha(R)`` at an R it evaluated, so stopping early costs
tightness, never soundness.

All computations default to float64: the bound of Proposition 2.3 is a difference of two
sums, and rounding must not make it smaller than the quantity it bounds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .models import SoftplusNet

#: ``L(idx, R) -> (m, K)``: bounds for the points ``idx`` (m,) at radii ``R`` (m,).
LipschitzFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Certificate:
    """Per-point result, all tensors of shape (n,).

    ``guarantee``: certified radius; ``radius``: the R at which it was attained (``inf``
    for bounds that do not depend on R); ``bound_class``: the class j attaining the minimum
    in Theorem 2.1 at that R (-1 for a zero margin); ``evaluations``: how many R were tried.
    """

    guarantee: torch.Tensor
    radius: torch.Tensor
    bound_class: torch.Tensor
    evaluations: torch.Tensor


def margins(logits: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """``f_c(x) - f_j(x)``, shape (n, K), with ``+inf`` at ``j = c``."""
    m = logits.gather(1, pred[:, None]) - logits
    return m.scatter(1, pred[:, None], float("inf"))


def _ratio(m: torch.Tensor, lip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``min_j m_j / L_j`` and its argmin; ``m/0 = inf`` for ``m > 0``, ``0/0 = 0``."""
    r = torch.where(lip > 0, m / lip.clamp_min(torch.finfo(lip.dtype).tiny), torch.inf)
    r = torch.where(m <= 0, torch.zeros_like(r), r)
    return r.min(dim=1)


def theorem21(
    m: torch.Tensor,
    lipschitz: LipschitzFn,
    rtol: float = 1e-3,
    max_iter: int = 100,
    r_max: float = float("inf"),
) -> Certificate:
    """Maximize ``alpha(R)`` of Theorem 2.1 over R for every point at once.

    ``m``: margins (n, K) from :func:`margins`. With ``g(R) = min_j m_j / L_j(R)``
    non-increasing, ``alpha(R) = min(g(R), R)`` and the optimum ``alpha*`` satisfies
    ``alpha* <= g(0)``. Bisection on ``[lo, hi] = [0, min(g(0), r_max)]`` keeps
    ``g(lo) >= lo`` (so ``alpha(lo) = lo`` is certified) and ``alpha* <= hi``; it stops when
    ``hi - lo <= rtol * hi``, so the reported value is within a relative ``rtol`` of the
    bound's optimum. The reported guarantee is the largest ``alpha(R)`` evaluated.
    """
    n = m.shape[0]
    dev, dt = m.device, m.dtype
    all_idx = torch.arange(n, device=dev)
    g0, j0 = _ratio(m, lipschitz(all_idx, torch.zeros(n, device=dev, dtype=dt)))
    best = torch.zeros(n, device=dev, dtype=dt)
    best_r = torch.zeros(n, device=dev, dtype=dt)
    best_j = torch.full((n,), -1, device=dev, dtype=torch.long)
    evals = torch.ones(n, device=dev, dtype=torch.long)
    lo = torch.zeros(n, device=dev, dtype=dt)
    hi = torch.clamp(g0, max=r_max)

    def evaluate(idx: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        g, j = _ratio(m[idx], lipschitz(idx, r))
        alpha = torch.minimum(g, r)
        better = alpha > best[idx]
        best[idx] = torch.where(better, alpha, best[idx])
        best_r[idx] = torch.where(better, r, best_r[idx])
        best_j[idx] = torch.where(better, j, best_j[idx])
        evals[idx] += 1
        return g

    # Points with a finite, positive search interval; the others keep 0 (zero margin) or are
    # unbounded (L_j = 0 for all j and r_max = inf): guarantee +inf.
    unbounded = torch.isinf(hi)
    best[unbounded], best_r[unbounded] = torch.inf, torch.inf
    best_j[unbounded] = j0[unbounded]
    active = all_idx[(hi > 0) & ~unbounded]
    if len(active):
        g_hi = evaluate(active, hi[active])  # alpha(hi) = g(hi) unless g(hi) >= hi
        lo[active] = torch.where(g_hi >= hi[active], hi[active], lo[active])
    for _ in range(max_iter):
        active = active[(hi[active] - lo[active]) > rtol * hi[active]]
        if len(active) == 0:
            break
        mid = 0.5 * (lo[active] + hi[active])
        g = evaluate(active, mid)
        ok = g >= mid
        lo[active] = torch.where(ok, mid, lo[active])
        hi[active] = torch.where(ok, hi[active], mid)
    return Certificate(best, best_r, best_j, evals)


class Prop23Bound:
    """Local cross-Lipschitz bound of Proposition 2.3 (one hidden layer, p = q = 2).

    With ``d_r = w_jr - w_cr``, ``G = U U^T`` and ``beta_rm = d_r d_m G_rm``,
    ``L_j(R)^2 = sum_rm max(beta_rm, 0) s+_r s+_m + min(beta_rm, 0) s-_r s-_m`` where
    ``s+-_r = sigma'(z_r +- R ||u_r||_2)`` and ``z = U x + b`` (the hidden biases only shift
    z; the proof is unchanged). Splitting ``d = d+ - d-`` and ``G = G+ - G-`` into positive
    and negative parts gives, with ``a = s+`` and ``b = s-``,
    ``sum max(beta,0) a_r a_m = (d+a)^T G+ (d+a) + (d-a)^T G+ (d-a) + 2 (d+a)^T G- (d-a)``
    ``sum min(beta,0) b_r b_m = -[(d+b)^T G- (d+b) + (d-b)^T G- (d-b) + 2 (d+b)^T G+ (d-b)]``,
    i.e. six (mK, H) x (H, H) products per evaluation, no (H, H) tensor per point.
    """

    def __init__(self, net: SoftplusNet, x: torch.Tensor, pred: torch.Tensor, dtype=torch.float64):
        U = net.U.detach().to(dtype)
        self.W = net.W.detach().to(dtype)
        self.alpha = net.alpha
        self.unorm = U.norm(dim=1)  # (H,)
        G = U @ U.T
        self.Gp, self.Gn = G.clamp_min(0), (-G).clamp_min(0)
        self.z = x.to(dtype) @ U.T + net.hidden_bias().detach().to(dtype)  # (n, H)
        self.pred = pred

    def __call__(self, idx: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        z = self.z[idx]
        shift = r[:, None] * self.unorm[None, :]
        a = torch.sigmoid(self.alpha * (z + shift))[:, None, :]  # (m, 1, H)
        b = torch.sigmoid(self.alpha * (z - shift))[:, None, :]
        d = self.W[None, :, :] - self.W[self.pred[idx]][:, None, :]  # (m, K, H)
        dp, dn = d.clamp_min(0), (-d).clamp_min(0)

        def quad(u: torch.Tensor, g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return ((u @ g) * v).sum(-1)

        pa, na, pb, nb = dp * a, dn * a, dp * b, dn * b
        pos = quad(pa, self.Gp, pa) + quad(na, self.Gp, na) + 2 * quad(pa, self.Gn, na)
        neg = quad(pb, self.Gn, pb) + quad(nb, self.Gn, nb) + 2 * quad(pb, self.Gp, nb)
        return (pos - neg).clamp_min(0).sqrt()


def global_bound(
    net: SoftplusNet, pred: torch.Tensor, dtype=torch.float64, spectral_norm=None
) -> torch.Tensor:
    """Global cross-Lipschitz constants ``||w_c - w_j||_2 ||U||_2`` (Section 5), shape (n, K).

    Valid for every y because ``0 < sigma' <= 1`` (softplus is 1-Lipschitz).
    ``spectral_norm`` (``||U||_2``) may be passed in so that it is computed once.
    """
    W = net.W.detach().to(dtype)
    spec = spectral_norm
    if spec is None:
        spec = torch.linalg.matrix_norm(net.U.detach().to(dtype), ord=2)
    return (W[pred][:, None, :] - W[None, :, :]).norm(dim=-1) * spec


def certify_softplus(
    net: SoftplusNet,
    x: torch.Tensor,
    rtol: float = 1e-3,
    dtype: torch.dtype = torch.float64,
    batch_size: int = 2048,
) -> dict[str, torch.Tensor]:
    """L2 guarantees of the one-hidden-layer net for the points ``x`` (n, d).

    Returns per-point tensors: ``pred``, ``margin`` (``f_c - max_{j != c} f_j``),
    ``guarantee_local`` (Theorem 2.1 + Proposition 2.3), ``radius_local``, ``bound_class``,
    ``guarantee_global`` (Theorem 2.1 with the global constant; no search needed) and
    ``evaluations`` (number of R evaluated).
    """
    net = copy.deepcopy(net).to(dtype=dtype, device=x.device).eval()
    out: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        spec = torch.linalg.matrix_norm(net.U, ord=2)  # point-independent: once for all
        for i in range(0, len(x), batch_size):
            xb = x[i : i + batch_size].to(dtype)
            logits = net(xb)
            pred = logits.argmax(1)
            m = margins(logits, pred)
            cert = theorem21(m, Prop23Bound(net, xb, pred, dtype), rtol=rtol)
            g_glob, _ = _ratio(m, global_bound(net, pred, dtype, spectral_norm=spec))
            parts = {
                "pred": pred,
                "margin": m.min(1).values,
                "guarantee_local": cert.guarantee,
                "radius_local": cert.radius,
                "bound_class": cert.bound_class,
                "evaluations": cert.evaluations,
                "guarantee_global": g_glob,
            }
            for k, v in parts.items():
                out.setdefault(k, []).append(v.cpu())
    return {k: torch.cat(v) for k, v in out.items()}


def linear_lipschitz(W: torch.Tensor, pred: torch.Tensor) -> LipschitzFn:
    """For a linear model ``f = W x + c`` the cross-Lipschitz constant is exact and
    constant: ``||w_c - w_j||_2``; Theorem 2.1 then gives the exact distance to the
    decision boundary (the paper's tightness remark). Used as a test oracle."""
    lip = (W[pred][:, None, :] - W[None, :, :]).norm(dim=-1)
    return lambda idx, r: lip[idx]
