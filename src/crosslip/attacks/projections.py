r"""Exact box-constrained minimal-norm steps onto a half-space (Section 4), p = 1, 2, inf.

For rows ``(x, v, t)`` (point, linearized gradient difference, required decrease ``t >= 0``)

    min ||delta||_p  s.t.  <v, delta> <= -t,  lo <= x + delta <= hi          (opt:p-box)

(the paper's ``c = -t``). Coordinate i can lower ``<v, delta>`` by moving towards the face
``v_i`` points away from, by at most ``room_i`` (``x_i - lo`` if ``v_i > 0``, else
``hi - x_i``), i.e. by at most ``cap_i = |v_i| room_i``; the optimal step is
``delta_i = -sign(v_i) u_i`` with ``0 <= u_i <= room_i``.

* p = 2 (Lemma 4.1, Algorithm 1): ``u_i = min(lambda |v_i|, room_i)``; the decrease
  ``phi(lambda) = sum_i v_i^2 min(lambda, room_i / |v_i|)`` is piecewise linear and
  non-decreasing, with breakpoints ``room_i / |v_i|``.
* p = inf: ``u_i = min(eps, room_i)``, ``psi(eps) = sum_i |v_i| min(eps, room_i)``, breakpoints
  ``room_i``: the smallest eps with ``psi(eps) >= t`` is the optimum (any feasible delta has
  ``|delta_i| <= ||delta||_inf`` so it decreases ``<v, .>`` by at most ``psi(||delta||_inf)``).
* p = 1: a fractional knapsack: decrease per unit of L1 norm is ``|v_i|``, so the optimum
  fills coordinates in order of decreasing ``|v_i|`` (LP duality: multiplier ``1/|v_k|`` of
  the last, partially used coordinate).

p = 2 and inf share one structure: breakpoints ``b_i`` and weights ``w_i`` with the decrease
``sum_i w_i min(s, b_i)``; after sorting ``b`` (O(d log d)), cumulative sums give it at
every breakpoint, and each query ``t`` is one ``searchsorted`` (O(log d)) plus a clip (O(d)).
p = 1 sorts by ``|v|`` and searches the cumulative capacities. A row with ``t`` above its
total capacity is infeasible: it is flagged, and gets the box point with the largest decrease.
Everything is batched over rows, in the dtype of the inputs, on their device.

:class:`BoxProblem` pays for the sort once and then answers many ``t`` per row cheaply: the
upper-bound search (:mod:`crosslip.attacks.upper_bounds`) solves every row for a doubling
and then a bisection of ``t``. For one ``t`` per row, :func:`project_box` skips the sort
(:mod:`crosslip.attacks.single_rhs`: Newton's method on the decrease function for p = 2 and
inf, a sampled bracket and a small ``topk`` for p = 1), with the same optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..norms import check_p


def check_box(x: torch.Tensor, lo: float, hi: float) -> None:
    """Raise ``ValueError`` unless every entry of ``x`` lies in ``[lo, hi]``."""
    if x.numel() == 0:
        return
    smallest, largest = torch.aminmax(x)
    if not (lo <= float(smallest) and float(largest) <= hi):  # NaN fails too
        raise ValueError(f"points must lie in the box [{lo}, {hi}]")


def feasible_rows(t: torch.Tensor, capacity: torch.Tensor) -> torch.Tensor:
    """Rows (n,) whose decrease ``t`` the box allows: ``t <= capacity``, up to a relative
    1e-12 for the rounding of the capacity's sum (both solvers use this rule)."""
    return t <= capacity * (1 + 1e-12)


@dataclass
class BoxProblem:
    """Sorted data of (opt:p-box) for a batch of rows, reusable for many ``t``."""

    p: float
    x: torch.Tensor  # (n, d)
    v: torch.Tensor  # (n, d)
    lo: float
    hi: float
    room: torch.Tensor  # (n, d) how far each coordinate can move in the helpful direction
    keys: torch.Tensor  # (n, d) p=2/inf: decrease at the sorted breakpoints; p=1: cum. caps
    below: torch.Tensor  # (n, d) p=2/inf: sum_{i<k} w_(i) b_(i); p=1: sorted |v|
    above: torch.Tensor  # (n, d) p=2/inf: sum_{i>=k} w_(i);     p=1: sorted room
    order: torch.Tensor | None  # (n, d) p=1: coordinates by decreasing |v|
    capacity: torch.Tensor  # (n,) the largest decrease of <v, delta> inside the box

    @classmethod
    def build(
        cls,
        x: torch.Tensor,
        v: torch.Tensor,
        p: float = 2,
        lo: float = 0.0,
        hi: float = 1.0,
        chunk: int = 1024,
        check: bool = True,
    ) -> BoxProblem:
        """Sort the breakpoints of every row (in chunks of ``chunk`` rows, so that the
        temporaries stay in cache). ``check=False`` skips :func:`check_box` (the caller
        guarantees ``x`` in the box): then nothing is read back to the host."""
        p = check_p(p)
        if check:
            check_box(x, lo, hi)
        # x - lo where v > 0, else hi - x: each computed directly, so that x - room lands
        # exactly on lo (lo = 0) and x + room never rounds above hi (hi = 1)
        room = torch.where(v > 0, x - lo, hi - x)
        keys, below, above = torch.empty_like(v), torch.empty_like(v), torch.empty_like(v)
        order = torch.empty(v.shape, dtype=torch.long, device=v.device) if p == 1 else None
        for i in range(0, v.shape[0], chunk):
            sl = slice(i, i + chunk)
            if p == 1:
                _build_l1(v[sl], room[sl], keys[sl], below[sl], above[sl], order[sl])
            else:
                _build_breaks(v[sl], room[sl], p, keys[sl], below[sl], above[sl])
        capacity = (v.abs() * room).sum(1)  # every coordinate at its face: any p
        return cls(p, x, v, lo, hi, room, keys, below, above, order, capacity)

    def solve(
        self, target: torch.Tensor, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Solve for the decreases ``target`` (m,) (``c = -target``) on ``rows`` (m,).

        Returns ``(delta (m, d), scale (m,), feasible (m,))``: ``scale`` is the multiplier
        ``lambda`` (p = 2), the norm ``eps`` (p = inf) or ``1/|v_k|`` of the last coordinate
        used (p = 1); 0 for ``target <= 0`` (``delta = 0``), ``inf`` for infeasible rows.
        """

        def pick(a: torch.Tensor) -> torch.Tensor:
            return a if rows is None else a[rows]

        keys = pick(self.keys)
        t = target.to(keys.dtype)
        d = keys.shape[1]
        big = torch.finfo(keys.dtype).max
        k = torch.searchsorted(keys, t[:, None]).squeeze(1)  # first break reaching t
        feasible = feasible_rows(t, pick(self.capacity))
        done = t <= 0
        kc = k.clamp(max=d - 1)[:, None]
        room, v = pick(self.room), pick(self.v)
        if self.p == 1:
            av, rm = pick(self.below), pick(self.above)
            before = keys.gather(1, (k - 1).clamp_min(0)[:, None]).squeeze(1) * (k > 0)
            a_k = av.gather(1, kc).squeeze(1)
            part = (t - before) / a_k.clamp_min(torch.finfo(t.dtype).tiny)
            pos = torch.arange(d, device=keys.device)[None, :]
            u_sorted = rm.masked_fill(pos >= k[:, None], 0.0)  # full room before k
            rm_k = rm.gather(1, kc).squeeze(1)
            last = torch.where(k < d, torch.minimum(part, rm_k), rm_k)  # partial at k
            u_sorted.scatter_(1, kc, last[:, None])
            u = torch.empty_like(rm).scatter_(1, pick(self.order), u_sorted)
            u.masked_fill_(done[:, None], 0.0)
            delta = -torch.sign(v) * u
            scale = 1 / a_k
        else:
            below, above = pick(self.below), pick(self.above)
            s = (t - below.gather(1, kc).squeeze(1)) / above.gather(1, kc).squeeze(1)
            s = torch.where(k >= d, big, s).clamp(0, big)  # infeasible: to the box
            s = torch.where(done, 0.0, s)  # t <= 0: no step (0/0 where v = 0 and t = 0)
            if self.p == 2:  # -sign(v) min(s |v|, room), without sign or abs
                delta = -torch.maximum(torch.minimum(s[:, None] * v, room), -room)
            else:
                delta = -torch.sign(v) * torch.minimum(s[:, None], room)
            scale = s
        scale = torch.where(done, 0.0, scale)
        scale = torch.where(feasible, scale, torch.inf)
        return delta, scale, feasible


def _build_l1(v, room, keys, av, rm, order) -> None:
    """p = 1 (in place): coordinates by decreasing ``|v|``, cumulative capacities."""
    torch.sort(v.abs(), dim=1, descending=True, out=(av, order))
    torch.gather(room, 1, order, out=rm)
    torch.cumsum(av * rm, dim=1, out=keys)


def _build_breaks(v, room, p, keys, below, above) -> None:
    """p = 2 / inf (in place): sorted breakpoints ``b``, ``below_k = sum_{i<k} w_i b_i``,
    ``above_k = sum_{i>=k} w_i`` and the decrease ``below_k + b_k above_k`` at each."""
    absv = v.abs()
    if p == 2:
        b, w = room / absv, absv * absv
    else:
        b, w = room.clone(), absv
    b.masked_fill_(absv == 0, torch.inf)  # v_i = 0: never a breakpoint (0/0, x/0)
    b, idx = b.sort(dim=1)
    w = w.gather(1, idx)
    infinite = torch.isinf(b)
    contrib = (w * b).masked_fill_(infinite, 0.0)
    # exclusive and reverse cumulative sums directly, not as differences of cumulative sums:
    # with heavy-tailed weights, total - sum_{i<k} w_i cancels to 0 (or below) for the last
    # breakpoints, and a feasible row near its capacity got s = 0
    below[:, 0] = 0.0
    torch.cumsum(contrib[:, :-1], 1, out=below[:, 1:])
    torch.cumsum(w.flip(1), 1, out=above)
    above.copy_(above.flip(1))
    torch.addcmul(below, b, above, out=keys)
    keys.masked_fill_(infinite, torch.inf)


def project_box_reference(
    x: torch.Tensor,
    v: torch.Tensor,
    c: torch.Tensor,
    p: float = 2,
    lo: float = 0.0,
    hi: float = 1.0,
) -> torch.Tensor:
    """Straightforward per-row implementation (a Python loop over rows and sorted
    coordinates): the speed baseline of ``benchmarks/bench_attack.py`` and a test oracle."""
    p = check_p(p)
    out = torch.zeros_like(x)
    for r in range(x.shape[0]):
        xr, vr, t = x[r].tolist(), v[r].tolist(), -float(c[r])
        if t <= 0:
            continue
        d = len(xr)
        room = [xr[i] - lo if vr[i] > 0 else hi - xr[i] for i in range(d)]
        delta = [0.0] * d
        if p == 1:
            for i in sorted(range(d), key=lambda i: -abs(vr[i])):
                if vr[i] == 0 or t <= 0:
                    break
                u = min(room[i], t / abs(vr[i]))
                delta[i] = -math.copysign(u, vr[i])
                t -= abs(vr[i]) * u
        else:
            a = [abs(vi) if p == 2 else 1.0 for vi in vr]
            w = [abs(vr[i]) * a[i] for i in range(d)]
            idx = sorted((i for i in range(d) if vr[i] != 0), key=lambda i: room[i] / a[i])
            rest, s, done = sum(w[i] for i in idx), math.inf, 0.0
            for i in idx:  # walk the breakpoints until the decrease reaches t
                b = room[i] / a[i]
                if done + rest * b >= t:
                    s = (t - done) / rest
                    break
                done += w[i] * b
                rest -= w[i]
            for i in idx:
                delta[i] = -math.copysign(min(s * a[i], room[i]), vr[i])
        out[r] = torch.tensor(delta, dtype=x.dtype, device=x.device)
    return out
