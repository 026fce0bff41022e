"""Cross-Lipschitz regularization (Section 3): closed form = autograd definition."""

from __future__ import annotations

import pytest
import torch

from crosslip.regularizers import (
    cross_lipschitz_autograd,
    cross_lipschitz_softplus,
    helmert,
    weight_decay,
)

from .helpers import random_net, random_points


def definition(net, x):
    """Eq. (eq:crosslip) literally: 1/(nK^2) sum_i sum_{l,m} ||grad f_l - grad f_m||^2,
    with gradients from jacrev and the double sum written out."""
    jac = torch.func.vmap(torch.func.jacrev(lambda z: net(z[None])[0]))(x)  # (n, K, d)
    n, k, _ = jac.shape
    total = 0.0
    for l in range(k):  # noqa: E741
        for m in range(k):
            total = total + (jac[:, l] - jac[:, m]).pow(2).sum()
    return total / (n * k * k)


def test_closed_form_equals_definition_and_autograd():
    for seed, (d, k, h) in enumerate([(3, 2, 4), (10, 5, 16), (20, 10, 32)]):
        net = random_net(d, k, h, seed, scale=2.0)
        x = random_points(7, d, seed)
        ref = definition(net, x)
        auto = cross_lipschitz_autograd(net, x)
        assert torch.allclose(auto, ref, rtol=1e-10)
        for method in ("auto", "gradients", "gram"):
            closed = cross_lipschitz_softplus(net, x, method=method)
            assert torch.allclose(closed, ref, rtol=1e-10), (method, closed, ref)


@pytest.mark.parametrize("method", ["gradients", "gram"])
def test_closed_form_gradients_equal_autograd_gradients(method):
    net = random_net(12, 6, 20, 5, scale=2.0)
    x = random_points(9, 12, 5)
    params = [p for p in net.parameters()]
    closed = cross_lipschitz_softplus(net, x, method=method)
    g_closed = torch.autograd.grad(closed, params, allow_unused=True)
    g_ref = torch.autograd.grad(definition(net, x), params, allow_unused=True)
    for a, b in zip(g_closed, g_ref, strict=True):
        if b is None:  # the output bias does not enter any input gradient
            assert a is None or torch.allclose(a, torch.zeros_like(a))
            continue
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3, 10, 43])
def test_helmert_contrasts_are_orthonormal_and_orthogonal_to_ones(k):
    q = helmert(k)
    assert q.shape == (k - 1, k)
    assert torch.allclose(q @ q.T, torch.eye(k - 1, dtype=q.dtype), atol=1e-12)
    assert torch.allclose(q.sum(1), torch.zeros(k - 1, dtype=q.dtype), atol=1e-12)
    centring = torch.eye(k, dtype=q.dtype) - 1.0 / k
    assert torch.allclose(q.T @ q, centring, atol=1e-12)  # what the closed form relies on


def test_auto_picks_the_cheaper_exact_form():
    net = random_net(784, 10, 64, 0)
    small, large = random_points(4, 784, 0), random_points(200, 784, 1)
    # n K H d vs H^2 d + n H^2: gradients for 4 points, the Gram form for 200
    for x in (small, large):
        a = cross_lipschitz_softplus(net, x)
        assert torch.allclose(a, cross_lipschitz_softplus(net, x, method="gram"), rtol=1e-10)
    with pytest.raises(ValueError, match="method"):
        cross_lipschitz_softplus(net, small, method="fast")


def test_cross_lipschitz_is_invariant_to_adding_a_common_function():
    """Section 3: adding the same g to every output leaves Omega unchanged."""
    net = random_net(6, 4, 10, 9)
    x = random_points(5, 6, 9)
    before = cross_lipschitz_softplus(net, x)
    with torch.no_grad():
        net.output_layer.weight += net.output_layer.weight[0].clone()  # f_j += f_0, all j
    assert torch.allclose(cross_lipschitz_softplus(net, x), before, rtol=1e-10)


def test_weight_decay_is_squared_norm_of_weights():
    net = random_net(4, 3, 5, 1)
    expected = net.hidden_layer.weight.pow(2).sum() + net.output_layer.weight.pow(2).sum()
    assert torch.allclose(weight_decay(net), expected)


def test_softplus_derivatives_are_finite_and_exact_everywhere():
    """Double backpropagation needs sigma'' too: logaddexp's own second derivative is NaN
    below alpha z ~ -90, which once made a ResNet's Cross-Lipschitz step NaN."""
    from crosslip.models import softplus

    z = torch.tensor([-1e4, -100.0, -1.0, 0.0, 1.0, 100.0, 1e4], dtype=torch.float64,
                     requires_grad=True)  # fmt: skip
    (d1,) = torch.autograd.grad(softplus(z, 10.0).sum(), z, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), z)
    s = torch.sigmoid(10.0 * z.detach())
    assert torch.equal(d1.detach(), s)
    assert torch.isfinite(d2).all() and torch.allclose(d2, 10.0 * s * (1 - s), atol=1e-12)
