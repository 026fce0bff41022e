"""A sort-based baseline for the box-constrained projections, in the style of AutoAttack's
FAB projections (Croce & Hein 2020): per row, one full sort of the breakpoints, cumulative
sums over the sorted order, and a bisection of ``ceil(log2 d)`` gather steps for the piece
that reaches the required decrease. Written for ``bench_attack.py`` (not AutoAttack's code):
same problem as :class:`crosslip.attacks.BoxProblem`, rows ``(x (n, d), v (n, d), t (n,))``,
``min ||delta||_p s.t. <v, delta> <= -t, lo <= x + delta <= hi``; it returns ``delta``.
L1 inverts its permutation with a second sort, as FAB does.
"""

from __future__ import annotations

import math

import torch


def _bisect(keys: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """First index k with ``keys[:, k] >= t`` (keys non-decreasing), by ``ceil(log2 d)``
    halvings of ``[0, d]``; ``d`` where no key reaches t."""
    n, d = keys.shape
    lo = torch.zeros(n, dtype=torch.long, device=keys.device)
    hi = torch.full((n,), d, dtype=torch.long, device=keys.device)
    for _ in range(math.ceil(math.log2(d + 1))):
        mid = (lo + hi) // 2
        below = keys.gather(1, mid.clamp(max=d - 1)[:, None]).squeeze(1) < t
        go = below & (mid < hi)
        lo = torch.where(go, mid + 1, lo)
        hi = torch.where(go, hi, mid)
    return lo


def _room(x, v, lo, hi):
    return torch.where(v > 0, x - lo, hi - x)


def project_sorted(x, v, t, p, lo=0.0, hi=1.0) -> torch.Tensor:
    """The baseline for ``p`` in (1, 2, inf): ``delta`` (n, d)."""
    room, absv = _room(x, v, lo, hi), v.abs()
    d = x.shape[1]
    if p == 1:
        order = torch.argsort(absv, dim=1, descending=True)
        inverse = torch.argsort(order, dim=1)  # FAB inverts the permutation by sorting
        a, r = absv.gather(1, order), room.gather(1, order)
        cum = torch.cumsum(a * r, dim=1)
        k = _bisect(cum, t)
        kc = k.clamp(max=d - 1)[:, None]
        before = torch.where(k > 0, cum.gather(1, (k - 1).clamp_min(0)[:, None]).squeeze(1), 0)
        part = (t - before) / a.gather(1, kc).squeeze(1)
        pos = torch.arange(d, device=x.device)[None, :]
        u = torch.where(pos < k[:, None], r, 0.0)
        r_k = r.gather(1, kc).squeeze(1)
        u.scatter_(1, kc, torch.where(k < d, torch.minimum(part, r_k), r_k)[:, None])
        return -torch.sign(v) * u.gather(1, inverse) * (t > 0)[:, None]
    if p == 2:
        b, w = room / absv, absv * absv
    else:
        b, w = room, absv
    b = torch.where(absv == 0, torch.inf, b)
    bs, idx = torch.sort(b, dim=1)
    ws = w.gather(1, idx)
    fin = torch.isfinite(bs)
    wb = torch.where(fin, ws * bs, 0.0)
    below = torch.cumsum(wb, 1) - wb
    above = ws.sum(1, keepdim=True) - torch.cumsum(ws, 1) + ws
    keys = torch.where(fin, below + bs * above, torch.inf)
    k = _bisect(keys, t)
    kc = k.clamp(max=d - 1)[:, None]
    s = (t - below.gather(1, kc).squeeze(1)) / above.gather(1, kc).squeeze(1)
    big = torch.finfo(s.dtype).max
    s = torch.where((k >= d) | ~fin.gather(1, kc).squeeze(1), big, s).clamp(0, big)[:, None]
    step = torch.minimum(s * absv, room) if p == 2 else torch.minimum(s, room)
    return -torch.sign(v) * step
