"""The one-hidden-layer classifier of the paper, and input gradients of any classifier.

The one-hidden-layer network of Section 2.3 / Section 5:
``f_j(x) = sum_r w_jr sigma(<u_r, x> + b_r) + c_j`` with the softplus
``sigma(z) = log(1 + exp(alpha z)) / alpha`` (alpha = 10), whose derivative
``sigma'(z) = sigmoid(alpha z)`` is monotonically increasing, as Proposition 2.3 requires.
Shapes: ``U`` is (H, d), ``b`` (H,), ``W`` (K, H), ``c`` (K,). The softplus itself is
:func:`crosslip.softplus.softplus`; saving and loading models is :mod:`crosslip.checkpoints`.
"""

from __future__ import annotations

import torch
from torch import nn

from .softplus import softplus


class SoftplusNet(nn.Module):
    """One hidden layer of ``hidden`` softplus units (Section 5: 1024 units, alpha = 10).

    ``bias`` switches the hidden biases ``b`` and output biases ``c`` on (the output bias
    does not change any input gradient, so it does not enter the bounds).
    ``dropout`` is the probability of dropping a hidden unit in training (0 disables it).
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        hidden: int = 1024,
        alpha: float = 10.0,
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.hyper = dict(
            in_dim=in_dim,
            num_classes=num_classes,
            hidden=hidden,
            alpha=alpha,
            bias=bias,
            dropout=dropout,
        )
        self.alpha = float(alpha)
        self.hidden_layer = nn.Linear(in_dim, hidden, bias=bias)
        self.output_layer = nn.Linear(hidden, num_classes, bias=bias)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def U(self) -> torch.Tensor:
        return self.hidden_layer.weight

    @property
    def W(self) -> torch.Tensor:
        return self.output_layer.weight

    def hidden_bias(self) -> torch.Tensor:
        b = self.hidden_layer.bias
        return (
            torch.zeros(self.U.shape[0], dtype=self.U.dtype, device=self.U.device)
            if b is None
            else b
        )

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """``z = U x + b``, shape (n, H)."""
        return self.hidden_layer(x)

    def sigma_prime(self, z: torch.Tensor) -> torch.Tensor:
        """``sigma'(z) = sigmoid(alpha z)``."""
        return torch.sigmoid(self.alpha * z)

    def logits_and_preactivation(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``f(x)`` (n, K) and the hidden preactivation ``z = U x + b`` (n, H) that
        they are computed from (before dropout), for ``x`` of shape (n, d)."""
        z = self.preactivation(x)
        return self.output_layer(self.dropout(softplus(z, self.alpha))), z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``f(x)``, shape (n, K), for ``x`` of shape (n, d)."""
        return self.logits_and_preactivation(x)[0]

    def class_gradients(self, x: torch.Tensor) -> torch.Tensor:
        """Input gradients ``grad f_j(x) = U^T (w_j * sigma'(z))``, shape (n, K, d)."""
        s = self.sigma_prime(self.preactivation(x))  # (n, H)
        return (s[:, None, :] * self.W[None, :, :]) @ self.U


def class_gradients(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Input gradients of every output, shape (n, K, d): closed form if the model has one,
    else exact automatic differentiation (one backward pass per class)."""
    if hasattr(model, "class_gradients"):
        return model.class_gradients(x)
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        out = model(x)
        grads = [
            torch.autograd.grad(out[:, k].sum(), x, retain_graph=k < out.shape[1] - 1)[0]
            for k in range(out.shape[1])
        ]
    return torch.stack(grads, dim=1)
