"""Randomized search for counterexamples to the bounds and guarantees (hypothesis).

Hypothesis draws the shapes (input dimension, hidden units, classes), the weight scale, the
norm, the box constraint and the radius; every drawn case must survive sampling of the set
and a projected-gradient attack on the margin inside every certified ball (Theorem 2.1's and
the certificates beyond the paper). ``derandomize``
keeps CI deterministic; raise ``CROSSLIP_HYPOTHESIS_EXAMPLES`` to search longer.
"""

from __future__ import annotations

import math
import os

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crosslip.certify import certify_softplus

from .helpers import random_net, random_points
from .test_certify import DUAL, bounds_for, grad_diff, margin_attack, sample_set

EXAMPLES = int(os.environ.get("CROSSLIP_HYPOTHESIS_EXAMPLES", "60"))
CASES = dict(
    d=st.integers(1, 12),
    h=st.integers(1, 40),
    k=st.integers(2, 6),
    scale=st.floats(0.1, 8.0),
    seed=st.integers(0, 10_000),
    p=st.sampled_from([1.0, 2.0, math.inf]),
    box=st.booleans(),
)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(**CASES, radius=st.floats(0.0, 3.0))
def test_no_sampled_point_exceeds_any_bound(d, h, k, scale, seed, p, box, radius):
    net = random_net(d, k, h, seed, scale)
    x = random_points(3, d, seed)
    pred = net(x).argmax(1)
    r = torch.full((3,), radius, dtype=torch.float64)
    ys = sample_set(x, r, 150, p, box, torch.Generator().manual_seed(seed))
    actual = torch.stack(
        [grad_diff(net, ys[i], pred[i].repeat(150), DUAL[p]).max(0).values for i in range(3)]
    )
    for name, fn in bounds_for(net, x, pred, p, box):
        lip = fn(torch.arange(3), r)
        assert torch.all(actual <= lip * (1 + 1e-9) + 1e-12), name


#: The certificates beyond the paper, and the best of all, per norm (``_box`` inside the box).
METHODS = ("linear", "curvature", "integrated", "best")
COLUMN = {
    (2.0, False): "guarantee_l2",
    (1.0, False): "guarantee_l1",
    (math.inf, False): "guarantee_linf",
    (2.0, True): "guarantee_l2_box",
    (1.0, True): "guarantee_l1_box",
    (math.inf, True): "guarantee_linf_box",
}


@settings(max_examples=EXAMPLES // 2, deadline=None, derandomize=True)
@given(**CASES)
def test_attack_inside_the_certified_ball_never_succeeds(d, h, k, scale, seed, p, box):
    net = random_net(d, k, h, seed, scale)
    x = random_points(8, d, seed + 1)
    base = COLUMN[(p, box)].removesuffix("_box")
    # this example's norm (and box) only: the other columns are other examples' cases
    paper = ("local", "global", "l2") if p == 2 else (base.removeprefix("guarantee_"),)
    kinds = (*paper, *METHODS[:-1], *(("box",) if box else ()))
    res = certify_softplus(net, x, rtol=1e-4, kinds=kinds)
    suffix = "_box" if box else ""
    cols = [base + suffix] + [f"{base}_{m}{suffix}" for m in METHODS]
    # one attack on every column's balls at once (the same walks as one attack per column)
    n = len(cols)
    radius = torch.cat([res[col].clamp(max=1e6) * (1 - 1e-9) for col in cols])
    xs, preds = x.repeat(n, 1), res["pred"].repeat(n)
    adv, pred = margin_attack(net, xs, preds, radius, p, box, restarts=4, steps=40, seed=seed)
    held = (adv == pred).reshape(n, -1).all(1)
    assert held.all(), [col for col, ok in zip(cols, held, strict=True) if not ok]
