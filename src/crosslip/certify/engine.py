"""Every guarantee of the one-hidden-layer net for a batch of points, in one call.

Columns (all per point, shape (n,)); "guarantee" always means a certified radius:

============================  ==============================================================
``pred``, ``margin``          predicted class c and ``f_c - max_{j != c} f_j``
``guarantee_local``           L2, Proposition 2.3 (the paper's local guarantee); ``radius_local``,
                              ``bound_class`` (j attaining the minimum), ``evaluations`` (R tried)
``guarantee_global``          L2, global constant ``||w_c - w_j||_2 ||U||_2`` (no search needed)
``guarantee_l2``              L2, tightest: ``min(Prop. 2.3, interval, global)`` (``radius_l2``)
``guarantee_l1``              L1 (q = inf), interval bound
``guarantee_linf``            Linf (q = 1), interval bound
``guarantee_*_box``           the same three, for perturbations that keep ``x + delta`` in
                              ``[0, 1]^d`` only (never to be compared with the unconstrained ones)
``guarantee_{p}_linear``      linear relaxation (:mod:`.relaxation`), per requested norm p
``guarantee_{p}_curvature``   curvature bound (:mod:`.curvature`)
``guarantee_{p}_integrated``  Theorem 2.1 integrated along the ray (:mod:`.integrated`)
``guarantee_{p}_best``        the largest certificate of that norm; each with ``_box`` too
============================  ==============================================================

Every reported value is a radius certified at an evaluated R (``alpha(R)`` of Theorem 2.1,
or the radius within which another certificate's lower bound on the margin at R stays
positive), for the real function of the float64 weights at the float64 point, with every
rounding of its computation covered (:mod:`.rounding`; ``docs/guarantees.md`` says what
this means for a float32 deployment).

A :class:`~crosslip.models.torch_softplus.TorchSoftplusNet` (a network trained elsewhere with
``nn.Softplus``, which is the identity above its threshold) is certified for the function it
computes, ``g``: ``pred`` and ``margin`` are ``g``'s, and the margins that Theorem 2.1 uses
are the exact softplus net's lower bounds at x minus ``NetTerms.threshold_gap[c, j]`` (a
bound on ``|(g_c - g_j) - (f_c - f_j)|`` everywhere). If ``f_c(y) - f_j(y) >= m_j - L_j
||y - x||`` with ``m_j = f_c(x) - f_j(x) - gap_cj``, then ``g_c(y) - g_j(y) >= f_c(y) -
f_j(y) - gap_cj > 0`` for ``||y - x|| < m_j / L_j``: each radius holds for ``g``. The
Lipschitz bounds are the exact net's (they bound ``f``, the only use the argument makes of
them).
A combined guarantee is the maximum of its own search and of the guarantees it is built
from (each is valid for it), so it is never below any of them. A set of perturbations that
is smaller (box) can only have a larger guarantee, and the unconstrained one is valid for
it: the same rule.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..models import SoftplusNet
from ..norms import NORMS
from ..progress import Progress
from .curvature import CurvatureBound
from .integrated import integrated
from .linf_curvature import LinfCurvatureBound
from .linf_trust_region import LinfTrustRegionBound
from .relaxation import LinearRelaxation
from .rounding import gamma, require_float64
from .search import (
    Certificate,
    certificate_columns,
    margins,
    margins_lower,
    min_ratio,
    radius_search,
    theorem21,
    unbounded_points,
)
from .settings import CertifySettings, settings_with
from .softplus_bounds import (
    IntervalBound,
    MinBound,
    NetTerms,
    PreactivationRange,
    Prop23Bound,
    global_bound,
)
from .trust_region import TrustRegionBound

#: The curvature certificates minimised over the ball, by norm (``trust_region_steps``).
TRUST_REGIONS = {2.0: TrustRegionBound, math.inf: LinfTrustRegionBound}

#: Norm families: the guarantees of Theorem 2.1 with the paper's bounds.
NORM_KINDS = ("local", "global", "l2", "l1", "linf", "box")
#: Certificates beyond the paper, each computed for every requested p-norm (l2, l1, linf)
#: and, with ``box``, its box-constrained version: the linear relaxation
#: (:mod:`.relaxation`), the curvature bound (:mod:`.curvature`) and Theorem 2.1 integrated
#: along the ray (:mod:`.integrated`).
METHOD_KINDS = ("linear", "curvature", "integrated")
#: The guarantee families :func:`certify_softplus` can compute.
KINDS = NORM_KINDS + METHOD_KINDS


def certify_softplus(
    net: SoftplusNet,
    x: torch.Tensor,
    settings: CertifySettings | None = None,
    dtype: torch.dtype = torch.float64,
    batch_size: int = 1024,
    **changes: Any,
) -> dict[str, torch.Tensor]:
    """Guarantees of the one-hidden-layer net for the points ``x`` (n, d); see the module
    docstring for the columns. ``settings`` (default: the schema's; keyword ``changes``
    of its fields, e.g. ``rtol=1e-4``, apply on top): ``kinds`` selects the families
    (``"local"`` and ``"global"`` are always computed when ``"l2"`` is requested; ``"box"``
    adds the ``*_box`` column of each requested p-norm and needs ``x`` in ``[0, 1]^d``; each
    of :data:`METHOD_KINDS` adds its column for every requested p-norm, box included);
    ``rtol``: the searches' relative precision; ``tangent_steps``: steps on the tangent
    points of the linear relaxation (0: tangents at the point); ``integration_nodes``: nodes
    of the integrated bound; ``trust_region_steps``: Lanczos steps of the L2 and L-inf curvature
    certificates minimised over the ball (:mod:`.trust_region`, :mod:`.linf_trust_region`;
    0: only the curvature forms; otherwise each row of those columns is the better of the
    two); ``expansion_steps``: its bounds
    again with the units expanded about the last minimiser (:mod:`.expansion`);
    ``expansion_ascent_steps``: then, in L2 and L1, about points found by gradient ascent.
    Computation in float64 (``dtype`` must be float64: the rounding analysis is
    float64's), on ``x.device``, in batches of ``batch_size`` points; results on the CPU.

    Every guarantee holds for the real function of the net's weights taken as float64
    numbers, at the points ``x`` taken as float64 numbers, rounding of this computation
    included (:mod:`.rounding`). ``margin`` is the computed one. Progress (points done, rate)
    goes to the ``"crosslip"`` logger (:mod:`crosslip.progress`).
    """
    require_float64(dtype)
    settings = settings_with(settings, changes)
    kinds, rtol = settings.kinds, settings.rtol
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown guarantee kinds {sorted(unknown)}; choose from {KINDS}")
    kinds = tuple(kinds)
    if "l2" in kinds:
        kinds = tuple(dict.fromkeys(("local", "global", *kinds)))
    if set(kinds) & set(METHOD_KINDS) and not set(kinds) & set(NORMS):
        raise ValueError(
            f"the certificates {sorted(set(kinds) & set(METHOD_KINDS))} are computed for the "
            "requested norms: add l2, l1 or linf to the kinds"
        )
    options = Options(
        rtol,
        kinds,
        settings.tangent_steps,
        settings.integration_nodes,
        settings.trust_region_steps,
        settings.expansion_steps,
        settings.expansion_ascent_steps,
    )
    net = copy.deepcopy(net).to(dtype=dtype, device=x.device).eval()
    out: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad(), Progress("certify", len(x), "points") as progress:
        terms = NetTerms(net, dtype)  # point-independent products: once for all batches
        for i in range(0, len(x), batch_size):
            part = _certify_batch(net, terms, x[i : i + batch_size].to(dtype), options)
            for k, v in part.items():
                out.setdefault(k, []).append(v.cpu())
            progress.update(len(part["pred"]))
    return {k: torch.cat(v) for k, v in out.items()}


@dataclass(frozen=True)
class Options:
    """What one batch of :func:`certify_softplus` computes and how (its settings, the kinds
    completed)."""

    rtol: float
    kinds: tuple[str, ...]
    tangent_steps: int
    integration_nodes: int
    trust_region_steps: int
    expansion_steps: int
    expansion_ascent_steps: int

    def ascents(self, p: float) -> int:
        """The p-norm ball's ascent steps on the expansion points: L2 (the trust region) and
        L1 (the curvature form at the vertices) only; in L-inf the ascent raised the mean
        of the record's 200-epoch Cross-Lipschitz 1e-2 network by 1.2% for 2.7 times the
        column's time (20 points)."""
        return self.expansion_ascent_steps if p in (1, 2) else 0

    def minimised(self, p: float) -> tuple[int, int, int]:
        """The p-norm trust region's settings: Lanczos steps, moves, ascent steps."""
        return self.trust_region_steps, self.expansion_steps, self.ascents(p)


def _certify_batch(
    net: SoftplusNet, terms: NetTerms, x: torch.Tensor, opt: Options
) -> dict[str, torch.Tensor]:
    kinds, rtol = opt.kinds, opt.rtol
    z = terms.preactivation(x)  # shared by the logits and every range
    pad = terms.pad(x, z)
    logits, err = terms.logits(x, z, pad)
    if terms.threshold is None:
        pred = logits.argmax(1)
        m_hat, m = margins_lower(logits, err, pred)
    else:  # PyTorch's thresholded softplus: its class, exact net's margins minus the gap
        user = net(x)
        pred = user.argmax(1)
        _, m = margins_lower(logits, err + terms.threshold_gap[pred], pred)
        m_hat = margins(user, pred)
    van = terms.vanishing[pred]  # (n, K)
    unbounded = unbounded_points(m, van)
    res: dict[str, torch.Tensor] = {"pred": pred, "margin": m_hat.min(1).values}
    glob = global_bound(net, pred, x.dtype, spectral_norm=terms.spectral_norm)
    ranges: dict[tuple[float, bool], PreactivationRange] = {}

    def rng(p: float, box: bool = False) -> PreactivationRange:
        if (p, box) not in ranges:
            ranges[p, box] = PreactivationRange(terms, x, pred, p=p, box=box, z=z, pad=pad)
        return ranges[p, box]

    def search(bound, near: torch.Tensor | None = None) -> Certificate:
        """Theorem 2.1 with ``bound``, its search started just above ``near`` (a guarantee
        that this one is at least, and usually close to) where given."""
        start = None if near is None else near * (1 + rtol / 4)
        return theorem21(m, bound, rtol=rtol, vanishes=van, start=start)

    def radius(fn, box: bool, near: torch.Tensor) -> torch.Tensor:
        """``fn``'s certified radii, the search started a little above ``near``."""
        r_max = box_diameter(x, fn.rng.p) if box else math.inf
        origin = getattr(fn, "origin", None)  # an estimate at R = 0 where it has one
        cert = radius_search(
            fn, m, rtol, r_max=r_max, unbounded=unbounded, start=1.5 * near, origin=origin
        )
        return cert.guarantee.masked_fill(unbounded, math.inf)  # safe everywhere

    if "local" in kinds:
        res.update(certificate_columns(pred, m_hat, search(Prop23Bound(rng(2)))))
    if "global" in kinds:
        res["guarantee_global"] = min_ratio(m, glob, van)[0]
    boxes = (False, True) if "box" in kinds else (False,)
    for box in boxes:
        suffix = "_box" if box else ""
        for name, p in NORMS.items():
            if name not in kinds:
                continue
            col = f"guarantee_{name}"
            # a box guarantee is at least the ball's, the tightest L2 one at least
            # Proposition 2.3's, and each mostly close to it: its search starts there
            near = None
            if box:
                near = res[col]
            elif p == 2:
                near = res["guarantee_local"]
            if p == 2:
                bound = MinBound(rng(2, box), glob)
                cert = search(bound, near)
                parts = [cert.guarantee, res["guarantee_local"], res["guarantee_global"]]
                res["radius_l2" + suffix] = cert.radius
            else:
                bound = IntervalBound(rng(p, box))
                cert = search(bound, near)
                parts = [cert.guarantee]
            if box:
                parts.append(res[col])
            res[col + suffix] = torch.stack(parts).max(0).values
            methods = [res[col + suffix]]
            if "integrated" in kinds:
                # in L2 its nodes take Proposition 2.3 and the global bound: the interval
                # bound (a fifth of their time) moved the mean by 3e-5 on MNIST
                nodes = MinBound(rng(2, box), glob, interval=False) if p == 2 else bound
                steps = integrated(m, nodes, cert, opt.integration_nodes, van)
                res[f"{col}_integrated{suffix}"] = torch.maximum(steps, res[col + suffix])
            if "linear" in kinds:
                relax = LinearRelaxation(rng(p, box), m, opt.tangent_steps)
                res[f"{col}_linear{suffix}"] = radius(relax, box, res[col + suffix])
            minimised = TRUST_REGIONS.get(p) if opt.trust_region_steps else None
            if "curvature" in kinds and minimised and not box:
                # each row of the trust region is at least the lambda_max form's at the same
                # R, so it needs no search of that form first; it starts above the best
                # certificate so far
                done = [res[f"{col}_{k}"] for k in METHOD_KINDS if f"{col}_{k}" in res]
                near = torch.stack([res[col], *done])
                exact = minimised(rng(p), m, *opt.minimised(p))
                res[f"{col}_curvature"] = radius(exact, False, near.max(0).values)
            elif "curvature" in kinds and minimised and minimised.boxed:
                # the cube in the box: its own dual, over ranges of the box, each row at least
                # the ball's first form; and the ball's radius holds in the box
                near = torch.maximum(res[col + suffix], res[f"{col}_curvature"])
                exact = minimised(rng(p, box), m, *opt.minimised(p))
                got = radius(exact, box, near)
                res[f"{col}_curvature{suffix}"] = torch.maximum(got, res[f"{col}_curvature"])
            elif "curvature" in kinds:
                # L-inf: its constant through a diagonal scaling, proved (:mod:`.linf_curvature`)
                kind = LinfCurvatureBound if math.isinf(p) else CurvatureBound
                moves = opt.expansion_steps if p != 2 else 0
                curv = kind(rng(p, box), m, moves, opt.ascents(p))
                res[f"{col}_curvature{suffix}"] = radius(curv, box, res[col + suffix])
                if minimised:  # the ball's radius holds in the box
                    near = res[f"{col}_curvature{suffix}"]
                    res[f"{col}_curvature{suffix}"] = torch.maximum(near, res[f"{col}_curvature"])
            methods += [res[f"{col}_{k}{suffix}"] for k in METHOD_KINDS if k in kinds]
            if box:  # the whole ball's certificates hold in the box too
                methods.append(res[f"{col}_best"])
            res[f"{col}_best{suffix}"] = torch.stack(methods).max(0).values
    return res


def box_diameter(x: torch.Tensor, p: float) -> torch.Tensor:
    """``max_{y in [0, 1]^d} ||y - x||_p`` (n,), rounded up: from this radius on the ball
    contains the whole box, so a box certificate there certifies every radius; it is
    reported as this radius."""
    far = torch.maximum(x, 1 - x)
    return torch.linalg.vector_norm(far, ord=p, dim=1).mul_(1 + gamma(x.shape[1] + 2))
