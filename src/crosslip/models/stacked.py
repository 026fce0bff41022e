"""A grid of one-hidden-layer softplus networks as one module (Section 5).

Section 5 trains the same network (one hidden layer of softplus units, Section 2.3) for a
grid of regularizers and hyperparameters. Networks that share the architecture, the data,
the batch order and the epochs can be trained as *one* model whose weights carry a leading
grid dimension: ``U`` (G, H, d), ``W`` (G, K, H) and, with biases, ``b`` (G, H), ``c``
(G, K). Grid point ``g`` computes exactly :class:`~crosslip.models.SoftplusNet` with the
weights ``U[g], b[g], W[g], c[g]``,

    ``f^g_j(x) = sum_r W[g]_jr sigma(<U[g]_r, x> + b[g]_r) + c[g]_j``,

and every product of a forward or backward pass is one batched product over the G networks
(:mod:`crosslip.training.grid` trains it). The grouped evaluations (:meth:`grouped_logits`,
:meth:`grouped_class_gradients`) give each row of a batch the network of its own grid point:
the attacks of adversarial training use them to attack all G networks at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .softplus import softplus
from .softplus_net import SoftplusNet

#: Hyperparameters that every network of a stack shares (the rest: ``keep_hidden``,
#: ``keep_input``, which only act in training, may differ per grid point).
SHARED_HYPER = ("in_dim", "num_classes", "hidden", "alpha", "bias")


class StackedSoftplusNet(nn.Module):
    """G :class:`SoftplusNet` of one shape as one module (module docstring).

    Built from the networks (their weights are copied; ``hyper`` of each is kept so that
    :meth:`network` gives each back as a :class:`SoftplusNet`). Dropout is not part of the
    module: the trainer passes the per-grid-point scales (mask / keep probability) to
    :meth:`logits_and_preactivation`, so that each grid point draws its own masks."""

    def __init__(self, nets: Sequence[SoftplusNet]) -> None:
        super().__init__()
        if not nets:
            raise ValueError("a stack needs at least one network")
        first = nets[0].hyper
        for i, net in enumerate(nets):
            differ = [k for k in SHARED_HYPER if net.hyper[k] != first[k]]
            if differ:
                raise ValueError(
                    f"network {i} differs from network 0 in {', '.join(differ)}: "
                    "a stack holds networks of one shape"
                )
        self.hypers: list[dict[str, Any]] = [dict(net.hyper) for net in nets]
        self.alpha = float(first["alpha"])
        self.U = nn.Parameter(torch.stack([net.U.detach() for net in nets]).clone())
        self.W = nn.Parameter(torch.stack([net.W.detach() for net in nets]).clone())
        self.b: nn.Parameter | None = None
        self.c: nn.Parameter | None = None
        if first["bias"]:
            self.b = nn.Parameter(torch.stack([net.hidden_layer.bias.detach() for net in nets]))
            self.c = nn.Parameter(torch.stack([net.output_layer.bias.detach() for net in nets]))

    @property
    def size(self) -> int:
        """G, the number of networks."""
        return self.U.shape[0]

    def network(self, g: int) -> SoftplusNet:
        """Grid point ``g`` as a :class:`SoftplusNet` (a copy of its weights, on this
        module's device and in its dtype). Draws no random numbers: the copy is laid out on
        the ``meta`` device, so neither the CPU's nor the device's generator moves."""
        with torch.device("meta"):
            net = SoftplusNet(**self.hypers[g])
        net = net.to_empty(device=self.U.device).to(self.U.dtype)
        with torch.no_grad():
            net.hidden_layer.weight.copy_(self.U[g])
            net.output_layer.weight.copy_(self.W[g])
            if self.b is not None and self.c is not None:
                net.hidden_layer.bias.copy_(self.b[g])
                net.output_layer.bias.copy_(self.c[g])
        return net

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """``z = U x + b`` of every network, shape (G, n, H), for ``x`` (n, d) (the same
        points for every network) or (G, n, d) (points per network).

        Computed as ``z^T = U x^T`` (a view of (G, H, n)), so that the gradient of ``U``,
        ``dz^T x``, comes out in ``U``'s own layout, with no copy of the size of the stack's
        weights; for shared points it is one (G H, d) x (d, n) product."""
        size, h, d = self.U.shape
        if x.dim() == 2:  # one (G H, d) x (d, n) product, and one for its gradient
            z = (self.U.reshape(size * h, d) @ x.T).view(size, h, -1).mT
        else:
            z = torch.matmul(self.U, x.mT).mT
        return z if self.b is None else z + self.b[:, None, :]

    def sigma_prime(self, z: torch.Tensor) -> torch.Tensor:
        """``sigma'(z) = sigmoid(alpha z)``."""
        return torch.sigmoid(self.alpha * z)

    def logits_and_preactivation(
        self,
        x: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        hidden_scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (G, n, K) and preactivations (G, n, H) for ``x`` (n, d) or (G, n, d).

        Dropout as scales (inverted dropout: a mask divided by its keep probability, 1
        where nothing is dropped): ``input_scale`` (G, n, d) multiplies the input of each
        network, ``hidden_scale`` (G, n, H) its hidden units; the preactivation is that of
        the (scaled) input, as :meth:`SoftplusNet.logits_and_preactivation` returns it."""
        if input_scale is not None:
            x = x * input_scale
        z = self.preactivation(x)
        a = softplus(z, self.alpha)
        if hidden_scale is not None:
            a = a * hidden_scale
        logits = torch.matmul(a, self.W.mT)
        return (logits if self.c is None else logits + self.c[:, None, :]), z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of every network, (G, n, K), without dropout."""
        return self.logits_and_preactivation(x)[0]

    # ----------------------------------------------------------------------------------
    # each row its own network
    # ----------------------------------------------------------------------------------
    def _rows_by_network(
        self, x: torch.Tensor, group: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of ``x`` (R, d) laid out per network: (G, m, d) with ``m`` the most
        rows of one network (zeros pad the rest), and each row's position there (R,)."""
        size = self.size
        counts = torch.bincount(group, minlength=size)
        order = torch.argsort(group, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.empty_like(group)
        pos[order] = torch.arange(len(group), device=group.device) - starts[group[order]]
        m = int(counts.max()) if len(group) else 0
        padded = x.new_zeros(size, m, x.shape[1])
        padded[group, pos] = x
        return padded, pos

    def grouped_logits(self, x: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """Logits (R, K) of row ``i`` of ``x`` (R, d) by network ``group[i]`` (no dropout)."""
        padded, pos = self._rows_by_network(x, group)
        return self(padded)[group, pos]

    def grouped_class_gradients(self, x: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """Input gradients ``grad f^g_j(x_i) = U[g]^T (W[g]_j * sigma'(z_i))`` with
        ``g = group[i]``, shape (R, K, d), for ``x`` (R, d)."""
        padded, pos = self._rows_by_network(x, group)
        s = self.sigma_prime(self.preactivation(padded))  # (G, m, H)
        size, m, h = s.shape
        k = self.W.shape[1]
        a = (s[:, :, None, :] * self.W[:, None, :, :]).reshape(size, m * k, h)
        grads = torch.matmul(a, self.U).view(size, m, k, -1)
        return grads[group, pos]
