"""Shared builders for the tests: small random models with controllable shapes."""

from __future__ import annotations

import torch

from crosslip.models import SoftplusNet


def random_net(
    d: int, k: int, h: int, seed: int, scale: float = 1.0, bias: bool = True
) -> SoftplusNet:
    """A random one-hidden-layer softplus net in float64 (weights ~ N(0, scale^2/fan_in))."""
    g = torch.Generator().manual_seed(seed)
    net = SoftplusNet(d, k, hidden=h, alpha=10.0, bias=bias).double()
    with torch.no_grad():
        net.hidden_layer.weight.copy_(
            torch.randn(h, d, generator=g, dtype=torch.float64) * scale / d**0.5
        )
        net.output_layer.weight.copy_(
            torch.randn(k, h, generator=g, dtype=torch.float64) * scale / h**0.5
        )
        if bias:
            net.hidden_layer.bias.copy_(torch.randn(h, generator=g, dtype=torch.float64) * 0.1)
            net.output_layer.bias.copy_(torch.randn(k, generator=g, dtype=torch.float64) * 0.1)
    return net.eval()


def random_points(n: int, d: int, seed: int) -> torch.Tensor:
    """Points in the unit box [0, 1]^d, float64."""
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def files_in(folder) -> list[str]:
    """Names of everything in ``folder`` (hidden temporaries included); [] if absent."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []
