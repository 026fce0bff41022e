"""The workflow's stages as plain functions (the Snakemake scripts only call these).

Each stage reads files, calls the maths in :mod:`crosslip.certify`, :mod:`crosslip.attacks`
and :mod:`crosslip.train`, and writes its outputs atomically.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from .attacks import upper_bound_l2
from .certify import KINDS, certify_kernel, certify_softplus
from .data import load_dataset, load_prepared, save_prepared
from .device import resolve_device
from .io import atomic_path, read_json, write_json
from .kernel_train import KERNEL_REGULARIZERS, KernelTrainConfig, train_kernel
from .kernels import GaussianKernelModel
from .models import load_model, save_model
from .train import TrainConfig, train

#: Schema of the per-instance results: one row per evaluated test point per model.
INSTANCE_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("model_id", pa.string()),
        ("regularizer", pa.string()),
        ("lr", pa.float64()),
        ("lam", pa.float64()),
        ("seed", pa.int64()),
        ("status", pa.string()),
        ("test_error", pa.float64()),
        ("test_index", pa.int64()),
        ("label", pa.int64()),
        ("pred", pa.int64()),
        ("correct", pa.bool_()),
        ("margin", pa.float64()),
        ("local_bound", pa.string()),
        ("guarantee_local", pa.float64()),
        ("radius_local", pa.float64()),
        ("bound_class", pa.int64()),
        ("guarantee_global", pa.float64()),
        ("ratio_global_local", pa.float64()),
        ("guarantee_l2", pa.float64()),
        ("guarantee_l1", pa.float64()),
        ("guarantee_linf", pa.float64()),
        ("guarantee_l2_box", pa.float64()),
        ("guarantee_l1_box", pa.float64()),
        ("guarantee_linf_box", pa.float64()),
        ("upper_bound", pa.float64()),
        ("attack_success", pa.bool_()),
        ("attack_target", pa.int64()),
        ("adv_class", pa.int64()),
        ("certify_seconds", pa.float64()),
        ("attack_seconds", pa.float64()),
    ]
)

#: Guarantee columns filled by the certification stage (NaN where a kind was not requested
#: or does not exist for the model family).
GUARANTEE_COLUMNS = [
    "guarantee_local", "radius_local", "bound_class", "guarantee_global", "guarantee_l2",
    "guarantee_l1", "guarantee_linf", "guarantee_l2_box", "guarantee_l1_box",
    "guarantee_linf_box",
]  # fmt: skip
CERTIFY_COLUMNS = ["test_index", "label", "pred", "margin", "local_bound", *GUARANTEE_COLUMNS,
                   "certify_seconds"]  # fmt: skip
ATTACK_COLUMNS = ["test_index", "upper_bound", "attack_success", "attack_target", "adv_class",
                  "attack_seconds"]  # fmt: skip


def write_parquet(df: pd.DataFrame, path: Path | str, schema: pa.Schema | None = None) -> None:
    """Write ``df`` to Parquet atomically (optionally cast to ``schema``)."""
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def prepare_data(name: str, out: Path | str, cache: str, mirror: str | None) -> dict[str, Any]:
    """Load a registered dataset (download/mirror/cache) and store it as 8-bit ``.npz``."""
    ds = load_dataset(name, cache_dir=cache, mirror_dir=mirror)
    save_prepared(ds, out)
    return {"name": ds.name, "n_train": len(ds.y_train), "n_test": len(ds.y_test), "d": ds.dim}


def eval_indices(n_test: int, n_points: int, seed: int = 0) -> np.ndarray:
    """Sorted, fixed-seed random subset of ``n_points`` test indices (all if larger)."""
    if n_points >= n_test:
        return np.arange(n_test)
    return np.sort(np.random.default_rng(seed).choice(n_test, size=n_points, replace=False))


def train_stage(
    data: Path | str,
    params: dict[str, Any],
    model_id: str,
    model_out: Path | str,
    metrics_out: Path | str,
    device: str = "auto",
) -> dict[str, Any]:
    """Train one grid point (a net by SGD or a kernel model by L-BFGS); write the model
    (weights-only file) and its metrics JSON."""
    ds = load_prepared(data)
    if params["regularizer"] in KERNEL_REGULARIZERS:
        fit, cfg = train_kernel, KernelTrainConfig(**params)
    else:
        fit, cfg = train, TrainConfig(**params)
    res = fit(
        cfg,
        ds.x_train,
        ds.y_train,
        ds.x_test,
        ds.y_test,
        ds.num_classes,
        device=resolve_device(device),
    )
    res.metrics["dataset"] = ds.name
    res.metrics["model_id"] = model_id
    save_model(res.model, model_out, meta={"dataset": ds.name, "status": res.metrics["status"]})
    write_json(res.metrics, metrics_out)
    return res.metrics


def _empty_frame(columns: list[str]) -> pd.DataFrame:
    """No rows, the columns typed as in INSTANCE_SCHEMA (for a model that diverged)."""
    return pd.DataFrame(
        {c: pd.Series(dtype=INSTANCE_SCHEMA.field(c).type.to_pandas_dtype()) for c in columns}
    )


def _points(data: Path | str, n_points: int) -> tuple[np.ndarray, torch.Tensor, np.ndarray]:
    ds = load_prepared(data)
    idx = eval_indices(len(ds.y_test), n_points)
    return idx, torch.as_tensor(ds.x_test[idx]), ds.y_test[idx]


def certify_stage(
    data: Path | str,
    model: Path | str,
    metrics: Path | str,
    out: Path | str,
    n_points: int,
    rtol: float,
    kinds: list[str] | tuple[str, ...] = KINDS,
    device: str = "auto",
) -> pd.DataFrame:
    """Guarantees of Theorem 2.1 for the eval points. One-hidden-layer nets: local L2
    (Proposition 2.3), global L2, the tightest L2, L1 and Linf, and their box-constrained
    versions (:func:`crosslip.certify.certify_softplus`; ``kinds`` selects them). Gaussian-
    kernel models: local L2 (Proposition 2.2); the other columns stay empty."""
    idx, x, y = _points(data, n_points)
    if read_json(metrics)["status"] != "ok":
        df = _empty_frame(CERTIFY_COLUMNS)
    else:
        dev = resolve_device(device)
        net = load_model(model)
        t0 = time.perf_counter()
        if isinstance(net, GaussianKernelModel):  # Proposition 2.2: the L2 local bound only
            res = certify_kernel(net, x.to(dev), rtol=rtol)
            res["guarantee_l2"] = res["guarantee_local"]
            local_bound = "prop2.2"
        else:
            res = certify_softplus(net, x.to(dev), rtol=rtol, kinds=tuple(kinds))
            local_bound = "prop2.3" if "guarantee_local" in res else None
        secs = (time.perf_counter() - t0) / max(len(idx), 1)
        df = pd.DataFrame({"test_index": idx, "label": y, **{k: v.numpy() for k, v in res.items()}})
        df["local_bound"] = local_bound
        df["certify_seconds"] = secs
        df = df.reindex(columns=CERTIFY_COLUMNS)
        df["bound_class"] = df["bound_class"].fillna(-1).astype("int64")
    write_parquet(df, out)
    return df


def attack_stage(
    data: Path | str,
    model: Path | str,
    metrics: Path | str,
    out: Path | str,
    n_points: int,
    rtol: float,
    max_steps: int,
    device: str = "auto",
) -> pd.DataFrame:
    """Paper's L2 upper bounds (Section 4 + search on the right-hand side) for the eval points."""
    idx, x, _ = _points(data, n_points)
    if read_json(metrics)["status"] != "ok":
        df = _empty_frame(ATTACK_COLUMNS)
    else:
        dev = resolve_device(device)
        net = load_model(model)
        t0 = time.perf_counter()
        ub = upper_bound_l2(net, x.to(dev), rtol=rtol, max_steps=max_steps)
        secs = (time.perf_counter() - t0) / max(len(idx), 1)
        df = pd.DataFrame(
            {
                "test_index": idx,
                "upper_bound": np.where(ub.success.numpy(), ub.norm.numpy(), np.nan),
                "attack_success": ub.success.numpy(),
                "attack_target": ub.target.numpy(),
                "adv_class": ub.adv_class.numpy(),
                "attack_seconds": secs,
            }
        )
    write_parquet(df, out)
    return df


def instances_stage(
    certify: Path | str,
    attack: Path | str,
    metrics: Path | str,
    model_id: str,
    out: Path | str,
) -> pd.DataFrame:
    """Join certification and attack results with the model's identifiers (INSTANCE_SCHEMA)."""
    met = read_json(metrics)
    cfg = met["config"]
    df = pd.read_parquet(certify).merge(
        pd.read_parquet(attack), on="test_index", how="outer", validate="one_to_one"
    )
    df["correct"] = df["pred"] == df["label"]
    ratio = df["guarantee_global"] / df["guarantee_local"]
    df["ratio_global_local"] = ratio.where(df["guarantee_local"] > 0)
    ids = {
        "dataset": met["dataset"],
        "model_id": model_id,
        "regularizer": cfg["regularizer"],
        "lr": float("nan") if cfg["lr"] is None else float(cfg["lr"]),  # kernels: no lr
        "lam": float(cfg["lam"]),
        "seed": int(cfg["seed"]),
        "status": met["status"],
        "test_error": met["test_error"],
    }
    for k, v in ids.items():
        df[k] = v
    df = df.sort_values("test_index")[INSTANCE_SCHEMA.names]
    write_parquet(df, out, INSTANCE_SCHEMA)
    return df
