"""Corners where a shortcut could certify more than is true: bounds that vanish at x but not
nearby (saturated hidden units, underflowing kernels), margins that float64 gets wrong
(checked in 250-bit arithmetic), the search's own shortcuts (+inf, ``r_max``, huge
brackets), exact distances of tiny nets by brute force, and attacks from
:mod:`crosslip.attacks` in saturating regimes.

Each test states an explicit perturbation or an exact distance the certificate must respect.
"""

from __future__ import annotations

import math

import mpmath as mp
import pytest
import torch

from crosslip.attacks import refine_upper_bound, upper_bound
from crosslip.certify import certify_kernel, certify_softplus, linear_lipschitz, theorem21
from crosslip.models import SoftplusNet
from crosslip.models.kernels import GaussianKernelModel

from .helpers import random_net, random_points

DT = torch.float64
mp.mp.prec = 250
GUARANTEES = {  # column -> (p, box)
    "guarantee_local": (2.0, False),
    "guarantee_global": (2.0, False),
    "guarantee_l2": (2.0, False),
    "guarantee_l1": (1.0, False),
    "guarantee_linf": (math.inf, False),
    "guarantee_l2_box": (2.0, True),
    "guarantee_l1_box": (1.0, True),
    "guarantee_linf_box": (math.inf, True),
}


def net_with(U, b, W, c, alpha=10.0) -> SoftplusNet:
    """A float64 softplus net with the given weights (lists or tensors)."""
    U, W = torch.as_tensor(U, dtype=DT), torch.as_tensor(W, dtype=DT)
    net = SoftplusNet(U.shape[1], W.shape[0], hidden=U.shape[0], alpha=alpha, bias=True)
    net = net.double().eval()
    with torch.no_grad():
        net.hidden_layer.weight.copy_(U)
        net.hidden_layer.bias.copy_(torch.as_tensor(b, dtype=DT))
        net.output_layer.weight.copy_(W)
        net.output_layer.bias.copy_(torch.as_tensor(c, dtype=DT))
    return net


def mpv(t: torch.Tensor) -> list:
    """A float64 tensor as nested lists of exact mpmath numbers."""
    return [mpv(r) for r in t] if t.ndim > 1 else [mp.mpf(float(v)) for v in t]


def exact_net(net):
    U, W = mpv(net.U.detach()), mpv(net.W.detach())
    b = mpv(net.hidden_bias().detach())
    c = mpv(net.output_layer.bias.detach())
    return U, b, W, c, mp.mpf(net.alpha)


def exact_z(U, b, x):
    return [
        mp.fsum(u * xi for u, xi in zip(row, x, strict=True)) + br
        for row, br in zip(U, b, strict=True)
    ]


def exact_logits(net, x: torch.Tensor) -> list:
    """Logits of the real function at the float64 point x (d,)."""
    U, b, W, c, alpha = exact_net(net)
    z = exact_z(U, b, mpv(x))
    sig = [mp.log1p(mp.exp(alpha * zr)) / alpha for zr in z]
    return [
        mp.fsum(w * s for w, s in zip(row, sig, strict=True)) + cj
        for row, cj in zip(W, c, strict=True)
    ]


# ------------------------------------------------------------- bounds that vanish at x only
def saturated_net() -> SoftplusNet:
    """Two hidden units, both saturated off at x = (0.5, 0.5): ``z = 200 * 0.5 - 180 = -80``,
    so ``sigma'(z) = sigmoid(-800)`` and ``sigma(z)`` underflow to exactly 0 in float64, and
    every gradient at x is 0. Class 0 wins by the output bias 0.5; class 1 gains
    ``sigma(z_1) + sigma(z_2)`` as soon as a unit turns on."""
    return net_with(
        [[200.0, 0.0], [0.0, 200.0]], [-180.0, -180.0], [[0.0, 0.0], [1.0, 1.0]], [0.5, 0.0]
    )


def test_saturated_units_get_a_finite_guarantee_below_a_flipping_perturbation():
    net = saturated_net()
    x = torch.tensor([[0.5, 0.5]], dtype=DT)
    with torch.no_grad():
        assert torch.all(net.sigma_prime(net.preactivation(x)) == 0)  # the corner: L_j(0) = 0
        # an explicit perturbation of norm 0.41 in every p-norm (one coordinate, in the box)
        delta = torch.tensor([[0.41, 0.0]], dtype=DT)
        assert net(x).argmax(1).item() == 0 and net(x + delta).argmax(1).item() == 1
    res = certify_softplus(net, x)
    for col in GUARANTEES:
        g = float(res[col][0])
        assert math.isfinite(g) and g < 0.41, col
    # and not vacuous: the units stay off up to a distance ~0.4 (z = 200 t - 80 must reach ~0.5)
    assert float(res["guarantee_l2"][0]) > 0.35 and float(res["guarantee_linf"][0]) > 0.35
    # (the package's attacks linearize at x, where every gradient is 0: they cannot see this
    # flip, hence the explicit perturbation above)


def test_search_evaluates_where_the_bound_is_zero_at_r0():
    """An abstract version of the corner: ``L(R) = 0`` below R = 3 and large above. The
    optimum is 3 (``alpha(R) = R`` below, tiny above): the search must find it, from above,
    and never report more."""
    m = torch.tensor([[math.inf, 1.0]] * 3, dtype=DT)

    def step(idx, r):
        lip = torch.where(r < 3.0, 0.0, 1e6)
        return torch.stack([torch.zeros_like(lip), lip], 1)

    cert = theorem21(m, step, rtol=1e-6)
    assert torch.all(cert.guarantee < 3.0) and torch.all(cert.guarantee > 3.0 * (1 - 1e-5))
    assert torch.all(cert.bound_class == 1) or torch.all(cert.guarantee == cert.radius)


def test_kernel_values_that_underflow_at_x_do_not_certify_everything():
    """Two centres, x far to the left of both: ``k(x_0, x) ~ 1e-290`` (class 0 wins by that),
    ``k(x_1, x)`` subnormal, and every product of two kernel values in Proposition 2.2
    underflows to 0 at R = 0. Moving x to 0.6 (closer to centre 1) flips the decision."""
    model = GaussianKernelModel(torch.tensor([[0.0], [1.0]], dtype=DT), 2, gamma=1.0)
    with torch.no_grad():
        model.coef.copy_(torch.eye(2, dtype=DT))
    x = torch.tensor([[-25.8]], dtype=DT)
    with torch.no_grad():
        assert model(x).argmax(1).item() == 0 and float(model(x)[0, 0]) > 0
        assert model(torch.tensor([[0.6]], dtype=DT)).argmax(1).item() == 1
    g = float(certify_kernel(model, x)["guarantee_local"][0])
    assert math.isfinite(g) and g < 26.4


def test_a_provably_vanishing_class_is_never_reached():
    """Tied output weights: ``f_0 - f_1 = c_0 - c_1`` everywhere, so class 1 never overtakes
    class 0 (+inf against it), while class 2 does (finite). With all other classes tied, the
    point is certified against everything: +inf, decided from the weights."""
    gen = torch.Generator().manual_seed(3)
    U = torch.randn(6, 4, generator=gen, dtype=DT)
    w = torch.randn(6, generator=gen, dtype=DT)
    net = net_with(U, torch.zeros(6), torch.stack([w, w, -w]), [3.0, 0.0, 0.0])
    x = random_points(5, 4, 0)
    res = certify_softplus(net, x)
    assert torch.all(res["pred"] == 0)
    assert torch.all(res["bound_class"] == 2)  # class 1 can never attain the minimum
    assert torch.all(torch.isfinite(res["guarantee_l2"]) & (res["guarantee_l2"] > 0))
    tied = net_with(U, torch.zeros(6), torch.stack([w, w, w]), [1.0, 0.0, -1.0])
    res = certify_softplus(tied, x)
    for col in GUARANTEES:
        assert torch.all(torch.isinf(res[col])), col
    zero_u = net_with(
        torch.zeros(6, 4), torch.ones(6), torch.randn(3, 6, generator=gen, dtype=DT), [0.0, 0, 0]
    )
    res = certify_softplus(zero_u, x)  # U = 0: the net is constant
    assert torch.all(torch.isinf(res["guarantee_local"]) | (res["margin"] == 0))


# ------------------------------------------------- float64 decides otherwise than the reals
def exact_kernel_logits(model, x: torch.Tensor) -> list:
    X, A = mpv(model.centers), mpv(model.coef.detach())
    g = mp.mpf(model.gamma)
    k = [mp.exp(-g * mp.fsum((a - b) ** 2 for a, b in zip(mpv(x), row, strict=True))) for row in X]
    return [mp.fsum(a * kk for a, kk in zip(row, k, strict=True)) for row in A]


def computed_logit0(res) -> float:
    """Class 0's computed logit from a certificate of a two-class model whose class-1 logit
    is exactly 0 (the margin column is the computed ``f_c - f_j``)."""
    m = float(res["margin"][0])
    return m if int(res["pred"][0]) == 0 else -m


def test_rounding_adversarial_margin_gets_no_certificate():
    """A net whose float64 logit of class 0 is off by more than 1: ``2^60 (sigma_1 - sigma_3)
    + sigma_2`` (~1e8) with each product rounded by up to 128. An output bias of class 1
    halfway between the computed and the real logit of class 0 makes float64 and the real
    function predict *different* classes at x, each by a margin of at least 0.5: a
    certificate of the computed class there is false, whatever its radius."""
    found = 0
    big = 2.0**60
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        U = torch.rand(3, 3, generator=gen, dtype=DT) * 0.2
        U[2] = U[0] + torch.rand(3, generator=gen, dtype=DT) * 1e-9  # sigma_3 - sigma_1 ~ 1e-10
        net = net_with(U, torch.ones(3), [[big, 1.0, -big], [0.0, 0.0, 0.0]], [0.0, 0.0])
        x = torch.rand(1, 3, generator=gen, dtype=DT)
        f0 = computed_logit0(certify_softplus(net, x, kinds=("local",)))  # the margin only
        true0 = exact_logits(net, x[0])[0]
        if abs(mp.mpf(f0) - true0) < 1:
            continue
        with torch.no_grad():
            net.output_layer.bias[1] = float((mp.mpf(f0) + true0) / 2)
        exact = exact_logits(net, x[0])
        real_pred = 0 if exact[0] > exact[1] else 1
        res = certify_softplus(net, x)
        assert int(res["pred"][0]) != real_pred and float(res["margin"][0]) >= 0.5  # the trap
        for col in GUARANTEES:
            assert float(res[col][0]) == 0.0, col
        found += 1
    assert found >= 3


def test_rounding_adversarial_kernel_margin_gets_no_certificate():
    """The same trap for a Gaussian-kernel model: coefficients ``(2^60, 1, -2^60)`` on three
    nearby centres, and class 1's constant carried by a fourth centre placed at x (kernel
    value exactly 1 there)."""
    found = 0
    big = 2.0**60
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        centers = torch.rand(3, 2, generator=gen, dtype=DT)
        centers[2] = centers[0] + torch.rand(2, generator=gen, dtype=DT) * 1e-9
        x = torch.rand(1, 2, generator=gen, dtype=DT)
        model = GaussianKernelModel(torch.cat([centers, x]), 2, gamma=0.5)
        with torch.no_grad():
            model.coef.copy_(torch.tensor([[big, 1.0, -big, 0.0], [0.0] * 4], dtype=DT))
        f0, true0 = computed_logit0(certify_kernel(model, x)), exact_kernel_logits(model, x[0])[0]
        if abs(mp.mpf(f0) - true0) < 1:
            continue
        with torch.no_grad():
            model.coef[1, 3] = float((mp.mpf(f0) + true0) / 2)
        exact = exact_kernel_logits(model, x[0])
        real_pred = 0 if exact[0] > exact[1] else 1
        res = certify_kernel(model, x)
        assert int(res["pred"][0]) != real_pred and float(res["margin"][0]) >= 0.5  # the trap
        assert float(res["guarantee_local"][0]) == 0.0
        found += 1
    assert found >= 3


# ------------------------------------------------------------------- the search's shortcuts
@pytest.mark.parametrize("r_max", [0.01, 0.5, 50.0])
def test_r_max_caps_but_never_extends_a_guarantee(r_max):
    gen = torch.Generator().manual_seed(1)
    W = torch.randn(4, 6, generator=gen, dtype=DT)
    x = torch.randn(50, 6, generator=gen, dtype=DT)
    logits = x @ W.T
    pred = logits.argmax(1)
    from crosslip.certify import margins

    m = margins(logits, pred)
    exact = theorem21(m, linear_lipschitz(W, pred), rtol=1e-9).guarantee  # the exact distance
    capped = theorem21(m, linear_lipschitz(W, pred), rtol=1e-9, r_max=r_max).guarantee
    assert torch.all(capped <= torch.clamp(exact, max=r_max) * (1 + 1e-12))
    assert torch.allclose(capped, torch.clamp(exact, max=r_max), rtol=1e-6)


def test_huge_brackets_are_searched_geometrically():
    """g(0) near the largest float64 (a bound that is tiny at R = 0) must not stop the search
    after the first steps: the optimum, here R = 1, is found within rtol."""
    m = torch.tensor([[math.inf, 1.0]], dtype=DT)

    def steep(idx, r):  # L(R) = 1e-300 + R^2: g(R) = 1 / (1e-300 + R^2), alpha* = 1
        return torch.stack([torch.zeros_like(r), 1e-300 + r * r], 1)

    cert = theorem21(m, steep, rtol=1e-4)
    assert 1 - 2e-4 < float(cert.guarantee[0]) <= 1.0
    assert int(cert.evaluations[0]) < 40


def test_nan_bounds_certify_nothing():
    m = torch.tensor([[math.inf, 1.0, 2.0]], dtype=DT)
    cert = theorem21(m, lambda idx, r: torch.full((len(idx), 3), math.nan, dtype=DT))
    assert float(cert.guarantee[0]) == 0.0


# ------------------------------------------------------------------- exact distances in 1-D
def exact_distance_1d(net, x, lo=-6.0, hi=6.0, steps=200_001):
    """Distance from x (1,) to the nearest t where the decision changes, by a dense scan of
    [x + lo, x + hi] and bisection of each sign change of the margin to machine precision.
    +inf if none in the window (then the window itself bounds nothing)."""
    t = torch.linspace(lo, hi, steps, dtype=DT)
    with torch.no_grad():
        out = net(x + t[:, None])
        c = int(net(x[None]).argmax(1))
        other = out.clone()
        other[:, c] = -math.inf
        marg = out[:, c] - other.max(1).values
    flips = torch.nonzero(marg <= 0).flatten()
    if len(flips) == 0:
        return math.inf
    best = math.inf
    zero = int(torch.argmin(t.abs()))
    for side in (flips[flips > zero], flips[flips < zero].flip(0)):
        if len(side) == 0:
            continue
        k = int(side[0])
        a, b = float(t[k - 1 if k > zero else k + 1]), float(t[k])  # a: still c, b: flipped
        for _ in range(200):
            mid = 0.5 * (a + b)
            with torch.no_grad():
                o = net(x + torch.tensor([[mid]], dtype=DT))[0]
            oc = o[c].item()
            o[c] = -math.inf
            if oc - o.max().item() <= 0:
                b = mid
            else:
                a = mid
        best = min(best, abs(b))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_guarantees_of_1d_nets_are_below_the_exact_distance(seed):
    """In one dimension every p-norm is |t| and the minimal adversarial perturbation is the
    distance to the nearest decision change, found here by brute force. Large weights and
    biases make saturated and nearly-linear units both appear."""
    gen = torch.Generator().manual_seed(seed)
    h, k = 12, 3
    U = torch.randn(h, 1, generator=gen, dtype=DT) * 6
    b = torch.randn(h, generator=gen, dtype=DT) * 4
    W = torch.randn(k, h, generator=gen, dtype=DT)
    net = net_with(U, b, W, torch.zeros(k))
    xs = torch.linspace(-2, 2, 9, dtype=DT)[:, None]
    res = certify_softplus(net, xs, kinds=("l2", "l1", "linf"))
    for i in range(len(xs)):
        dist = exact_distance_1d(net, xs[i])
        for col in (
            "guarantee_local",
            "guarantee_global",
            "guarantee_l2",
            "guarantee_l1",
            "guarantee_linf",
        ):
            assert float(res[col][i]) <= dist * (1 + 1e-9), (col, i, dist)
        # not vacuous where a decision change is near
        if dist < 0.5:
            assert float(res["guarantee_l2"][i]) > 0.0


# ------------------------------------------------- attacks of the package, saturating regime
@pytest.mark.parametrize("seed", range(4))
def test_package_attacks_never_beat_the_certificate_on_saturating_nets(seed):
    """Large weights and negative biases switch many units off at the test points (the
    regime of the corner above); the paper's attack and its refinement, in the box, must
    stay above the box guarantees, and their samples must really change the decision."""
    net = random_net(8, 4, 24, seed, scale=12.0)
    with torch.no_grad():
        net.hidden_layer.bias.sub_(4.0)
    x = random_points(40, 8, seed)
    res = certify_softplus(net, x, kinds=("l2", "l1", "linf", "box"))
    for p, col in (
        (2.0, "guarantee_l2_box"),
        (1.0, "guarantee_l1_box"),
        (math.inf, "guarantee_linf_box"),
    ):
        ub = upper_bound(net, x, p=p)
        ref = refine_upper_bound(net, x, ub, p=p, steps=3)
        s = ref.success
        assert s.any()
        with torch.no_grad():
            assert torch.all(net(x[s] + ref.delta[s]).argmax(1) != res["pred"][s])
        assert torch.all(ref.norm[s] >= res[col][s]), col
