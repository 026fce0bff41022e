"""The data stage: a registered dataset, verified and stored as 8-bit ``.npz``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..data import load_dataset, save_prepared


def prepare_data(name: str, out: Path | str, cache: str, mirror: str | None) -> dict[str, Any]:
    """Load a registered dataset (download/mirror/cache) and store it as 8-bit ``.npz``."""
    ds = load_dataset(name, cache_dir=cache, mirror_dir=mirror)
    save_prepared(ds, out)
    return {"name": ds.name, "n_train": len(ds.y_train), "n_test": len(ds.y_test), "d": ds.dim}
