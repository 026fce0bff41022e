"""The workflow's stages as plain functions (the Snakemake scripts only call these).

Each stage reads files, calls the maths in :mod:`crosslip.certify`, :mod:`crosslip.attacks`
and :mod:`crosslip.train`, and writes its outputs atomically, with the columns of
:mod:`crosslip.results_schema`.
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

from .attacks import refine_upper_bound, upper_bound
from .augment import center_crop
from .certify import KINDS, certify
from .checkpoints import load_model, save_model
from .data import load_dataset, load_prepared, save_prepared
from .device import resolve_device
from .families import KERNEL_REGULARIZERS
from .io import atomic_path, read_json, write_json
from .kernel_train import KernelTrainConfig, train_kernel
from .norms import norm_p
from .results_schema import (
    ATTACK_COLUMNS,
    CERTIFY_COLUMNS,
    INSTANCE_SCHEMA,
    model_keys,
    upper_bound_column,
)
from .train import TrainConfig, train


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
    args = (ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes)
    if params["regularizer"] in KERNEL_REGULARIZERS:
        res = train_kernel(KernelTrainConfig(**params), *args, device=resolve_device(device))
    else:
        cfg = TrainConfig(**params)
        res = train(cfg, *args, device=resolve_device(device), shape=ds.shape)
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


def _points(
    data: Path | str, n_points: int, metrics: dict[str, Any]
) -> tuple[np.ndarray, torch.Tensor, np.ndarray, tuple[int, ...]]:
    """The eval points as the model sees them (center crops for the augment setting), their
    labels, test indices and image shape."""
    ds = load_prepared(data)
    idx = eval_indices(len(ds.y_test), n_points)
    x, shape = torch.as_tensor(ds.x_test[idx]), tuple(ds.shape)
    cfg = metrics.get("config", {})
    if cfg.get("setting") == "augment":
        x = center_crop(x, shape, cfg["crop"])
        shape = (cfg["crop"], cfg["crop"], shape[2])
    return idx, x, ds.y_test[idx], shape


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
    """Guarantees of Theorem 2.1 for the eval points, as :func:`crosslip.certify.certify`
    gives them for the model's kind. One-hidden-layer nets: local L2 (Proposition 2.3),
    global L2, the tightest L2, L1 and Linf, and their box-constrained versions (``kinds``
    selects them). Gaussian-kernel models: local L2 (Proposition 2.2). Other networks
    (ResNets): prediction and margin only (``local_bound = "none"``). Columns a model does
    not have stay empty."""
    met = read_json(metrics)
    idx, x, y, _ = _points(data, n_points, met)
    if met["status"] != "ok":
        df = _empty_frame(CERTIFY_COLUMNS)
    else:
        dev = resolve_device(device)
        net = load_model(model)
        t0 = time.perf_counter()
        cert = certify(net, x.to(dev), kinds=tuple(kinds), rtol=rtol)
        secs = (time.perf_counter() - t0) / max(len(idx), 1)
        columns = {k: v.numpy() for k, v in cert.columns.items()}
        df = pd.DataFrame({"test_index": idx, "label": y, **columns})
        df["local_bound"] = cert.local_bound
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
    norms: list[str] | tuple[str, ...] = ("l2", "l1", "linf"),
    refine_steps: int = 5,
    device: str = "auto",
    examples_out: Path | str | None = None,
    n_examples: int = 2,
) -> pd.DataFrame:
    """Upper bounds (Section 4) for the eval points, per requested norm: the paper's search
    (``upper_bound_{p}``; for L2 the column ``upper_bound`` with its target and class) and
    the refinement by re-linearization (``upper_bound_{p}_refined``). Failed attacks are
    null (``attack_success`` says which, for the L2 paper procedure).

    ``examples_out`` (``.npz``) receives the L2 adversarial samples of the paper's procedure
    for the first ``n_examples`` eval points, for the illustration figure: ``test_index``,
    ``x``, ``delta``, ``adv`` (each (m, d)), ``pred``, ``adv_class``, ``norm``, ``success``
    and the image ``shape``; empty arrays for a diverged model."""
    met = read_json(metrics)
    idx, x, _, shape = _points(data, n_points, met)
    examples: dict[str, np.ndarray] = {}
    if met["status"] != "ok":
        df = _empty_frame(ATTACK_COLUMNS)
    else:
        dev = resolve_device(device)
        net = load_model(model)
        xd = x.to(dev)
        t0 = time.perf_counter()
        df = pd.DataFrame({"test_index": idx})
        for name in norms:
            p = norm_p(name)
            ub = upper_bound(net, xd, p=p, rtol=rtol, max_steps=max_steps)
            ref = refine_upper_bound(net, xd, ub, p=p, steps=refine_steps, rtol=rtol,
                                     max_steps=max_steps)  # fmt: skip
            df[upper_bound_column(name)] = np.where(ub.success.numpy(), ub.norm.numpy(), np.nan)
            df[f"upper_bound_{name}_refined"] = np.where(ref.success.numpy(), ref.norm.numpy(),
                                                         np.nan)  # fmt: skip
            if name == "l2":
                df["attack_success"] = ub.success.numpy()
                df["attack_target"] = ub.target.numpy()
                df["adv_class"] = ub.adv_class.numpy()
                m = min(n_examples, len(idx))
                examples = {"test_index": idx[:m], "x": x[:m].numpy(),
                            "delta": ub.delta[:m].numpy(),
                            "adv": (x[:m].double() + ub.delta[:m]).numpy(),
                            "pred": ub.pred[:m].numpy(),
                            "adv_class": ub.adv_class[:m].numpy(), "norm": ub.norm[:m].numpy(),
                            "success": ub.success[:m].numpy()}  # fmt: skip
        df["attack_seconds"] = (time.perf_counter() - t0) / max(len(idx), 1)
        df = df.reindex(columns=ATTACK_COLUMNS)
        if "l2" not in norms:
            df["attack_success"] = False
            df[["attack_target", "adv_class"]] = -1
    write_parquet(df, out)
    if examples_out is not None:
        with atomic_path(examples_out) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, shape=np.asarray(shape, dtype=np.int64), **examples)
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
    df = pd.read_parquet(certify).merge(
        pd.read_parquet(attack), on="test_index", how="outer", validate="one_to_one"
    )
    df["correct"] = df["pred"] == df["label"]
    ratio = df["guarantee_global"] / df["guarantee_local"]
    df["ratio_global_local"] = ratio.where(df["guarantee_local"] > 0)
    for k, v in model_keys(met, model_id).items():
        df[k] = v
    df = df.sort_values("test_index")[INSTANCE_SCHEMA.names]
    write_parquet(df, out, INSTANCE_SCHEMA)
    return df
