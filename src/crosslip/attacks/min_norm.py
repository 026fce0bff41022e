"""A minimal-norm attack (L2, L1, L-inf) with adaptive norm constraints, box-constrained
(beyond Section 4).

The paper's upper bound (Section 4, :func:`~crosslip.attacks.upper_bound`) solves the
box-constrained problem exactly for the classifier *linearized at x* and searches the
right-hand side until the class changes; :func:`~crosslip.attacks.refine_upper_bound`
re-linearizes at the adversarial point. Both stop at the first linearization that works, so
on a classifier that is far from linear they can sit well above the minimal perturbation.
:func:`min_norm_attack` is an iterative attack from the field's state of the art, written
for crosslip: the fast minimum-norm attack (FMN; Pintor, Roli, Brendel, Biggio, "Fast
Minimum-norm Adversarial Attacks through Adaptive Norm Constraints", NeurIPS 2021), in its
L2, L1 and L-inf forms, with the warm start, targets and restarts below. It solves

    min ||delta||_p  s.t.  max_{j != c} f_j(x + delta) > f_c(x + delta),  lo <= x + delta <= hi

for ``c = argmax_j f_j(x)``, and reports, per point, the smallest *verified* sample found.

**One walk** (``steps`` iterations, all rows at once). A row is a point ``x``, its class
``c``, a start ``delta_0`` and a class ``t`` whose logit is pushed up (a *target*), or none
(untargeted: the strongest other class at the current iterate). With the margin
``g(delta) = f_c(x + delta) - f_t(x + delta)`` and a norm budget ``eps``:

1. evaluate ``g`` and its input gradient at ``x + delta`` (one forward and one backward
   pass); if ``x + delta`` is adversarial (below) and closer than the row's best, keep it;
2. adapt the budget: adversarial: ``eps <- min(eps (1 - gamma_k), best norm)`` (shrink);
   else, once the row has been adversarial: ``eps <- eps (1 + gamma_k)`` (grow back); before
   that: ``eps <- (||delta|| + g / ||grad g||) (1 + gamma_k)``, the linearized distance to
   the boundary with an overshoot of ``gamma_k`` (without it the walk creeps up to a
   boundary that curves away and never crosses it); never above the box's diameter;
3. step ``delta <- delta - a_k eps grad g / ||grad g||`` (a step relative to the budget,
   so the walk does not depend on the scale of the data), then project onto the ball
   ``||delta|| <= eps`` (rescale) and onto the box (clip).

``gamma_k`` anneals from 0.05 to 0.001 and ``a_k`` from 1 to 0.01 by a cosine schedule, as
in FMN. **In the p-norm** every norm above is the p-norm and the linearized distance uses
the dual norm of the gradient; the step is the gradient's sign in L-inf (a step of p-norm
``a_k eps``) and the L2-normalised gradient in L1 (FMN's), and the projection onto the ball
is a clip (L-inf) or the Euclidean projection onto the L1 ball (:func:`project_l1_ball`,
which makes the L1 iterate sparse). In L1 each run's sample is polished (below), not only
the best per point: a sparse iterate may end at another class than the nearest, and the
polish is exact for the class it reached. The budget of an adversarial row never exceeds
its best norm, so the walk keeps probing below it; the best iterate is what the walk
returns.

**Runs per point.** (i) One untargeted walk from ``start`` (typically the paper's or the
refined sample, :class:`~crosslip.attacks.UpperBound`) where it succeeded, else from
``delta = 0``; (ii) ``targets`` targeted walks from ``delta = 0``, one for each of the
classes with the smallest linearized distance ``(f_c - f_j) / ||grad f_c - grad f_j||`` at
``x`` (the paper's first-order estimate; at most the K - 1 classes): the minimum over
targets of Section 4, walked instead of linearized once; (iii) ``restarts`` untargeted
walks from random points ``x + r u`` (``u`` uniform on the unit sphere, ``r`` uniform in
``[0, rho]``, clipped to the box), ``rho`` the best norm of (i)-(ii) (else the smallest
linearized distance): they leave the local minimum that the first walks found. (i) and (ii)
run as one batch of rows, then (iii).

**Spending only what changes the answer.** Two savings, both off in :data:`THOROUGH`:

- *early stopping* (``patience`` > 0): a row stops once its best norm has not fallen below
  ``(1 - tol)`` times its value ``patience`` steps before, provided its point already has a
  verified sample (from ``start`` or any of its rows: the walks of one point share their
  best); stopped rows leave the batch (the tensors are compacted, so a step costs what the
  rows still walking cost);
- *pruning* (``prune`` > 0): a target ``j`` whose linearized distance at ``x`` exceeds
  ``prune`` times the norm of ``start``'s verified sample is not walked. On a linear
  classifier that distance is a lower bound on the norm of every sample at which ``j``
  beats ``c`` (exact without the box, larger with it), so with ``prune`` >= 1 no target
  that could improve on ``start`` is dropped; on a curved one the factor is the margin for
  the first-order error.

What each budget buys is measured by ``benchmarks/bench_min_norm.py`` (docs/bounds.md):
the default (100 steps, 3 targets, 2 restarts, ``tol`` 1e-3, ``patience`` 10, ``prune``
1.5) against the thorough one (200 steps, 9 targets, 8 restarts, every walk to its end).

**Polish.** The best sample is refined by :func:`~crosslip.attacks.refine_upper_bound`
(``polish_steps`` re-linearizations at the sample, the exact box-constrained projection of
``x`` and the search on the right-hand side to ``rtol``): a walk ends within about
``gamma`` of the boundary, the projection lands on it; on a linear classifier it is exact.

**Verification.** A sample counts only where the forward pass (in ``dtype``, float64 by
default, like the other attacks) at ``x + delta`` gives some class a logit above ``f_c`` by
more than ``1e-9 (1 + |f_c| + |f_j|)``, and ``x + delta`` lies in ``[lo, hi]^d``: the
margin is far above the rounding of a float64 forward pass, so a re-evaluation of the same
sample (another batch, another order of the sums) finds the class changed too; it costs
about 1e-9 relative in the norm. Every reported sample is checked once more at the end;
points where nothing passes are failures (``norm`` inf, ``target`` and ``adv_class`` -1,
``delta`` 0), never a sample that does not change the class. A sample on the boundary
(adversarial by less than the margin: a search's end, or ``start``'s) is enlarged to
``delta (1 + tau)`` for the smallest ``tau`` of :data:`NUDGES` that passes. So with
``start`` the result is never worse than ``start``'s sample where that passes the check (the
first walk evaluates it before its first step), and at most ``1 + tau`` times it where it
sits on the boundary (``tau`` 1e-12 to 1e-6 in the tests).

Shapes: ``x`` (n, d); the model maps (m, d) to (m, K) logits and is differentiable (any
``nn.Module``: the one-hidden-layer nets, kernel models, ResNets on flat inputs). Batched
over points and runs (rows), on ``x``'s device; no Python loop over points. Deterministic
for a ``seed`` and ``batch_size`` (the random restarts draw from a generator on the device).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..models import class_gradients
from ..norms import check_p, dual_exponent
from ..progress import Progress
from .settings import MinNormSettings
from .upper_bounds import UpperBound, _cat, _prepare, refine_upper_bound

#: A sample counts as adversarial when another class beats ``c`` by more than this times
#: ``1 + |f_c| + |f_j|`` (module docstring: robust to the rounding of a re-evaluation).
ADV_MARGIN = 1e-9
#: FMN's schedules (cosine annealing from the first to the second value over a walk): the
#: relative change ``gamma`` of the norm budget and the step ``a`` relative to the budget.
GAMMA = (0.05, 0.001)
STEP = (1.0, 0.01)
#: Relative enlargements ``delta (1 + tau)`` tried, smallest first, on a sample that sits on
#: the boundary (adversarial by less than the margin; e.g. a search's end, or ``start``).
NUDGES = (1e-12, 1e-10, 1e-8, 1e-6, 1e-4)
#: The thorough budget (the default until the early stopping was measured; for papers):
#: 200 steps per walk, 9 targets, 8 restarts, every walk to its end, every target walked.
THOROUGH = {"steps": 200, "targets": 9, "restarts": 8, "tol": 0.0, "patience": 0, "prune": 0.0}


def _cosine(start: float, end: float, k: int, steps: int) -> float:
    """Cosine annealing from ``start`` (k = 0) to ``end`` (k = steps)."""
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * k / max(steps, 1)))


def _verify(
    model: torch.nn.Module, xa: torch.Tensor, c: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether some class beats ``c`` at ``xa`` by more than the margin (module docstring),
    and the best other class; from one forward pass."""
    with torch.no_grad():
        return _adversarial(model(xa), c)[:2]


def _adversarial(
    logits: torch.Tensor, c: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(adversarial (m,), best other class (m,), f_c (m,), best other logit (m,))``."""
    fc = logits.gather(1, c[:, None]).squeeze(1)
    best, cls = logits.scatter(1, c[:, None], -torch.inf).max(1)
    gap = (best - fc).detach()
    adv = gap > ADV_MARGIN * (1 + fc.detach().abs() + best.detach().abs())
    return adv, cls, fc, best


def _in_box(xa: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return ((xa >= lo) & (xa <= hi)).all(1)


def _norm(t: torch.Tensor, p: float) -> torch.Tensor:
    """The p-norm of each row of ``t`` (m, d): (m,)."""
    return torch.linalg.vector_norm(t, ord=p, dim=1)


def project_l1_ball(v: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """The Euclidean projection of each row of ``v`` (m, d) onto the L1 ball of its
    ``radius`` (m,) (Duchi, Shalev-Shwartz, Singer and Chandra, ICML 2008: soft
    thresholding at the ``theta`` found by one sort); rows inside the ball unchanged."""
    a = v.abs()
    inside = a.sum(1) <= radius
    srt = a.sort(1, descending=True).values
    csum = srt.cumsum(1) - radius[:, None]
    j = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)
    rho = ((srt - csum / j) > 0).sum(1).clamp_min(1)  # the last index that stays positive
    theta = csum.gather(1, (rho - 1)[:, None]) / rho[:, None].to(v.dtype)
    shrunk = v.sign() * (a - theta.clamp_min(0)).clamp_min(0)
    return torch.where(inside[:, None], v, shrunk)


def _step(grad: torch.Tensor, size: torch.Tensor, p: float) -> torch.Tensor:
    """The walk's descent step of ``size`` (m,) per row along the gradient ``grad`` (m, d):
    the sign (p-norm of the step ``size``) for p = inf, the L2-normalised gradient for
    p = 1 and 2 (FMN's; for L1 the projection onto the ball then makes it sparse)."""
    tiny = torch.finfo(grad.dtype).tiny
    if math.isinf(p):
        return size[:, None] * grad.sign()
    return size[:, None] * grad / _norm(grad, 2).clamp_min(tiny)[:, None]


def _project(delta: torch.Tensor, eps: torch.Tensor, p: float) -> torch.Tensor:
    """``delta`` (m, d) onto the p-ball of radius ``eps`` (m,): a rescale (L2), a clip
    (L-inf) or :func:`project_l1_ball` (L1)."""
    if math.isinf(p):
        return torch.maximum(torch.minimum(delta, eps[:, None]), -eps[:, None])
    if p == 1:
        return project_l1_ball(delta, eps)
    tiny = torch.finfo(delta.dtype).tiny
    return delta * (eps / _norm(delta, 2).clamp_min(tiny)).clamp(max=1)[:, None]


def _nudged(
    model: torch.nn.Module,
    x: torch.Tensor,
    c: torch.Tensor,
    delta: torch.Tensor,
    lo: float,
    hi: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(delta', passes (m,), adv_class (m,))``: ``delta`` where it passes the check
    (module docstring), else ``delta (1 + tau)`` clipped to the box for the smallest
    ``tau`` of :data:`NUDGES` that passes (a sample on the boundary moved just across it),
    else ``delta`` unchanged (``passes`` False)."""
    adv, cls = _verify(model, x + delta, c)
    adv &= _in_box(x + delta, lo, hi)
    delta = delta.clone()
    for tau in NUDGES:
        idx = torch.nonzero(~adv).squeeze(1)
        if len(idx) == 0:
            break
        xs = x[idx]
        d = (xs + delta[idx] * (1 + tau)).clamp(lo, hi) - xs
        ok, k = _verify(model, xs + d, c[idx])
        ok &= _in_box(xs + d, lo, hi)
        delta[idx[ok]], adv[idx[ok]], cls[idx[ok]] = d[ok], True, k[ok]
    return delta, adv, cls


def _walk(
    model: torch.nn.Module,
    x: torch.Tensor,
    c: torch.Tensor,
    delta: torch.Tensor,
    target: torch.Tensor,
    steps: int,
    lo: float,
    hi: float,
    point: torch.Tensor,
    known: torch.Tensor,
    live: torch.Tensor | None = None,
    tol: float = 0.0,
    patience: int = 0,
    p: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One FMN walk per row (module docstring) in the p-norm from ``delta`` (m, d) for the
    rows ``x``
    (m, d), ``c`` (m,) and ``target`` (m,) (-1: untargeted). Returns the best adversarial
    iterate per row: ``(norm (m,), delta (m, d), adv_class (m,))``, inf / 0 / -1 where the
    walk found none.

    Early stopping (``patience`` > 0; 0: every row walks all ``steps``): a row stops once
    its best norm has not fallen below ``(1 - tol)`` times its value ``patience`` steps
    before, provided its point (``point`` (m,), the point of each row, in ``range(n)``)
    has a verified sample: the best of ``known`` (n,) (e.g. the start's norm, inf: none)
    and of all its rows so far. Stopped rows leave the batch: the tensors of the remaining
    rows are compacted, so a step costs what the rows still walking cost. ``live`` (m,):
    the rows walked at all (the others return inf, e.g. pruned targets)."""
    m, dev = x.shape[0], x.device
    best = torch.full((m,), torch.inf, dtype=x.dtype, device=dev)
    best_delta = torch.zeros_like(x)
    best_cls = torch.full((m,), -1, dtype=torch.long, device=dev)
    shared = known.to(dev, x.dtype).clone()  # (n,) the best verified norm per point
    act = torch.arange(m, device=dev) if live is None else torch.nonzero(live).squeeze(1)
    # the walking rows' state, compacted as rows stop
    xs, cs, ds, ts, ps = x[act], c[act], delta[act], target[act], point[act]
    eps = _norm(ds, p)
    found = torch.zeros(len(act), dtype=torch.bool, device=dev)
    ref = torch.full((len(act),), torch.inf, dtype=x.dtype, device=dev)
    since = torch.zeros(len(act), dtype=torch.long, device=dev)
    tiny = torch.finfo(x.dtype).tiny
    q = dual_exponent(p)
    # no sample in the box is farther from x
    diameter = (hi - lo) * (1.0 if math.isinf(p) else x.shape[1] ** (1 / p))

    def keep(ds: torch.Tensor, adv: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
        nrm = _norm(ds, p)
        better = adv & (nrm < best[act]) & _in_box(xs + ds, lo, hi)
        rows = act[better]
        best[rows], best_delta[rows], best_cls[rows] = nrm[better], ds[better], cls[better]
        shared.scatter_reduce_(0, ps[better], nrm[better], reduce="amin")
        return nrm

    for k in range(steps):
        if len(act) == 0:
            break
        xa = (xs + ds).requires_grad_(True)
        with torch.enable_grad():
            logits = model(xa)
            adv, cls, fc, other = _adversarial(logits, cs)
            targeted = ts >= 0
            tval = logits.gather(1, ts.clamp_min(0)[:, None]).squeeze(1)
            margin = fc - torch.where(targeted, tval, other)
            (grad,) = torch.autograd.grad(margin.sum(), xa)
        with torch.no_grad():
            nrm = keep(ds, adv, cls)
            found |= adv
            gamma = _cosine(*GAMMA, k, steps)
            gnorm = _norm(grad, q).clamp_min(tiny)  # the dual norm: a linearized distance
            to_boundary = (nrm + margin.detach().clamp_min(0) / gnorm) * (1 + gamma)
            row_best = best[act]
            eps = torch.where(
                adv,
                torch.minimum(eps * (1 - gamma), row_best),
                torch.where(found, eps * (1 + gamma), to_boundary),
            ).clamp(max=diameter)
            ds = ds - _step(grad, _cosine(*STEP, k, steps) * eps, p)  # 0 where grad is 0
            ds = (xs + _project(ds, eps, p)).clamp(lo, hi) - xs
            if patience > 0:
                improved = row_best < ref * (1 - tol)  # the first sample found counts
                ref = torch.where(improved, row_best, ref)
                since = torch.where(improved, 0, since + 1)
                walking = (since < patience) | ~torch.isfinite(shared[ps])
                if not bool(walking.all()):
                    act, xs, cs, ds, ts, ps = (t[walking] for t in (act, xs, cs, ds, ts, ps))
                    eps, found, ref, since = (t[walking] for t in (eps, found, ref, since))
    if len(act):
        adv, cls = _verify(model, xs + ds, cs)  # the last iterate of the rows still walking
        keep(ds, adv, cls)
    return best, best_delta, best_cls


def _linearized_distance(
    model: torch.nn.Module, x: torch.Tensor, c: torch.Tensor, p: float = 2.0
) -> torch.Tensor:
    """``(f_c - f_j) / ||grad f_c - grad f_j||_q`` at ``x`` (n, K): Section 4's first-order
    p-norm distance to the boundary of class j (inf for j = c and where the gradients
    agree)."""
    with torch.no_grad():
        logits = model(x)
        grads = class_gradients(model, x)  # (n, K, d)
        rows = torch.arange(len(x), device=x.device)
        diff = torch.linalg.vector_norm(
            grads[rows, c][:, None, :] - grads, ord=dual_exponent(p), dim=2
        )
        gap = logits.gather(1, c[:, None]) - logits
        dist = torch.where(diff > 0, gap / diff, torch.inf)
        return dist.scatter(1, c[:, None], torch.inf)


def _best_of_runs(
    runs: int, norm: torch.Tensor, delta: torch.Tensor, cls: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ordered run-major (``runs`` blocks of the same n points) -> per point the row of
    smallest norm: ``(norm, delta, adv_class, target)``, each (n, ...)."""
    n = norm.shape[0] // runs
    best, run = norm.view(runs, n).min(0)
    row = run * n + torch.arange(n, device=norm.device)
    return best, delta[row], cls[row], target[row]


def _random_starts(
    x: torch.Tensor,
    radius: torch.Tensor,
    restarts: int,
    lo: float,
    hi: float,
    gen: torch.Generator,
    p: float = 2.0,
) -> torch.Tensor:
    """``restarts`` random starts per point, run-major (restarts * n, d): ``x + r u`` clipped
    to the box, ``u`` a Gaussian direction scaled to p-norm 1 (uniform on the sphere for
    L2), ``r`` uniform in ``[0, radius]``."""
    xs = x.repeat(restarts, 1)
    u = torch.randn(xs.shape, generator=gen, dtype=x.dtype, device=x.device)
    u = u / _norm(u, p).clamp_min(torch.finfo(x.dtype).tiny)[:, None]
    r = torch.rand(len(xs), generator=gen, dtype=x.dtype, device=x.device)
    r = r * radius.repeat(restarts)
    return (xs + r[:, None] * u).clamp(lo, hi) - xs


def _batch(
    model: torch.nn.Module,
    x: torch.Tensor,
    start: UpperBound | None,
    walks: MinNormSettings,
    lo: float,
    hi: float,
    polish_steps: int,
    rtol: float,
    max_steps: int,
    gen: torch.Generator,
    p: float = 2.0,
) -> UpperBound:
    steps, targets, restarts = walks.steps, walks.targets, walks.restarts
    tol, patience, prune = walks.tol, walks.patience, walks.prune
    n, dev = x.shape[0], x.device
    with torch.no_grad():
        c = model(x).argmax(1)
    dist = _linearized_distance(model, x, c, p)
    n_targets = min(targets, dist.shape[1] - 1)
    # (i) untargeted from start where it succeeded, (ii) targeted at the closest classes
    delta0 = torch.zeros_like(x)
    known = torch.full((n,), torch.inf, dtype=x.dtype, device=dev)  # the start's norm
    if start is not None:
        ok = start.success.to(dev)
        delta0 = torch.where(ok[:, None], start.delta.to(dev, x.dtype), delta0)
        delta0, passes, _ = _nudged(model, x, c, (x + delta0).clamp(lo, hi) - x, lo, hi)
        known = torch.where(ok & passes, _norm(delta0, p), known)
    order = dist.argsort(1)[:, :n_targets]
    tgt = torch.cat([torch.full((n,), -1, dtype=torch.long, device=dev), *order.T])
    # a target whose linearized distance exceeds prune x the start's norm is not walked
    near = (dist.gather(1, order) <= prune * known[:, None]) | (prune <= 0)
    live = torch.cat([torch.ones(n, dtype=torch.bool, device=dev), *near.T])
    runs = 1 + n_targets
    point = torch.arange(n, device=dev)

    def walk(
        runs: int,
        deltas: torch.Tensor,
        tgt: torch.Tensor,
        known: torch.Tensor,
        live: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`_walk` on ``runs`` blocks of rows of the n points (run-major: deltas
        (runs n, d), tgt (runs n,)), sharing per point (``known`` (n,), ``live`` (runs n,)
        or None)."""
        rep = (x.repeat(runs, 1), c.repeat(runs), deltas, tgt, steps, lo, hi)
        return _walk(model, *rep, point.repeat(runs), known, live, tol, patience, p)

    deltas = torch.cat([delta0, torch.zeros_like(x).repeat(n_targets, 1)])
    res = walk(runs, deltas, tgt, known, live)
    reached = torch.where(tgt < 0, res[2], tgt)
    best, delta, cls, target = _best_of_runs(runs, *res, reached)
    polish_args = (polish_steps, lo, hi, rtol, max_steps)
    # L1: a walk's sparse iterate may end at a class that is not the nearest, and the
    # polish is exact for the class it reached only: each run's sample is polished
    per_run = (
        [_polish(model, x, c, *_run(runs, r, *res, reached), p, *polish_args) for r in range(runs)]
        if p == 1 and polish_steps > 0
        else []
    )
    # (iii) random restarts around x, within the best norm so far
    if restarts > 0:
        radius = torch.where(torch.isfinite(best), best, dist.min(1).values)
        radius = torch.nan_to_num(radius, posinf=0.0)
        starts = _random_starts(x, radius, restarts, lo, hi, gen, p)
        none = torch.full((restarts * n,), -1, dtype=torch.long, device=dev)
        res = walk(restarts, starts, none, torch.minimum(best, known), None)
        r_best, r_delta, r_cls, r_target = _best_of_runs(restarts, *res, res[2])
        better = r_best < best
        best = torch.where(better, r_best, best)
        delta = torch.where(better[:, None], r_delta, delta)
        cls = torch.where(better, r_cls, cls)
        target = torch.where(better, r_target, target)
    walked = _upper_bound(best, delta, cls, target, c)
    if polish_steps > 0 and bool(walked.success.any()):
        polished = _polish(model, x, c, best, delta, cls, target, p, *polish_args)
        return _final(model, x, c, lo, hi, p, polished, walked, *per_run)
    return _final(model, x, c, lo, hi, p, walked)


def _upper_bound(
    best: torch.Tensor,
    delta: torch.Tensor,
    cls: torch.Tensor,
    target: torch.Tensor,
    c: torch.Tensor,
) -> UpperBound:
    """The walks' best per point as an :class:`UpperBound` (no sample where none)."""
    success = torch.isfinite(best)
    return UpperBound(
        norm=best,
        target=torch.where(success, target, -1),
        adv_class=torch.where(success, cls, -1),
        success=success,
        pred=c,
        delta=torch.where(success[:, None], delta, torch.zeros_like(delta)),
    )


def _run(
    runs: int, r: int, norm: torch.Tensor, delta: torch.Tensor, cls: torch.Tensor, tgt: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows of run ``r`` of ``runs`` run-major blocks: ``(norm, delta, cls, target)``."""
    n = norm.shape[0] // runs
    rows = slice(r * n, (r + 1) * n)
    return norm[rows], delta[rows], cls[rows], tgt[rows]


def _polish(
    model: torch.nn.Module,
    x: torch.Tensor,
    c: torch.Tensor,
    best: torch.Tensor,
    delta: torch.Tensor,
    cls: torch.Tensor,
    target: torch.Tensor,
    p: float,
    steps: int,
    lo: float,
    hi: float,
    rtol: float,
    max_steps: int,
) -> UpperBound:
    """The samples re-linearized ``steps`` times (:func:`refine_upper_bound`: the exact
    box-constrained projection of x for the linearization at each sample)."""
    walked = _upper_bound(best, delta, cls, target, c)
    return refine_upper_bound(
        model,
        x,
        walked,
        p=p,
        steps=steps,
        lo=lo,
        hi=hi,
        rtol=rtol,
        max_steps=max_steps,
        dtype=x.dtype,
        progress=False,
    )


def _final(
    model: torch.nn.Module,
    x: torch.Tensor,
    c: torch.Tensor,
    lo: float,
    hi: float,
    p: float,
    *candidates: UpperBound,
) -> UpperBound:
    """Per point the smallest candidate sample in the p-norm that passes the check (module
    docstring) once more; results on the CPU."""
    n, dev = x.shape[0], x.device
    norm = torch.full((n,), torch.inf, dtype=x.dtype, device=dev)
    delta = torch.zeros_like(x)
    target = torch.full((n,), -1, dtype=torch.long, device=dev)
    adv_class = target.clone()
    for cand in candidates:
        d, adv, cls = _nudged(model, x, c, cand.delta.to(dev, x.dtype), lo, hi)
        nrm = _norm(d, p)
        better = cand.success.to(dev) & adv & (nrm < norm)
        norm = torch.where(better, nrm, norm)
        delta = torch.where(better[:, None], d, delta)
        target = torch.where(better, cand.target.to(dev), target)
        adv_class = torch.where(better, cls, adv_class)
    success = torch.isfinite(norm)
    return UpperBound(
        norm=norm.cpu(),
        target=target.cpu(),
        adv_class=adv_class.cpu(),
        success=success.cpu(),
        pred=c.cpu(),
        delta=delta.cpu(),
    )


def min_norm_attack(
    model: torch.nn.Module,
    x: torch.Tensor,
    start: UpperBound | None = None,
    settings: MinNormSettings | None = None,
    p: float = 2.0,
    lo: float = 0.0,
    hi: float = 1.0,
    polish_steps: int = 5,
    rtol: float = 1e-4,
    max_steps: int = 60,
    dtype: torch.dtype = torch.float64,
    batch_size: int = 4096,
    seed: int = 0,
    progress: bool = True,
    **changes: Any,
) -> UpperBound:
    """Minimal-norm L2 adversarial samples in the box ``[lo, hi]^d`` for each point of ``x``
    (n, d) by FMN walks (module docstring), with ``settings`` (:class:`MinNormSettings`,
    default the schema's ``attack.min_norm_*``; keyword ``changes`` of its fields, e.g.
    ``steps=20``, apply on top): one walk from ``start`` (an :class:`UpperBound` of the same
    points, e.g. the paper's or the refined one; None: from ``x``), ``targets`` targeted
    ones and ``restarts`` random restarts per point, at most ``steps`` iterations each (a
    walk stops early per ``tol`` and ``patience``; targets beyond ``prune`` times the
    start's norm are not walked: module docstring), then ``polish_steps``
    re-linearizations (:func:`refine_upper_bound` with ``rtol``,
    ``max_steps``). Every reported sample is verified by a forward pass in ``dtype``.

    Runs on ``x``'s device in ``dtype`` (the model is converted, never changed); the
    :class:`UpperBound` comes back on the CPU, ``target`` holding the class a walk was
    aimed at (for the untargeted walks the class reached). ``batch_size`` bounds the rows
    (point x run) of one forward pass. ``progress``: points done and rate per batch to the
    ``"crosslip"`` logger (:mod:`crosslip.progress`)."""
    walks = (settings or MinNormSettings()).but(**changes)
    for name in ("targets", "restarts"):
        if getattr(walks, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(walks, name)}")
    if walks.steps < 1:
        raise ValueError(f"steps must be >= 1, got {walks.steps}")
    model = _prepare(model, x, dtype)
    x = x.to(dtype)
    gen = torch.Generator(device=x.device).manual_seed(seed)
    runs = max(1 + walks.targets, walks.restarts, 1)
    per_batch = max(1, batch_size // runs)
    parts, found = [], 0
    p = check_p(p)
    name = "Linf" if math.isinf(p) else f"L{p:g}"
    with Progress(f"attack min-norm {name}", len(x), "points", active=progress) as bar:
        for i in range(0, len(x), per_batch):
            sl = slice(i, i + per_batch)
            part_start = None
            if start is not None:
                part_start = UpperBound(
                    *(getattr(start, f)[sl] for f in UpperBound.__annotations__)
                )
            parts.append(
                _batch(
                    model, x[sl], part_start, walks, lo, hi, polish_steps, rtol, max_steps, gen, p
                )
            )
            found += int(parts[-1].success.sum())
            bar.update(len(parts[-1].norm), successes=found)
    return _cat(parts)
