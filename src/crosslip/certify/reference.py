"""Straightforward per-point implementations, written as the paper states them.

They are the oracles the batched code is tested against and the baselines the benchmarks
compare with: one point at a time, the (H, H) matrix ``beta`` of Proposition 2.3 built
explicitly for each class, and the same search (:func:`~.search.theorem21`). They evaluate
the formulas as printed in float64, without the rounding terms of the batched code
(:mod:`.rounding`), so they agree with it to about 1e-9 relative, not to the last bit.
"""

from __future__ import annotations

import torch

from ..models import SoftplusNet
from .search import LipschitzFn, margins, theorem21


def prop23_reference(
    U: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor,
    alpha: float,
    G: torch.Tensor,
    x: torch.Tensor,
    c: int,
    r: float,
) -> torch.Tensor:
    """Proposition 2.3 for one point ``x`` (d,) and predicted class ``c`` at radius ``r``:

    ``L_j = [sum_rm max(beta_rm, 0) s+_r s+_m + min(beta_rm, 0) s-_r s-_m]^(1/2)`` with
    ``beta_rm = (w_jr - w_cr)(w_jm - w_cm) <u_r, u_m>`` and ``G = U U^T`` (H, H).
    Returns (K,) with 0 at ``j = c``.
    """
    z = U @ x + b
    shift = r * U.norm(dim=1)
    s_hi = torch.sigmoid(alpha * (z + shift))
    s_lo = torch.sigmoid(alpha * (z - shift))
    out = torch.zeros(W.shape[0], dtype=U.dtype, device=U.device)
    for j in range(W.shape[0]):
        if j == c:
            continue
        d = W[j] - W[c]
        beta = torch.outer(d, d) * G
        terms = torch.where(
            beta > 0, beta * torch.outer(s_hi, s_hi), beta * torch.outer(s_lo, s_lo)
        )
        out[j] = terms.sum().clamp_min(0).sqrt()
    return out


def certify_prop23_reference(net: SoftplusNet, x: torch.Tensor, rtol: float = 1e-3) -> torch.Tensor:
    """Theorem 2.1 + Proposition 2.3 (L2) point by point; guarantees (n,) in float64."""
    net = net.double().eval()
    U, W = net.U.detach(), net.W.detach()
    b = net.hidden_bias().detach()
    G = U @ U.T
    out = torch.empty(len(x), dtype=torch.float64, device=U.device)
    with torch.no_grad():
        for i in range(len(x)):
            xi = x[i].double()
            logits = net(xi[None])
            c = int(logits.argmax(1))
            m = margins(logits, torch.tensor([c], device=logits.device))

            def lip(idx: torch.Tensor, r: torch.Tensor, xi=xi, c=c) -> torch.Tensor:
                return prop23_reference(U, W, b, net.alpha, G, xi, c, float(r[0]))[None]

            out[i] = theorem21(m, lip, rtol=rtol).guarantee[0]
    return out


def linear_lipschitz(W: torch.Tensor, pred: torch.Tensor, q: float = 2.0) -> LipschitzFn:
    """For a linear model ``f = W x + c`` the cross-Lipschitz constant ``||w_c - w_j||_q`` is
    exact and constant, and Theorem 2.1 gives the exact p-distance to the decision boundary
    (the paper's tightness remark after Theorem 2.1). Used as a test oracle."""
    lip = (W[pred][:, None, :] - W[None, :, :]).norm(p=q, dim=-1)
    return lambda idx, r: lip[idx]
