"""Rounding: every computed bound and margin against the same quantity in 250-bit arithmetic
(mpmath), on nets built to make float64 cancel catastrophically, and the assumptions of the
error model (accuracy of PyTorch's elementary functions, the verified spectral norm).

The cancelling nets are chosen so that float64 gets a bound badly wrong: the computed bound
must still be above the real one. (Nets on which float64 gets the *decision* wrong are in
``test_certify_corners.py``: their certificate must be 0.)
"""

from __future__ import annotations

import math

import mpmath as mp
import pytest
import torch

from crosslip.certify import (
    IntervalBound,
    NetTerms,
    PreactivationRange,
    Prop23Bound,
    global_bound,
    spectral_norm_upper,
)
from crosslip.certify.kernel_bounds import logit_errors
from crosslip.certify.rounding import FN_REL, float32_agrees
from crosslip.models.kernels import GaussianKernelModel

from .helpers import random_net, random_points
from .test_certify_corners import exact_logits, exact_net, exact_z, mpv, net_with

mp.mp.prec = 250

DT = torch.float64


def sigmoid(t):
    return 1 / (1 + mp.exp(-t))


def exact_ranges(net, x, R, p, box):
    """The real ``[s-_r, s+_r]`` of (*) at the float64 point x over B_p(x, R) (∩ box)."""
    U, b, _, _, alpha = exact_net(net)
    xs = mpv(x)
    z = exact_z(U, b, xs)
    q = {1.0: math.inf, 2.0: 2.0, math.inf: 1.0}[p]
    R = mp.mpf(R)
    lo, hi = [], []
    for r, row in enumerate(U):
        if q == 2.0:
            norm = mp.sqrt(mp.fsum(u * u for u in row))
        elif q == 1.0:
            norm = mp.fsum(abs(u) for u in row)
        else:
            norm = max(abs(u) for u in row)
        up = down = R * norm
        if box:
            h = [min(R, 1 - xi) for xi in xs]
            low = [max(-R, -xi) for xi in xs]
            up = min(
                up, mp.fsum(max(u * hh, u * ll) for u, hh, ll in zip(row, h, low, strict=True))
            )
            down = min(
                down, mp.fsum(max(-u * hh, -u * ll) for u, hh, ll in zip(row, h, low, strict=True))
            )
        lo.append(sigmoid(alpha * (z[r] - down)))
        hi.append(sigmoid(alpha * (z[r] + up)))
    return lo, hi


def exact_prop23(net, x, c, j, R, box=False):
    U, _, W, _, _ = exact_net(net)
    lo, hi = exact_ranges(net, x, R, 2.0, box)
    d = [wj - wc for wj, wc in zip(W[j], W[c], strict=True)]
    total = []
    for r in range(len(U)):
        for m in range(len(U)):
            beta = d[r] * d[m] * mp.fsum(a * bb for a, bb in zip(U[r], U[m], strict=True))
            total.append(beta * hi[r] * hi[m] if beta > 0 else beta * lo[r] * lo[m])
    return mp.sqrt(max(mp.fsum(total), 0))


def exact_interval(net, x, c, j, R, p, box=False):
    U, _, W, _, _ = exact_net(net)
    lo, hi = exact_ranges(net, x, R, p, box)
    d = [wj - wc for wj, wc in zip(W[j], W[c], strict=True)]
    mid = [(a + bb) / 2 for a, bb in zip(lo, hi, strict=True)]
    half = [(bb - a) / 2 for a, bb in zip(lo, hi, strict=True)]
    B = []
    for i in range(len(U[0])):
        centre = mp.fsum(d[r] * U[r][i] * mid[r] for r in range(len(U)))
        B.append(abs(centre) + mp.fsum(abs(d[r] * U[r][i]) * half[r] for r in range(len(U))))
    q = {1.0: math.inf, 2.0: 2.0, math.inf: 1.0}[p]
    if q == 2.0:
        return mp.sqrt(mp.fsum(v * v for v in B))
    return mp.fsum(B) if q == 1.0 else max(B)


@pytest.mark.parametrize("scale", [1.0, 1e8])
@pytest.mark.parametrize("R", [0.0, 1e-3, 0.3, 1e300])
def test_box_shifts_are_above_and_close_to_the_exact_ones(scale, R):
    """The box's ``D-, D+`` (two products, ``(S +- T) / 2``) against their definition
    ``sum_i max(u_i a_i, -u_i b_i)`` in 250-bit arithmetic: never below, and within 1e-9
    relative (plus 2^-990). Rows of large entries of both signs and points near the
    middle of the box make ``T = (a - b)^T U`` cancel."""
    gen = torch.Generator().manual_seed(3 if scale > 1 else 4)
    d, h = 7, 5
    U = torch.randn(h, d, generator=gen, dtype=DT) * scale
    U[0] = torch.tensor([scale, -scale, scale, -scale, 1.0, -1.0, 0.5], dtype=DT)
    net = net_with(U, torch.zeros(h, dtype=DT), torch.randn(2, h, generator=gen, dtype=DT), [0, 0])
    x = torch.cat([torch.full((1, d), 0.5, dtype=DT), torch.rand(3, d, generator=gen, dtype=DT)])
    x[0, 1] = 0.5 + 2.0**-40  # a step up and down that differ in their last bits
    rng = PreactivationRange(net, x, torch.zeros(len(x), dtype=torch.long), p=2, box=True)
    down, up = rng.shifts(torch.arange(len(x)), torch.full((len(x),), R, dtype=DT))
    Ue = [mpv(row) for row in U]
    for i in range(len(x)):
        a = [min(mp.mpf(R), 1 - xi) for xi in mpv(x[i])]
        b = [min(mp.mpf(R), xi) for xi in mpv(x[i])]
        for r, row in enumerate(Ue):
            norm = mp.mpf(R) * mp.sqrt(mp.fsum(u * u for u in row))
            for got, sign in ((up[i, r], 1), (down[i, r], -1)):
                want = min(
                    norm,
                    mp.fsum(
                        max(sign * u * s, -sign * u * t) for u, s, t in zip(row, a, b, strict=True)
                    ),
                )
                assert mp.mpf(float(got)) >= want, (i, r, sign)
                assert mp.mpf(float(got)) <= want * (1 + mp.mpf(1e-9)) + mp.mpf(2) ** -990


def cancelling_net(B: float, eps: float, d: int = 3, seed: int = 0):
    """Units 0 and 1 identical (same row of U, same bias), output weights ``B`` and
    ``-B + eps`` for class 1, 0 for class 0: the real gradient difference is
    ``eps sigma'(z_0) u_0``, while every term of Proposition 2.3 is ~``B^2``. Unit 2 is
    an ordinary unit with small weights."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=gen, dtype=DT) * 0.3
    U = torch.stack([u, u, torch.randn(d, generator=gen, dtype=DT) * 0.3])
    W = torch.tensor([[0.0, 0.0, 0.0], [B, -B + eps, 1e-3]], dtype=DT)
    return net_with(U, torch.tensor([0.1, 0.1, -0.2], dtype=DT), W, [0.0, 0.0])


# ------------------------------------------------------------------ the error model's inputs
def test_elementary_functions_are_far_more_accurate_than_assumed():
    """FN_REL (2^-44) must hold with a wide margin: measured error below FN_REL / 64 where
    the result is at least 2^-1000, below 2^-1022 absolute (assumed: 2^-1020) under it."""
    gen = torch.Generator().manual_seed(0)
    t = torch.cat(
        [torch.randn(600, generator=gen, dtype=DT) * s for s in (1, 10, 100, 300)]
        + [
            torch.linspace(-745, 745, 601, dtype=DT),
            torch.tensor([-744.9, -740.0, -709.0, -37.0, -36.0, 0.0, 36.0, 709.0], dtype=DT),
        ]
    )
    sig = torch.sigmoid(t)
    lae = torch.logaddexp(t, torch.zeros_like(t))
    ex = torch.exp(t.clamp(max=709.0))
    tiny = mp.mpf(2) ** -1000
    for i in range(len(t)):
        v = mp.mpf(float(t[i]))
        for got, want in (
            (sig[i], 1 / (1 + mp.exp(-v))),
            (lae[i], mp.log1p(mp.exp(v))),
            (ex[i], mp.exp(min(v, 709))),
        ):
            err = abs(mp.mpf(float(got)) - want)
            if want >= tiny:
                assert err <= want * FN_REL / 64, (float(t[i]), float(got))
            else:
                assert err <= mp.mpf(2) ** -1022, (float(t[i]), float(got))


def exact_spectral_norm(U: torch.Tensor):
    A = mp.matrix(mpv(U))
    return max(mp.svd_r(A, compute_uv=False))


SPECTRAL_CASES = {
    "tall": lambda g: torch.randn(12, 5, generator=g, dtype=DT),
    "wide": lambda g: torch.randn(4, 11, generator=g, dtype=DT),
    "rank one": lambda g: torch.outer(
        torch.randn(9, generator=g, dtype=DT), torch.randn(6, generator=g, dtype=DT)
    ),
    "tied top": lambda g: torch.diag(torch.tensor([3.0, 3.0 * (1 - 1e-15), 1.0], dtype=DT)),
    "ill-conditioned": lambda g: (
        torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=DT))[0]
        @ torch.diag(torch.logspace(-12, 0, 8, dtype=DT))
    ),
    "huge": lambda g: torch.randn(6, 6, generator=g, dtype=DT) * 1e150,
    "tiny": lambda g: torch.randn(6, 6, generator=g, dtype=DT) * 1e-150,
    "one entry": lambda g: torch.zeros(5, 4, dtype=DT).index_put_(
        (torch.tensor([2]), torch.tensor([1])), torch.tensor([-7.0], dtype=DT)
    ),
}


@pytest.mark.parametrize("case", sorted(SPECTRAL_CASES))
def test_spectral_norm_upper_is_an_upper_bound_and_tight(case):
    U = SPECTRAL_CASES[case](torch.Generator().manual_seed(1))
    exact = exact_spectral_norm(U)
    up = float(spectral_norm_upper(U))
    assert mp.mpf(up) >= exact
    assert up <= float(exact) * (1 + 1e-6) + 2.0**-498  # absolute terms cover underflow
    assert float(spectral_norm_upper(torch.zeros(3, 4, dtype=DT))) == 0.0


# ------------------------------------------------------------------------------- margins
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_logit_error_bounds_contain_the_real_logits(seed, scale):
    net = random_net(5, 4, 9, seed, scale)
    x = random_points(6, 5, seed)
    terms = NetTerms(net)
    logits, err = terms.logits(x, terms.preactivation(x))
    for i in range(len(x)):
        exact = exact_logits(net, x[i])
        for j in range(4):
            gap = abs(mp.mpf(float(logits[i, j])) - exact[j])
            assert gap <= mp.mpf(float(err[i, j]))
            assert float(err[i, j]) <= 1e-11 * (1 + abs(float(exact[j])))  # not vacuous


def test_kernel_logit_error_bounds_contain_the_real_logits():
    gen = torch.Generator().manual_seed(5)
    model = GaussianKernelModel(torch.rand(7, 4, generator=gen, dtype=DT), 3, gamma=2.0)
    with torch.no_grad():
        model.coef.copy_(torch.randn(3, 7, generator=gen, dtype=DT) * 1e6)
    x = torch.rand(5, 4, generator=gen, dtype=DT)
    kern = model.kernel(x)
    logits, err = kern @ model.coef.detach().T, logit_errors(model, x, kern)
    X, A = mpv(model.centers), mpv(model.coef.detach())
    g = mp.mpf(model.gamma)
    for i in range(len(x)):
        xi = mpv(x[i])
        k = [
            mp.exp(-g * mp.fsum((a - bb) ** 2 for a, bb in zip(xi, row, strict=True))) for row in X
        ]
        for j in range(3):
            exact = mp.fsum(a * kk for a, kk in zip(A[j], k, strict=True))
            assert abs(mp.mpf(float(logits[i, j])) - exact) <= mp.mpf(float(err[i, j]))


# -------------------------------------------------------------------------------- bounds
def bound_cases():
    """(name, net, x (n, d)): random nets and the catastrophic-cancellation nets."""
    cases = [(f"random{s}", random_net(3, 3, 6, s, 4.0), random_points(2, 3, s)) for s in range(2)]
    for B, eps in ((1e8, 1e-3), (1e12, 1e-6), (2.0**60, 1.0)):
        cases.append((f"cancel{B:g}", cancelling_net(B, eps), random_points(2, 3, 7)))
    return cases


@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("R", [0.0, 0.05, 0.7])
def test_computed_bounds_are_above_the_exact_formulas(case, R):
    """Each bound as crosslip computes it is at least the same formula evaluated in 250-bit
    arithmetic at the real inputs (the exact pre-activations and shifts): the outward
    rounding and the error terms cover every rounding, also where the formula's terms are
    ~B^2 and its value ~eps (the cancelling nets)."""
    _, net, x = bound_cases()[case]
    pred = torch.zeros(len(x), dtype=torch.long)  # certify class 0 against class 1, 2
    idx = torch.arange(len(x))
    r = torch.full((len(x),), R, dtype=DT)
    k = net.W.shape[0]
    for box in (False, True):
        rng2 = PreactivationRange(net, x, pred, p=2, box=box)
        prop = Prop23Bound(rng2)(idx, r)
        for i in range(len(x)):
            for j in range(1, k):
                assert mp.mpf(float(prop[i, j])) >= exact_prop23(net, x[i], 0, j, R, box)
        for p in (1.0, 2.0, math.inf):
            inter = IntervalBound(PreactivationRange(net, x, pred, p=p, box=box))(idx, r)
            for i in range(len(x)):
                for j in range(1, k):
                    want = exact_interval(net, x[i], 0, j, R, p, box)
                    assert mp.mpf(float(inter[i, j])) >= want, (p, box, i, j)
    glob = global_bound(net, pred)
    spec = exact_spectral_norm(net.U.detach())
    W = mpv(net.W.detach())
    for j in range(1, k):
        dn = mp.sqrt(mp.fsum((a - bb) ** 2 for a, bb in zip(W[j], W[0], strict=True)))
        assert mp.mpf(float(glob[0, j])) >= dn * spec


def test_cancelling_bound_is_not_vacuous_for_moderate_cancellation():
    """The error term of Proposition 2.3 is about ``sqrt(8 (d + H + 8) u) nu``, i.e.
    ``~2e-7 B s ||u||`` here, against the real ``~eps s ||u||``: with B = 1e8 and eps = 100
    (terms cancelling to 1e-6 of their size) the bound stays within 1.5x of the real one."""
    net = cancelling_net(1e8, 100.0)
    x = random_points(2, 3, 7)
    pred = torch.zeros(2, dtype=torch.long)
    L = Prop23Bound(PreactivationRange(net, x, pred))(torch.arange(2), torch.zeros(2, dtype=DT))
    for i in range(2):
        exact = exact_prop23(net, x[i], 0, 1, 0.0)
        assert exact <= mp.mpf(float(L[i, 1])) <= 1.5 * exact


def test_the_float32_check_evaluates_without_tf32_and_restores_the_settings():
    """On CUDA, float32 products may round to TF32 (cuDNN's default for convolutions): the
    check of the float32 decision turns that off while it evaluates, whatever was set, and
    puts the settings back."""
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
            return torch.stack([x.sum(1), -x.sum(1)], 1)

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        x = torch.tensor([[1.0, 2.0], [-3.0, 1.0]], dtype=torch.float64)
        agrees = float32_agrees(Probe(), x, torch.tensor([0, 1]))
        assert agrees.tolist() == [True, True] and seen == [(False, False)]
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
