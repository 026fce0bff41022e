"""One-hidden-layer softplus networks built from standard ``torch.nn`` layers elsewhere.

A network trained outside crosslip as

    nn.Sequential(nn.Linear(d, H), nn.Softplus(beta=b, threshold=t), nn.Linear(H, K))

(optionally with a leading ``nn.Flatten()``, any width H, any ``beta > 0``, with or without
either bias) is the net of Section 2.3 with ``alpha = beta``, except for one detail:
``nn.Softplus`` is the *identity* where ``beta z > threshold`` (PyTorch's switch for numerical
stability), while crosslip's softplus (:func:`crosslip.models.softplus.softplus`) and every bound of
Proposition 2.3 are about the exact ``log(1 + exp(beta z)) / beta``. :class:`TorchSoftplusNet`
computes the user's function (PyTorch's ``softplus(z, beta, threshold)``) and keeps the exact
net's weights, so the certification can bound the difference
(:attr:`crosslip.certify.softplus_bounds.NetTerms.threshold_gap`):

    0 <= softplus(z) - torch_softplus(z) <= log1p(exp(-threshold)) / beta   for every z,

the maximum being approached just above ``z = threshold / beta`` (where ``softplus(z) - z =
log1p(exp(-beta z)) / beta``). Shapes as in :mod:`crosslip.models`: ``U`` (H, d), ``b`` (H,),
``W`` (K, H), ``c`` (K,); inputs ``x`` (n, d).

:func:`from_sequential` turns such an ``nn.Sequential`` into a :class:`TorchSoftplusNet`;
:func:`from_state_dict` does the same from its ``state_dict()`` (plain tensors), with
``beta`` and ``threshold`` given separately (a state dict stores neither).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelFileError, UnsupportedModelError
from .softplus_net import SoftplusNet

#: What crosslip certifies, in words (used in error messages).
SUPPORTED = (
    "nn.Sequential([nn.Flatten(),] nn.Linear(d, H), nn.Softplus(beta, threshold), "
    "nn.Linear(H, K)) with any width H, beta > 0 and either bias on or off "
    "(crosslip.models.torch_softplus); state dict keys 0.weight, 0.bias?, 2.weight, 2.bias? "
    "(1.*, 3.* after a leading nn.Flatten)"
)
#: PyTorch's defaults of ``nn.Softplus``.
TORCH_BETA, TORCH_THRESHOLD = 1.0, 20.0


class TorchSoftplusNet(SoftplusNet):
    """The user's ``Linear -> nn.Softplus(beta, threshold) -> Linear`` network.

    ``forward`` computes what the user's ``nn.Sequential`` computes (PyTorch's thresholded
    softplus); :meth:`sigma_prime` is that function's derivative (1 where ``beta z >
    threshold``), so attacks follow the user's function. The inherited ``U``, ``W``, biases
    and ``alpha = beta`` describe the exact softplus net that Proposition 2.3 bounds; the
    certification accounts for the difference (module docstring). ``hidden_bias`` and
    ``output_bias`` switch the two biases independently.
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        hidden: int,
        beta: float = TORCH_BETA,
        threshold: float = TORCH_THRESHOLD,
        hidden_bias: bool = True,
        output_bias: bool = True,
    ) -> None:
        if not beta > 0 or beta == float("inf"):
            raise ValueError(f"softplus beta must be a positive number, got {beta}")
        if threshold != threshold:
            raise ValueError("softplus threshold is NaN")
        super().__init__(in_dim, num_classes, hidden, alpha=beta, bias=hidden_bias)
        if output_bias != hidden_bias:
            self.output_layer = nn.Linear(hidden, num_classes, bias=output_bias)
        self.threshold = float(threshold)
        self.hyper = dict(
            in_dim=int(in_dim),
            num_classes=int(num_classes),
            hidden=int(hidden),
            beta=float(beta),
            threshold=float(threshold),
            hidden_bias=bool(hidden_bias),
            output_bias=bool(output_bias),
        )

    def logits_and_preactivation(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The user's logits (n, K) (PyTorch's thresholded softplus) and ``z = U x + b``."""
        z = self.preactivation(x)
        return self.output_layer(F.softplus(z, self.alpha, self.threshold)), z

    def sigma_prime(self, z: torch.Tensor) -> torch.Tensor:
        """Derivative of PyTorch's softplus: ``sigmoid(beta z)``, 1 where ``beta z >
        threshold``."""
        return torch.where(
            self.alpha * z > self.threshold, torch.ones_like(z), torch.sigmoid(self.alpha * z)
        )


def _build(
    U: torch.Tensor,
    b: torch.Tensor | None,
    W: torch.Tensor,
    c: torch.Tensor | None,
    beta: float,
    threshold: float,
) -> TorchSoftplusNet:
    h, d = U.shape
    with torch.device(U.device):  # built where its weights are, whatever the default
        net = TorchSoftplusNet(d, W.shape[0], h, beta, threshold, b is not None, c is not None)
    net = net.to(dtype=U.dtype)
    with torch.no_grad():
        net.hidden_layer.weight.copy_(U)
        net.output_layer.weight.copy_(W)
        if b is not None:
            net.hidden_layer.bias.copy_(b)
        if c is not None:
            net.output_layer.bias.copy_(c)
    return net.eval()


def from_sequential(model: nn.Module) -> TorchSoftplusNet:
    """A :class:`TorchSoftplusNet` with a copy of the weights of ``model``, an
    ``nn.Sequential`` of the supported shape (:data:`SUPPORTED`); raises
    :class:`~crosslip.errors.UnsupportedModelError` for anything else. The layers must be
    exactly these classes (a subclass may compute something else)."""
    layers = list(model.children()) if type(model) is nn.Sequential else None
    if layers and type(layers[0]) is nn.Flatten:
        flat = layers[0]
        if flat.start_dim != 1 or flat.end_dim != -1:
            layers = None
        else:
            layers = layers[1:]
    kinds = [nn.Linear, nn.Softplus, nn.Linear]
    if layers is None or [type(m) for m in layers] != kinds:
        found = (
            [type(m).__name__ for m in model.children()]
            if isinstance(model, nn.Sequential)
            else type(model).__name__
        )
        raise UnsupportedModelError(
            f"crosslip has guarantees for {SUPPORTED}; got {found}. Other models get upper "
            "bounds only (crosslip.attacks.upper_bound)"
        )
    first, act, last = layers
    if first.out_features != last.in_features:
        raise UnsupportedModelError(
            f"the layers do not chain: Linear({first.in_features}, {first.out_features}) then "
            f"Linear({last.in_features}, {last.out_features})"
        )
    if first.weight.dtype != last.weight.dtype:
        raise UnsupportedModelError(
            f"the two Linear layers have different dtypes ({first.weight.dtype}, "
            f"{last.weight.dtype}); cast the model to one dtype"
        )
    return _build(
        first.weight.detach(),
        None if first.bias is None else first.bias.detach(),
        last.weight.detach(),
        None if last.bias is None else last.bias.detach(),
        float(act.beta),
        float(act.threshold),
    )


def _layout(keys: set[str]) -> tuple[str, str] | None:
    """The Linear layers' key prefixes of a supported state dict, or None."""
    for first, last in (("0", "2"), ("1", "3")):
        required = {f"{first}.weight", f"{last}.weight"}
        optional = {f"{first}.bias", f"{last}.bias"}
        if required <= keys <= required | optional:
            return first, last
    return None


def from_state_dict(
    state: Mapping[str, torch.Tensor],
    beta: float = TORCH_BETA,
    threshold: float = TORCH_THRESHOLD,
    source: str = "state dict",
) -> TorchSoftplusNet:
    """A :class:`TorchSoftplusNet` from the ``state_dict()`` of a supported ``nn.Sequential``
    (keys ``0.weight`` (H, d), ``0.bias`` (H,), ``2.weight`` (K, H), ``2.bias`` (K,), biases
    optional; ``1.*`` and ``3.*`` after a leading ``nn.Flatten``), with the softplus's
    ``beta`` and ``threshold`` (not stored in a state dict). Raises
    :class:`~crosslip.errors.ModelFileError` naming ``source`` for other keys, shapes that
    do not chain, non-float or non-finite weights."""
    keys = set(state)
    layout = _layout(keys)
    if layout is None:
        shown = ", ".join(sorted(keys)[:8]) + (", ..." if len(keys) > 8 else "")
        raise ModelFileError(
            f"{source}: keys {{{shown}}} are not those of a supported network; expected {SUPPORTED}"
        )
    first, last = layout
    t = {k: state[k] for k in keys}
    for k, v in t.items():
        if not v.is_floating_point():
            raise ModelFileError(f"{source}: {k} has dtype {v.dtype}; expected float weights")
        if not torch.isfinite(v).all():
            raise ModelFileError(f"{source}: {k} holds NaN or infinite values")
    U, W = t[f"{first}.weight"], t[f"{last}.weight"]
    b, c = t.get(f"{first}.bias"), t.get(f"{last}.bias")
    shapes = {k: tuple(v.shape) for k, v in t.items()}
    ok = U.ndim == 2 and W.ndim == 2 and W.shape[1] == U.shape[0] and U.shape[0] >= 1
    ok = ok and (b is None or tuple(b.shape) == (U.shape[0],))
    ok = ok and (c is None or tuple(c.shape) == (W.shape[0],))
    if not ok:
        raise ModelFileError(
            f"{source}: shapes {shapes} do not chain as Linear(d, H) -> Linear(H, K) "
            "((H, d), (H,), (K, H), (K,))"
        )
    dtype = torch.float64 if len({v.dtype for v in t.values()}) > 1 else U.dtype
    cast = {k: v.detach().to(device="cpu", dtype=dtype) for k, v in t.items()}
    return _build(
        cast[f"{first}.weight"],
        cast.get(f"{first}.bias"),
        cast[f"{last}.weight"],
        cast.get(f"{last}.bias"),
        float(beta),
        float(threshold),
    )
