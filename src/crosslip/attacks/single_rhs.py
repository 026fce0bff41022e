r"""Exact box-constrained steps onto a half-space for one right-hand side per row, without a
full sort (Section 4): :func:`project_box`.

Same problem as :mod:`crosslip.attacks.projections`: rows ``(x, v, t)`` with

    min ||delta||_p  s.t.  <v, delta> <= -t,  lo <= x + delta <= hi          (opt:p-box)

and ``room_i`` how far coordinate i can move in the direction that lowers ``<v, delta>``
(``c_i = |v_i| room_i`` its capacity). The sorted solver (:class:`BoxProblem`) sorts d
values per row, once for many ``t``; with one ``t`` per row that sort is most of the time.

* p = 2 (Lemma 4.1) and p = inf share the decrease function
  ``phi(s) = sum_i min(w_i s, c_i)`` with ``w_i = v_i^2`` (p = 2, breakpoint
  ``b_i = room_i / |v_i|``) or ``w_i = |v_i|`` (p = inf, ``b_i = room_i``). ``phi`` is
  concave, piecewise linear and non-decreasing; the optimum is ``u_i = min(s* a_i, room_i)``
  (``a_i = |v_i|`` or 1) at the smallest ``s*`` with ``phi(s*) >= t``. Newton's method runs
  from below: at ``s_k <= s*`` the line ``phi(s_k) + slope_k (s - s_k)`` with
  ``slope_k = sum_{b_i > s_k} w_i`` lies above ``phi`` for ``s >= s_k`` (concavity), so its
  root ``s_{k+1} = (t - sum_{b_i <= s_k} c_i) / slope_k`` is again ``<= s*``. A step that
  crosses no breakpoint lands on ``s*``, and every other step saturates at least one more
  coordinate, so the loop ends; the last ``s`` is the sorted solver's closed form
  ``(t - below_k) / above_k`` for the same piece: exact, not approximate. The start
  ``s_0 = t / sum_i w_i`` is below ``s*`` since ``phi(s) <= s sum_i w_i``. Both sums are
  taken directly (one batched matrix product of ``[w; c]`` with the two masks), never as a
  difference, so they do not cancel. In practice 10-15 steps, each one pass over the rows;
  converged rows leave the working set. Rows still moving after ``max_steps`` (breakpoint
  layouts built to need many steps) are finished by the sorted solver.
* p = 1 (fractional knapsack by decreasing ``|v_i|``): the threshold ``tau`` is the
  largest ``|v_i|`` with ``G(tau) = sum_{|v_j| >= tau} c_j >= t``; coordinates with
  ``|v_i| > tau`` move to their face, those with ``|v_i| = tau`` share the rest of ``t`` in
  proportion to their capacity (any split among equal ``|v|`` has the same L1 norm), the
  others stay. ``tau`` is found without sorting the row: the sorted strided sample of every
  row estimates it; exact ``G`` at sample values around the estimate (one batched pass)
  brackets it, ``lo <= tau < hi``; wide brackets are split at evenly spaced values; a
  ``topk`` of the few ``|v_i|`` left in the bracket, with cumulative capacities from
  ``G(hi)``, picks it. The sample only steers the search: any sample gives the same
  ``tau``, only slower.

Rows with ``t <= 0`` get ``delta = 0``; rows with ``t`` above their capacity are infeasible,
flagged, and get the box point with the largest decrease, as in :class:`BoxProblem`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..norms import check_p
from .projections import BoxProblem, check_box, feasible_rows

MAX_NEWTON_STEPS = 40
COMPACT_BELOW = 0.5  # shrink the working set once fewer than this share of rows still move


def project_box(
    x: torch.Tensor,
    v: torch.Tensor,
    c: torch.Tensor,
    p: float = 2,
    lo: float = 0.0,
    hi: float = 1.0,
    max_steps: int = MAX_NEWTON_STEPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact solution of (opt:p-box) with right-hand side ``c`` (n,) (``<v, delta> <= c``)
    for every row of ``x, v`` (n, d): ``(delta (n, d), feasible (n,))`` in the dtype and on
    the device of ``x``. ``c >= 0`` gives ``delta = 0``; ``max_steps`` bounds the Newton
    steps (p = 2, inf) before the sort-based solver takes over the rows still moving.
    """
    p = check_p(p)
    check_box(x, lo, hi)
    t = -c.to(v.dtype)
    # x - lo and x - hi: room_i is the one whose sign is v_i's (x - lo if v_i > 0, else
    # hi - x), so room_i = max(sign(v_i) (x_i - lo), sign(v_i) (x_i - hi)),
    # |v_i| room_i = max(v_i (x_i - lo), v_i (x_i - hi)) and, for p = 2,
    # room_i / |v_i| = max((x_i - lo) / v_i, (x_i - hi) / v_i), each rounded exactly as the
    # direct expressions (negation is exact)
    # (n, d) temporaries are few and reused: in float64 at MNIST size each new one costs
    # about as much in page faults as the arithmetic on it
    e_lo = x - lo if lo != 0 else x
    e_hi = x - hi
    if p == 1:
        return _knapsack(v, e_lo, e_hi, t)
    n, d = v.shape
    A = torch.empty(n, 2, d, dtype=v.dtype, device=v.device)  # [w, c] per row
    tmp = torch.mul(v, e_hi)
    torch.maximum(torch.mul(v, e_lo, out=A[:, 1]), tmp, out=A[:, 1])
    if p == 2:
        torch.mul(v, v, out=A[:, 0])
        b = torch.div(e_lo, v)  # v_i = 0: inf or NaN, with w_i = c_i = 0
        torch.maximum(b, torch.div(e_hi, v, out=tmp), out=b)
    else:
        sign = torch.sign(v)
        torch.abs(v, out=A[:, 0])
        b = torch.mul(sign, e_lo)
        torch.maximum(b, torch.mul(sign, e_hi, out=tmp), out=b)
    s, feasible = _newton(A, b, t, max_steps)
    del A, b
    left = torch.isnan(s)
    if bool(left.any()):  # rows still moving after max_steps: the sort-based solver
        rows = torch.nonzero(left).squeeze(1)
        _, scale, _ = BoxProblem.build(x[rows], v[rows], p, lo, hi).solve(t[rows])
        s[rows] = scale.nan_to_num(posinf=torch.finfo(v.dtype).max)
    # delta = -sign(v) min(s a, room) = -clamp(s v, x - hi, x - lo) (p = 2) or
    # -clamp(s sign(v), x - hi, x - lo) (p = inf): lands exactly on the faces
    step = torch.mul(v, s[:, None], out=tmp) if p == 2 else sign.mul_(s[:, None])
    return step.clamp_(min=e_hi, max=e_lo).neg_(), feasible


def _newton(
    A: torch.Tensor, b: torch.Tensor, t: torch.Tensor, max_steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Newton from below on ``phi`` for weights/capacities ``A`` (n, 2, d) = ``[w, c]``,
    breakpoints ``b`` (n, d) and decreases ``t`` (n,).

    Returns ``(s (n,), feasible (n,))``: 0 where ``t <= 0``, the largest finite float where
    the row is infeasible (every coordinate to its face), NaN where ``max_steps`` did not
    suffice.
    """
    n = A.shape[0]
    big = torch.finfo(A.dtype).max
    sums = A.sum(2)  # (n, 2): sum w, capacity
    feasible = feasible_rows(t, sums[:, 1])
    # phi(s) <= s sum w: t / sum w is below s*. Rows with t <= 0 start (and stay) at 0,
    # infeasible rows at big (everything saturated: slope 0); neither moves
    cur = torch.where(t > 0, (t / sums[:, 0]).clamp_(max=big), 0.0)
    cur = torch.where(feasible, cur, big)
    s = torch.empty_like(cur)
    rows = torch.arange(n, device=A.device)  # the working set, as indices of all rows
    M = torch.empty_like(A)
    for _ in range(max_steps):
        torch.gt(b, cur[:, None], out=M[:, 0])  # unsaturated: slope sum w_i
        torch.le(b, cur[:, None], out=M[:, 1])  # saturated: fixed sum c_i
        prod = torch.bmm(A, M.transpose(1, 2))  # (m, 2, 2)
        slope, fixed = prod[:, 0, 0], prod[:, 1, 1]
        # slope 0: every coordinate saturated, phi = capacity >= t up to rounding
        new = torch.where(slope > 0, (t - fixed) / slope, big)
        moved = new > cur
        cur = torch.where(moved, new, cur)
        n_moved = int(moved.sum())
        if n_moved == 0:
            break
        if n_moved < COMPACT_BELOW * len(rows):  # drop the converged rows from the work
            s[rows[~moved]] = cur[~moved]
            keep = moved.nonzero().squeeze(1)
            rows, cur, t = rows[keep], cur[keep], t[keep]
            A, b = A.index_select(0, keep), b.index_select(0, keep)  # (faster than A[keep])
            M = M[: len(keep)]
    else:
        cur.fill_(torch.nan)
    s[rows] = cur
    return s, feasible


def _knapsack(
    v: torch.Tensor, e_lo: torch.Tensor, e_hi: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """p = 1: ``(delta (n, d), feasible (n,))`` from the threshold ``tau`` on ``|v|``.

    ``tau`` is the largest ``|v_i|`` with ``G(tau) = sum_{|v_j| >= tau} c_j >= t``; the
    coordinates with ``|v_i| > tau`` move to their face, those with ``|v_i| = tau`` share the
    rest of ``t`` in proportion to their capacity, the others stay.
    """
    n, d = v.shape
    dt, dev = v.dtype, v.device
    A = torch.empty(n, 2, d, dtype=dt, device=dev)  # [c; 1]: sums and counts by bmm
    cap = torch.mul(v, e_lo, out=A[:, 0])
    torch.maximum(cap, torch.mul(v, e_hi), out=cap)  # |v| room
    A[:, 1].fill_(1.0)
    feasible = feasible_rows(t, cap.sum(1))
    live = (t > 0) & feasible
    absv = torch.abs(v)
    tau = torch.full((n,), torch.inf, dtype=dt, device=dev)  # t <= 0: nothing moves
    tau[~feasible] = -1.0  # infeasible: every coordinate to its face
    if bool(live.all()):
        tau = _threshold(absv, A, t)
    elif bool(live.any()):
        rows = torch.nonzero(live).squeeze(1)
        tau[rows] = _threshold(absv.index_select(0, rows), A.index_select(0, rows), t[rows])
    M = torch.empty(n, 2, d, dtype=dt, device=dev)
    torch.gt(absv, tau[:, None], out=M[:, 0])
    torch.eq(absv, tau[:, None], out=M[:, 1])
    sums = torch.bmm(cap[:, None, :], M.transpose(1, 2)).squeeze(1)  # (n, 2)
    before, tied = sums[:, 0], sums[:, 1]
    share = ((t - before) / tied.clamp_min(torch.finfo(dt).tiny)).clamp_(0, 1)
    share = torch.where(live, share, 0.0)
    used = M[:, 0].addcmul_(M[:, 1], share[:, None])  # (n, d) share of room used
    # -sign(v) room = -clamp(sign(v) big, x - hi, x - lo): exactly the face (0 for v = 0)
    face = torch.sign(v).mul_(torch.finfo(dt).max).clamp_(min=e_hi, max=e_lo)
    return face.mul_(used).neg_(), feasible


SAMPLE_STRIDE = 8  # the first estimate sorts every 8th coordinate of a row
SAMPLE_OFFSETS = (-16, -8, -4, -2, -1, 0, 1, 2, 4, 8, 16)  # pivots: sample ranks around it
SPLIT_PIVOTS = 7  # further rounds split wide brackets into 8 parts of equal width
SPLIT_ROUNDS = 3
TOPK_CANDIDATES = 32  # rows with more candidates in their bracket take a larger topk
PIVOT_CHUNK = 1024  # rows per batched pivot evaluation (bounds the (rows, P, d) masks)


def _threshold(absv: torch.Tensor, A: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``tau`` (m,) for rows with ``0 < t <= capacity``: ``absv`` (m, d), ``A`` (m, 2, d)
    (capacities and ones).

    Without a full sort: a strided sample of every row, sorted, estimates where ``tau``
    lies; exact ``G`` at sample values around the estimate brackets it,
    ``lo <= tau < hi``; brackets holding more than ``TOPK_CANDIDATES`` values are split at
    evenly spaced values (up to ``SPLIT_ROUNDS`` times); a ``topk`` of the ``|v_i|`` left in
    the bracket, by decreasing ``|v|`` with cumulative capacities from ``G(hi)``, finds
    ``tau`` exactly (the first reaching ``t``; the last candidate if rounding falls short).
    """
    m, d = absv.shape
    dt, dev = absv.dtype, absv.device
    cap = A[:, 0]
    sample, order = torch.sort(absv[:, ::SAMPLE_STRIDE], dim=1, descending=True)
    k = sample.shape[1]
    scum = cap[:, ::SAMPLE_STRIDE].gather(1, order).cumsum_(1).mul_(d / k)
    est = torch.searchsorted(scum, t[:, None])  # (m, 1)
    offsets = torch.tensor(SAMPLE_OFFSETS, device=dev)
    pivots = sample.gather(1, (est + offsets).clamp_(0, k - 1))
    br = _Bracket.start(m, d, dt, dev)
    br.update(pivots, _at_pivots(absv, A, pivots), t)
    br.reset(br.counts() <= 0, d)  # G not monotone through rounding: the whole row
    counts = br.counts()
    for _ in range(SPLIT_ROUNDS):
        wide = torch.nonzero(counts > TOPK_CANDIDATES).squeeze(1)
        if len(wide) == 0:
            break
        aw = absv.index_select(0, wide)
        lo = torch.maximum(br.lo[wide], aw.amin(1))
        hi = torch.minimum(br.hi[wide], aw.amax(1))
        steps = torch.arange(1, SPLIT_PIVOTS + 1, dtype=dt, device=dev) / (SPLIT_PIVOTS + 1)
        split = lo[:, None] + (hi - lo)[:, None] * steps
        sub = br.select(wide)
        sub.update(split, _at_pivots(aw, A.index_select(0, wide), split), t[wide])
        br.put(wide, sub)
        br.reset(br.counts() <= 0, d)
        counts = br.counts()
    inside = torch.ge(absv, br.lo[:, None]).logical_and_(absv < br.hi[:, None]).to(dt)
    keyed = torch.mul(absv, inside)
    keyed.add_(inside.sub_(1))  # |v| inside the bracket, -1 outside
    del inside
    # rows with at most TOPK_CANDIDATES candidates: one topk over all rows (cheaper than
    # copying them out); the rest: a larger topk of their own
    small = counts <= TOPK_CANDIDATES
    tau = _first_reaching(keyed, cap, br.base, t, counts, int(counts.masked_fill(~small, 1).max()))
    wide = torch.nonzero(~small).squeeze(1)
    if len(wide):
        tau[wide] = _first_reaching(
            keyed.index_select(0, wide),
            cap.index_select(0, wide),
            br.base[wide],
            t[wide],
            counts[wide],
            int(counts[wide].max()),
        )
    return tau


def _first_reaching(
    keyed: torch.Tensor,
    cap: torch.Tensor,
    base: torch.Tensor,
    t: torch.Tensor,
    counts: torch.Tensor,
    k: int,
) -> torch.Tensor:
    """Per row, of the ``k`` largest ``keyed`` values (the bracket's ``|v|``, -1 outside),
    the first whose cumulative capacity from ``base`` reaches ``t``; the last candidate if
    rounding falls short (m,)."""
    val, idx = torch.topk(keyed, k, dim=1)
    ccum = cap.gather(1, idx).masked_fill_(val < 0, 0.0).cumsum_(1).add_(base[:, None])
    j = torch.searchsorted(ccum, t[:, None])
    last = (counts[:, None] - 1).clamp_(0, k - 1)
    return val.gather(1, torch.minimum(j, last)).squeeze(1)


def _at_pivots(absv: torch.Tensor, A: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """``(G, count)`` (m, 2, P) of ``|v| >= pivot`` for pivots (m, P), in row chunks."""
    m, d = absv.shape
    out = torch.empty(m, 2, pivots.shape[1], dtype=A.dtype, device=A.device)
    mask = torch.empty(min(m, PIVOT_CHUNK), pivots.shape[1], d, dtype=A.dtype, device=A.device)
    for i in range(0, m, PIVOT_CHUNK):
        sl = slice(i, i + PIVOT_CHUNK)
        mk = mask[: min(PIVOT_CHUNK, m - i)]
        torch.ge(absv[sl, None, :], pivots[sl, :, None], out=mk)
        torch.bmm(A[sl], mk.transpose(1, 2), out=out[sl])
    return out


@dataclass
class _Bracket:
    """Per row: ``lo <= tau < hi``, ``base = G(hi)``, ``n_lo``/``n_hi`` counts of
    ``|v| >= lo`` / ``>= hi`` (so ``n_lo - n_hi`` values lie in the bracket)."""

    lo: torch.Tensor
    hi: torch.Tensor
    base: torch.Tensor
    n_lo: torch.Tensor
    n_hi: torch.Tensor

    @classmethod
    def start(cls, m: int, d: int, dt: torch.dtype, dev: torch.device) -> _Bracket:
        def full(value: float) -> torch.Tensor:
            return torch.full((m,), value, dtype=dt, device=dev)

        return cls(full(-1.0), full(torch.inf), full(0.0), full(float(d)), full(0.0))

    def update(self, pivots: torch.Tensor, at: torch.Tensor, t: torch.Tensor) -> None:
        """Narrow with ``G`` and counts ``at`` (m, 2, P) at ``pivots`` (m, P): a pivot
        with ``G >= t`` is a lower end, one with ``G < t`` an upper end (G is
        non-increasing in the pivot)."""
        reach = at[:, 0] >= t[:, None]
        inf = torch.tensor(torch.inf, dtype=pivots.dtype, device=pivots.device)
        self.lo = torch.maximum(self.lo, torch.where(reach, pivots, -1.0).amax(1))
        self.hi = torch.minimum(self.hi, torch.where(reach, inf, pivots).amin(1))
        self.base = torch.maximum(self.base, torch.where(reach, 0.0, at[:, 0]).amax(1))
        most = float(torch.finfo(pivots.dtype).max)
        self.n_lo = torch.minimum(self.n_lo, torch.where(reach, at[:, 1], most).amin(1))
        self.n_hi = torch.maximum(self.n_hi, torch.where(reach, 0.0, at[:, 1]).amax(1))

    def reset(self, rows: torch.Tensor, d: int) -> None:
        """Back to the whole row (``-1 <= tau < inf``, d values) where ``rows`` (m,)."""
        self.lo[rows], self.hi[rows], self.base[rows] = -1.0, torch.inf, 0.0
        self.n_lo[rows], self.n_hi[rows] = float(d), 0.0

    def counts(self) -> torch.Tensor:
        return (self.n_lo - self.n_hi).long()

    def select(self, rows: torch.Tensor) -> _Bracket:
        return _Bracket(*(getattr(self, f.name)[rows] for f in fields(self)))

    def put(self, rows: torch.Tensor, other: _Bracket) -> None:
        for f in fields(self):
            getattr(self, f.name)[rows] = getattr(other, f.name)
