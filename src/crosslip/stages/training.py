"""The training stage: one grid point, a network by SGD or a kernel model by L-BFGS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoints import save_model
from ..data import load_prepared
from ..device import check_device_memory, resolve_device
from ..families import KERNEL_REGULARIZERS
from ..io import write_json
from ..kernel_train import KernelTrainConfig, train_kernel
from ..train import TrainConfig, train


def train_stage(
    data: Path | str,
    params: dict[str, Any],
    model_id: str,
    model_out: Path | str,
    metrics_out: Path | str,
    device: str = "auto",
    memory_gb: float | None = None,
) -> dict[str, Any]:
    """Train one grid point (a net by SGD or a kernel model by L-BFGS, within ``memory_gb``
    GiB of its device: config ``kernel.memory_gb``); write the model (weights-only file) and
    its metrics JSON."""
    ds = load_prepared(data)
    args = (ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes)
    if params["regularizer"] in KERNEL_REGULARIZERS:
        dev = resolve_device(device)
        check_device_memory(dev, memory_gb)
        res = train_kernel(KernelTrainConfig(**params), *args, device=dev, memory_gb=memory_gb)
    else:
        cfg = TrainConfig(**params)
        res = train(cfg, *args, device=resolve_device(device), shape=ds.shape)
    res.metrics["dataset"] = ds.name
    res.metrics["model_id"] = model_id
    save_model(res.model, model_out, meta={"dataset": ds.name, "status": res.metrics["status"]})
    write_json(res.metrics, metrics_out)
    return res.metrics
