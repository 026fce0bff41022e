"""The terms of a local guarantee (crosslip.certify.decomposition) add up to the certificate:
``guarantee = min(margin / L(R*), R*)`` at the certified radius, ``L(0)`` is the exact
gradient difference at the point, the ascent's estimate lies between ``L(0)`` and
Proposition 2.3's ``L(R*)``, and alpha enters only through ``alpha ||u_r||``."""

from __future__ import annotations

import torch

from crosslip.certify import certify_softplus
from crosslip.certify.decomposition import (
    ascend_gradient_difference,
    decompose,
    unit_sharpness,
)
from crosslip.models import SoftplusNet, class_gradients

from .helpers import random_net, random_points


def net_and_points(bias: bool = True) -> tuple[SoftplusNet, torch.Tensor]:
    return random_net(12, 4, 24, seed=3, scale=3.0, bias=bias), random_points(40, 12, seed=4)


def test_the_terms_make_up_the_certified_guarantee():
    net, x = net_and_points()
    t = decompose(net, x, ascent_steps=10)
    cert = certify_softplus(net, x, kinds=("local",))
    torch.testing.assert_close(t["guarantee"], cert["guarantee_local"], rtol=0, atol=0)
    finite = torch.isfinite(t["radius"])
    assert finite.all()
    rebuilt = torch.minimum(t["margin"] / t["lip_radius"], t["radius"])
    torch.testing.assert_close(rebuilt, t["guarantee"], rtol=1e-6, atol=0)
    assert (t["first_order"] >= t["guarantee"] * (1 - 1e-9)).all()
    assert (t["growth"] >= 1 - 1e-9).all()


def test_the_constant_at_the_point_is_the_gradient_difference():
    net, x = net_and_points()
    t = decompose(net, x, ascent_steps=0)
    grads = class_gradients(net, x)  # (n, K, d)
    rows = torch.arange(len(x))
    diff = grads[rows, t["pred"]] - grads[rows, t["bound_class"]]
    torch.testing.assert_close(t["lip_point"], diff.norm(dim=1), rtol=1e-10, atol=0)
    # with no ascent step the estimate is the value at the point
    torch.testing.assert_close(t["lip_ascent"], t["lip_point"], rtol=1e-12, atol=0)


def test_the_ascent_lies_between_the_point_and_the_bound_and_stays_in_the_ball():
    net, x = net_and_points()
    t = decompose(net, x, ascent_steps=40)
    assert (t["lip_ascent"] >= t["lip_point"] * (1 - 1e-12)).all()
    assert (t["lip_ascent"] <= t["lip_radius"] * (1 + 1e-9)).all()
    assert (t["lip_ascent"] > t["lip_point"] * (1 + 1e-6)).any()  # it does climb
    d = net.W[t["bound_class"]] - net.W[t["pred"]]
    at_zero = ascend_gradient_difference(net, x, d.detach(), torch.zeros(len(x)), steps=5)
    torch.testing.assert_close(at_zero, t["lip_point"], rtol=1e-12, atol=0)


def test_the_shares_of_units_are_fractions():
    net, x = net_and_points()
    t = decompose(net, x, ascent_steps=0)
    for name in ("off", "on", "crossing"):
        assert ((t[name] >= 0) & (t[name] <= 1)).all(), name
    assert (t["off"] + t["on"] <= 1).all()


def test_alpha_enters_only_through_the_units_sharpness():
    """``sum_r w_r sigma_alpha(<u_r, x>) = sum_r (w_r / alpha) sigma_1(<alpha u_r, x>)``: the
    same function, so the same guarantee and terms, and the same ``alpha ||u_r||``."""
    net, x = net_and_points(bias=False)
    twin = SoftplusNet(12, 4, hidden=24, alpha=1.0, bias=False).double()
    with torch.no_grad():
        twin.hidden_layer.weight.copy_(net.U * net.alpha)
        twin.output_layer.weight.copy_(net.W / net.alpha)
    torch.testing.assert_close(twin(x), net(x), rtol=1e-12, atol=1e-12)
    a, b = decompose(net, x, ascent_steps=5), decompose(twin, x, ascent_steps=5)
    for name in ("guarantee", "margin", "lip_point", "lip_radius", "first_order", "off", "on"):
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-12, msg=name)
    torch.testing.assert_close(unit_sharpness(net), unit_sharpness(twin), rtol=1e-12, atol=0)
