"""Networks built from torch.nn layers elsewhere: the same guarantees as crosslip's own class,
and sound for the function they compute, PyTorch's softplus threshold included."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from crosslip.certify import certify, certify_softplus
from crosslip.certify.softplus_bounds import NetTerms
from crosslip.errors import ModelFileError, UnsupportedModelError
from crosslip.models import SoftplusNet
from crosslip.models.softplus import softplus
from crosslip.models.torch_softplus import from_sequential, from_state_dict

from .helpers import random_points
from .test_certify import COLUMNS, margin_attack, sample_set

KINDS = ("local", "global", "l2", "l1", "linf", "box")


def sequential(
    d: int,
    h: int,
    k: int,
    beta: float,
    threshold: float = 20.0,
    bias: bool = True,
    seed: int = 0,
    scale: float = 2.0,
    flatten: bool = False,
) -> nn.Sequential:
    """A user's network, float64, weights ~ N(0, scale^2 / fan_in), biases ~ N(0, 0.5^2)."""
    torch.manual_seed(seed)
    layers = [nn.Linear(d, h, bias=bias), nn.Softplus(beta, threshold), nn.Linear(h, k, bias=bias)]
    net = nn.Sequential(*([nn.Flatten()] if flatten else []), *layers).double()
    with torch.no_grad():
        for lin in (layers[0], layers[2]):
            lin.weight.normal_(0, scale / lin.in_features**0.5)
            if bias:
                lin.bias.normal_(0, 0.5)
    return net.eval()


def own_class(seq: nn.Sequential) -> SoftplusNet:
    """The same weights in crosslip's SoftplusNet (exact softplus)."""
    first, act, last = [m for m in seq if not isinstance(m, nn.Flatten)]
    net = SoftplusNet(first.in_features, last.out_features, first.out_features, act.beta, True)
    net = net.double()
    with torch.no_grad():
        net.hidden_layer.weight.copy_(first.weight)
        net.output_layer.weight.copy_(last.weight)
        net.hidden_layer.bias.copy_(first.bias)
        net.output_layer.bias.copy_(last.bias)
    return net.eval()


def test_torch_softplus_is_below_the_exact_one_by_at_most_the_gap():
    """The key inequality, on a dense grid around every switch point and far from it:
    ``0 <= softplus(z) - torch_softplus(z) <= log1p(exp(-threshold)) / beta``, and the gap
    is attained (nearly) just above the switch."""
    for beta in (1.0, 10.0, 37.5, 0.3):
        for threshold in (20.0, 5.0, 1.0, 0.0, -3.0):
            z0 = threshold / beta
            z = torch.cat(
                [
                    z0 + torch.linspace(-1e-3, 1e-3, 20001, dtype=torch.float64) / beta,
                    torch.linspace(-50, 50, 20001, dtype=torch.float64) / beta,
                ]
            )
            diff = softplus(z, beta) - F.softplus(z, beta, threshold)
            eps = math.log1p(math.exp(-threshold)) / beta
            ulps = 8 * 2.0**-53 * (1 + z.abs() + eps)  # the evaluation's own rounding
            assert torch.all(diff >= -ulps)
            assert torch.all(diff <= eps + ulps)
            assert diff.max() >= eps * (1 - 1e-3)


@pytest.mark.parametrize("beta", [1.0, 10.0, 37.5])
@pytest.mark.parametrize("bias", [True, False])
def test_threshold_gap_bounds_the_class_differences_everywhere(beta, bias):
    """``|(g_c - g_j) - (f_c - f_j)| <= gap[c, j]`` at random points and at points whose
    hidden units sit exactly at the switch."""
    seq = sequential(5, 17, 4, beta, threshold=1.0, bias=bias, seed=3)
    net = from_sequential(seq)
    gap = NetTerms(net).threshold_gap
    exact = SoftplusNet(5, 4, 17, beta, bias=bias).double()
    exact.load_state_dict(
        {k: v for k, v in net.state_dict().items() if k in exact.state_dict()}, strict=True
    )
    x = torch.randn(400, 5, dtype=torch.float64) * 3
    # points with unit 0 exactly at the switch: z_0 = threshold / beta
    u, b = net.U[0], net.hidden_bias()[0]
    t = (1.0 / beta - b - x[:50] @ u) / (u @ u)
    x = torch.cat([x, x[:50] + t[:, None] * u[None, :]])
    g, f = net(x), exact(x)
    dg = g[:, :, None] - g[:, None, :]
    df = f[:, :, None] - f[:, None, :]
    assert torch.all((dg - df).abs() <= gap * (1 + 1e-9) + 1e-12)
    assert (dg - df).abs().amax() > 0.02 * gap.max()  # the difference is real here


@pytest.mark.parametrize("beta,h", [(37.5, 13), (1.0, 40), (10.0, 7)])
def test_sequential_gets_the_guarantees_of_the_same_weights_in_crosslips_class(beta, h):
    """At PyTorch's default threshold the gap is ~ 2e-9 / beta ||w_c - w_j||_1: the
    guarantees equal those of SoftplusNet to a relative 1e-6, and are never above them."""
    seq = sequential(6, h, 3, beta, seed=1, flatten=beta == 37.5)
    x = random_points(20, 6, 1)
    got = certify(seq, x, kinds=KINDS, rtol=1e-6)
    want = certify(own_class(seq), x, kinds=KINDS, rtol=1e-6)
    assert got.local_bound == "prop2.3"
    assert torch.equal(got.columns["pred"], want.columns["pred"])
    for col, _, _ in COLUMNS:
        a, b = got.columns[col], want.columns[col]
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-12), col
        assert torch.all(a <= b * (1 + 1e-6)), col
    assert (got.columns["guarantee_l2"] > 0).all()


def test_unsupported_sequentials_are_refused_with_the_supported_shapes():
    relu = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    deep = nn.Sequential(nn.Linear(4, 5), nn.Softplus(), nn.Linear(5, 5), nn.Softplus())
    for model in (relu, deep, nn.Sequential(nn.Flatten(0), *relu)):
        with pytest.raises(UnsupportedModelError, match=r"nn.Softplus\(beta, threshold\)"):
            certify(model, torch.rand(2, 4))
    with pytest.raises(UnsupportedModelError, match="ReLU"):
        certify(relu, torch.rand(2, 4))


def test_state_dict_layouts_and_bad_state_dicts():
    seq = sequential(4, 6, 3, 10.0, bias=False)
    net = from_state_dict(seq.state_dict(), beta=10.0, source="m.pt")
    assert net.hyper["hidden_bias"] is False and net.hyper["output_bias"] is False
    x = torch.rand(9, 4, dtype=torch.float64)
    assert torch.equal(net(x), seq(x))
    flat = sequential(4, 6, 3, 10.0, flatten=True)
    net = from_state_dict(flat.state_dict(), beta=10.0, source="m.pt")
    assert torch.equal(net(x), flat(x))
    # one bias only
    state = {**seq.state_dict(), "2.bias": torch.ones(3, dtype=torch.float64)}
    assert from_state_dict(state, beta=10.0).hyper["output_bias"] is True
    bad = [
        ({"0.weight": torch.ones(6, 4)}, "keys"),
        ({**seq.state_dict(), "4.weight": torch.ones(1)}, "keys"),
        ({"0.weight": torch.ones(6, 4), "2.weight": torch.ones(3, 5)}, "do not chain"),
        ({"0.weight": torch.ones(6, 4, dtype=torch.int64), "2.weight": torch.ones(3, 6)}, "float"),
        ({"0.weight": torch.full((6, 4), math.nan), "2.weight": torch.ones(3, 6)}, "NaN"),
    ]
    for state, what in bad:
        with pytest.raises(ModelFileError, match=f"m.pt: .*{what}"):
            from_state_dict(state, source="m.pt")


def test_output_layer_without_bias_and_hidden_with_bias_is_certified_soundly():
    seq = sequential(3, 8, 3, 10.0, threshold=0.5, seed=4)
    seq[2].bias = None
    net = from_sequential(seq)
    assert net.output_layer.bias is None and net.hidden_layer.bias is not None
    x = random_points(16, 3, 4)
    res = certify_softplus(net, x, rtol=1e-4)
    adv, pred = margin_attack(net, x, res["pred"], res["guarantee_l2"] * (1 - 1e-9), 2.0, False)
    assert torch.all(adv == pred)


@pytest.mark.parametrize("beta", [1.0, 10.0, 37.5])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("threshold", [20.0, 0.5])
def test_no_attack_inside_the_certified_ball_of_the_thresholded_function(beta, bias, threshold):
    """Projected gradient attacks (random restarts) and sampling inside every certified
    ball of the function the user's model computes never change its decision."""
    d, h, k = 5, 23, 4
    seq = sequential(d, h, k, beta, threshold, bias, seed=int(beta * 7) + bias)
    net = from_sequential(seq)
    x = random_points(12, d, 2)
    res = certify_softplus(net, x, rtol=1e-4, kinds=KINDS)
    assert torch.equal(res["pred"], seq(x).argmax(1))  # the user's function decides
    gen = torch.Generator().manual_seed(0)
    for col, p, box in COLUMNS:
        radius = res[col].clamp(max=1e6) * (1 - 1e-9)
        adv, pred = margin_attack(net, x, res["pred"], radius, p, box, restarts=4, steps=40)
        assert torch.all(adv == pred), col
        ys = sample_set(x, radius, 200, p, box, gen)  # (n, 300, d)
        with torch.no_grad():
            got = seq(ys.reshape(-1, d)).argmax(1).reshape(len(x), -1)
        assert torch.all(got == res["pred"][:, None]), col


def test_uncorrected_certificates_break_where_the_threshold_matters():
    """The test above can fail: at a low threshold, the exact net's certificates (no gap)
    are wrong for the thresholded function at some points (its class differs already at
    x), while the corrected ones hold and are 0 exactly where the gap eats the margin."""
    seq = sequential(4, 30, 3, 1.0, threshold=-1.0, seed=5, scale=3.0)
    net = from_sequential(seq)
    x = random_points(400, 4, 5)
    exact = certify(own_class(seq), x, kinds=("l2",), rtol=1e-4).columns
    fixed = certify(seq, x, kinds=("l2",), rtol=1e-4).columns
    user = seq(x).argmax(1)
    wrong = (exact["pred"] != user) & (exact["guarantee_l2"] > 0)
    assert wrong.any()  # uncorrected: a positive radius for a class the user's net does not give
    assert torch.equal(fixed["pred"], user)
    assert (fixed["guarantee_l2"][wrong] == 0).all()
    assert (fixed["guarantee_l2"] <= exact["guarantee_l2"] + (exact["pred"] != user) * 1e9).all()
    adv, pred = margin_attack(net, x, fixed["pred"], fixed["guarantee_l2"] * (1 - 1e-9), 2.0, False)
    assert torch.all(adv == pred)


def test_units_sitting_at_the_threshold_are_covered():
    """Every hidden unit exactly at the switch at x (beta z = threshold), a margin of the
    order of the gap: the certificate holds for the thresholded function."""
    beta, threshold, h = 37.5, 2.0, 6
    seq = sequential(2, h, 2, beta, threshold, bias=True, seed=9)
    first = seq[0]
    x = torch.tensor([[0.4, 0.7]], dtype=torch.float64)
    with torch.no_grad():  # every unit's z at x is threshold / beta exactly (up to rounding)
        first.bias.copy_(threshold / beta - first.weight @ x[0])
    net = from_sequential(seq)
    z = net.preactivation(x)
    assert torch.allclose(beta * z, torch.full_like(z, threshold), atol=1e-12)
    res = certify_softplus(net, x, rtol=1e-6)
    for col, p, box in COLUMNS:
        radius = res[col] * (1 - 1e-9)
        adv, pred = margin_attack(net, x, res["pred"], radius, p, box, restarts=20, steps=80)
        assert torch.all(adv == pred), col
    # shifting the last layer so the margin is about the gap: certificate 0 or sound
    gap = NetTerms(net).threshold_gap[0, 1]
    g = seq(x)[0]
    with torch.no_grad():
        seq[2].bias[1] += g[0] - g[1] - 0.5 * gap
    net = from_sequential(seq)
    res = certify_softplus(net, x, rtol=1e-6)
    assert res["pred"].item() == seq(x).argmax(1).item()
    assert res["guarantee_l2"].item() == 0  # margin below the gap: nothing certified
