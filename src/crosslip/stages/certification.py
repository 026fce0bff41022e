"""The certification stage: guarantees of Theorem 2.1 for the evaluation points."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from ..certify import KINDS, certify
from ..checkpoints import load_model
from ..device import resolve_device
from ..io import read_json
from ..results_schema import CERTIFY_COLUMNS
from .common import empty_frame, eval_points, write_parquet


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
    idx, x, y, _ = eval_points(data, n_points, met)
    if met["status"] != "ok":
        df = empty_frame(CERTIFY_COLUMNS)
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
