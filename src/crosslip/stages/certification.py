"""The certification stage: guarantees of Theorem 2.1 for the evaluation points."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..certify import certify, float32_agrees
from ..certify.settings import CertifySettings, settings_with
from ..device import check_device_memory, resolve_device
from ..io.files import read_json
from ..io.logs import about_model
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
    settings: CertifySettings | None = None,
    **changes: Any,
) -> pd.DataFrame:
    """Guarantees of Theorem 2.1 for the ``settings.n_points`` eval points, as
    :func:`crosslip.certify.certify` gives them for the model's kind, with ``settings``
    (default: the schema's; keyword ``changes`` of its fields apply on top). One-hidden-layer
    nets: local L2 (Proposition 2.3), global L2, the tightest L2, L1 and Linf, their
    box-constrained versions, and per norm the certificates beyond the paper (linear
    relaxation, curvature, in L2 minimised over the ball, Theorem 2.1 integrated) with the
    best of all and, for L2, the method that gave it (``kinds`` selects them).
    Gaussian-kernel models: local L2 (Proposition 2.2, on the device within ``memory_gb``
    GiB of it). Other networks (ResNets): prediction and margin only (``local_bound =
    "none"``). Columns a model does not have stay empty.
    ``float32_agrees``: whether the model cast to float32 predicts the same class at the
    point; where it does not, every guarantee is 0 and there is no best method (a
    certificate covers the float64 function only, docs/guarantees.md)."""
    settings = settings_with(settings, changes)
    met = read_json(metrics)
    idx, x, y, _ = eval_points(data, settings.n_points, met)
    if met["status"] != "ok":
        df = empty_frame(CERTIFY_COLUMNS)
    else:
        dev = resolve_device(settings.device)
        net = load_stored(model, met["config"].get("format"))
        t0 = time.perf_counter()
        if isinstance(net, GaussianKernelModel):
            check_device_memory(dev, settings.memory_gb)
        cert = certify(net, x.to(dev), settings)
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
    settings: CertifySettings | None = None,
) -> dict[str, pd.DataFrame]:
    """:func:`certify_stage` with ``settings`` for each ``(model id, model file, metrics
    file, output)`` of ``models``, in this one process (config ``certify.batch_models``);
    each model's lines go to its own log (:func:`crosslip.io.logs.about_model`)."""
    out = {}
    for model_id, model, metrics, table in models:
        with about_model(model_id):
            out[model_id] = certify_stage(data, model, metrics, table, settings)
    return out
