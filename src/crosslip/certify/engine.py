"""Every guarantee of the one-hidden-layer net for a batch of points, in one call.

Columns (all per point, shape (n,)); "guarantee" always means Theorem 2.1's radius:

=====================  =====================================================================
``pred``, ``margin``   predicted class c and ``f_c - max_{j != c} f_j``
``guarantee_local``    L2, Proposition 2.3 (the paper's local guarantee); ``radius_local``,
                       ``bound_class`` (j attaining the minimum), ``evaluations`` (R tried)
``guarantee_global``   L2, global constant ``||w_c - w_j||_2 ||U||_2`` (no search needed)
``guarantee_l2``       L2, tightest: ``min(Prop. 2.3, interval, global)`` (``radius_l2``)
``guarantee_l1``       L1 (q = inf), interval bound
``guarantee_linf``     Linf (q = 1), interval bound
``guarantee_*_box``    the same three, for perturbations that keep ``x + delta`` in
                       ``[0, 1]^d`` only (never to be compared with the unconstrained ones)
=====================  =====================================================================

Every reported value is ``alpha(R)`` of Theorem 2.1 at an evaluated R, for the real function
of the float64 weights at the float64 point, with every rounding of its computation covered
(:mod:`.rounding`; ``docs/guarantees.md`` says what this means for a float32 deployment).

A :class:`~crosslip.torch_softplus.TorchSoftplusNet` (a network trained elsewhere with
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

import torch

from ..models import SoftplusNet
from ..progress import Progress
from .rounding import require_float64
from .search import (
    Certificate,
    certificate_columns,
    margins,
    margins_lower,
    min_ratio,
    theorem21,
)
from .softplus_bounds import (
    IntervalBound,
    MinBound,
    NetTerms,
    PreactivationRange,
    Prop23Bound,
    global_bound,
)

#: The guarantee families :func:`certify_softplus` can compute.
KINDS = ("local", "global", "l2", "l1", "linf", "box")


def certify_softplus(
    net: SoftplusNet,
    x: torch.Tensor,
    rtol: float = 1e-3,
    dtype: torch.dtype = torch.float64,
    batch_size: int = 1024,
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, torch.Tensor]:
    """Guarantees of the one-hidden-layer net for the points ``x`` (n, d); see the module
    docstring for the columns. ``kinds`` selects the families (``"local"`` and ``"global"``
    are always computed when ``"l2"`` is requested; ``"box"`` adds the ``*_box`` column of
    each requested p-norm and needs ``x`` in ``[0, 1]^d``). Computation in float64 (``dtype``
    must be float64: the rounding analysis is float64's), on ``x.device``, in batches of
    ``batch_size`` points; results on the CPU.

    Every guarantee holds for the real function of the net's weights taken as float64
    numbers, at the points ``x`` taken as float64 numbers, rounding of this computation
    included (:mod:`.rounding`). ``margin`` is the computed one. Progress (points done, rate)
    goes to the ``"crosslip"`` logger (:mod:`crosslip.progress`).
    """
    require_float64(dtype)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown guarantee kinds {sorted(unknown)}; choose from {KINDS}")
    kinds = tuple(kinds)
    if "l2" in kinds:
        kinds = tuple(dict.fromkeys(("local", "global", *kinds)))
    net = copy.deepcopy(net).to(dtype=dtype, device=x.device).eval()
    out: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad(), Progress("certify", len(x), "points") as progress:
        terms = NetTerms(net, dtype)  # point-independent products: once for all batches
        for i in range(0, len(x), batch_size):
            part = _certify_batch(net, terms, x[i : i + batch_size].to(dtype), rtol, kinds)
            for k, v in part.items():
                out.setdefault(k, []).append(v.cpu())
            progress.update(len(part["pred"]))
    return {k: torch.cat(v) for k, v in out.items()}


def _certify_batch(
    net: SoftplusNet, terms: NetTerms, x: torch.Tensor, rtol: float, kinds: tuple[str, ...]
) -> dict[str, torch.Tensor]:
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
    res: dict[str, torch.Tensor] = {"pred": pred, "margin": m_hat.min(1).values}
    glob = global_bound(net, pred, x.dtype, spectral_norm=terms.spectral_norm)

    def ranges(p: float, box: bool = False) -> PreactivationRange:
        return PreactivationRange(terms, x, pred, p=p, box=box, z=z, pad=pad)

    def search(bound) -> Certificate:
        return theorem21(m, bound, rtol=rtol, vanishes=van)

    ball2 = ranges(2)
    if "local" in kinds:
        res.update(certificate_columns(pred, m_hat, search(Prop23Bound(ball2))))
    if "global" in kinds:
        res["guarantee_global"] = min_ratio(m, glob, van)[0]
    boxes = (False, True) if "box" in kinds else (False,)
    for box in boxes:
        suffix = "_box" if box else ""
        if "l2" in kinds:
            cert = search(MinBound(ranges(2, True) if box else ball2, glob))
            parts = [cert.guarantee, res["guarantee_local"], res["guarantee_global"]]
            if box:
                parts.append(res["guarantee_l2"])
            res["guarantee_l2" + suffix] = torch.stack(parts).max(0).values
            res["radius_l2" + suffix] = cert.radius
        for name, p in (("l1", 1), ("linf", math.inf)):
            if name in kinds:
                g = search(IntervalBound(ranges(p, box))).guarantee
                if box:
                    g = torch.maximum(g, res["guarantee_" + name])
                res["guarantee_" + name + suffix] = g
    return res
