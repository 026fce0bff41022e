"""Upper bounds on the minimal adversarial perturbation (Section 4), p = 1, 2, inf.

*Paper's procedure* (:func:`upper_bound`). For every target class j != c the classifier is
linearized at x, ``v = grad f_c(x) - grad f_j(x)``, and the box-constrained problem
(:mod:`.projections`) ``min ||delta||_p s.t. <v, delta> <= -t, x + delta in [lo, hi]^d`` is
solved for a right-hand side ``t`` that is searched (Section 5: "binary search in the
classifier output difference") until ``x + delta`` crosses the decision boundary: starting at
``t0 = f_c(x) - f_j(x)`` it doubles until the prediction changes (or the box capacity is
reached: failure for that target), then bisects between the last unchanged and the first
changed ``t`` until their perturbation norms agree to ``rtol`` (relative) or ``max_steps`` is
spent. The smallest successful ``delta`` over the targets is the upper bound.

*Refinement* (:func:`refine_upper_bound`, beyond the paper, in the spirit of DeepFool/FAB):
re-linearize ``f_c - f_j`` at the current adversarial point ``x_k = x + delta_k`` (j the class
that wins there), keep projecting the *original* x onto the box-constrained half-space of
that linearization with the same search on ``t`` (started at the linear model's value at x,
``t0 = g(x_k) - <v_k, delta_k>``), and keep the new point when it is closer. It is never worse
than the paper's bound.

Every reported point is verified by a forward pass: it lies in the box and some class scores
strictly above c there (the reported end of each search is always the changed one).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..models import class_gradients
from ..progress import Progress
from .projections import BoxProblem


@dataclass
class UpperBound:
    """Per-point result, shape (n,): ``norm`` (``inf`` if no target succeeded), ``target``
    (the linearization class j of the best sample, -1 if none), ``adv_class`` (the class
    predicted at the sample), ``success``, ``pred`` (the class c predicted at x); ``delta``
    (n, d) is the best perturbation."""

    norm: torch.Tensor
    target: torch.Tensor
    adv_class: torch.Tensor
    success: torch.Tensor
    pred: torch.Tensor
    delta: torch.Tensor


_FIELDS = tuple(UpperBound.__annotations__)


#: The classifier of a batch of rows: ``(x (m, d), rows (m,)) -> logits (m, K)``, where
#: ``rows`` are the rows' indices in the batch (a grid of networks attacks each row on its
#: own network; a plain model ignores them).
Logits = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _classifier(model: torch.nn.Module, groups: torch.Tensor | None) -> tuple[Logits, Any]:
    """The logits and input gradients of the rows of a batch: ``model`` itself, or with
    ``groups`` (one grid point per row) a :class:`crosslip.models.StackedSoftplusNet`'s
    network ``groups[row]`` for each row."""
    if groups is None:
        return (lambda x, rows: model(x)), (lambda x, rows: class_gradients(model, x))
    return (
        lambda x, rows: model.grouped_logits(x, groups[rows]),
        lambda x, rows: model.grouped_class_gradients(x, groups[rows]),
    )


def _changed(
    logits_of: Logits, xa: torch.Tensor, c: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether some class scores strictly above c at ``xa``, and the best other class."""
    logits = logits_of(xa, rows)
    fc = logits.gather(1, c[:, None]).squeeze(1)
    other = logits.scatter(1, c[:, None], -torch.inf)
    best, cls = other.max(1)
    return best > fc, cls


def _search(
    logits_of: Logits,
    xs,
    c_row,
    v,
    t0,
    p,
    lo,
    hi,
    rtol,
    max_steps,
    point: torch.Tensor | None = None,
    bound: torch.Tensor | None = None,
):
    """The paper's search on ``t`` for rows (point ``xs``, class ``c_row``, direction ``v``;
    ``logits_of`` the rows' classifier).

    Returns verified ``(norm (m,), delta (m, d), adv_class (m,))``; ``inf`` / 0 / -1 where
    the row found no adversarial sample.

    A row stops early once its result cannot matter to the caller: ``point`` (m,), the
    point of each row, when only the smallest norm per point is used (the targets of
    :func:`upper_bound`): a row whose norm at the unchanged ``t_lo`` already exceeds the
    norm at a changed ``t`` of another row of its point cannot end below it (the norm of
    the projection grows with t); ``bound`` (m,), when only norms below it are used
    (:func:`refine_upper_bound`): a row whose norm at ``t_lo`` reaches it. The rows that
    can still win are searched exactly as without these, so the per-point minimum and its
    sample are the same; the other rows end with a verified, coarser norm (or ``inf``).
    """
    prob = BoxProblem.build(xs, v, p, lo, hi)
    cap = prob.capacity
    m = xs.shape[0]
    dev, dt = xs.device, xs.dtype
    rows_all = torch.arange(m, device=dev)
    t_lo = torch.zeros(m, dtype=dt, device=dev)
    t_hi = torch.full((m,), torch.inf, dtype=dt, device=dev)
    n_lo = torch.zeros(m, dtype=dt, device=dev)  # ||delta(t_lo)||, ||delta(t_hi)||
    n_hi = torch.full((m,), torch.inf, dtype=dt, device=dev)

    def attempt(t: torch.Tensor, rows: torch.Tensor):
        delta, _, _ = prob.solve(t, rows)
        ch, cls = _changed(logits_of, xs[rows] + delta, c_row[rows], rows)
        return delta, ch, cls

    def step(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Try ``t`` on ``rows``; move t_hi (changed) or t_lo (unchanged) there."""
        delta, ch, _ = attempt(t, rows)
        norm = torch.linalg.vector_norm(delta, ord=p, dim=1)
        t_hi[rows[ch]], n_hi[rows[ch]] = t[ch], norm[ch]
        t_lo[rows[~ch]], n_lo[rows[~ch]] = t[~ch], norm[~ch]
        return ch

    points = int(point.max()) + 1 if point is not None and m else 0

    def hopeful(rows: torch.Tensor) -> torch.Tensor:
        """The rows whose result may still matter (docstring)."""
        keep = torch.ones_like(rows, dtype=torch.bool)
        if points:
            best = torch.full((points,), torch.inf, dtype=dt, device=dev)
            best = best.scatter_reduce(0, point, n_hi, "amin")
            keep &= n_lo[rows] <= best[point[rows]]
        if bound is not None:
            keep &= n_lo[rows] < bound[rows]
        return rows[keep]

    t = torch.minimum(t0.clamp_min(0), cap)
    pending = rows_all.clone()
    for _ in range(64):  # expansion: double t until the prediction changes or capacity
        if len(pending) == 0:
            break
        miss = pending[~step(t[pending], pending)]
        pending = hopeful(miss[t[miss] < cap[miss]])
        t[pending] = torch.minimum(2 * t[pending].clamp_min(1e-12), cap[pending])
    active = rows_all[torch.isfinite(t_hi)]
    for _ in range(max_steps):  # bisection on t between unchanged t_lo and changed t_hi
        active = hopeful(active[(n_hi[active] - n_lo[active]) > rtol * n_hi[active]])
        if len(active) == 0:
            break
        step(0.5 * (t_lo[active] + t_hi[active]), active)
    norm = torch.full((m,), torch.inf, dtype=dt, device=dev)
    delta_rows = torch.zeros_like(xs)
    adv_cls = torch.full((m,), -1, dtype=torch.long, device=dev)
    okr = rows_all[torch.isfinite(t_hi)]
    if len(okr):  # final, verified samples
        delta, ch, cls = attempt(t_hi[okr], okr)
        okr, delta, cls = okr[ch], delta[ch], cls[ch]
        norm[okr] = torch.linalg.vector_norm(delta, ord=p, dim=1)
        delta_rows[okr] = delta
        adv_cls[okr] = cls
    return norm, delta_rows, adv_cls


def _prepare(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.nn.Module:
    """The model in eval mode, in ``dtype``, on ``x``'s device: the model itself when it
    already is (no copy on the hot path of adversarial training), else a converted copy (the
    caller's model is never changed)."""
    tensors = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    if not model.training and all(t.dtype == dtype and t.device == x.device for t in tensors):
        return model
    return copy.deepcopy(model).to(dtype=dtype, device=x.device).eval()


def upper_bound(
    model: torch.nn.Module,
    x: torch.Tensor,
    p: float = 2,
    lo: float = 0.0,
    hi: float = 1.0,
    rtol: float = 1e-3,
    max_steps: int = 40,
    dtype: torch.dtype = torch.float64,
    batch_size: int = 512,
    progress: bool = True,
    groups: torch.Tensor | None = None,
    to_cpu: bool = True,
) -> UpperBound:
    """The paper's upper bound in the p-norm for each point of ``x`` (n, d), minimum over all
    targets (module docstring). Batched over points x targets; results on the CPU, or on
    ``x``'s device with ``to_cpu=False``. ``progress``: report points done and rate per
    batch to the ``"crosslip"`` logger (:mod:`crosslip.progress`; off inside adversarial
    training). ``groups`` (n,): a :class:`crosslip.models.StackedSoftplusNet` ``model`` is
    attacked at point ``i`` by its network ``groups[i]`` (adversarial training of a grid)."""
    model = _prepare(model, x, dtype)
    parts, found = [], 0
    with Progress(f"attack {_norm_name(p)}", len(x), "points", active=progress) as bar:
        for i in range(0, len(x), batch_size):
            part = slice(i, i + batch_size)
            logits_of, grads_of = _classifier(model, None if groups is None else groups[part])
            parts.append(
                _paper_batch(logits_of, grads_of, x[part].to(dtype), p, lo, hi, rtol, max_steps)
            )
            if to_cpu:
                parts[-1] = UpperBound(*(getattr(parts[-1], f).cpu() for f in _FIELDS))
            found += int(parts[-1].success.sum())
            bar.update(len(parts[-1].norm), successes=found)
    return _cat(parts)


def _norm_name(p: float) -> str:
    return "Linf" if p == float("inf") else f"L{p:g}"


def _cat(parts: list[UpperBound]) -> UpperBound:
    return UpperBound(*(torch.cat([getattr(r, f) for r in parts]) for f in _FIELDS))


@torch.no_grad()
def _paper_batch(logits_of: Logits, grads_of: Any, x, p, lo, hi, rtol, max_steps) -> UpperBound:
    n = x.shape[0]
    every = torch.arange(n, device=x.device)
    logits = logits_of(x, every)
    k = logits.shape[1]
    pred = logits.argmax(1)
    grads = grads_of(x, every)  # (n, K, d)
    # rows: every (point, target) pair with target != pred
    point = torch.arange(n, device=x.device).repeat_interleave(k)
    target = torch.arange(k, device=x.device).repeat(n)
    keep = target != pred[point]
    point, target = point[keep], target[keep]
    c_row = pred[point]
    v = grads[point, c_row] - grads[point, target]
    t0 = logits[point, c_row] - logits[point, target]
    rows_logits = lambda xr, rows: logits_of(xr, point[rows])  # noqa: E731
    norm, delta_rows, adv_cls = _search(
        rows_logits, x[point], c_row, v, t0, p, lo, hi, rtol, max_steps, point=point
    )
    # minimum over targets per point
    per_point = torch.full((n, k), torch.inf, dtype=x.dtype, device=x.device)
    per_point[point, target] = norm
    best_norm, best_t = per_point.min(1)
    success = torch.isfinite(best_norm)
    row_of = torch.full((n, k), -1, dtype=torch.long, device=x.device)
    row_of[point, target] = torch.arange(len(point), device=x.device)
    best_row = row_of[torch.arange(n, device=x.device), best_t].clamp_min(0)
    return UpperBound(
        norm=best_norm,
        target=torch.where(success, best_t, -1),
        adv_class=torch.where(success, adv_cls[best_row], -1),
        success=success,
        pred=pred,
        delta=torch.where(success[:, None], delta_rows[best_row], torch.zeros_like(x)),
    )


def refine_upper_bound(
    model: torch.nn.Module,
    x: torch.Tensor,
    start: UpperBound,
    p: float = 2,
    steps: int = 5,
    lo: float = 0.0,
    hi: float = 1.0,
    rtol: float = 1e-3,
    max_steps: int = 40,
    dtype: torch.dtype = torch.float64,
    progress: bool = True,
) -> UpperBound:
    """Refine the successful samples of ``start`` by ``steps`` re-linearizations at the
    current adversarial point (module docstring). Never worse than ``start``. Each step
    (all successful points at once) is reported to the ``"crosslip"`` logger unless
    ``progress`` is off."""
    model = _prepare(model, x, dtype)
    dev = x.device
    x = x.to(dtype)
    best = UpperBound(*(getattr(start, f).clone().to(dev) for f in _FIELDS))
    best.delta = best.delta.to(dtype)
    best.norm = best.norm.to(dtype)
    pred = best.pred
    bar = Progress(
        f"refine {_norm_name(p)}", steps, "steps", every=1 / max(steps, 1), active=progress
    )
    for _ in range(steps):
        idx = torch.nonzero(best.success).squeeze(1)
        if len(idx) == 0:
            break
        with torch.no_grad():
            xs, c = x[idx], pred[idx]
            xk = xs + best.delta[idx]
            j = best.adv_class[idx]
            logits = model(xk)
            grads = class_gradients(model, xk)
            ar = torch.arange(len(idx), device=dev)
            v = grads[ar, c] - grads[ar, j]
            gk = logits[ar, c] - logits[ar, j]  # <= 0 at an adversarial point
            t0 = gk - (v * best.delta[idx]).sum(1)  # linear model at x_k, evaluated at x
            enough = best.norm[idx] * (1 - 1e-12)  # what counts as better
            norm, delta, cls = _search(
                lambda xr, rows: model(xr), xs, c, v, t0, p, lo, hi, rtol, max_steps, bound=enough
            )
        better = norm < enough
        bar.update(1, points=len(idx), improved=int(better.sum()))
        if not better.any():
            break
        upd = idx[better]
        best.norm[upd] = norm[better]
        best.delta[upd] = delta[better]
        best.adv_class[upd] = cls[better]
        best.target[upd] = j[better]
    bar.close()
    return UpperBound(*(getattr(best, f).cpu() for f in _FIELDS))
