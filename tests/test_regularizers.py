"""Cross-Lipschitz regularization (Section 3): closed form = autograd definition."""

from __future__ import annotations

import pytest
import torch

from crosslip.training.core import TrainConfig
from crosslip.training.regularizers import (
    _ContrastGradientNorm,
    _GramNorm,
    cross_lipschitz_autograd,
    cross_lipschitz_flops,
    cross_lipschitz_softplus,
    helmert,
    weight_decay,
)
from crosslip.training.single import objective_terms

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


def _backward_nodes(t: torch.Tensor) -> set[str]:
    """Names of every node in the autograd graph of ``t``."""
    names, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and type(node).__name__ not in names:
            names.add(type(node).__name__)
            stack.extend(f for f, _ in node.next_functions)
    return names


@pytest.mark.parametrize("n", [1, 4, 40, 200])
def test_auto_picks_the_form_with_fewer_flops(n):
    net = random_net(784, 10, 64, 0)
    x = random_points(n, 784, n)
    flops = cross_lipschitz_flops(n, 784, 10, 64)
    cheaper = min(flops, key=flops.__getitem__)
    nodes = _backward_nodes(cross_lipschitz_softplus(net, x))
    expected = {"gram": "_GramNormBackward", "gradients": "_ContrastGradientNormBackward"}
    assert expected[cheaper] in nodes and expected[min(flops, key=lambda m: -flops[m])] not in nodes
    # 2 n (K-1) H d per product, three products; the Gram form: 4 H^2 d + 4 n H^2
    assert flops == {"gradients": 6 * n * 9 * 64 * 784, "gram": 4 * 64 * 64 * 784 + 4 * n * 64 * 64}
    assert cheaper == ("gradients" if n < 5 else "gram")
    with pytest.raises(ValueError, match="method"):
        cross_lipschitz_softplus(net, x, method="fast")


@pytest.mark.parametrize("norm", [_ContrastGradientNorm, _GramNorm])
@pytest.mark.parametrize("k1", [0, 1, 4])
def test_hand_written_backward_passes_gradcheck(norm, k1):
    """Value = sum_i sum_k ||U^T (q_k * s_i)||^2 and its hand-written gradients against
    finite differences, for every subset of inputs that needs a gradient."""
    g = torch.Generator().manual_seed(k1)
    s = torch.rand(5, 7, generator=g, dtype=torch.float64)
    q = torch.randn(k1, 7, generator=g, dtype=torch.float64)
    u = torch.randn(7, 3, generator=g, dtype=torch.float64)
    literal = (
        sum((u.T @ (q[k] * s[i])).pow(2).sum() for i in range(5) for k in range(k1))
        if k1
        else torch.zeros((), dtype=torch.float64)
    )
    assert torch.allclose(norm.apply(s, q, u), literal, rtol=1e-12, atol=1e-14)
    for mask in [
        (True, True, True),
        (True, False, False),
        (False, True, False),
        (False, False, True),
    ]:
        inputs = [t.clone().requires_grad_(m) for t, m in zip((s, q, u), mask, strict=True)]
        assert torch.autograd.gradcheck(norm.apply, inputs)


def test_shared_preactivation_gives_the_same_value_and_gradients():
    """A training step passes the forward's z = U x + b instead of recomputing it."""
    for dropout in (0.0, 0.5):
        net = random_net(12, 5, 16, 3, scale=2.0)
        net.dropout = torch.nn.Dropout(dropout) if dropout else net.dropout
        x = random_points(6, 12, 3)
        torch.manual_seed(0)
        logits, z = net.logits_and_preactivation(x)
        torch.manual_seed(0)
        assert torch.equal(logits, net(x))
        assert torch.equal(z, net.preactivation(x))
        for method in ("gradients", "gram"):
            shared = cross_lipschitz_softplus(net, x, method, preactivation=z)
            alone = cross_lipschitz_softplus(net, x, method)
            assert torch.allclose(shared, alone, rtol=1e-12)
            g1 = torch.autograd.grad(
                shared, list(net.parameters()), allow_unused=True, retain_graph=True
            )
            g2 = torch.autograd.grad(alone, list(net.parameters()), allow_unused=True)
            for a, b in zip(g1, g2, strict=True):
                assert (a is None) == (b is None) and (
                    a is None or torch.allclose(a, b, rtol=1e-12)
                )
    with pytest.raises(ValueError, match=r"preactivation has shape \(6, 15\); expected \(6, 16\)"):
        cross_lipschitz_softplus(net, x, preactivation=z[:, :15])


def test_objective_terms_is_cross_entropy_plus_the_chosen_penalty():
    from crosslip.models.resnet import ResNet

    net = random_net(12, 5, 16, 4, scale=2.0)
    x, y = random_points(6, 12, 4), torch.arange(6) % 5
    ce_ref = torch.nn.functional.cross_entropy(net(x), y)
    for reg, lam, pen_ref in [
        ("cross_lipschitz", 0.1, cross_lipschitz_autograd(net, x)),
        ("weight_decay", 0.1, weight_decay(net)),
        ("none", 0.0, torch.zeros((), dtype=torch.float64)),
    ]:
        ce, pen = objective_terms(net, x, y, TrainConfig(regularizer=reg, lam=lam))
        assert torch.allclose(ce, ce_ref, rtol=1e-12) and torch.allclose(pen, pen_ref, rtol=1e-10)
    # any other architecture: double backpropagation
    torch.manual_seed(0)
    res = ResNet((8, 8, 1), 3, n=1).double()
    xi, yi = torch.rand(2, 64, dtype=torch.float64), torch.tensor([0, 2])
    _, pen = objective_terms(res, xi, yi, TrainConfig(regularizer="cross_lipschitz", lam=0.1))
    assert torch.allclose(pen, cross_lipschitz_autograd(res, xi), rtol=1e-10)


def test_cross_lipschitz_is_invariant_to_adding_a_common_function():
    """Section 3: adding the same g to every output leaves Omega unchanged."""
    net = random_net(6, 4, 10, 9)
    x = random_points(5, 6, 9)
    before = cross_lipschitz_softplus(net, x)
    with torch.no_grad():
        net.output_layer.weight += net.output_layer.weight[0].clone()  # f_j += f_0, all j
    assert torch.allclose(cross_lipschitz_softplus(net, x), before, rtol=1e-10)


def test_weight_decay_is_half_the_squared_norm_of_weights():
    """The authors' tf.nn.l2_loss: 1/2 sum of squares of the weights, biases excluded."""
    net = random_net(4, 3, 5, 1)
    expected = net.hidden_layer.weight.pow(2).sum() + net.output_layer.weight.pow(2).sum()
    assert torch.allclose(weight_decay(net), expected / 2)


def test_weight_decay_of_a_resnet_skips_batch_norm_scales():
    from crosslip.models.resnet import ResNet

    net = ResNet((8, 8, 1), n=1)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.fill_(100.0)
    convs = [m.weight for m in net.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    assert torch.allclose(weight_decay(net), 0.5 * sum(w.pow(2).sum() for w in convs))


def test_softplus_derivatives_are_finite_and_exact_everywhere():
    """Double backpropagation needs sigma'' too: logaddexp's own second derivative is NaN
    below alpha z ~ -90, which once made a ResNet's Cross-Lipschitz step NaN."""
    from crosslip.models.softplus import softplus

    z = torch.tensor(
        [-1e4, -100.0, -1.0, 0.0, 1.0, 100.0, 1e4], dtype=torch.float64, requires_grad=True
    )
    (d1,) = torch.autograd.grad(softplus(z, 10.0).sum(), z, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), z)
    s = torch.sigmoid(10.0 * z.detach())
    assert torch.equal(d1.detach(), s)
    assert torch.isfinite(d2).all() and torch.allclose(d2, 10.0 * s * (1 - s), atol=1e-12)
