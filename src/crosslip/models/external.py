"""Models trained elsewhere: reading their files without running code from them.

Five formats (config ``external_models[].format``; docs/your-own-models.md):

* ``state_dict``: ``torch.save(model.state_dict(), path)`` of a supported one-hidden-layer
  softplus network (:data:`crosslip.models.torch_softplus.SUPPORTED`), read with
  ``torch.load(weights_only=True)`` and required to be a flat mapping ``str -> Tensor``;
  ``beta`` and ``threshold`` of its ``nn.Softplus`` come from the config entry (PyTorch's
  defaults 1 and 20). Certified for the function it computes (Proposition 2.3, thresholds
  accounted for: :mod:`crosslip.certify.engine`).
* ``kernel_npz``: a Gaussian-kernel expansion ``f_j(x) = sum_r coef[j, r] exp(-gamma ||x -
  centers[r]||^2)`` (Section 2.2) as an ``.npz`` of plain arrays ``centers`` (n, d),
  ``coef`` (K, n) and the scalar ``gamma`` (:class:`~crosslip.models.kernels.GaussianKernelModel`),
  read with ``allow_pickle=False``. Certified with Proposition 2.2.
* ``torch_export``: a program saved with ``torch.export.save`` (``.pt2``), vetted before
  it is read (:mod:`crosslip.models.exported`): a one-hidden-layer softplus graph is
  certified as its state dict would be (``beta`` and ``threshold`` from the graph), any
  other classifier gets upper bounds only.
* ``crosslip``: a model file that crosslip wrote (``results/models/<dataset>/<model>/model.pt``,
  :func:`~crosslip.models.checkpoints.save_model`: weights and constructor arguments, read
  with ``weights_only``): certified as crosslip certifies the model it trained, e.g. to
  certify again the weights of a committed run.
* ``torchscript``: any other ``nn.Module`` saved with ``torch.jit.save``, read with
  ``torch.jit.load``. Upper bounds (attacks) only: crosslip has no guarantee for an
  arbitrary network, so its guarantee columns stay empty (null, not 0).

Everything else is refused with :class:`~crosslip.errors.ModelFileError` naming the file: a
pickled module or any pickle with objects, a TorchScript archive given as a state dict,
nested or non-tensor entries, garbage bytes, object arrays in an ``.npz``.
"""

from __future__ import annotations

import pickle
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config.validate import MODEL_SUFFIX_FORMATS
from ..errors import ModelFileError
from ..io.files import read_npz_array, sha256_of
from .checkpoints import load_error_reason, load_model
from .exported import is_pt2_archive, load_exported
from .kernels import GaussianKernelModel
from .softplus_net import SoftplusNet
from .torch_softplus import TORCH_BETA, TORCH_THRESHOLD, TorchSoftplusNet, from_state_dict

#: The formats of :func:`load_external`.
FORMATS = ("state_dict", "kernel_npz", "torch_export", "crosslip", "torchscript")
#: File endings that imply a format when the config entry names none.
SUFFIX_FORMATS = MODEL_SUFFIX_FORMATS


def model_format(entry: Mapping[str, Any]) -> str:
    """The format of a config entry: its ``format``, else implied by the file ending
    (:data:`SUFFIX_FORMATS`); raises :class:`ModelFileError` when neither says."""
    if entry.get("format"):
        return str(entry["format"])
    suffix = Path(entry["path"]).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        raise ModelFileError(
            f"{entry['path']}: cannot tell the model format from the ending {suffix!r}; "
            f"give format: one of {', '.join(FORMATS)}"
        )
    return SUFFIX_FORMATS[suffix]


def is_torchscript(path: Path | str) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip with ``code/`` or
    ``constants.pkl``, which ``torch.save`` archives do not have)."""
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return any("/code/" in n or n.endswith("/constants.pkl") for n in names)


def load_state_dict_file(path: Path | str) -> dict[str, torch.Tensor]:
    """A flat ``{name: Tensor}`` from ``torch.save(model.state_dict(), path)``, read with
    ``weights_only=True`` (no code runs); raises :class:`ModelFileError` naming ``path``
    for anything else."""
    if is_torchscript(path):
        raise ModelFileError(
            f"{path}: a TorchScript archive, not a state dict; for upper bounds (attacks) "
            "only declare format: torchscript, for guarantees save model.state_dict() of a "
            "supported network with torch.save"
        )
    if is_pt2_archive(path):
        raise ModelFileError(
            f"{path}: a torch.export archive (.pt2), not a state dict; declare format: torch_export"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ModelFileError(
            f"{path}: refused to load (not plain tensors; it may contain code or objects: "
            f"{load_error_reason(exc)}); save model.state_dict() with torch.save"
        ) from exc
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as exc:
        raise ModelFileError(
            f"{path}: not a readable PyTorch file ({type(exc).__name__}: "
            f"{load_error_reason(exc)}); save model.state_dict() with torch.save"
        ) from exc
    if not isinstance(state, Mapping):
        raise ModelFileError(
            f"{path}: holds a {type(state).__name__}, not a state dict; save "
            "model.state_dict() with torch.save"
        )
    bad = [
        str(k)
        for k, v in state.items()
        if not isinstance(k, str) or not isinstance(v, torch.Tensor)
    ]
    if bad:
        raise ModelFileError(
            f"{path}: not a flat state dict of tensors (entries {bad[:5]} are not name -> "
            "tensor); save model.state_dict() of the network itself"
        )
    return dict(state)


def load_kernel_npz(path: Path | str) -> GaussianKernelModel:
    """A :class:`~crosslip.models.kernels.GaussianKernelModel` (float64) from an ``.npz`` with
    ``centers`` (n, d), ``coef`` (K, n) and scalar ``gamma > 0`` (``allow_pickle=False``)."""
    if not zipfile.is_zipfile(path):
        raise ModelFileError(
            f"{path}: not a readable .npz (not a zip archive of arrays); save the arrays with "
            "numpy.savez"
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("centers", "coef", "gamma") if k not in z.files]
            if missing:
                raise ModelFileError(
                    f"{path}: missing arrays {missing} (has {sorted(z.files)}); a kernel model "
                    "holds centers (n, d), coef (K, n) and gamma (a scalar)"
                )
            arrays = {
                k: read_npz_array(z, k, path, ModelFileError, "Save numeric arrays only")
                for k in ("centers", "coef", "gamma")
            }
    except ModelFileError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ModelFileError(f"{path}: not a readable .npz ({exc})") from exc
    centers, coef, gamma = arrays["centers"], arrays["coef"], arrays["gamma"]
    for name, a in arrays.items():
        if a.dtype.kind not in "fiu":
            raise ModelFileError(f"{path}: {name} has dtype {a.dtype}; expected numbers")
        if not np.isfinite(a).all():
            raise ModelFileError(f"{path}: {name} holds NaN or infinite values")
    if centers.ndim != 2 or coef.ndim != 2 or coef.shape[1] != centers.shape[0]:
        raise ModelFileError(
            f"{path}: centers {centers.shape} and coef {coef.shape} do not fit; expected "
            "centers (n, d) and coef (K, n)"
        )
    if gamma.size != 1 or not float(gamma.reshape(())) > 0:
        raise ModelFileError(f"{path}: gamma must be one positive number, got {gamma!r}")
    model = GaussianKernelModel(
        torch.from_numpy(centers).to(torch.float64), coef.shape[0], float(gamma.reshape(()))
    )
    with torch.no_grad():
        model.coef.copy_(torch.from_numpy(coef))
    return model.eval()


def load_torchscript(path: Path | str) -> nn.Module:
    """A module saved by ``torch.jit.save`` (on the CPU, eval mode)."""
    if not is_torchscript(path):
        raise ModelFileError(
            f"{path}: not a TorchScript archive (save the module with "
            "torch.jit.save(torch.jit.script(model), path))"
        )
    try:
        return torch.jit.load(str(path), map_location="cpu").eval()
    except (RuntimeError, ValueError, OSError) as exc:
        raise ModelFileError(f"{path}: TorchScript archive cannot be loaded ({exc})") from exc


def load_external(entry: Mapping[str, Any]) -> nn.Module:
    """The model of a config entry of ``external_models`` (``path``, optional ``format``,
    ``beta``, ``threshold``, ``sha256``), checksum verified first; eval mode, CPU."""
    path = Path(entry["path"]).expanduser()
    if not path.is_file():
        raise ModelFileError(f"{path}: model file not found (external model {entry['name']})")
    digest = entry.get("sha256")
    if digest:
        got = sha256_of(path)
        if got != str(digest).lower():
            raise ModelFileError(
                f"{path}: SHA-256 mismatch (the file has {got[:12]}..., the config says "
                f"{str(digest)[:12]}...): the file changed or is damaged"
            )
    fmt = model_format(entry)
    if fmt == "state_dict":
        return from_state_dict(
            load_state_dict_file(path),
            beta=float(entry.get("beta", TORCH_BETA)),
            threshold=float(entry.get("threshold", TORCH_THRESHOLD)),
            source=str(path),
        )
    if fmt == "kernel_npz":
        return load_kernel_npz(path)
    if fmt == "torch_export":
        return load_exported(path)
    if fmt == "crosslip":
        return load_model(path)
    if fmt == "torchscript":
        return load_torchscript(path)
    raise ModelFileError(f"{path}: unknown model format {fmt!r}; allowed: {', '.join(FORMATS)}")


def load_stored(path: Path | str, fmt: str | None = None) -> nn.Module:
    """A model file of the workflow: ``fmt`` is the format of an imported external model
    (its metrics' ``config.format``; None for a model crosslip trained). The import job
    stores a TorchScript module as TorchScript, an exported program that is not a softplus
    net as its vetted ``.pt2`` archive, everything else in crosslip's weights-only format
    (:func:`~crosslip.models.checkpoints.load_model`). Eval mode, CPU."""
    if fmt == "torchscript":
        return load_torchscript(path)
    if fmt == "torch_export" and is_pt2_archive(path):
        return load_exported(path)
    return load_model(path)


def guarantees_of(model: nn.Module) -> str:
    """What crosslip certifies for a loaded external model, in words (for metrics)."""
    if isinstance(model, TorchSoftplusNet):
        return "prop2.3 (PyTorch softplus threshold accounted for)"
    if isinstance(model, SoftplusNet):
        return "prop2.3 and every certificate beyond the paper"
    if isinstance(model, GaussianKernelModel):
        return "prop2.2"
    return "none (upper bounds only)"
