"""The softplus ``sigma(z) = log(1 + exp(alpha z)) / alpha`` of the paper's networks.

Section 2.3 / Section 5 use it as activation (alpha = 10) because it is continuously
differentiable with ``sigma'(z) = sigmoid(alpha z)``, monotonically increasing, as
Proposition 2.3 requires. :func:`softplus` computes it exactly for every z (with exactly that
derivative), :class:`Softplus` is the same as a module. Both the one-hidden-layer net
(:mod:`crosslip.models`) and the ResNet (:mod:`crosslip.models.resnet`) build on this module.
"""

from __future__ import annotations

import torch
from torch import nn


class _Softplus(torch.autograd.Function):
    """``logaddexp(alpha z, 0) / alpha`` with the derivative ``sigmoid(alpha z)`` written out.

    PyTorch's own derivative of ``logaddexp`` is right, but its *second* derivative is NaN
    for ``alpha z`` below about -90 (an overflowing exponential), which poisons the double
    backpropagation of exact Cross-Lipschitz regularization; ``sigmoid`` differentiates
    stably."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z: torch.Tensor, alpha: float) -> torch.Tensor:
        return torch.logaddexp(alpha * z, torch.zeros_like(z)) / alpha

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        z, alpha = inputs
        ctx.save_for_backward(z)
        ctx.alpha = alpha

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (z,) = ctx.saved_tensors
        return grad * torch.sigmoid(ctx.alpha * z), None


def softplus(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """``log(1 + exp(alpha z)) / alpha``, computed stably and *exactly* everywhere; any shape.

    ``torch.nn.functional.softplus`` switches to the identity above ``alpha z > 20``; there
    its derivative is 1 instead of ``sigmoid(alpha z)``, which is smaller by up to 2e-9.
    The bounds of Proposition 2.3 use ``sigma' = sigmoid(alpha z)``, so the network must
    compute exactly the function they are about: ``logaddexp(alpha z, 0) / alpha`` is stable
    for any z, its derivative is exactly ``sigmoid(alpha z)``, and so are its higher
    derivatives (:class:`_Softplus`).
    """
    return _Softplus.apply(z, alpha)


class Softplus(nn.Module):
    """The exact softplus of :func:`softplus` as a module (elementwise, any shape)."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return softplus(z, self.alpha)
