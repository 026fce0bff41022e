"""The one-hidden-layer classifier of the paper, and input gradients of any classifier.

The one-hidden-layer network of Section 2.3 / Section 5:
``f_j(x) = sum_r w_jr sigma(<u_r, x> + b_r) + c_j`` with the softplus
``sigma(z) = log(1 + exp(alpha z)) / alpha`` (alpha = 10), whose derivative
``sigma'(z) = sigmoid(alpha z)`` is monotonically increasing, as Proposition 2.3 requires.
Shapes: ``U`` is (H, d), ``b`` (H,), ``W`` (K, H), ``c`` (K,). The softplus itself is
:func:`crosslip.models.softplus.softplus`; saving and loading models is
:mod:`crosslip.models.checkpoints`.
"""

from __future__ import annotations

import torch
from torch import nn

from .softplus import softplus


class SoftplusNet(nn.Module):
    """One hidden layer of ``hidden`` softplus units (Section 5: 1024 units, alpha = 10).

    ``bias`` switches the hidden biases ``b`` and output biases ``c`` on (the paper's
    ``f_j`` and the authors' networks have none; the output bias does not change any input
    gradient, so it does not enter the bounds). ``init``: ``authors`` draws
    ``U ~ N(0, 1/(d H))``, ``W ~ N(0, 1/(K H))`` and sets biases to 0.1 (the authors' code);
    ``pytorch`` keeps :class:`torch.nn.Linear`'s default. In training, dropout keeps each
    input coordinate with probability ``keep_input`` and each hidden unit with
    ``keep_hidden`` (inverted dropout, 1 = off); at evaluation the network is the plain
    ``f``.
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        hidden: int = 1024,
        alpha: float = 10.0,
        bias: bool = False,
        keep_hidden: float = 1.0,
        keep_input: float = 1.0,
        init: str = "pytorch",
    ) -> None:
        super().__init__()
        for name, keep in (("keep_hidden", keep_hidden), ("keep_input", keep_input)):
            if not 0 < keep <= 1:
                raise ValueError(f"{name} is a keep probability in (0, 1]; got {keep}")
        self.hyper = dict(
            in_dim=in_dim,
            num_classes=num_classes,
            hidden=hidden,
            alpha=alpha,
            bias=bias,
            keep_hidden=keep_hidden,
            keep_input=keep_input,
        )
        self.alpha = float(alpha)
        self.hidden_layer = nn.Linear(in_dim, hidden, bias=bias)
        self.output_layer = nn.Linear(hidden, num_classes, bias=bias)
        self.input_dropout = _dropout(keep_input)
        self.dropout = _dropout(keep_hidden)
        if init == "authors":
            self.authors_init()
        elif init != "pytorch":
            raise ValueError(f"unknown init {init!r}; allowed: authors, pytorch")

    @torch.no_grad()
    def authors_init(self) -> None:
        """``U ~ N(0, 1/(d H))``, ``W ~ N(0, 1/(K H))``, biases 0.1, as the authors' code."""
        (h, d), k = self.U.shape, self.W.shape[0]
        nn.init.normal_(self.hidden_layer.weight, std=(1.0 / (d * h)) ** 0.5)
        nn.init.normal_(self.output_layer.weight, std=(1.0 / (k * h)) ** 0.5)
        for layer in (self.hidden_layer, self.output_layer):
            if layer.bias is not None:
                nn.init.constant_(layer.bias, 0.1)

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
        """``z = U x + b``, shape (n, H) (no dropout)."""
        return self.hidden_layer(x)

    def sigma_prime(self, z: torch.Tensor) -> torch.Tensor:
        """``sigma'(z) = sigmoid(alpha z)``."""
        return torch.sigmoid(self.alpha * z)

    def logits_and_preactivation(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``f(x)`` (n, K) and the hidden preactivation ``z = U x + b`` (n, H) that
        they are computed from (before hidden dropout; in training with ``keep_input < 1``,
        of the input after its dropout), for ``x`` of shape (n, d)."""
        z = self.preactivation(self.input_dropout(x))
        return self.output_layer(self.dropout(softplus(z, self.alpha))), z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``f(x)``, shape (n, K), for ``x`` of shape (n, d)."""
        return self.logits_and_preactivation(x)[0]

    def class_gradients(self, x: torch.Tensor) -> torch.Tensor:
        """Input gradients ``grad f_j(x) = U^T (w_j * sigma'(z))``, shape (n, K, d)."""
        s = self.sigma_prime(self.preactivation(x))  # (n, H)
        return (s[:, None, :] * self.W[None, :, :]) @ self.U


def _dropout(keep: float) -> nn.Module:
    return nn.Dropout(1.0 - keep) if keep < 1 else nn.Identity()


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
