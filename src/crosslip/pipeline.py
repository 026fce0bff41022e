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

from .attacks import refine_upper_bound, upper_bound
from .augment import center_crop
from .certify import KINDS, certify_kernel, certify_softplus, margins
from .data import load_custom, load_dataset, load_prepared, read_class_names, save_prepared
from .data.custom import check_fits_training
from .device import resolve_device
from .io import atomic_path, read_json, write_json
from .kernel_train import KERNEL_REGULARIZERS, KernelTrainConfig, train_kernel
from .kernels import GaussianKernelModel
from .models import SoftplusNet, load_model, save_model
from .train import TrainConfig, train

#: Schema of the per-instance results: one row per evaluated test point per model.
INSTANCE_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("model_id", pa.string()),
        ("family", pa.string()),
        ("regularizer", pa.string()),
        ("lr", pa.float64()),
        ("lam", pa.float64()),
        ("kernel_a", pa.float64()),
        ("seed", pa.int64()),
        ("setting", pa.string()),
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
        ("upper_bound_l2_refined", pa.float64()),
        ("upper_bound_l1", pa.float64()),
        ("upper_bound_l1_refined", pa.float64()),
        ("upper_bound_linf", pa.float64()),
        ("upper_bound_linf_refined", pa.float64()),
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
                  "upper_bound_l2_refined", "upper_bound_l1", "upper_bound_l1_refined",
                  "upper_bound_linf", "upper_bound_linf_refined", "attack_seconds"]  # fmt: skip
#: attack.norms in the config -> the p of the norm
#: Identifying columns of a model (:func:`model_keys`), shared by the per-instance results
#: and the summary tables: the schema's columns up to ``test_error``.
MODEL_KEYS = INSTANCE_SCHEMA.names[: INSTANCE_SCHEMA.names.index("test_error") + 1]
ATTACK_NORMS = {"l2": 2.0, "l1": 1.0, "linf": float("inf")}


def model_family(cfg: dict[str, Any]) -> str:
    """``kernel`` (Gaussian-kernel model), ``mlp`` (one hidden layer) or ``resnet``, from
    the training config stored in a model's metrics."""
    if cfg["regularizer"] in KERNEL_REGULARIZERS:
        return "kernel"
    return str(cfg.get("arch", "mlp"))


def model_keys(met: dict[str, Any], model_id: str) -> dict[str, Any]:
    """The identifying columns of a model (:data:`MODEL_KEYS`, in order) from its metrics:
    kernel models have no ``lr`` and networks no ``kernel_a`` (NaN); kernel models train in
    the plain setting. ``lam`` is the regularizer's grid value: lambda, or for dropout the
    probability ``keep_hidden`` of keeping a hidden unit."""
    cfg = met["config"]
    return {
        "dataset": met["dataset"],
        "model_id": model_id,
        "family": model_family(cfg),
        "regularizer": cfg["regularizer"],
        "lr": float("nan") if cfg.get("lr") is None else float(cfg["lr"]),
        "lam": float(cfg["keep_hidden"] if cfg["regularizer"] == "dropout" else cfg["lam"]),
        "kernel_a": float(cfg["a"]) if "a" in cfg else float("nan"),
        "seed": int(cfg["seed"]),
        "setting": cfg.get("setting", "plain"),
        "status": met["status"],
        "test_error": met["test_error"],
    }


def write_parquet(df: pd.DataFrame, path: Path | str, schema: pa.Schema | None = None) -> None:
    """Write ``df`` to Parquet atomically (optionally cast to ``schema``)."""
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def prepare_data(
    name: str,
    out: Path | str,
    cache: str,
    mirror: str | None,
    source: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Load a dataset and store it as ``.npz`` (:func:`crosslip.data.save_prepared`).

    ``source`` None: the registered dataset ``name`` (download/mirror/cache); else the
    config entry of a dataset of your own (:func:`crosslip.data.load_custom`). ``training``
    (``settings``, ``arch``, ``crop``), when given, is checked against the image shape
    (:func:`crosslip.data.custom.check_fits_training`). Every check runs before anything is
    written, and the file is written atomically: bad data leaves no file. Returns a summary
    (sizes, image shape, classes)."""
    ds = load_custom(source) if source else load_dataset(name, cache_dir=cache, mirror_dir=mirror)
    if training is not None:
        check_fits_training(ds, training["settings"], training["arch"], training["crop"])
    save_prepared(ds, out)
    return {"name": ds.name, "n_train": len(ds.y_train), "n_test": len(ds.y_test), "d": ds.dim,
            "shape": list(ds.shape), "num_classes": ds.num_classes,
            "class_names": list(ds.class_names)}  # fmt: skip


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
    """Guarantees of Theorem 2.1 for the eval points. One-hidden-layer nets: local L2
    (Proposition 2.3), global L2, the tightest L2, L1 and Linf, and their box-constrained
    versions (:func:`crosslip.certify.certify_softplus`; ``kinds`` selects them). Gaussian-
    kernel models: local L2 (Proposition 2.2); the other columns stay empty. Other networks
    (ResNets): prediction and margin only (``local_bound = "none"``)."""
    met = read_json(metrics)
    idx, x, y, _ = _points(data, n_points, met)
    if met["status"] != "ok":
        df = _empty_frame(CERTIFY_COLUMNS)
    else:
        dev = resolve_device(device)
        net = load_model(model)
        t0 = time.perf_counter()
        if isinstance(net, GaussianKernelModel):  # Proposition 2.2: the L2 local bound only
            res = certify_kernel(net, x.to(dev), rtol=rtol)
            res["guarantee_l2"] = res["guarantee_local"]
            local_bound = "prop2.2"
        elif isinstance(net, SoftplusNet):
            res = certify_softplus(net, x.to(dev), rtol=rtol, kinds=tuple(kinds))
            local_bound = "prop2.3" if "guarantee_local" in res else None
        else:  # deep networks: no local bound (the paper reports upper bounds only)
            with torch.no_grad():
                logits = net.double().to(dev)(x.to(dev).double()).cpu()
            pred = logits.argmax(1)
            res = {"pred": pred, "margin": margins(logits, pred).min(1).values}
            local_bound = "none"
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
    ``x``, ``delta``, ``adv`` (each (m, d)), ``pred``, ``adv_class``, ``norm``, ``success``,
    the image ``shape`` and the dataset's ``class_names``; empty arrays for a diverged model."""
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
            p = ATTACK_NORMS[name]
            ub = upper_bound(net, xd, p=p, rtol=rtol, max_steps=max_steps)
            ref = refine_upper_bound(net, xd, ub, p=p, steps=refine_steps, rtol=rtol,
                                     max_steps=max_steps)  # fmt: skip
            col = "upper_bound" if name == "l2" else f"upper_bound_{name}"
            df[col] = np.where(ub.success.numpy(), ub.norm.numpy(), np.nan)
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
            np.savez(fh, shape=np.asarray(shape, dtype=np.int64),
                     class_names=read_class_names(data), **examples)  # fmt: skip
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
