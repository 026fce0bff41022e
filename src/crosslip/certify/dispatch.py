"""One entry point for the guarantees of any classifier: :func:`certify`.

The bounds that Theorem 2.1 can use depend on the model's kind:

* :class:`~crosslip.models.kernels.GaussianKernelModel`: the local L2 guarantee of Proposition 2.2
  (:func:`.kernel_bounds.certify_kernel`), the only L2 bound implemented for it, so also
  reported as ``guarantee_l2``; ``local_bound = "prop2.2"``.
* :class:`~crosslip.models.SoftplusNet`: the kinds of :data:`.engine.KINDS` (local L2 of
  Proposition 2.3, global L2, tightest L2, L1, Linf, box-constrained, and per norm the
  linear relaxation, curvature and integrated certificates with the best of all;
  :func:`.engine.certify_softplus`); ``local_bound = "prop2.3"``.
* a plain ``nn.Sequential([nn.Flatten(),] nn.Linear, nn.Softplus, nn.Linear)`` built and
  trained elsewhere: converted to a :class:`~crosslip.models.torch_softplus.TorchSoftplusNet`
  (the same function, PyTorch's softplus threshold included) and certified like the
  one-hidden-layer net, for the function it computes (:mod:`.engine`); any other
  ``nn.Sequential`` is refused with :class:`~crosslip.errors.UnsupportedModelError`, which
  lists the supported shapes.
* any other ``nn.Module`` (the ResNets, TorchScript modules): prediction and margin only,
  as no sound bound is implemented for it (the paper reports upper bounds only);
  ``local_bound = "none"``.

Another kind of model gets its bounds by registering a function with
:func:`certify_model` (``@certify_model.register``), without touching the callers.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..models import SoftplusNet
from ..models.kernels import GaussianKernelModel
from ..models.torch_softplus import from_sequential
from .engine import KINDS, certify_softplus
from .kernel_bounds import certify_kernel
from .search import margins
from .settings import CertifySettings, settings_with


@dataclass(frozen=True)
class Certification:
    """The guarantees of one model at a batch of points.

    ``columns``: per-point CPU tensors of shape (n,) named as the results' columns
    (:data:`crosslip.results_schema.CERTIFY_COLUMNS`; always ``pred`` and ``margin``, the
    guarantees a model kind has, plus diagnostics such as ``evaluations``).
    ``local_bound``: which bound gave ``guarantee_local`` (``"prop2.3"``, ``"prop2.2"``),
    ``"none"`` for a model without one, ``None`` where the local guarantee was not requested.
    """

    columns: dict[str, torch.Tensor]
    local_bound: str | None


def certify(
    model: nn.Module, x: torch.Tensor, settings: CertifySettings | None = None, **changes: Any
) -> Certification:
    """Guarantees (Theorem 2.1 and the certificates beyond it) of ``model`` at the points
    ``x`` (n, d), chosen by the model's kind (see the module docstring). ``settings``
    (default: the schema's; keyword ``changes`` of its fields apply on top): ``kinds``
    selects among :data:`~crosslip.certify.engine.KINDS` where the model has several, and
    must name known kinds for every model; ``rtol`` is the searches' relative tolerance;
    ``memory_gb`` the budget of a Gaussian-kernel model's bound
    (:func:`.kernel_bounds.plan_for`); ``tangent_steps``, ``integration_nodes`` and
    ``trust_region_steps`` those of the one-hidden-layer nets
    (:func:`.engine.certify_softplus`). Computed in float64 on ``x``'s device; results on
    the CPU. ``model`` is not modified."""
    settings = settings_with(settings, changes)
    unknown = sorted(set(settings.kinds) - set(KINDS))
    if unknown:
        raise ConfigError(f"unknown guarantee kinds {unknown}; choose from {', '.join(KINDS)}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"certify needs a torch.nn.Module, got {type(model).__name__}")
    if x.ndim != 2:
        raise ValueError(f"x must have shape (n, d), got {tuple(x.shape)}")
    return certify_model(model, x, settings)


@functools.singledispatch
def certify_model(model: nn.Module, x: torch.Tensor, settings: CertifySettings) -> Certification:
    """Any other classifier: its prediction ``c`` and margin ``f_c - max_{j != c} f_j``
    (float64, batches of 256 points), no guarantee."""
    net = copy.deepcopy(model).to(device=x.device, dtype=torch.float64).eval()
    preds, margin = [], []
    with torch.no_grad():
        for i in range(0, max(len(x), 1), 256):
            logits = net(x[i : i + 256].to(torch.float64))
            pred = logits.argmax(1)
            preds.append(pred.cpu())
            margin.append(margins(logits, pred).min(1).values.cpu())
    columns = {"pred": torch.cat(preds), "margin": torch.cat(margin)}
    return Certification(columns, "none")


@certify_model.register
def _certify_kernel_model(
    model: GaussianKernelModel, x: torch.Tensor, settings: CertifySettings
) -> Certification:
    # Proposition 2.2, the only L2 bound, on x's device within the budget
    columns = certify_kernel(
        model, x, rtol=settings.rtol, memory_gb=settings.memory_gb, device=x.device
    )
    columns["guarantee_l2"] = columns["guarantee_local"]
    return Certification(columns, "prop2.2")


@certify_model.register
def _certify_softplus_net(
    model: SoftplusNet, x: torch.Tensor, settings: CertifySettings
) -> Certification:
    columns = certify_softplus(model, x, settings)
    return Certification(columns, "prop2.3" if "guarantee_local" in columns else None)


@certify_model.register
def _certify_sequential(
    model: nn.Sequential, x: torch.Tensor, settings: CertifySettings
) -> Certification:
    net = from_sequential(model).to(x.device)
    return _certify_softplus_net(net, x, settings)
