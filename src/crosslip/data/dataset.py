"""The dataset container, the registry of loaders, and the prepared ``.npz`` format.

:class:`Dataset` holds float32 images in [0, 1], flattened to (n, d), and int64 labels;
loaders register under a name with :func:`register` (the modules :mod:`.mnist`,
:mod:`.cifar10`, :mod:`.gtsrb`, :mod:`.embedded` do so when :mod:`crosslip.data` is imported)
and :func:`load_dataset` calls them. :func:`save_prepared` / :func:`load_prepared` write and
read the 8-bit ``.npz`` that the workflow's stages share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataFormatError, UnknownDatasetError
from ..io import atomic_path


@dataclass(frozen=True)
class Dataset:
    """Train and test splits; ``x_*`` float32 in [0, 1] of shape (n, d), ``y_*`` int64 (n,)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    shape: tuple[int, ...]
    num_classes: int

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if x.dtype != np.float32 or x.ndim != 2 or x.shape[0] != y.shape[0]:
                raise ValueError(f"{self.name}: bad {split} arrays {x.shape}/{x.dtype}, {y.shape}")
            if x.size and (x.min() < 0 or x.max() > 1):
                raise ValueError(f"{self.name}: {split} images outside [0, 1]")

    @property
    def dim(self) -> int:
        return int(self.x_train.shape[1])

    @classmethod
    def from_pixels(
        cls,
        name: str,
        train: tuple[np.ndarray, np.ndarray],
        test: tuple[np.ndarray, np.ndarray],
        shape: tuple[int, ...],
        num_classes: int,
        counts: tuple[int, int] | None = None,
        source: str = "",
    ) -> Dataset:
        """A dataset from 8-bit images (any shape, first axis = samples) and labels, per
        split ``(images, labels)``; ``counts`` = (train, test), when given, must match the
        numbers of images (else :class:`DataFormatError` naming ``source``)."""
        (x_train, y_train), (x_test, y_test) = train, test
        if counts is not None and (len(x_train), len(x_test)) != tuple(counts):
            raise DataFormatError(
                f"{source or name}: {len(x_train)} training and {len(x_test)} test images, "
                f"expected {counts[0]} and {counts[1]}"
            )
        return cls(
            name=name,
            x_train=to_unit_float(x_train),
            y_train=np.asarray(y_train).astype(np.int64),
            x_test=to_unit_float(x_test),
            y_test=np.asarray(y_test).astype(np.int64),
            shape=tuple(shape),
            num_classes=num_classes,
        )


Loader = Callable[..., Dataset]
_REGISTRY: dict[str, Loader] = {}


def register(name: str) -> Callable[[Loader], Loader]:
    """Decorator adding a loader to the registry under ``name``."""

    def deco(fn: Loader) -> Loader:
        _REGISTRY[name] = fn
        return fn

    return deco


def available() -> list[str]:
    """Names of the registered datasets."""
    return sorted(_REGISTRY)


def load_dataset(
    name: str, cache_dir: Path | str = "results/downloads", mirror_dir: Path | str | None = None
) -> Dataset:
    """Load a registered dataset; see the module docstring."""
    if name not in _REGISTRY:
        raise UnknownDatasetError(f"unknown dataset {name!r}; available: {', '.join(available())}")
    return _REGISTRY[name](
        cache_dir=Path(cache_dir), mirror_dir=None if mirror_dir is None else Path(mirror_dir)
    )


def to_unit_float(images: np.ndarray) -> np.ndarray:
    """uint8 pixels (any shape, first axis = samples) -> float32 (n, d) in [0, 1]."""
    flat = np.asarray(images).reshape(len(images), -1)
    return (flat.astype(np.float32) / np.float32(255.0)).astype(np.float32)


def save_prepared(ds: Dataset, path: Path | str) -> None:
    """Write a dataset as a compressed ``.npz`` of 8-bit pixels (atomically)."""

    def q(x: np.ndarray) -> np.ndarray:
        u = np.rint(x * 255.0)
        if not np.allclose(u / 255.0, x, atol=1e-6):
            raise ValueError(f"{ds.name}: images are not 8-bit; cannot store them as uint8")
        return u.astype(np.uint8)

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(
            fh,
            name=np.array(ds.name),
            x_train=q(ds.x_train),
            y_train=ds.y_train,
            x_test=q(ds.x_test),
            y_test=ds.y_test,
            shape=np.array(ds.shape),
            num_classes=np.array(ds.num_classes),
        )


def load_prepared(path: Path | str) -> Dataset:
    """Read a file written by :func:`save_prepared` (no pickles: ``allow_pickle=False``).

    Raises :class:`DataFormatError` naming the file when it holds pickled objects or lacks
    an array."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return Dataset(
                name=str(z["name"]),
                x_train=to_unit_float(z["x_train"]),
                y_train=z["y_train"].astype(np.int64),
                x_test=to_unit_float(z["x_test"]),
                y_test=z["y_test"].astype(np.int64),
                shape=tuple(int(s) for s in z["shape"]),
                num_classes=int(z["num_classes"]),
            )
    except (ValueError, KeyError) as exc:
        raise DataFormatError(
            f"{path}: not a prepared dataset ({exc}); delete it and let the prepare_data job "
            "write it again"
        ) from exc
