"""The data stage: a registered dataset, verified and stored as 8-bit ``.npz``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..data import load_custom, load_dataset, save_prepared
from ..data.custom import check_fits_training


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
    return {
        "name": ds.name,
        "n_train": len(ds.y_train),
        "n_test": len(ds.y_test),
        "d": ds.dim,
        "shape": list(ds.shape),
        "num_classes": ds.num_classes,
        "class_names": list(ds.class_names),
    }
