"""The import stage of a model trained elsewhere: read, check against its dataset, store.

The stored ``model.pt`` and ``metrics.json`` take the place of a training job's, so the
certify, attack and instances stages treat the model as any other (family ``external``).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import torch

from ..data import load_prepared
from ..device import host_tensor
from ..errors import ModelFileError
from ..families import EXTERNAL
from ..io.files import atomic_path, sha256_of, write_json
from ..models.checkpoints import save_model
from ..models.exported import ExportedClassifier
from ..models.external import guarantees_of, load_external, model_format
from ..models.torch_softplus import TorchSoftplusNet


@torch.no_grad()
def _test_predictions(model: torch.nn.Module, x: torch.Tensor, source: str) -> torch.Tensor:
    """The model's classes for the test points ``x`` (n, d), float64, batches of 512."""
    model = copy.deepcopy(model).to(torch.float64)
    preds = []
    for i in range(0, len(x), 512):
        try:
            out = model(x[i : i + 512].to(torch.float64))
        except RuntimeError as exc:
            raise ModelFileError(
                f"{source}: the model fails on the dataset's test images as flat float64 "
                f"vectors (n, {x.shape[1]}): {str(exc).splitlines()[0]}"
            ) from exc
        if not isinstance(out, torch.Tensor) or out.shape[:1] != (len(x[i : i + 512]),):
            raise ModelFileError(
                f"{source}: the model's output is not a tensor (n, K) of class scores"
            )
        preds.append(out)
    logits = torch.cat(preds)
    if not torch.isfinite(logits).all():
        raise ModelFileError(f"{source}: the model gives NaN or infinite scores on test images")
    return logits


def import_model_stage(
    data: Path | str,
    entry: dict[str, Any],
    model_out: Path | str,
    metrics_out: Path | str,
) -> dict[str, Any]:
    """Read the external model of config entry ``entry`` (:func:`crosslip.models.external.
    load_external`), check that it takes the dataset's flat test images (n, d) and returns
    one score per class (n, K), and write it as ``model_out`` (crosslip's weights-only file;
    a TorchScript module as TorchScript, an exported program other than a softplus net as
    its vetted ``.pt2`` archive) with ``metrics_out`` (its test error on the whole
    test set, family ``external``). Raises :class:`~crosslip.errors.ModelFileError` naming
    the file for a model that does not fit the dataset."""
    source = str(entry["path"])
    model = load_external(entry)
    ds = load_prepared(data)
    x = host_tensor(ds.x_test)
    d, k = ds.dim, ds.num_classes
    shape_note = f"dataset {ds.name}: d = {d} ({'x'.join(map(str, ds.shape))}), K = {k}"
    hyper = getattr(model, "hyper", {})
    if hyper.get("in_dim", d) != d or hyper.get("num_classes", k) != k:
        raise ModelFileError(
            f"{source}: the model maps {hyper['in_dim']} inputs to {hyper['num_classes']} "
            f"classes, but {shape_note}"
        )
    logits = _test_predictions(model, x, source)
    if logits.ndim != 2 or logits.shape[1] != k:
        raise ModelFileError(
            f"{source}: the model returns scores of shape {tuple(logits.shape[1:])} per "
            f"image; {shape_note}"
        )
    y = host_tensor(ds.y_test)
    test_error = float((logits.argmax(1) != y).double().mean())
    fmt = model_format(entry)
    if fmt == "torchscript":
        with atomic_path(model_out) as tmp:
            torch.jit.save(model, str(tmp))
    elif isinstance(model, ExportedClassifier):  # the vetted archive itself
        with atomic_path(model_out) as tmp:
            shutil.copyfile(entry["path"], tmp)
    else:
        save_model(model, model_out, meta={"dataset": ds.name, "status": "ok", "format": fmt})
    config = {
        "family": EXTERNAL,
        "regularizer": EXTERNAL,
        "format": fmt,
        "path": source,
        "sha256": sha256_of(entry["path"]),
        "guarantees": guarantees_of(model),
        **(
            {"beta": model.alpha, "threshold": model.threshold}
            if isinstance(model, TorchSoftplusNet)
            else {}
        ),
    }
    metrics = {
        "status": "ok",
        "test_error": test_error,
        "dataset": ds.name,
        "model_id": entry["name"],
        "config": config,
    }
    write_json(metrics, metrics_out)
    return metrics
