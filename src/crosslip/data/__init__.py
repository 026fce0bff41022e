"""Datasets: a registry of loaders returning float32 images in [0, 1] and int64 labels.

>>> from crosslip.data import load_dataset
>>> ds = load_dataset("mnist5k")          # embedded, offline
>>> ds.x_train.shape, ds.x_train.dtype    # (4000, 784), float32

Each loader takes keyword options (``cache_dir``, ``mirror_dir``) and returns a
:class:`Dataset`. Images are flattened to ``(n, d)``; ``shape`` keeps the image shape
(channels last, as in the source) for figures, ``class_names`` the name of each class.

Datasets of your own (IDX files, a ``.npz``, a folder of images per class) are declared in the
config and read by :func:`crosslip.data.custom.load_custom` (docs/your-own-data.md).

Registered: ``mnist5k`` (embedded subset), ``mnist`` (IDX files, :mod:`.mnist`), ``cifar10``
(the python-version archive, :mod:`.cifar10`, shape (32, 32, 3)) and ``gtsrb`` (the final
benchmark archives cropped to their ROI and resized, :mod:`.gtsrb`, shape (32, 32, 3)). The
downloaded ones come from a mirror folder (config key ``data.mirrors.<name>``), the cache
(``cache_dir/<name>``) or their official URLs, checked against the published checksums
(:mod:`.fetch`); a file whose content is not in the documented format raises
:class:`DataFormatError` (:class:`UnsafePickleError` for a pickle that would run code).
"""

from __future__ import annotations

from ..errors import ChecksumError, DataFormatError, DataUnavailableError, UnknownDatasetError
from . import cifar10, embedded, gtsrb, mnist  # registers the loaders
from .custom import CustomDataError, load_custom
from .dataset import (
    Dataset,
    Loader,
    available,
    load_dataset,
    load_prepared,
    read_class_names,
    register,
    save_prepared,
    to_unit_float,
)
from .unpickle import UnsafePickleError

__all__ = [
    "ChecksumError",
    "CustomDataError",
    "DataFormatError",
    "DataUnavailableError",
    "Dataset",
    "Loader",
    "UnknownDatasetError",
    "UnsafePickleError",
    "available",
    "cifar10",
    "embedded",
    "gtsrb",
    "load_custom",
    "load_dataset",
    "load_prepared",
    "mnist",
    "read_class_names",
    "register",
    "save_prepared",
    "to_unit_float",
]
