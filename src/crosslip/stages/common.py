"""What the stages share: the evaluation points and atomic Parquet files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ..augment import center_crop
from ..data import load_prepared
from ..io import atomic_path
from ..results_schema import INSTANCE_SCHEMA


def write_parquet(df: pd.DataFrame, path: Path | str, schema: pa.Schema | None = None) -> None:
    """Write ``df`` to Parquet atomically (optionally cast to ``schema``)."""
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def eval_indices(n_test: int, n_points: int, seed: int = 0) -> np.ndarray:
    """Sorted, fixed-seed random subset of ``n_points`` test indices (all if larger)."""
    if n_points >= n_test:
        return np.arange(n_test)
    return np.sort(np.random.default_rng(seed).choice(n_test, size=n_points, replace=False))


def empty_frame(columns: list[str]) -> pd.DataFrame:
    """No rows, the columns typed as in INSTANCE_SCHEMA (for a model that diverged)."""
    return pd.DataFrame(
        {c: pd.Series(dtype=INSTANCE_SCHEMA.field(c).type.to_pandas_dtype()) for c in columns}
    )


def eval_points(
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
