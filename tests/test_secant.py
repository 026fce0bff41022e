"""The secant curvature of a softplus unit (crosslip.certify.secant): its bounds hold
``Q(h) = 2 D(h) / h^2`` over the whole range, checked against a quadrature of the integral
remainder (no cancellation), including at extreme and saturated pre-activations; they are
never looser than the largest and smallest ``sigma''`` on the interval, and much tighter on
wide ranges."""

from __future__ import annotations

import mpmath  # torch's own dependency (through sympy)
import pytest
import torch

from crosslip.certify.secant import (
    max_second_derivative,
    min_second_derivative,
    remainder,
    secant_curvature,
)


def remainder_range(z, lo, hi, alpha, points: int = 64, nodes: int = 4001):
    """The largest and smallest ``Q(h) = 2 int_0^1 (1 - t) sigma''(z + t h) dt`` (n,) over
    ``points`` values of ``z + h`` spread over ``[lo, hi]`` (Simpson's rule on ``nodes``
    nodes; ``sigma''`` as a product of two sigmoids, so saturated units lose nothing)."""
    s = torch.linspace(0, 1, points, dtype=torch.float64)
    h = lo[:, None] * (1 - s) + hi[:, None] * s - z[:, None]
    t = torch.linspace(0, 1, nodes, dtype=torch.float64)
    weight = torch.full((nodes,), 2.0, dtype=torch.float64)
    weight[1::2] = 4.0
    weight[0] = weight[-1] = 1.0
    weight *= 2 * (1 - t) / (3 * (nodes - 1))
    ups, downs = [], []
    for i in range(len(z)):
        y = alpha * (z[i] + h[i][:, None] * t)
        q = (alpha * torch.sigmoid(y) * torch.sigmoid(-y) * weight).sum(1)
        ups.append(q.max())
        downs.append(q.min())
    return torch.stack(ups), torch.stack(downs)


def units(n: int, seed: int, centre: float, width: float):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=gen, dtype=torch.float64) * centre
    left = torch.rand(n, generator=gen, dtype=torch.float64) ** 2 * width
    right = torch.rand(n, generator=gen, dtype=torch.float64) ** 2 * width
    return z, z - left, z + right


CASES = [  # alpha, spread of z, widest side of the range
    (1.0, 6.0, 40.0),
    (10.0, 3.0, 40.0),
    (10.0, 0.3, 2.0),
    (10.0, 60.0, 5.0),  # mostly saturated
    (3.0, 0.01, 0.05),  # inside the near piece
]


@pytest.mark.parametrize("alpha,centre,width", CASES)
def test_the_bounds_hold_the_remainder_over_the_whole_range(alpha, centre, width):
    z, lo, hi = units(80, int(alpha * 7 + centre), centre, width)
    pad = torch.zeros_like(z)
    up, down = secant_curvature(z[None], pad[None], lo[None], hi[None], alpha)
    q_up, q_down = remainder_range(z, lo, hi, alpha)
    # Simpson's own error is far below 1e-7 of these values
    assert torch.all(up[0] >= q_up * (1 - 1e-7)), (up[0] / q_up).min()
    assert torch.all(down[0] <= q_down * (1 + 1e-7) + 1e-300), (down[0] / q_down).max()
    assert torch.all(up[0] <= max_second_derivative(lo, hi, alpha))
    assert torch.all(down[0] >= min_second_derivative(lo, hi, alpha))


def test_an_uncertain_pre_activation_is_covered():
    """The real z may be anywhere within ``pad`` of the computed one: the bounds for the
    computed z and its pad hold the remainder at both ends of that interval."""
    alpha = 10.0
    z, lo, hi = units(60, 3, 2.0, 10.0)
    pad = torch.full_like(z, 1e-3)
    lo, hi = lo - pad, hi + pad  # the interval holds the real z, as the ranges' do
    up, down = secant_curvature(z[None], pad[None], lo[None], hi[None], alpha)
    for real in (z - pad, z + pad):
        q_up, q_down = remainder_range(real, lo, hi, alpha)
        assert torch.all(up[0] >= q_up * (1 - 1e-7))
        assert torch.all(down[0] <= q_down * (1 + 1e-7) + 1e-300)


def test_wide_ranges_are_charged_far_less_than_the_largest_second_derivative():
    alpha = 10.0
    z, lo, hi = units(80, 11, 3.0, 40.0)
    up, _ = secant_curvature(z[None], torch.zeros_like(z)[None], lo[None], hi[None], alpha)
    q_up, _ = remainder_range(z, lo, hi, alpha)
    whole = max_second_derivative(lo, hi, alpha)
    live = q_up > 1e-6  # where the curvature matters at all
    assert torch.mean(up[0][live] / q_up[live]) < 1.15  # close to the real largest value
    assert torch.mean(whole[live] / q_up[live]) > 3  # where sigma''s maximum is far above it


@pytest.mark.parametrize("z", [-30.0, -4.0, -1.0, -0.1, 0.0, 0.5, 3.0])
def test_the_remainder_rises_then_falls_along_a_side(z):
    """The lemma behind the lower bound (module docstring, *Bound on inf Q*): along ``h >
    0``, ``Q(h)`` never rises again once it has fallen (quadrature on a fine grid)."""
    h = torch.logspace(-3, 3, 2000, dtype=torch.float64)
    zs = torch.full_like(h, z)
    q, _ = remainder_range(zs, zs + h, zs + h, 1.0, points=1)  # Q(h) at each h
    step = torch.diff(q)
    fell = torch.cumsum(step < -1e-13 * q.max(), 0) > 0
    assert not torch.any(fell & (step > 1e-13 * q.max()))


def test_the_lower_bound_is_close_to_the_real_smallest_remainder_on_wide_ranges():
    """``Q`` rises, then falls on each side, so its smallest value is ``sigma''(z)`` or its
    value at an end of the range, evaluated there (chords over pieces gave 0.83 of it on
    average here)."""
    alpha = 10.0
    z, lo, hi = units(80, 73, 3.0, 40.0)
    _, down = secant_curvature(z[None], torch.zeros_like(z)[None], lo[None], hi[None], alpha)
    _, q_down = remainder_range(z, lo, hi, alpha)
    live = q_down > 1e-12
    assert torch.mean(down[0][live] / q_down[live]) > 0.95


def test_an_unbounded_range_gets_the_bounds_of_the_whole_interval():
    """Ranges that run to infinity on either side (a huge radius) fall back to the largest
    and smallest ``sigma''`` of the whole interval, never to the near piece's."""
    alpha = 10.0
    z = torch.tensor([[1.0, 3.0, -4.0, -2.0]], dtype=torch.float64)
    lo = torch.tensor([[-torch.inf, -torch.inf, -6.0, -1e308]], dtype=torch.float64)
    hi = torch.tensor([[torch.inf, 5.0, torch.inf, 1e308]], dtype=torch.float64)
    up, down = secant_curvature(z, torch.zeros_like(z), lo, hi, alpha)
    assert torch.equal(up, max_second_derivative(lo, hi, alpha))  # alpha / 4: they cross 0
    # inf Q over a range unbounded on a side is 0 (sigma'' vanishes there): exactly that
    assert torch.equal(down, torch.zeros_like(down))


@pytest.mark.parametrize("alpha,centre,width", CASES)
def test_units_left_out_get_the_whole_interval_and_the_others_are_unchanged(alpha, centre, width):
    """``up_units`` / ``down_units``: the units kept get the full computation's bounds (to
    the last bits: vectorised ``exp`` and ``log`` may round a lane differently from the
    scalar tail, both within ``FN_REL``); the others the largest and smallest ``sigma''`` on
    their interval."""
    z, lo, hi = units(80, int(alpha * 5 + centre), centre, width)
    z, lo, hi = z.view(2, 40), lo.view(2, 40), hi.view(2, 40)
    pad = torch.full_like(z, 1e-9)
    gen = torch.Generator().manual_seed(int(width))
    keep_up = torch.rand(2, 40, generator=gen) < 0.5
    keep_down = torch.rand(2, 40, generator=gen) < 0.5
    up, down = secant_curvature(z, pad, lo, hi, alpha)
    up_k, down_k = secant_curvature(z, pad, lo, hi, alpha, up_units=keep_up, down_units=keep_down)
    torch.testing.assert_close(up_k[keep_up], up[keep_up], rtol=1e-13, atol=0)
    torch.testing.assert_close(down_k[keep_down], down[keep_down], rtol=1e-13, atol=0)
    assert torch.equal(up_k[~keep_up], max_second_derivative(lo, hi, alpha)[~keep_up])
    assert torch.equal(down_k[~keep_down], min_second_derivative(lo, hi, alpha)[~keep_down])


@pytest.mark.parametrize("alpha,centre,width", CASES)
def test_the_remainder_about_any_point_is_within_its_error_of_the_real_one(alpha, centre, width):
    """``remainder(y, s)`` at steps of both signs is within its stated error of ``D_y(s) = s^2
    / 2 int_0^1 2 (1 - t) sigma''(y + t s) dt``, computed with 60 digits (mpmath), and the
    error a few float64 roundings of the terms' magnitudes, not more."""
    y, lo, hi = units(200, 3, centre, width)
    gen = torch.Generator().manual_seed(4)
    s = torch.where(torch.rand(200, generator=gen, dtype=torch.float64) < 0.5, lo - y, hi - y)

    def softplus(v):
        a = alpha * v
        return (a + mpmath.log1p(mpmath.exp(-a)) if a > 0 else mpmath.log1p(mpmath.exp(a))) / alpha

    exact = []
    with mpmath.workdps(60):
        for yi, si in zip(y.tolist(), s.tolist(), strict=True):
            yi, si = mpmath.mpf(yi), mpmath.mpf(si)
            slope = 1 / (1 + mpmath.exp(-alpha * yi))
            exact.append(float(softplus(yi + si) - softplus(yi) - slope * si))
    exact = torch.tensor(exact, dtype=torch.float64)
    d, err = remainder(y, s, alpha)
    gap = (d - exact).abs()
    assert (gap <= err).all(), (gap - err).max()
    scale = (1 + y.abs() + s.abs()) * (1 + alpha * s.abs())
    assert (err < 1e-11 * scale).all(), (err / scale).max()
