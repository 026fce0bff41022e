"""Saving and loading trained classifiers as weights-only files.

A model file is a ``torch.save`` of a plain dict: ``format`` (a tag of :data:`FORMATS`),
``hyper`` (the constructor arguments, JSON), ``meta`` (JSON) and ``state_dict`` (tensors).
:func:`load_model` reads it with ``weights_only=True``, so a file cannot run code, and rebuilds
the module from its tag: :class:`~crosslip.models.SoftplusNet`,
:class:`~crosslip.models.kernels.GaussianKernelModel`, :class:`~crosslip.models.resnet.ResNet` or
:class:`~crosslip.models.torch_softplus.TorchSoftplusNet` (a network trained elsewhere).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelFileError
from ..io.files import atomic_path
from .kernels import GaussianKernelModel
from .resnet import ResNet
from .softplus_net import SoftplusNet
from .torch_softplus import TorchSoftplusNet


def _kernel_model(h: dict[str, Any]) -> GaussianKernelModel:
    centers = torch.zeros(h["n_centers"], h["in_dim"])  # the saved state fills them in
    # (on the device load_model builds the module on)
    return GaussianKernelModel(centers, h["num_classes"], h["gamma"])


def _resnet(h: dict[str, Any]) -> ResNet:
    return ResNet(**{**h, "shape": tuple(h["shape"])})


#: Weights-only file formats: format tag -> how to rebuild the module from ``hyper``.
FORMATS: dict[str, Callable[[dict[str, Any]], nn.Module]] = {
    "crosslip.SoftplusNet/1": lambda h: SoftplusNet(**h),
    "crosslip.GaussianKernelModel/1": _kernel_model,
    "crosslip.ResNet/1": _resnet,
    "crosslip.TorchSoftplusNet/1": lambda h: TorchSoftplusNet(**h),
}


def _format_of(model: nn.Module) -> str:
    tag = f"crosslip.{type(model).__name__}/1"
    if tag not in FORMATS:
        raise TypeError(f"cannot save a {type(model).__name__}: known formats {list(FORMATS)}")
    return tag


#: Paragraphs of torch's refusal that are advice for torch's users, not the reason; the
#: first even suggests loading with ``weights_only=False``, which would run the file's code.
_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def load_error_reason(exc: BaseException) -> str:
    """The reason in a torch loading error, in one line."""
    lines = [line.strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith(_TORCH_ADVICE)]
    return " ".join(kept or [line for line in lines if line][:1])


def save_model(model: nn.Module, path: Path | str, meta: dict[str, Any] | None = None) -> None:
    """Save weights and constructor arguments, atomically; loadable with ``weights_only``.
    Works for the classes of :data:`FORMATS` (``TypeError`` for any other module)."""
    payload = {
        "format": _format_of(model),
        "hyper": json.dumps(model.hyper),
        "meta": json.dumps(meta or {}),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_model(path: Path | str, map_location: str | torch.device = "cpu") -> nn.Module:
    """Load a model written by :func:`save_model` without unpickling arbitrary objects, in
    eval mode and in the dtype it was saved in (an external model stored in its own format:
    :func:`crosslip.models.external.load_stored`).

    Raises :class:`~crosslip.errors.ModelFileError` naming ``path`` for a file that would
    run code, is damaged, or is not a crosslip model file."""
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ModelFileError(
            f"{path}: refused to load (not a plain weights file; it may contain code): "
            f"{load_error_reason(exc)}"
        ) from exc
    except (RuntimeError, EOFError, KeyError) as exc:  # truncated, empty or not a torch file
        raise ModelFileError(
            f"{path}: not a readable model file ({type(exc).__name__}: {load_error_reason(exc)}); "
            "delete it and let the train job write it again"
        ) from exc
    if not isinstance(payload, dict) or payload.get("format") not in FORMATS:
        raise ModelFileError(f"{path}: not a crosslip model file (known formats: {list(FORMATS)})")
    with torch.device(map_location):  # built where its weights are, whatever the default
        model = FORMATS[payload["format"]](json.loads(payload["hyper"]))
    state = payload["state_dict"]
    model = model.to(dtype=next(iter(state.values())).dtype)
    model.load_state_dict(state)
    return model.eval()
