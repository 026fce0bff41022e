"""Box-constrained adversarial samples of Section 4 (upper bounds).

For a target class j the classifier is linearized at x and

    min ||delta||_2  s.t.  <v, delta> <= c,  lo <= x + delta <= hi          (opt:l2-box)

with ``v = grad f_c(x) - grad f_j(x)`` and ``c = f_j(x) - f_c(x) < 0`` is solved exactly
(Lemma 4.1 / Algorithm 1). For a nonlinear classifier the right-hand side is then searched
until ``x + delta`` crosses the decision boundary (Section 5: "binary search in the classifier
output difference"); the smallest successful ``delta`` over all targets ``j != c`` is an
upper bound on the minimal adversarial perturbation. Every reported point is checked by a
forward pass: it lies in the box and is classified differently.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from .models import class_gradients


@dataclass
class BoxL2Problem:
    """Sorted breakpoints of Algorithm 1 for a batch of rows, reusable for many ``c``.

    With ``gamma_r`` the lambda at which coordinate r reaches its box face
    (``(x_r - lo)/v_r`` for ``v_r > 0``, ``(hi - x_r)/(-v_r)`` for ``v_r < 0``, ``inf`` for
    ``v_r = 0``), the KKT solution is ``delta(lambda) = clip(-lambda v, lo - x, hi - x)`` and
    ``phi(lambda) = -<v, delta(lambda)> = sum_r v_r^2 min(lambda, gamma_r)`` is continuous,
    piecewise linear and non-decreasing. Sorting ``gamma`` (O(d log d)) gives ``phi`` at
    every breakpoint by cumulative sums; a query ``c`` is then a binary search (O(log d))
    plus a clip (O(d)).
    """

    x: torch.Tensor  # (n, d)
    v: torch.Tensor  # (n, d)
    lo: float
    hi: float
    phi_at_breaks: torch.Tensor  # (n, d) non-decreasing, +inf past the finite breakpoints
    below: torch.Tensor  # (n, d) sum_{i<k} v_(i)^2 gamma_(i)
    above: torch.Tensor  # (n, d) sum_{i>=k} v_(i)^2
    capacity: torch.Tensor  # (n,) max phi: the largest decrease of <v, delta> in the box

    @classmethod
    def build(cls, x: torch.Tensor, v: torch.Tensor, lo: float = 0.0, hi: float = 1.0):
        if ((x < lo) | (x > hi)).any():
            raise ValueError(f"points must lie in the box [{lo}, {hi}]")
        room = torch.where(v > 0, x - lo, hi - x)  # distance to the face delta moves towards
        absv = v.abs()
        gamma = torch.where(absv > 0, room / absv.clamp_min(torch.finfo(v.dtype).tiny), torch.inf)
        gamma, order = gamma.sort(dim=1)
        v2 = v.gather(1, order).pow(2)
        finite = torch.isfinite(gamma)
        contrib = torch.where(finite, v2 * gamma, torch.zeros_like(v2))
        incl = contrib.cumsum(1)
        below = incl - contrib
        above = v2.flip(1).cumsum(1).flip(1)
        phi = torch.where(finite, below + gamma * above, torch.full_like(v2, torch.inf))
        return cls(x, v, lo, hi, phi, below, above, incl[:, -1])

    def solve(self, target: torch.Tensor, rows: torch.Tensor | None = None):
        """Solve with ``c = -target`` (``target`` >= 0, shape (m,)) for ``rows`` (m,).

        Returns ``(delta, lam, feasible)``; an infeasible row (``target > capacity``: no
        point of the box reaches the half-space) gets the box point that comes closest
        (``lambda = inf``) and ``feasible = False``.
        """
        if rows is None:
            rows = torch.arange(self.x.shape[0], device=self.x.device)
        phi, below, above = self.phi_at_breaks[rows], self.below[rows], self.above[rows]
        target = target.to(phi.dtype)
        k = torch.searchsorted(phi, target[:, None]).squeeze(1)  # first break with phi >= t
        feasible = target <= self.capacity[rows] * (1 + 1e-12)
        kc = k.clamp(max=phi.shape[1] - 1)[:, None]
        lam = (target - below.gather(1, kc).squeeze(1)) / above.gather(1, kc).squeeze(1)
        lam = torch.where(target <= 0, torch.zeros_like(lam), lam)
        lam = torch.where(k >= phi.shape[1], torch.full_like(lam, torch.inf), lam)
        x, v = self.x[rows], self.v[rows]
        step = torch.where(v == 0, torch.zeros_like(v), -lam[:, None] * v)
        delta = torch.minimum(torch.maximum(step, self.lo - x), self.hi - x)
        return delta, lam, feasible


def project_l2_box(
    x: torch.Tensor, v: torch.Tensor, c: torch.Tensor, lo: float = 0.0, hi: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact solution of (opt:l2-box) for every row: ``(delta (n, d), feasible (n,))``.

    ``c >= 0`` gives ``delta = 0``. Batched, no loop over rows, O(d log d) per row.
    """
    delta, _, feasible = BoxL2Problem.build(x, v, lo, hi).solve(-c)
    return delta, feasible


@dataclass
class UpperBound:
    """Per-point result, shape (n,): ``norm`` (``inf`` if no target succeeded), ``target``
    (the linearization class j of the best sample, -1 if none), ``adv_class`` (the class
    predicted at the sample), ``success``; ``delta`` (n, d) is the best perturbation."""

    norm: torch.Tensor
    target: torch.Tensor
    adv_class: torch.Tensor
    success: torch.Tensor
    delta: torch.Tensor


def upper_bound_l2(
    model: torch.nn.Module,
    x: torch.Tensor,
    lo: float = 0.0,
    hi: float = 1.0,
    rtol: float = 1e-3,
    max_steps: int = 40,
    dtype: torch.dtype = torch.float64,
    batch_size: int = 512,
) -> UpperBound:
    """Paper's L2 upper bound for each point of ``x`` (n, d), minimum over all targets.

    For every row (point, target j != c) the right-hand side ``t = -c`` of the linearized
    problem is searched: starting at the linearization ``t0 = f_c - f_j`` it doubles until
    the prediction changes (or the box capacity is reached: failure for that target), then
    bisects between the last unchanged and the first changed ``t`` until their perturbation
    norms agree to ``rtol`` (relative) or ``max_steps`` is spent. The reported perturbation
    is always the changed end, so every success is a verified adversarial sample (some class
    scores strictly above c) inside the box.
    """
    model = copy.deepcopy(model).to(dtype=dtype, device=x.device).eval()
    results = [
        _upper_bound_batch(model, x[i : i + batch_size].to(dtype), lo, hi, rtol, max_steps)
        for i in range(0, len(x), batch_size)
    ]
    return UpperBound(
        *(torch.cat([getattr(r, f) for r in results]) for f in UpperBound.__annotations__)
    )


def _changed(
    model: torch.nn.Module, xa: torch.Tensor, c: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(xa)
    fc = logits.gather(1, c[:, None]).squeeze(1)
    other = logits.scatter(1, c[:, None], -torch.inf)
    best, cls = other.max(1)
    return best > fc, cls


@torch.no_grad()
def _upper_bound_batch(model, x, lo, hi, rtol, max_steps) -> UpperBound:
    n = x.shape[0]
    logits = model(x)
    k = logits.shape[1]
    pred = logits.argmax(1)
    grads = class_gradients(model, x)  # (n, K, d)
    # rows: every (point, target) pair with target != pred
    point = torch.arange(n, device=x.device).repeat_interleave(k)
    target = torch.arange(k, device=x.device).repeat(n)
    keep = target != pred[point]
    point, target = point[keep], target[keep]
    c_row = pred[point]
    v = grads[point, c_row] - grads[point, target]
    t0 = (logits[point, c_row] - logits[point, target]).clamp_min(0)
    prob = BoxL2Problem.build(x[point], v, lo, hi)
    cap = prob.capacity
    xs = x[point]

    def attempt(t: torch.Tensor, rows: torch.Tensor):
        delta, _, _ = prob.solve(t, rows)
        ch, cls = _changed(model, xs[rows] + delta, c_row[rows])
        return delta, ch, cls

    m = len(point)
    rows_all = torch.arange(m, device=x.device)
    t_lo = torch.zeros(m, dtype=x.dtype, device=x.device)
    t_hi = torch.full((m,), torch.inf, dtype=x.dtype, device=x.device)
    n_lo = torch.zeros(m, dtype=x.dtype, device=x.device)  # ||delta(t_lo)||, ||delta(t_hi)||
    n_hi = torch.full((m,), torch.inf, dtype=x.dtype, device=x.device)

    def step(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Try ``t`` on ``rows``; move t_hi (changed) or t_lo (unchanged) there."""
        delta, ch, _ = attempt(t, rows)
        norm = delta.norm(dim=1)
        t_hi[rows[ch]], n_hi[rows[ch]] = t[ch], norm[ch]
        t_lo[rows[~ch]], n_lo[rows[~ch]] = t[~ch], norm[~ch]
        return ch

    t = torch.minimum(t0, cap)
    pending = rows_all.clone()
    for _ in range(64):  # expansion: double t until the prediction changes or capacity
        if len(pending) == 0:
            break
        miss = pending[~step(t[pending], pending)]
        pending = miss[t[miss] < cap[miss]]
        t[pending] = torch.minimum(2 * t[pending].clamp_min(1e-12), cap[pending])
    ok = torch.isfinite(t_hi)
    active = rows_all[ok]
    for _ in range(max_steps):  # bisection on t between unchanged t_lo and changed t_hi
        active = active[(n_hi[active] - n_lo[active]) > rtol * n_hi[active]]
        if len(active) == 0:
            break
        step(0.5 * (t_lo[active] + t_hi[active]), active)
    # final, verified samples
    norm = torch.full((m,), torch.inf, dtype=x.dtype, device=x.device)
    delta_rows = torch.zeros_like(xs)
    adv_cls = torch.full((m,), -1, dtype=torch.long, device=x.device)
    okr = rows_all[ok]
    if len(okr):
        delta, ch, cls = attempt(t_hi[okr], okr)
        okr, delta, cls = okr[ch], delta[ch], cls[ch]
        norm[okr] = delta.norm(dim=1)
        delta_rows[okr] = delta
        adv_cls[okr] = cls
    # minimum over targets per point
    per_point = torch.full((n, k), torch.inf, dtype=x.dtype, device=x.device)
    per_point[point, target] = norm
    best_norm, best_t = per_point.min(1)
    success = torch.isfinite(best_norm)
    row_of = torch.full((n, k), -1, dtype=torch.long, device=x.device)
    row_of[point, target] = rows_all
    best_row = row_of[torch.arange(n, device=x.device), best_t]
    best_delta = torch.where(
        success[:, None], delta_rows[best_row.clamp_min(0)], torch.zeros_like(x)
    )
    return UpperBound(
        norm=best_norm.cpu(),
        target=torch.where(success, best_t, -1).cpu(),
        adv_class=torch.where(success, adv_cls[best_row.clamp_min(0)], -1).cpu(),
        success=success.cpu(),
        delta=best_delta.cpu(),
    )
