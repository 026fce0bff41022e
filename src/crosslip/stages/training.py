"""The training stage: one grid point (a net by SGD or a kernel model by L-BFGS), or several
networks of one setting in one job (batched on CUDA: :mod:`crosslip.training.grid`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..config.specs import NetTrainSpec
from ..data import load_prepared
from ..device import check_device_memory, resolve_device
from ..families import KERNEL_REGULARIZERS
from ..io.files import write_json
from ..io.logs import about_model
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
    if params["regularizer"] in KERNEL_REGULARIZERS:
        dev = resolve_device(device)
        check_device_memory(dev, memory_gb)
        res = train_kernel(KernelTrainConfig(**params), ds, device=dev, memory_gb=memory_gb)
    else:
        res = train(TrainConfig(**params), ds, device=resolve_device(device))
    return _write(res, ds.name, model_id, model_out, metrics_out, code)


def train_grid_stage(
    data: Path | str,
    specs: Mapping[str, NetTrainSpec],
    outputs: Mapping[str, tuple[Path | str, Path | str]],
    device: str = "auto",
    code: str | None = None,
    batched: bool | None = None,
) -> dict[str, dict[str, Any]]:
    """Train the networks ``specs`` (model id -> spec; they share everything but the
    regularizer, lambda, dropout and learning rate) in one job and write each one's model
    and metrics to ``outputs[model_id] = (model file, metrics file)``, as :func:`train_stage`
    would; the metrics add ``grid_models``, the ids trained in the job, and ``grid_batched``,
    whether as one batched model (``grid_networks``: how many networks that model had, 1
    when trained alone). Returns the metrics by id.

    ``batched`` (None: the faster way on the device, :func:`batched_on`): True trains them as
    one batched model (:func:`crosslip.training.grid.train_grid`), False one after another
    with the single-model trainer (:func:`crosslip.training.single.train`). Both train the
    same networks (``tests/test_train_grid.py``: to 1e-10 in float64; dropout under the same
    masks, since each way draws its own), and neither depends on the other networks of the
    job, so a network comes out as it would in any batch on that device."""
    ds = load_prepared(data)
    ids = list(specs)
    dev = resolve_device(device)
    if batched is None:
        batched = batched_on(dev)
    if batched:
        results = train_grid([specs[m] for m in ids], ds, device=dev, tags=ids)
    else:
        results = []
        for model_id in ids:
            with about_model(model_id):  # its lines go to its own log file
                results.append(train(specs[model_id], ds, device=dev))
    written = {}
    for model_id, res in zip(ids, results, strict=True):
        res.metrics["grid_models"] = ids
        res.metrics["grid_batched"] = batched
        if not batched:  # trained alone: as train_grid says of a batch (its size, no graph)
            res.metrics.update(grid_networks=1, cuda_graph=False)
        written[model_id] = _write(res, ds.name, model_id, *outputs[model_id], code)
    return written


def batched_on(device: torch.device) -> bool:
    """Whether a grid trains faster as one batched model than one network after another on
    ``device``: on CUDA, where one batched step keeps the GPU busy (``bench_grid``: x1.9 at
    G = 1, x6.0 at G = 8, x6.9 at G = 26 on an H100), not on the CPU, where the batched
    products run at a lower rate than the plain ones (x0.81-0.87 on a 2-core AMD EPYC:
    docs/architecture.md, "Batched on CUDA only")."""
    return device.type == "cuda"
