"""The certification stage: guarantees of Theorem 2.1 for the evaluation points."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..certify import KINDS, certify, float32_agrees
from ..device import check_device_memory, resolve_device
from ..io import about_model, read_json
from ..models.external import load_stored
from ..models.kernels import GaussianKernelModel
from ..results_schema import CERTIFY_COLUMNS, GUARANTEE_COLUMNS, L2_GUARANTEE_METHODS
from .common import best_of, eval_points
from .parquet import empty_frame, write_parquet


def certify_stage(
    data: Path | str,
    model: Path | str,
    metrics: Path | str,
    out: Path | str,
    n_points: int,
    rtol: float,
    kinds: list[str] | tuple[str, ...] = KINDS,
    device: str = "auto",
    memory_gb: float | None = None,
    tangent_steps: int = 0,
    integration_nodes: int = 8,
    trust_region_steps: int = 0,
) -> pd.DataFrame:
    """Guarantees of Theorem 2.1 for the eval points, as :func:`crosslip.certify.certify`
    gives them for the model's kind. One-hidden-layer nets: local L2 (Proposition 2.3),
    global L2, the tightest L2, L1 and Linf, their box-constrained versions, and per norm
    the certificates beyond the paper (linear relaxation with ``tangent_steps``, curvature,
    in L2 minimised over the ball with ``trust_region_steps``, Theorem 2.1 integrated over
    ``integration_nodes``) with the best of all and, for L2,
    the method that gave it (``kinds`` selects them). Gaussian-kernel models: local L2
    (Proposition 2.2, on ``device`` within ``memory_gb`` GiB of it: config
    ``kernel.memory_gb``). Other networks (ResNets): prediction and margin only
    (``local_bound = "none"``). Columns a model does not have stay empty.
    ``float32_agrees``: whether the model cast to float32 predicts the same class at the
    point; where it does not, every guarantee is 0 and there is no best method (a
    certificate covers the float64 function only, docs/guarantees.md)."""
    met = read_json(metrics)
    idx, x, y, _ = eval_points(data, n_points, met)
    if met["status"] != "ok":
        df = empty_frame(CERTIFY_COLUMNS)
    else:
        dev = resolve_device(device)
        net = load_stored(model, met["config"].get("format"))
        t0 = time.perf_counter()
        if isinstance(net, GaussianKernelModel):
            check_device_memory(dev, memory_gb)
        cert = certify(
            net,
            x.to(dev),
            kinds=tuple(kinds),
            rtol=rtol,
            memory_gb=memory_gb,
            tangent_steps=tangent_steps,
            integration_nodes=integration_nodes,
            trust_region_steps=trust_region_steps,
        )
        secs = (time.perf_counter() - t0) / max(len(idx), 1)
        columns = {k: v.numpy() for k, v in cert.columns.items()}
        df = pd.DataFrame({"test_index": idx, "label": y, **columns})
        df["local_bound"] = cert.local_bound
        df["certify_seconds"] = secs
        df = df.reindex(columns=CERTIFY_COLUMNS)
        # a certificate covers the float64 function; where float32 decides otherwise: 0
        agrees = float32_agrees(net, x.to(dev), cert.columns["pred"]).numpy()
        df["float32_agrees"] = agrees
        certified = [c for c in GUARANTEE_COLUMNS if c != "bound_class"]
        df[certified] = df[certified].where(agrees[:, None] | df[certified].isna(), 0.0)
        if "guarantee_l2_best" in cert.columns:
            _, method = best_of(df, L2_GUARANTEE_METHODS, largest=True)
            df["guarantee_l2_best_method"] = np.where(agrees, method, None)
        df.loc[~agrees, "bound_class"] = -1
        df["bound_class"] = df["bound_class"].fillna(-1).astype("int64")
    write_parquet(df, out)
    return df


def certify_models_stage(
    data: Path | str,
    models: Sequence[tuple[str, Path | str, Path | str, Path | str]],
    n_points: int,
    rtol: float,
    kinds: list[str] | tuple[str, ...] = KINDS,
    device: str = "auto",
    memory_gb: float | None = None,
    tangent_steps: int = 0,
    integration_nodes: int = 8,
    trust_region_steps: int = 0,
) -> dict[str, pd.DataFrame]:
    """:func:`certify_stage` for each ``(model id, model file, metrics file, output)`` of
    ``models``, in this one process (config ``certify.batch_models``); each model's lines
    go to its own log (:func:`crosslip.io.about_model`)."""
    out = {}
    for model_id, model, metrics, table in models:
        with about_model(model_id):
            out[model_id] = certify_stage(
                data,
                model,
                metrics,
                table,
                n_points,
                rtol,
                kinds,
                device,
                memory_gb,
                tangent_steps,
                integration_nodes,
                trust_region_steps,
            )
    return out
