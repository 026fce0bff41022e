"""ResNet-32 with softplus (the paper's deep networks): structure, exact Cross-Lipschitz by
double backpropagation, and attacks that need nothing but autograd."""

from __future__ import annotations

import torch

from crosslip.attacks import upper_bound
from crosslip.models import class_gradients
from crosslip.models.resnet import ResNet
from crosslip.training.regularizers import cross_lipschitz_autograd, cross_lipschitz_from_gradients


def small_batch(n=4, shape=(12, 12, 3), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, shape[0] * shape[1] * shape[2], generator=gen, dtype=torch.float64)


def test_resnet32_has_32_parameter_layers_and_classifies_flat_images():
    net = ResNet((32, 32, 3))
    assert net.depth() == 32
    out = net.eval()(torch.rand(2, 32 * 32 * 3))
    assert out.shape == (2, 10)


def test_cross_lipschitz_by_double_backprop_is_exact_and_differentiable():
    torch.manual_seed(0)
    net = ResNet((12, 12, 3), n=1, width=1, dropout=0.3).double().eval()
    x = small_batch()
    omega = cross_lipschitz_autograd(net, x)
    # the definition with per-point Jacobians from torch.func
    jac = torch.func.vmap(torch.func.jacrev(lambda z: net(z[None])[0]))(x)
    assert torch.allclose(omega, cross_lipschitz_from_gradients(jac), rtol=1e-10)
    params = list(net.parameters())
    grads = [g for g in torch.autograd.grad(omega, params, allow_unused=True) if g is not None]
    assert len(grads) == len(params) - 1  # all but the output bias enter the input gradients
    assert all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    assert torch.allclose(class_gradients(net, x), jac, rtol=1e-10)


def test_attacks_apply_to_the_resnet():
    torch.manual_seed(1)
    net = ResNet((12, 12, 3), n=1).double()
    with torch.no_grad():  # batch-norm statistics of the data, and a decisive last layer
        for i in range(20):
            net(small_batch(64, seed=100 + i))
        net.fc.weight.mul_(20)
    net.eval()
    x = small_batch(6, seed=1)
    ub = upper_bound(net, x, p=2)
    assert ub.success.any()
    s = ub.success
    with torch.no_grad():
        assert torch.all(net(x[s] + ub.delta[s]).argmax(1) != net(x[s]).argmax(1))
    assert torch.all((x + ub.delta >= 0) & (x + ub.delta <= 1))
