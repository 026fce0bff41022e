"""The dataset container, the registry of loaders, and the prepared ``.npz`` format.

:class:`Dataset` holds float32 images in [0, 1], flattened to (n, d), and int64 labels;
loaders register under a name with :func:`register` (the modules :mod:`.mnist`,
:mod:`.cifar10`, :mod:`.gtsrb`, :mod:`.embedded` do so when :mod:`crosslip.data` is imported)
and :func:`load_dataset` calls them. :func:`save_prepared` / :func:`load_prepared` write and
read the 8-bit ``.npz`` that the workflow's stages share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import DataFormatError, UnknownDatasetError
from ..io.files import atomic_path


@dataclass(frozen=True)
class Dataset:
    """Train and test splits; ``x_*`` float32 in [0, 1] of shape (n, d), ``y_*`` int64 (n,).

    ``shape``: the image shape, channels last ((h, w, c), or (d,) for flat vectors);
    ``class_names``: one name per class (default ``"0"``, ``"1"``, ...)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    shape: tuple[int, ...]
    num_classes: int
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.class_names:
            object.__setattr__(self, "class_names", default_class_names(self.num_classes))
        object.__setattr__(self, "class_names", tuple(str(c) for c in self.class_names))
        if len(self.class_names) != self.num_classes:
            raise ValueError(
                f"{self.name}: {len(self.class_names)} class names for {self.num_classes} classes"
            )
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if x.dtype != np.float32 or x.ndim != 2 or x.shape[0] != y.shape[0]:
                raise ValueError(f"{self.name}: bad {split} arrays {x.shape}/{x.dtype}, {y.shape}")
            if x.size and not (x.min() >= 0 and x.max() <= 1):  # NaN fails both
                raise ValueError(f"{self.name}: {split} images outside [0, 1] or NaN")

    @property
    def dim(self) -> int:
        return int(self.x_train.shape[1])

    def head(self, train: int | None = None, test: int | None = None) -> Dataset:
        """The same dataset with only its first ``train`` training and ``test`` test points
        (a split whose count is None kept whole): a sample to train on quickly."""
        return replace(
            self,
            x_train=self.x_train[:train],
            y_train=self.y_train[:train],
            x_test=self.x_test[:test],
            y_test=self.y_test[:test],
        )

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
        class_names: tuple[str, ...] = (),
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
            class_names=tuple(class_names),
        )


def default_class_names(num_classes: int) -> tuple[str, ...]:
    """``("0", "1", ..., str(num_classes - 1))``: the names of classes known by number only."""
    return tuple(str(k) for k in range(num_classes))


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
    """uint8 pixels (any shape, first axis = samples) -> float32 (n, d) in [0, 1].

    One array is allocated (the division casts to float32 as it goes): on a virtual machine
    whose fresh memory pages fault slowly, each extra full-size temporary of full MNIST's
    training images (188 MB) cost seconds."""
    flat = np.asarray(images).reshape(len(images), -1)
    return np.divide(flat, np.float32(255.0), dtype=np.float32)


#: Rows that :func:`save_prepared` turns into 8-bit values at a time.
QUANTISE_ROWS = 4096


def save_prepared(ds: Dataset, path: Path | str) -> None:
    """Write a dataset as a compressed ``.npz`` (atomically): each split's pixels as uint8
    where they are 8-bit values (k / 255), else as float32 in [0, 1]; with the image shape,
    class count and class names."""

    def q(x: np.ndarray) -> np.ndarray:
        u = np.empty(x.shape, np.uint8)
        for rows in range(0, len(x), QUANTISE_ROWS):  # temporaries of one block, not all
            part = x[rows : rows + QUANTISE_ROWS]
            k = np.rint(part * 255.0)
            if not np.allclose(k / 255.0, part, atol=1e-6):
                return x.astype(np.float32)  # not 8-bit: stored as read
            u[rows : rows + QUANTISE_ROWS] = k
        return u

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
            class_names=np.array(ds.class_names, dtype=str),
        )


def _unit(pixels: np.ndarray) -> np.ndarray:
    """Stored pixels (uint8, or float32 in [0, 1]) -> float32 (n, d) in [0, 1]."""
    if pixels.dtype == np.uint8:
        return to_unit_float(pixels)
    return np.asarray(pixels, dtype=np.float32).reshape(len(pixels), -1)


def read_class_names(path: Path | str) -> np.ndarray:
    """The class names stored in a prepared dataset (strings, (K,)), read without loading
    the images; ``"0"``, ``"1"``, ... for a file written before names were stored."""
    with np.load(path, allow_pickle=False) as z:
        if "class_names" in z.files:
            return z["class_names"]
        return np.array(default_class_names(int(z["num_classes"])), dtype=str)


def load_prepared(path: Path | str) -> Dataset:
    """Read a file written by :func:`save_prepared` (no pickles: ``allow_pickle=False``).

    Raises :class:`DataFormatError` naming the file when it holds pickled objects or lacks
    an array."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return Dataset(
                name=str(z["name"]),
                x_train=_unit(z["x_train"]),
                y_train=z["y_train"].astype(np.int64),
                x_test=_unit(z["x_test"]),
                y_test=z["y_test"].astype(np.int64),
                shape=tuple(int(s) for s in z["shape"]),
                num_classes=int(z["num_classes"]),
                class_names=tuple(str(c) for c in z["class_names"])
                if "class_names" in z.files
                else (),
            )
    except (ValueError, KeyError) as exc:
        raise DataFormatError(
            f"{path}: not a prepared dataset ({exc}); delete it and let the prepare_data job "
            "write it again"
        ) from exc
