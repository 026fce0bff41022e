"""What the model stages share: the evaluation points as the model sees them (the Parquet
helpers are in :mod:`.parquet`, without torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..data import load_prepared
from ..data.augment import center_crop
from ..device import host_tensor


def eval_indices(n_test: int, n_points: int, seed: int = 0) -> np.ndarray:
    """Sorted, fixed-seed random subset of ``n_points`` test indices (all if larger)."""
    if n_points >= n_test:
        return np.arange(n_test)
    return np.sort(np.random.default_rng(seed).choice(n_test, size=n_points, replace=False))


def eval_points(
    data: Path | str, n_points: int, metrics: dict[str, Any]
) -> tuple[np.ndarray, torch.Tensor, np.ndarray, tuple[int, ...]]:
    """The eval points as the model sees them (center crops for the augment setting), their
    labels, test indices and image shape."""
    ds = load_prepared(data)
    idx = eval_indices(len(ds.y_test), n_points)
    x, shape = host_tensor(ds.x_test[idx]), tuple(ds.shape)
    cfg = metrics.get("config", {})
    if cfg.get("setting") == "augment":
        x = center_crop(x, shape, cfg["crop"])
        shape = (cfg["crop"], cfg["crop"], shape[2])
    return idx, x, ds.y_test[idx], shape


def best_of(
    df: pd.DataFrame, methods: dict[str, str], largest: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``df``, the largest (``largest``) or smallest of the columns of
    ``methods`` (method name -> column; a column that is absent or null did not run or
    failed) and the name of the method that gave it, the earlier one on a tie; NaN and None
    where none has a value."""
    n = len(df)
    values = np.stack(
        [
            df[c].to_numpy(dtype=np.float64) if c in df else np.full(n, np.nan)
            for c in methods.values()
        ],
        axis=1,
    )
    found = ~np.isnan(values).all(1)
    worst = -np.inf if largest else np.inf
    filled = np.where(np.isnan(values), worst, values)
    arg = np.argmax(filled, axis=1) if largest else np.argmin(filled, axis=1)
    best = np.where(found, values[np.arange(n), arg], np.nan)
    names = np.array(list(methods), dtype=object)[arg]
    return best, np.where(found, names, None)
