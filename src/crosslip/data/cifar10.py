"""CIFAR-10 (Krizhevsky 2009) from the official "python version": 50,000 + 10,000 images.

The archive ``cifar-10-python.tar.gz`` (MD5 published on the official page) holds
``cifar-10-batches-py/data_batch_1`` ... ``data_batch_5`` (10,000 training images each),
``test_batch`` (10,000) and ``batches.meta``. Each batch is a Python 2 pickle (protocol 2) of a
dict with byte-string keys: ``b"data"``, uint8 of shape (n, 3072) whose rows hold the red,
green and blue 32x32 planes one after the other (each row major), and ``b"labels"``, n ints in
0..9. The archive is read in memory, never extracted, and the batches with the restricted
unpickler of :mod:`crosslip.data.unpickle`.

Images are returned channels last, ``shape = (32, 32, 3)``: a row of ``x`` is the (H, W, C)
image flattened, so pixel (r, c) channel k is at index ``(32 * r + c) * 3 + k``, the layout
that :func:`crosslip.data.augment.to_images` and :class:`crosslip.models.resnet.ResNet` expect.
"""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import DataFormatError
from .dataset import Dataset, register
from .fetch import RemoteFile, fetch_dataset
from .unpickle import load_restricted

ARCHIVE = "cifar-10-python.tar.gz"
#: MD5 of the archive file as stored (https://www.cs.toronto.edu/~kriz/cifar.html).
MD5 = "c58f30108f718f92721af3b95e74349a"
BASE_URLS = ("https://www.cs.toronto.edu/~kriz/",)
FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
SHAPE = (32, 32, 3)
NUM_CLASSES = 10
#: The class names of ``batches.meta`` (``label_names``), in label order.
CLASS_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
#: Official (train, test) sizes, checked by the registered loader.
COUNTS = (50000, 10000)
#: A member larger than this is refused (a real batch is about 31 MB).
MAX_MEMBER_BYTES = 64 << 20


def remote_files(base_urls: Sequence[str] | None = None, md5: str = MD5) -> list[RemoteFile]:
    """The official archive, its URLs and the MD5 of its stored bytes (one file)."""
    base_urls = BASE_URLS if base_urls is None else tuple(base_urls)
    urls = tuple(base + ARCHIVE for base in base_urls)
    return [RemoteFile(ARCHIVE, md5, urls, decompressed=False, algorithm="md5")]


def _unsafe_name(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts


def read_members(path: Path, names: Sequence[str]) -> dict[str, bytes]:
    """Bytes of the regular-file members ``names`` of a ``.tar.gz``, read without extracting.

    Refuses archives with absolute or ``..`` member names, duplicated or oversized wanted
    members, and lists every wanted member that is missing; all as :class:`DataFormatError`.
    """
    wanted, found = set(names), {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                if _unsafe_name(member.name):
                    raise DataFormatError(f"{path}: unsafe member name {member.name!r} refused")
                if member.name not in wanted:
                    continue
                if member.name in found or not member.isfile():
                    raise DataFormatError(
                        f"{path}: {member.name} is duplicated or not a regular file"
                    )
                if member.size > MAX_MEMBER_BYTES:
                    raise DataFormatError(f"{path}: {member.name} is too large ({member.size} B)")
                fh = tar.extractfile(member)
                assert fh is not None  # regular file
                found[member.name] = fh.read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataFormatError(f"{path}: not a readable .tar.gz archive ({exc})") from exc
    missing = [n for n in names if n not in found]
    if missing:
        raise DataFormatError(f"{path}: missing member(s) {', '.join(missing)}")
    return found


def read_batch(raw: bytes, source: str) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch -> (uint8 images (n, 32, 32, 3) channels last, int64 labels (n,))."""
    obj = load_restricted(raw, source)
    if not isinstance(obj, dict):
        raise DataFormatError(f"{source}: expected a dict, got {type(obj).__name__}")
    batch = {k.decode("latin-1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    missing = [k for k in ("data", "labels") if k not in batch]
    if missing:
        raise DataFormatError(f"{source}: missing key(s) {', '.join(missing)}")
    data = batch["data"]
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != int(np.prod(SHAPE))
    ):
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataFormatError(f"{source}: 'data' must be uint8 of shape (n, 3072), got {got}")
    labels = np.asarray(batch["labels"]) if isinstance(batch["labels"], list | np.ndarray) else None
    if (
        labels is None
        or labels.shape != (len(data),)
        or not np.issubdtype(labels.dtype, np.integer)
    ):
        raise DataFormatError(f"{source}: 'labels' must be {len(data)} integers")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataFormatError(f"{source}: labels outside 0..{NUM_CLASSES - 1}")
    images = data.reshape(len(data), 3, 32, 32).transpose(0, 2, 3, 1)  # planes -> channels last
    return np.ascontiguousarray(images), labels.astype(np.int64)


def read_cifar10_archive(
    path: Path | str, counts: tuple[int, int] | None = None, name: str = "cifar10"
) -> Dataset:
    """Build a :class:`Dataset` from a (verified) ``cifar-10-python.tar.gz``.

    ``x_*`` are float32 (n, 3072) in [0, 1] in (H, W, C) order; ``counts`` = (train, test),
    when given, must match the number of images.
    """
    path = Path(path)
    names = [f"{FOLDER}/{b}" for b in (*TRAIN_BATCHES, TEST_BATCH)]
    members = read_members(path, names)
    splits = [read_batch(members[n], f"{path}: {n}") for n in names]
    x_train = np.concatenate([x for x, _ in splits[:-1]])
    y_train = np.concatenate([y for _, y in splits[:-1]])
    x_test, y_test = splits[-1]
    return Dataset.from_pixels(
        name,
        (x_train, y_train),
        (x_test, y_test),
        SHAPE,
        NUM_CLASSES,
        counts,
        source=str(path),
        class_names=CLASS_NAMES,
    )


@register("cifar10")
def load_cifar10(
    cache_dir: Path,
    mirror_dir: Path | None = None,
    *,
    files: Sequence[RemoteFile] | None = None,
    counts: tuple[int, int] | None = COUNTS,
) -> Dataset:
    """CIFAR-10: mirror folder (``data.mirrors.cifar10``), else cache, else the official URL.

    ``files`` replaces the official spec (:func:`remote_files`) and ``counts`` the official
    sizes (``None``: any); both only for tests with small archives.
    """
    files = remote_files() if files is None else files
    paths = fetch_dataset("cifar10", files, cache_dir, mirror_dir)
    return read_cifar10_archive(paths[ARCHIVE], counts=counts)
