"""Models saved with ``torch.export.save`` (``.pt2``; config format ``torch_export``).

``torch.export`` is the format current PyTorch exports models in (TorchScript is
deprecated). An archive holds the program's graph as JSON and its weights as raw tensor
bytes, but the format also allows pickled weights and constants, pickled custom objects, a
fallback to unrestricted unpickling and compiled AOTInductor libraries, all of which run
code when ``torch.export.load`` reads them. :func:`vet_archive` therefore reads the zip
itself first and refuses, with :class:`~crosslip.errors.ModelFileError` naming the file,
anything but the plain layout ``torch.export.save`` writes for a model of tensors:

* one root folder with ``archive_format`` ``pt2`` and ``archive_version``;
* ``models/model.json`` (the graph), ``data/weights/model_weights_config.json`` and
  ``data/constants/model_constants_config.json`` whose every entry has ``use_pickle``
  false (constants: tensors only, no custom or opaque objects), the raw ``weight_*`` and
  ``tensor_*`` payloads they name;
* ``data/sample_inputs/model.pt``, which must load with ``torch.load(weights_only=True)``
  (so that ``torch.export.load``'s own first attempt succeeds and its unrestricted fallback
  never runs);
* optional ``extra/`` text files and ``.data/`` markers.

Then :func:`load_exported` reads the program and looks at its graph:

* a one-hidden-layer softplus network, ``[flatten ->] linear -> softplus(beta, threshold)
  -> linear`` on one input with parameters only, becomes a
  :class:`~crosslip.models.torch_softplus.TorchSoftplusNet` of the same weights, with
  ``beta`` and ``threshold`` read from the graph (a state dict stores neither): it gets
  every guarantee a state dict gets (Proposition 2.3, thresholds accounted for);
* any other program becomes an :class:`ExportedClassifier`: prediction, margin and the
  attacks' upper bounds, no guarantee (null columns, as for TorchScript).
"""

from __future__ import annotations

import io
import json
import math
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelFileError
from .checkpoints import load_error_reason
from .torch_softplus import TORCH_BETA, TORCH_THRESHOLD, from_state_dict

#: What to do, in every refusal.
SAVE_AS = (
    "save the model with torch.export.save(torch.export.export(model, (x,)), path) in "
    "PyTorch >= 2.8 (weights as tensors, no AOTInductor package)"
)
#: The one program of an archive that ``torch.export.load`` returns.
MODEL = "model"
#: Marker files of the archive root that carry no data.
MARKERS = {
    "archive_format",
    "archive_version",
    "byteorder",
    ".data/version",
    ".data/serialization_id",
}


def is_pt2_archive(path: Path | str) -> bool:
    """Whether ``path`` is a zip with a ``<root>/archive_format`` member (a
    ``torch.export.save`` archive; crosslip's own model files and state dicts have none)."""
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.count("/") == 1 and n.endswith("/archive_format") for n in z.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def _config_entries(z: zipfile.ZipFile, name: str, path: Path | str) -> dict[str, Any]:
    """The ``config`` mapping of a weights or constants config JSON member."""
    try:
        cfg = json.loads(z.read(name))["config"]
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelFileError(f"{path}: {name} is not a readable payload config ({exc})") from exc
    if not isinstance(cfg, dict) or not all(isinstance(v, dict) for v in cfg.values()):
        raise ModelFileError(f"{path}: {name} is not a readable payload config")
    return cfg


def vet_archive(path: Path | str) -> None:
    """Refuse (:class:`ModelFileError` naming ``path``) a ``.pt2`` archive that
    ``torch.export.load`` could not read without unpickling objects or loading compiled
    code (module docstring); return if it holds only the graph and plain tensors."""
    if not is_pt2_archive(path):
        raise ModelFileError(f"{path}: not a torch.export archive (.pt2); {SAVE_AS}")
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if not n.endswith("/")]
            roots = {n.split("/", 1)[0] for n in names}
            if len(roots) != 1 or any("/" not in n for n in names):
                raise ModelFileError(f"{path}: not one archive folder (found {sorted(roots)})")
            root = roots.pop() + "/"
            rel = {n[len(root) :]: n for n in names}
            if z.read(root + "archive_format").decode(errors="replace").strip() != "pt2":
                raise ModelFileError(f"{path}: archive_format is not pt2; {SAVE_AS}")
            need = {
                f"models/{MODEL}.json",
                f"data/weights/{MODEL}_weights_config.json",
                f"data/constants/{MODEL}_constants_config.json",
                f"data/sample_inputs/{MODEL}.pt",
                "archive_version",
            }
            if missing := sorted(need - set(rel)):
                raise ModelFileError(f"{path}: missing {', '.join(missing)}; {SAVE_AS}")
            allowed = set(need) | MARKERS
            weights = _config_entries(z, root + f"data/weights/{MODEL}_weights_config.json", path)
            constants = _config_entries(
                z, root + f"data/constants/{MODEL}_constants_config.json", path
            )
            for kind, cfg, prefix in (
                ("weight", weights, "weight_"),
                ("constant", constants, "tensor_"),
            ):
                for fqn, meta in cfg.items():
                    file = str(meta.get("path_name", ""))
                    if meta.get("use_pickle") is not False or not file.startswith(prefix):
                        raise ModelFileError(
                            f"{path}: {kind} {fqn!r} is stored as a pickled object "
                            f"({file or 'no file'}), which would run code when read; {SAVE_AS}"
                        )
                    allowed.add(f"data/{kind}s/{file}")
            other = sorted(r for r in rel if r not in allowed and not r.startswith("extra/"))
            if other:
                raise ModelFileError(
                    f"{path}: holds {', '.join(other[:4])}{', ...' if len(other) > 4 else ''}: "
                    "only the graph and plain tensors are read (no pickles, compiled "
                    f"AOTInductor or other models); {SAVE_AS}"
                )
            sample = z.read(root + f"data/sample_inputs/{MODEL}.pt")
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, OSError, KeyError, EOFError) as exc:
        raise ModelFileError(f"{path}: not a readable .pt2 archive ({exc}); {SAVE_AS}") from exc
    try:
        torch.load(io.BytesIO(sample), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ModelFileError(
            f"{path}: its sample inputs are not plain tensors ({load_error_reason(exc)}); {SAVE_AS}"
        ) from exc
    except (RuntimeError, EOFError, KeyError, ValueError) as exc:
        raise ModelFileError(
            f"{path}: its sample inputs cannot be read ({exc}); {SAVE_AS}"
        ) from exc


def load_program(path: Path | str) -> torch.export.ExportedProgram:
    """The :class:`torch.export.ExportedProgram` of a vetted archive (:func:`vet_archive`)."""
    vet_archive(path)
    try:
        with open(path, "rb") as fh:  # a buffer: no AOTInductor loader, no suffix warning
            return torch.export.load(io.BytesIO(fh.read()))
    except Exception as exc:
        raise ModelFileError(
            f"{path}: the .pt2 archive cannot be loaded ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); {SAVE_AS}"
        ) from exc


def _softplus_state(
    program: torch.export.ExportedProgram,
) -> tuple[dict[str, torch.Tensor], float, float] | None:
    """The state dict (keys ``0.*``, ``2.*`` of :func:`~crosslip.models.torch_softplus.
    from_state_dict`), ``beta`` and ``threshold`` of a program whose graph is exactly
    ``[flatten(x, 1) ->] linear(x, U, b?) -> softplus(z, beta, threshold) -> linear(h, W,
    c?)`` on one user input with parameters only; None for any other graph."""
    sig = program.graph_signature
    params = dict(sig.inputs_to_parameters)
    if sig.inputs_to_buffers or sig.inputs_to_lifted_tensor_constants or len(sig.user_inputs) != 1:
        return None
    aten = torch.ops.aten
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    outputs = [n for n in program.graph.nodes if n.op == "output"]
    prev = next(n for n in program.graph.nodes if n.name == sig.user_inputs[0])
    if calls and calls[0].target == aten.flatten.using_ints:
        f = calls[0]
        if f.args[:1] != (prev,) or tuple(f.args[1:]) + (-1,) * (3 - len(f.args)) != (1, -1):
            return None
        prev, calls = f, calls[1:]
    kinds = [aten.linear.default, aten.softplus.default, aten.linear.default]
    if [n.target for n in calls] != kinds or calls[0].kwargs or calls[2].kwargs:
        return None
    first, act, last = calls
    if first.args[0] is not prev or act.args[0] is not first or last.args[0] is not act:
        return None
    if len(outputs) != 1 or outputs[0].args[0] not in ((last,), [last], last):
        return None
    state: dict[str, torch.Tensor] = {}
    for layer, node in (("0", first), ("2", last)):
        names = ["weight", "bias"][: len(node.args) - 1]
        for key, arg in zip(names, node.args[1:], strict=True):
            if arg is None:
                continue
            if getattr(arg, "op", None) != "placeholder" or arg.name not in params:
                return None
            state[f"{layer}.{key}"] = program.state_dict[params[arg.name]].detach()
    extra = dict(zip(("beta", "threshold"), act.args[1:], strict=False)) | act.kwargs
    beta, threshold = extra.get("beta", TORCH_BETA), extra.get("threshold", TORCH_THRESHOLD)
    if not all(isinstance(v, int | float) for v in (beta, threshold)):
        return None
    return state, float(beta), float(threshold)


class ExportedClassifier(nn.Module):
    """Any other exported classifier: ``forward`` runs the program (upper bounds only).

    An exported program accepts only the batch sizes its export allowed (one fixed size
    unless exported with a dynamic first dimension; dynamic sizes start at 2). ``forward``
    (n, d) -> (n, K) splits and pads (with copies of a batch's last row) to sizes the
    program takes, so the attacks can pass any batch. ``hyper`` names ``in_dim`` and
    ``num_classes`` where the program's shapes give them."""

    def __init__(self, program: torch.export.ExportedProgram) -> None:
        super().__init__()
        self.program = program.module()
        user = program.graph_signature.user_inputs
        node = next(n for n in program.graph.nodes if n.name == user[0]) if user else None
        val = node.meta.get("val") if node is not None else None
        self.lo, self.hi = 1, math.inf
        self.hyper: dict[str, int] = {}
        if isinstance(val, torch.Tensor) and val.ndim == 2:
            n, d = val.shape
            if isinstance(d, int):
                self.hyper["in_dim"] = d
            if isinstance(n, int):
                self.lo = self.hi = n
            else:
                rng = program.range_constraints.get(n.node.expr)
                if rng is not None:
                    up = rng.upper  # an int or torch's symbolic infinity
                    self.lo = max(1, int(rng.lower))
                    self.hi = int(up) if getattr(up, "is_Integer", False) else math.inf
        out = next(n for n in program.graph.nodes if n.op == "output").args[0]
        out = out[0] if isinstance(out, tuple | list) and len(out) == 1 else out
        oval = getattr(out, "meta", {}).get("val")
        if isinstance(oval, torch.Tensor) and oval.ndim == 2 and isinstance(oval.shape[1], int):
            self.hyper["num_classes"] = oval.shape[1]

    def train(self, mode: bool = True) -> ExportedClassifier:
        """Sets the flag only: an exported program has no train mode (it runs as exported,
        and refuses ``train()``), so this classifier is in eval mode whatever it says."""
        self.training = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores (n, K) of the program for inputs ``x`` (n, d)."""
        step = len(x) if self.hi == math.inf else int(self.hi)
        parts = []
        for chunk in x.split(max(step, 1)):
            m = len(chunk)
            if m < self.lo:
                chunk = torch.cat([chunk, chunk[-1:].expand(self.lo - m, *chunk.shape[1:])])
            parts.append(self.program(chunk)[:m])
        return torch.cat(parts)


def load_exported(path: Path | str) -> nn.Module:
    """The model of a ``.pt2`` archive (module docstring): a
    :class:`~crosslip.models.torch_softplus.TorchSoftplusNet` where the graph is a supported
    softplus network, else an :class:`ExportedClassifier`; eval mode, CPU."""
    program = load_program(path)
    found = _softplus_state(program)
    if found is not None:
        state, beta, threshold = found
        return from_state_dict(state, beta=beta, threshold=threshold, source=str(path))
    return ExportedClassifier(program).eval()
