"""The training stage: one grid point (a net by SGD or a kernel model by L-BFGS), or several
networks of one setting trained as one batched model (:mod:`crosslip.training.grid`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config.specs import NetTrainSpec
from ..data import load_prepared
from ..device import check_device_memory, resolve_device
from ..families import KERNEL_REGULARIZERS
from ..io import write_json
from ..models.checkpoints import save_model
from ..training.core import TrainConfig, TrainResult
from ..training.grid import train_grid
from ..training.kernel import KernelTrainConfig, train_kernel
from ..training.single import train


def _write(
    res: TrainResult,
    dataset: str,
    model_id: str,
    model_out: Path | str,
    metrics_out: Path | str,
    code: str | None,
) -> dict[str, Any]:
    res.metrics["dataset"] = dataset
    res.metrics["model_id"] = model_id
    if code is not None:  # the code digest it was trained with (crosslip.jobs.batches)
        res.metrics["code"] = code
    save_model(res.model, model_out, meta={"dataset": dataset, "status": res.metrics["status"]})
    write_json(res.metrics, metrics_out)
    return res.metrics


def train_stage(
    data: Path | str,
    params: dict[str, Any],
    model_id: str,
    model_out: Path | str,
    metrics_out: Path | str,
    device: str = "auto",
    memory_gb: float | None = None,
    code: str | None = None,
    grid: bool = False,
) -> dict[str, Any]:
    """Train one grid point (a net by SGD or a kernel model by L-BFGS, within ``memory_gb``
    GiB of its device: config ``kernel.memory_gb``); write the model (weights-only file) and
    its metrics JSON (with ``code``, the job's code digest, where given). ``grid`` (config
    ``train.batch_grid``): a one-hidden-layer network trains as a grid of one
    (:func:`train_grid_stage`), so that it comes out as it would in any batch."""
    if grid and params["regularizer"] not in KERNEL_REGULARIZERS:
        spec = TrainConfig(**params)
        if spec.arch == "mlp":
            return train_grid_stage(
                data,
                {model_id: spec},
                {model_id: (model_out, metrics_out)},
                device=device,
                code=code,
            )[model_id]
    ds = load_prepared(data)
    args = (ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes)
    if params["regularizer"] in KERNEL_REGULARIZERS:
        dev = resolve_device(device)
        check_device_memory(dev, memory_gb)
        res = train_kernel(KernelTrainConfig(**params), *args, device=dev, memory_gb=memory_gb)
    else:
        cfg = TrainConfig(**params)
        res = train(cfg, *args, device=resolve_device(device), shape=ds.shape)
    return _write(res, ds.name, model_id, model_out, metrics_out, code)


def train_grid_stage(
    data: Path | str,
    specs: Mapping[str, NetTrainSpec],
    outputs: Mapping[str, tuple[Path | str, Path | str]],
    device: str = "auto",
    code: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Train the networks ``specs`` (model id -> spec; they share everything but the
    regularizer, lambda, dropout and learning rate) as one batched model
    (:func:`crosslip.training.grid.train_grid`) and write each one's model and metrics to
    ``outputs[model_id] = (model file, metrics file)``, as :func:`train_stage` would; the
    metrics add ``grid_models``, the ids trained together. Returns the metrics by id."""
    ds = load_prepared(data)
    ids = list(specs)
    results = train_grid(
        [specs[m] for m in ids],
        ds.x_train,
        ds.y_train,
        ds.x_test,
        ds.y_test,
        ds.num_classes,
        device=resolve_device(device),
        shape=ds.shape,
        tags=ids,
    )
    written = {}
    for model_id, res in zip(ids, results, strict=True):
        res.metrics["grid_models"] = ids
        written[model_id] = _write(res, ds.name, model_id, *outputs[model_id], code)
    return written
