"""Theorem 2.1 as one generic, batched routine.

Theorem 2.1: for a classifier ``f`` predicting ``c`` at ``x`` and any ``R > 0``,
``alpha(R) = min{ min_{j != c} (f_c(x) - f_j(x)) / L_j(R), R }`` is a certified radius in the
p-norm whenever ``L_j(R) >= max_{y in B_p(x, R)} ||grad f_c(y) - grad f_j(y)||_q``
(``1/p + 1/q = 1``). The guarantee is ``max_R alpha(R)``.

:func:`theorem21` takes the margins and any function returning such bounds (non-decreasing
in R, as every bound in this package is), searches R for all points at once, and only ever
reports ``alpha(R)`` at an R it evaluated, so a loose search costs tightness, never soundness.

Rounding (:mod:`.rounding`): the search is given *lower* bounds on the real margins
(:func:`margins_lower`, from the computed logits and bounds on their forward error) and
*upper* bounds ``L_j(R)`` that already cover the rounding of their own evaluation; the
quotients are rounded down (:func:`ratios`), and ``min``, comparisons and the reported R are
exact. So every reported ``alpha(R)`` is a guarantee for the real function. ``+inf`` needs a
proof from the weights (``vanishes``), never an evaluation that happens to give 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .rounding import UNIT

#: ``L(idx, R) -> (m, K)``: bounds for the points ``idx`` (m,) at radii ``R`` (m,).
LipschitzFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Certificate:
    """Per-point result, all tensors of shape (n,).

    ``guarantee``: certified radius; ``radius``: the R at which it was attained (``inf``
    when no finite R limits it); ``bound_class``: the class j attaining the minimum in
    Theorem 2.1 at that R (-1 for a zero margin); ``evaluations``: how many R were tried.
    """

    guarantee: torch.Tensor
    radius: torch.Tensor
    bound_class: torch.Tensor
    evaluations: torch.Tensor


def certificate_columns(pred: torch.Tensor, m: torch.Tensor, cert: Certificate) -> dict:
    """The per-point columns of a local certificate: ``pred``, ``margin``
    (``f_c - max_{j != c} f_j``), ``guarantee_local``, ``radius_local``, ``bound_class``,
    ``evaluations``, each (n,)."""
    return {
        "pred": pred,
        "margin": m.min(1).values,
        "guarantee_local": cert.guarantee,
        "radius_local": cert.radius,
        "bound_class": cert.bound_class,
        "evaluations": cert.evaluations,
    }


def margins(logits: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """``f_c(x) - f_j(x)``, shape (n, K), with ``+inf`` at ``j = c``."""
    m = logits.gather(1, pred[:, None]) - logits
    return m.scatter(1, pred[:, None], float("inf"))


def margins_lower(
    logits: torch.Tensor, err: torch.Tensor, pred: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The computed margins (n, K) of :func:`margins` and lower bounds on the real ones.

    ``err`` (n, K) bounds the forward error of each computed logit:
    ``|logits_j - f_j(x)| <= err_j``. The subtraction ``fl(f_c - f_j) = (f_c - f_j)(1 + d)``,
    ``|d| <= u``, so ``f_c(x) - f_j(x) >= m_j - err_c - err_j - u |m_j| / (1 - u)``. We
    subtract ``slack = (err_c + err_j + 4 u |m_j|)(1 + 4u)``: the extra ``3 u |m_j|`` and the
    factor cover the rounding of the slack's sum and of the subtraction itself (where the
    result is positive, ``slack < |m_j|`` and that rounding is below ``u |m_j|``; where it
    is not, rounding keeps the sign). ``+inf`` stays at ``j = c``.
    """
    m = margins(logits, pred)
    slack = err.gather(1, pred[:, None]) + err + (4 * UNIT) * m.abs()
    lower = torch.where(torch.isinf(m), m, m - slack * (1 + 4 * UNIT))
    return m, lower


def ratios(
    m: torch.Tensor, lip: torch.Tensor, vanishes: torch.Tensor | None = None
) -> torch.Tensor:
    """Lower bounds on ``m_j / L_j`` (n, K): the quotient rounded down (times ``1 - 2u``:
    ``fl(m / L) <= (m / L)(1 + u)``) and capped at the largest float64 where it overflows
    (the real quotient is at least that). Conventions: a non-positive margin gives 0
    whatever ``L_j``; ``m_j / 0 = inf`` for ``m_j > 0`` (a zero *bound at this R* says no
    gradient difference on the ball); a NaN bound gives 0; ``+inf`` margins (``j = c``) give
    ``inf``; and where ``vanishes`` (n, K) is True (the gradient difference is zero for every
    y, decided from the weights) and ``m_j > 0``, ``inf`` whatever ``L_j``."""
    big = torch.finfo(lip.dtype).max
    q = (m / lip.clamp_min(torch.finfo(lip.dtype).tiny)) * (1 - 2 * UNIT)
    r = torch.where(lip > 0, q.clamp(max=big), torch.where(lip == 0, torch.inf, 0.0))
    r = torch.where(m > 0, r, torch.zeros_like(r))
    r = torch.where(torch.isinf(m) & (m > 0), torch.inf, r)
    if vanishes is not None:
        r = torch.where(vanishes & (m > 0), torch.inf, r)
    return r


def min_ratio(
    m: torch.Tensor, lip: torch.Tensor, vanishes: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``min_j m_j / L_j`` (n,) and its argmin (conventions of :func:`ratios`)."""
    return ratios(m, lip, vanishes).min(dim=1)


def theorem21(
    m: torch.Tensor,
    lipschitz: LipschitzFn,
    rtol: float = 1e-3,
    max_iter: int = 100,
    r_max: float = float("inf"),
    vanishes: torch.Tensor | None = None,
    start: torch.Tensor | None = None,
) -> Certificate:
    """Maximize ``alpha(R)`` of Theorem 2.1 over R for every point at once.

    ``m``: lower bounds on the margins (n, K) (:func:`margins_lower`; :func:`margins` when
    the logits are exact), ``+inf`` at ``j = c``; ``lipschitz``: upper bounds ``L_j(R)``,
    non-decreasing in R; ``vanishes`` (n, K) bool, optional: classes whose gradient
    difference ``grad f_c - grad f_j`` is zero at *every* y, decided from the weights (for
    them ``f_c - f_j`` is constant, so a positive margin never shrinks). Then
    ``g(R) = min_j m_j / L_j(R)`` is non-increasing, ``alpha(R) = min(g(R), R)``, and the
    optimum ``alpha* = sup{R : g(R) >= R}`` satisfies ``alpha* <= g(0)``. ``start`` (n,),
    optional: the first R to try (:func:`radius_search`; it changes the path only).

    Theorem 2.1 says exactly that class j cannot overtake c inside the ball of radius
    ``min(m_j / L_j(R), R)``, so this is :func:`radius_search` with the per-class radii
    ``rho_j(R) = m_j / L_j(R)`` rounded down (:func:`ratios`); see there for the search, its
    class pruning and why only ``alpha(R)`` at evaluated R is reported.

    *No certificate without an evaluation.* ``+inf`` is reported only where every class
    ``j != c`` vanishes and has a positive margin (then ``r_max``, ``inf`` by default). A
    bound that is 0 at ``R = 0`` (for instance, all hidden units saturated off at x, where
    ``sigma'`` underflows) says nothing about larger R: such a point gets
    ``hi = r_cap = min(r_max, largest float64)`` and the search evaluates ``g`` at
    ``r_cap`` and then at smaller R like any other point.
    """
    prune = bool(getattr(lipschitz, "supports_mask", False))

    def radius(idx: torch.Tensor, r: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        lip = lipschitz(idx, r, need) if prune else lipschitz(idx, r)
        return ratios(m[idx], lip, None if vanishes is None else vanishes[idx])

    unbounded = unbounded_points(m, vanishes)
    return radius_search(radius, m, rtol, max_iter, r_max, unbounded, prune=prune, start=start)


def unbounded_points(m: torch.Tensor, vanishes: torch.Tensor | None) -> torch.Tensor:
    """(n,) bool: points where every class ``j != c`` provably never overtakes ``c``: its
    gradient difference vanishes for every y (``vanishes``, decided from the weights) and its
    margin is positive (``+inf`` margins are the predicted class itself)."""
    if vanishes is None:
        return torch.zeros(m.shape[0], dtype=torch.bool, device=m.device)
    return ((vanishes & (m > 0)) | (torch.isinf(m) & (m > 0))).all(1)


#: ``rho(idx, R, need) -> (m, K)``: per-class certified radii from one evaluation at R
#: (:func:`radius_search`).
RadiusFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def radius_search(
    radius: RadiusFn,
    m: torch.Tensor,
    rtol: float = 1e-3,
    max_iter: int = 100,
    r_max: float | torch.Tensor = float("inf"),
    unbounded: torch.Tensor | None = None,
    prune: bool = True,
    start: torch.Tensor | None = None,
    origin: RadiusFn | None = None,
) -> Certificate:
    """The largest certified radius of every point, from per-class radii evaluated at R.

    ``radius(idx, R, need)``, with ``idx, R`` (m,) and ``need`` (m, K) bool, returns
    ``rho`` (m, K) such that class j cannot overtake the predicted class c anywhere in the
    set of perturbations of norm below ``min(rho_j, R)`` (the ball, or ball ∩ box, that the
    certificate is about): a lower bound on the margin over the set ``S(R)`` of radius R
    that stays positive up to ``rho_j``. ``+inf`` at ``j = c``; entries where ``need`` is
    False are ignored (a function may skip them and return ``+inf`` there). ``m`` (n, K):
    the margins' lower bounds; only their shape, device and dtype, and their sign (a point
    whose margin is not positive gets 0) are used here. ``unbounded`` (n,) bool: points
    proved safe everywhere (:func:`unbounded_points`), which get ``r_max``: a number, or
    (n,) per point (a box certificate stops where the ball contains the whole box).

    Then ``alpha(R) = min(g(R), R)`` with ``g(R) = min_j rho_j(R)`` is certified, and when
    ``g`` is non-increasing in R (every certificate here is, in exact arithmetic) the
    optimum ``alpha* = sup{R : g(R) >= R}`` satisfies ``alpha* <= g(0)``. Soundness never
    depends on that monotonicity: only ``alpha(R)`` at an R that was evaluated is reported.

    *Bracket.* One evaluation at R brackets ``alpha*`` from both sides: if ``g(R) >= R``,
    R is certified (``alpha(R) = R``) and ``alpha* <= g(R)`` (any ``R' > g(R)`` has
    ``g(R') <= g(R) < R'``); if ``g(R) < R``, ``alpha* < R`` and ``alpha(R) = g(R)`` is
    certified. So ``lo`` (always a reported ``alpha``) rises to ``min(g(R), R)`` and ``hi``
    falls to ``max(g(R), R)``, starting from ``[0, min(g(0), r_cap)]`` with ``r_cap =
    min(r_max, largest float64)``; the first R is ``hi``. The search stops when ``hi - lo
    <= rtol * hi``: the reported value is then within a relative ``rtol`` of the optimum.

    *Steps.* In a wide bracket (``hi > 16 lo``) the next R is the geometric mean
    ``sqrt(lo hi)``: a bracket that spans many orders of magnitude (as after ``r_cap``)
    shrinks to a factor 16 in about ``log2(log2(hi / lo))`` steps; with nothing certified
    yet (``lo = 0``: a certificate whose lower bound on the margin at R is negative says
    nothing smaller) the next R is ``hi / 8``, then ``hi / 8^2``, ``hi / 8^4``, … while
    nothing is certified (from ``r_cap`` to 1 in about 9 steps). Otherwise it
    is the secant root of ``h(R) = g(R) - R`` through the last two evaluations, kept a
    quarter-tolerance inside the bracket; when the bracket did not halve over two steps, a
    bisection step is taken instead, so the search is never much slower than bisection. On
    the smooth ``g`` of our bounds it needs ~5 evaluations for ``rtol = 1e-3`` (bisection:
    ~12).

    *Class pruning.* An evaluation at R' with ``g(R') < R'`` makes R' the new ``hi``, so
    every later R is smaller. A class j whose ``rho_j(R') > hi`` is, by the contract above,
    unable to overtake c within ``min(rho_j(R'), R') >= hi``, hence within every later R:
    it is skipped (``need`` False), and the computed ``min(g, R)`` stays a certified radius.
    This is a statement about the real classifier, so it holds whether or not the bound
    is monotone in R. ``prune=False`` evaluates every class at every R.

    ``start`` (n,), optional: the first R to try where it is positive and below
    ``hi`` (for instance a little above another certificate's radius), instead of ``hi``;
    it changes only the path of the search. With a ``start`` (and no ``origin``) nothing is
    evaluated at ``R = 0``: the bracket opens at ``[0, r_cap]`` and the first evaluation,
    at ``start``, closes it to ``[min(g, R), max(g, R)]`` (the step after it bisects). An
    evaluation at ``R = 0`` costs as much as any other with every class still needed, so a
    good ``start`` saves it; a point whose ``start`` is not positive begins at ``r_cap``.

    ``origin``, optional: per-class radii at ``R = 0`` in place of ``radius``'s there, for a
    radius function that is costly to evaluate rigorously: they open the bracket (``hi``)
    and the first secant step and are never reported, so an estimate changes the path and
    the tightness (an estimate below ``alpha*`` caps the result at it), never soundness.
    """
    n = m.shape[0]
    dev, dt = m.device, m.dtype
    all_idx = torch.arange(n, device=dev)
    r_max = torch.as_tensor(r_max, dtype=dt, device=dev).expand(n)
    r_cap = r_max.clamp(max=torch.finfo(dt).max)
    tiny = torch.finfo(dt).tiny

    everything = torch.ones_like(m, dtype=torch.bool)
    zero = torch.zeros(n, device=dev, dtype=dt)
    opened = start is not None and origin is None  # the bracket opens at start, not at 0
    if opened:
        g0 = torch.full((n,), torch.nan, device=dev, dtype=dt)  # unknown: no secant from it
    else:
        g0, _ = (origin or radius)(all_idx, zero, everything).min(dim=1)
    best = torch.zeros(n, device=dev, dtype=dt)
    best_r = torch.zeros(n, device=dev, dtype=dt)
    best_j = torch.full((n,), -1, device=dev, dtype=torch.long)
    evals = torch.full((n,), 0 if opened else 1, device=dev, dtype=torch.long)
    rho = torch.zeros_like(m)  # radii within which each class is known not to overtake
    lo = torch.zeros(n, device=dev, dtype=dt)
    hi = r_cap.clone() if opened else torch.clamp(g0, max=r_cap)

    def evaluate(idx: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """``g(r)`` at the points ``idx``; records the best ``alpha``."""
        need = rho[idx] <= hi[idx][:, None] if prune else everything[idx]
        q = radius(idx, r, need).masked_fill(~need, torch.inf)
        g, j = q.min(dim=1)
        alpha = torch.minimum(g, r)
        better = alpha > best[idx]
        best[idx] = torch.where(better, alpha, best[idx])
        best_r[idx] = torch.where(better, r, best_r[idx])
        best_j[idx] = torch.where(better & torch.isfinite(g), j, best_j[idx])
        evals[idx] += 1
        if prune:
            update = need & (g < r)[:, None]  # skipped classes keep their older radius
            rho[idx] = torch.where(update, torch.maximum(rho[idx], q), rho[idx])
        return g

    # Zero margins keep 0. Points where every class provably never overtakes c get r_max
    # (inf by default) and no bound class; all others get a finite, positive bracket.
    if unbounded is None:
        unbounded = torch.zeros(n, dtype=torch.bool, device=dev)
    best[unbounded], best_r[unbounded] = r_max[unbounded], r_max[unbounded]
    active = all_idx[(hi > 0) & ~unbounded & (m > 0).all(1)]
    # the last two evaluations (R, h(R)), for the secant step
    r_prev, h_prev = torch.zeros(n, device=dev, dtype=dt), g0.clone()
    r_last, h_last = r_prev.clone(), g0.clone()
    width_1 = torch.full((n,), torch.inf, device=dev, dtype=dt)  # bracket one step ago
    width_2 = width_1.clone()  # two steps ago
    shrink = torch.full((n,), 8.0, device=dev, dtype=dt)  # the next step down while lo = 0
    r = hi[active]
    if start is not None:
        first = start[active]
        r = torch.where((first > 0) & (first < r), first, r)
    for it in range(max_iter + 1):
        if it > 0:
            active = active[(hi[active] - lo[active]) > rtol * hi[active]]
            if len(active) == 0:
                break
            a_lo, a_hi = lo[active], hi[active]
            width = a_hi - a_lo
            rp, hp, rl, hl = r_prev[active], h_prev[active], r_last[active], h_last[active]
            r = rl - hl * (rl - rp) / (hl - hp)
            bisect = (width > 0.5 * width_2[active]) | ~torch.isfinite(r)
            r = torch.where(bisect, 0.5 * a_lo + 0.5 * a_hi, r)
            gap = 0.25 * rtol * a_hi
            r = torch.minimum(torch.maximum(r, a_lo + gap), a_hi - gap)
            wide = a_hi > 16 * a_lo
            down = (a_hi / shrink[active]).clamp_min(tiny)
            geometric = torch.where(a_lo > 0, a_lo.clamp_min(tiny).sqrt() * a_hi.sqrt(), down)
            r = torch.where(wide, geometric, r)
            grow = wide & (a_lo == 0)
            shrink[active] = torch.where(grow, (shrink[active] ** 2).clamp(max=1e300), 8.0)
            width_2[active] = width_1[active]
            width_1[active] = width
        g = evaluate(active, r)
        h = g - r  # g itself, not h + r: for R near the largest float64, h + r cancels g
        lo[active] = torch.maximum(lo[active], torch.minimum(g, r))
        hi[active] = torch.minimum(hi[active], torch.maximum(g, r))
        r_prev[active], h_prev[active] = r_last[active], h_last[active]
        r_last[active], h_last[active] = r, h
    return Certificate(best, best_r, best_j, evals)


def undercutting_rounds(
    key: torch.Tensor, open_: torch.Tensor, evaluate: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Per-class radii (n, K) where a costly certificate is evaluated only for the classes
    that can set a point's radius. ``key`` (n, K): a radius each class already has (a
    cheaper certificate's; ``inf`` where none is needed); ``open_`` (n, K) bool: the
    classes it does not settle; ``evaluate(mask)`` (n, K): the costly radii of the classes
    in ``mask`` (any value elsewhere), each at least as good as its ``key`` where the
    caller wants the better of the two. Two rounds: first each point's open class with the
    smallest ``key``, whose result ``t`` bounds the point's radius (the minimum over its
    classes) from above; then the open classes with ``key < t``. The others keep their
    ``key``: it is at least ``t``, so the point's radius is that of every open class
    evaluated, for fewer evaluations (:mod:`.integrated`, :mod:`.trust_region`).
    ``evaluate(mask, enough)`` also gets ``enough`` (n, 1): ``+inf`` in the first round,
    ``t`` in the second, where any sound radius at least ``t`` serves as well as the class's
    best (it cannot set the point's radius), so a certificate may stop refining there."""
    masked = torch.where(open_, key, torch.inf)
    first = torch.zeros_like(open_).scatter_(1, masked.argmin(1, keepdim=True), True) & open_
    got = evaluate(first, torch.full_like(key[:, :1], torch.inf))
    t = torch.where(first, got, torch.inf).min(1, keepdim=True).values
    out = torch.where(first, got, key)
    rest = open_ & ~first & (key < t)
    if rest.any():
        out = torch.where(rest, evaluate(rest, t), out)
    return out
