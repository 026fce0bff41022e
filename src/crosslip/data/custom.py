"""Datasets of your own, declared in the config: IDX files, a ``.npz`` of arrays, or a folder of
images per class (docs/your-own-data.md).

A config entry (config key ``datasets``, :func:`crosslip.config.grid.dataset_entry`) such as::

    {name: mydigits, format: idx, path: /data/mydigits}
    {name: scans, format: npz, path: scans.npz, sha256: <digest of scans.npz>}
    {name: signs, format: folder, path: data/signs, checksums: data/signs/SHA256SUMS}

is read by :func:`load_custom` into a :class:`crosslip.data.Dataset`, exactly like a registered
dataset: float32 pixels in [0, 1] flattened to (n, d) in channels-last order, int64 labels
0..K-1. The image shape, the number of classes K and the class names come from the data.

Formats
-------
``idx``
    A folder holding the four files of MNIST's layout and naming, each plain or
    gzip-compressed (``.gz``): ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``. idx3 images are (n, h, w),
    greyscale, shape (h, w, 1); colour images are idx4 (n, h, w, c), in files named
    ``*-images-idx4-ubyte``. Pixels uint8 (0..255) or float in [0, 1]; labels integers
    (idx1). Classes are named ``"0"``, ``"1"``, ...
``npz``
    One ``.npz`` (``numpy.savez``) with arrays ``x_train``, ``y_train``, ``x_test``,
    ``y_test``: images uint8 or float in [0, 1], channels last (n, h, w), (n, h, w, c), or
    flat vectors (n, d) (shape (d,): no ``augment`` setting, no ResNet); labels integers (n,).
    An optional array ``class_names`` (K strings) names the classes. Read with
    ``allow_pickle=False``: arrays of Python objects (pickles) are refused, never loaded.
``folder``
    ``train/<class>/*.png|*.jpg|*.jpeg`` and ``test/<class>/...`` (suffixes in any letter
    case), decoded by Pillow. The classes are the sorted folder names of ``train/`` and keep
    those names. Greyscale images (Pillow modes ``1``, ``L``, opaque ``LA``) have shape
    (h, w, 1); all others are converted to RGB, shape (h, w, 3). Hidden files (``.*``) are
    skipped; any other file is refused.

Checks
------
Checksums are verified first (:func:`verify_checksums`): ``sha256`` (one digest of the
``.npz``, or file -> digest) and a ``checksums`` file in ``sha256sum`` format, over the bytes as
stored. Then every split must be there and hold images of one shape, pixels must be finite and
in [0, 1], labels integers 0..K-1 with every class in both splits (K = the number of class
names where the data names its classes, else the largest label + 1; K >= 2). Whatever fails
raises :class:`CustomDataError`, one line that names the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..io.files import read_npz_array
from .dataset import Dataset, to_unit_float
from .fetch import ChecksumError, DataFormatError, content_digest
from .idx import IdxFormatError, read_idx

FORMATS = ("idx", "npz", "folder")
SPLITS = ("train", "test")
#: The file name prefix of each split in MNIST's naming.
IDX_PREFIX = {"train": "train", "test": "t10k"}
NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
#: What to save instead of an array of Python objects.
NPZ_ADVICE = "Save numeric arrays (uint8 or float images, integer labels)"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


class CustomDataError(DataFormatError):
    """A dataset of your own that cannot be used as it is: missing or damaged files, wrong
    checksums, labels or pixel values; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Split:
    """One split as read: ``x`` float32 (n, d) in [0, 1], ``y`` int64 (n,), the image shape
    (channels last) and where images and labels came from (for messages)."""

    x: np.ndarray
    y: np.ndarray
    shape: tuple[int, ...]
    images: str
    labels: str


# --------------------------------------------------------------------------------------
# the entry point
# --------------------------------------------------------------------------------------
def load_custom(entry: Mapping[str, Any]) -> Dataset:
    """The dataset of a config entry ``{name, format, path[, sha256][, checksums]}``.

    ``path`` is absolute or relative to the working directory. Verifies the checksums, reads
    the format (see the module docstring) and checks the content; raises
    :class:`CustomDataError` for anything wrong, before returning anything.
    """
    name, fmt = str(entry["name"]), entry["format"]
    if fmt not in FORMATS:
        raise CustomDataError(f"{name}: unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    path = Path(entry["path"]).expanduser()
    verify_checksums(entry)
    if fmt == "idx":
        train, test = read_idx_folder(path)
        names: tuple[str, ...] | None = None
    elif fmt == "npz":
        train, test, names = read_npz(path)
    else:
        train, test, names = read_image_folder(path)
    return assemble(name, train, test, names)


def assemble(
    name: str, train: Split, test: Split, class_names: Sequence[str] | None = None
) -> Dataset:
    """A :class:`Dataset` from two checked splits: same image shape, labels 0..K-1 with every
    class in both splits (K = ``len(class_names)`` when given, else the largest label + 1)."""
    if train.shape != test.shape:
        raise CustomDataError(
            f"{test.images}: images of shape {_dims(test.shape)}, but those of {train.images} "
            f"are {_dims(train.shape)}; all images must have one shape"
        )
    for split in (train, test):
        bad = np.flatnonzero(split.y < 0)
        if bad.size:
            raise CustomDataError(
                f"{split.labels}: label {split.y[bad[0]]} (item {bad[0]}) is negative; labels "
                "are the classes 0, 1, ..., K-1"
            )
    if class_names is not None:
        k = len(class_names)
        for split in (train, test):
            bad = np.flatnonzero(split.y >= k)
            if bad.size:
                raise CustomDataError(
                    f"{split.labels}: label {split.y[bad[0]]} (item {bad[0]}) is out of range: "
                    f"{k} classes, so labels 0..{k - 1}"
                )
    else:
        k = int(max(train.y.max(), test.y.max())) + 1
    names = tuple(class_names) if class_names is not None else tuple(map(str, range(k)))
    if k < 2:
        raise CustomDataError(f"{train.labels}: a single class; a classifier needs at least 2")
    for split, what in ((train, "training"), (test, "test")):
        counts = np.bincount(split.y, minlength=k)
        empty = np.flatnonzero(counts == 0)
        if empty.size:
            c = int(empty[0])
            label = f"class {c}" + (f" ({names[c]!r})" if names[c] != str(c) else "")
            raise CustomDataError(
                f"{split.labels}: {label} has no {what} images (labels must be the contiguous "
                f"classes 0..{k - 1}, each in both splits)"
            )
    return Dataset(name, train.x, train.y, test.x, test.y, train.shape, k, names)


# --------------------------------------------------------------------------------------
# shared checks of arrays
# --------------------------------------------------------------------------------------
def _dims(shape: tuple[int, ...]) -> str:
    return " x ".join(map(str, shape))


def image_shape(x: np.ndarray, source: str) -> tuple[int, ...]:
    """The channels-last image shape of an array of images: (n, h, w) -> (h, w, 1),
    (n, h, w, c) -> (h, w, c), flat (n, d) -> (d,)."""
    if x.ndim not in (2, 3, 4) or 0 in x.shape[1:]:
        raise CustomDataError(
            f"{source}: array of shape {x.shape}; expected images (n, h, w), (n, h, w, c) or "
            "flat vectors (n, d)"
        )
    return tuple(int(s) for s in x.shape[1:]) + ((1,) if x.ndim == 3 else ())


def unit_pixels(x: np.ndarray, source: str) -> np.ndarray:
    """uint8 pixels (/255) or float pixels in [0, 1] -> float32 (n, d) in [0, 1]; refuses
    other types, NaN and values outside [0, 1] (infinities included)."""
    if len(x) == 0:
        raise CustomDataError(f"{source}: no images")
    if x.dtype == np.uint8:
        return to_unit_float(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise CustomDataError(
            f"{source}: pixels of type {x.dtype}; store them as uint8 (0..255) or as floats "
            "in [0, 1]"
        )
    flat = x.reshape(len(x), -1)
    nan = np.isnan(flat).any(axis=1)
    if nan.any():
        raise CustomDataError(
            f"{source}: NaN pixels in {int(nan.sum())} image(s), the first image {np.argmax(nan)}"
        )
    outside = ((flat < 0) | (flat > 1)).any(axis=1)
    if outside.any():
        raise CustomDataError(
            f"{source}: pixel values outside [0, 1] (min {float(flat.min()):g}, max "
            f"{float(flat.max()):g}; first in image {np.argmax(outside)}); scale float pixels "
            "to [0, 1], or store 8-bit pixels as uint8"
        )
    return flat.astype(np.float32)


def int_labels(y: np.ndarray, source: str, n_images: int, images: str) -> np.ndarray:
    """Integer labels, one per image -> int64 (n,)."""
    if y.ndim != 1:
        raise CustomDataError(
            f"{source}: labels of shape {y.shape}; expected one integer class per image (n,) "
            "(one-hot labels: take argmax over the last axis)"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise CustomDataError(
            f"{source}: labels of type {y.dtype}; expected integers (e.g. y.astype(int))"
        )
    if len(y) != n_images:
        raise CustomDataError(f"{source}: {len(y)} labels for the {n_images} images of {images}")
    return y.astype(np.int64)


def make_split(x: np.ndarray, y: np.ndarray, images: str, labels: str) -> Split:
    """A checked :class:`Split` from raw images and labels."""
    shape = image_shape(x, images)
    pixels = unit_pixels(x, images)
    return Split(pixels, int_labels(y, labels, len(pixels), images), shape, images, labels)


# --------------------------------------------------------------------------------------
# idx
# --------------------------------------------------------------------------------------
def _idx_file(folder: Path, split: str, kind: str) -> Path:
    """The one file of ``split``'s ``kind`` (images or labels) in MNIST's naming."""
    dims = ("3", "4") if kind == "images" else ("1",)
    names = [f"{IDX_PREFIX[split]}-{kind}-idx{d}-ubyte{gz}" for d in dims for gz in ("", ".gz")]
    found = [folder / n for n in names if (folder / n).is_file()]
    if not found:
        raise CustomDataError(
            f"{folder}: missing the {split} split's {kind}: none of {', '.join(names)} is there"
        )
    if len(found) > 1:
        raise CustomDataError(
            f"{folder}: {' and '.join(p.name for p in found)} are both there; keep one"
        )
    return found[0]


def _read_idx(path: Path) -> np.ndarray:
    try:
        return read_idx(path)
    except (IdxFormatError, OSError) as exc:
        raise CustomDataError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from exc


def read_idx_folder(folder: Path) -> tuple[Split, Split]:
    """The train and test splits of an IDX folder (MNIST's four files, .gz or not)."""
    if not folder.is_dir():
        raise CustomDataError(f"{folder}: no such folder (format idx reads a folder)")
    splits = []
    for split in SPLITS:
        images, labels = _idx_file(folder, split, "images"), _idx_file(folder, split, "labels")
        x = _read_idx(images)
        if x.ndim not in (3, 4):
            raise CustomDataError(
                f"{images}: IDX array of shape {x.shape}; expected images (n, h, w) or (n, h, w, c)"
            )
        splits.append(make_split(x, _read_idx(labels), str(images), str(labels)))
    return splits[0], splits[1]


# --------------------------------------------------------------------------------------
# npz
# --------------------------------------------------------------------------------------
def read_npz(path: Path) -> tuple[Split, Split, tuple[str, ...] | None]:
    """The splits (and the class names, if stored) of a ``.npz`` of plain arrays."""
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no such file"
        raise CustomDataError(f"{path}: {what} (format npz reads one .npz file)")
    try:
        npz = np.load(path, allow_pickle=False)
    except ValueError as exc:  # numpy falls back to unpickling what is not .npy nor .npz
        raise CustomDataError(
            f"{path}: not a .npz of arrays (a pickle or an unknown format); refused: unpickling "
            "can run code. Save the arrays with numpy.savez"
        ) from exc
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise CustomDataError(f"{path}: not a readable .npz ({exc})") from exc
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise CustomDataError(f"{path}: a single array (.npy); expected a .npz of {NPZ_ARRAYS}")
    with npz:
        missing = [k for k in NPZ_ARRAYS if k not in npz.files]
        if missing:
            splits = sorted({k.split("_")[1] for k in missing}, key=SPLITS.index)
            raise CustomDataError(
                f"{path}: missing array(s) {', '.join(missing)} (the {' and '.join(splits)} "
                f"split); a .npz dataset holds {', '.join(NPZ_ARRAYS)}"
            )
        arrays = {
            k: read_npz_array(npz, k, path, CustomDataError, NPZ_ADVICE)
            for k in (*NPZ_ARRAYS, "class_names")
            if k in npz.files
        }
    names = None
    if "class_names" in arrays:
        raw = arrays["class_names"]
        if raw.ndim != 1 or raw.dtype.kind not in "US":
            raise CustomDataError(
                f"{path}: class_names must be a list of strings (K,), got {raw.dtype} {raw.shape}"
            )
        names = tuple(s.decode() if isinstance(s, bytes) else str(s) for s in raw.tolist())
    train, test = (
        make_split(arrays[f"x_{s}"], arrays[f"y_{s}"], f"{path}: x_{s}", f"{path}: y_{s}")
        for s in SPLITS
    )
    return train, test, names


# --------------------------------------------------------------------------------------
# folder of images
# --------------------------------------------------------------------------------------
def _visible(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _class_folders(split_dir: Path, split: str) -> list[str]:
    if not split_dir.is_dir():
        raise CustomDataError(
            f"{split_dir}: missing (the {split} split); a folder dataset holds "
            f"train/<class>/ and test/<class>/ with the images"
        )
    entries = _visible(split_dir)
    for p in entries:
        if not p.is_dir():
            raise CustomDataError(
                f"{p}: a file outside the class folders; images go in {split}/<class>/"
            )
    if not entries:
        raise CustomDataError(
            f"{split_dir}: empty; expected one folder per class ({split}/<class>/*.png|jpg)"
        )
    return [p.name for p in entries]


def decode_image(path: Path) -> np.ndarray:
    """An image file -> uint8 (h, w, 1) for greyscale, (h, w, 3) for anything else (Pillow);
    refuses images that are not 8-bit or that have transparent pixels."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            mode = im.mode
            if mode in ("I", "I;16", "I;16B", "I;16L", "F"):
                raise CustomDataError(
                    f"{path}: Pillow mode {mode} (more than 8 bits per pixel); convert the "
                    "images to 8-bit greyscale or colour"
                )
            alpha = "A" in mode or (mode == "P" and "transparency" in im.info)
            if alpha:
                opacity = np.asarray(im.convert("RGBA" if mode != "LA" else "LA"))[..., -1]
                if (opacity < 255).any():
                    raise CustomDataError(
                        f"{path}: transparent pixels; flatten the images onto a background"
                    )
            if mode in ("1", "L", "LA"):
                return np.asarray(im.convert("L"), dtype=np.uint8)[..., None]
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except CustomDataError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise CustomDataError(f"{path}: cannot decode the image ({exc})") from exc


def _image_files(folder: Path, split: str, cls: str) -> list[Path]:
    if not folder.is_dir():
        where = "training" if split == "train" else "test"
        raise CustomDataError(f"{folder}: missing; class {cls!r} has no {where} images")
    files = _visible(folder)
    for p in files:
        if p.is_dir() or p.suffix.lower() not in IMAGE_SUFFIXES:
            raise CustomDataError(
                f"{p}: not an image file; a class folder holds only "
                f"{', '.join('*' + s for s in IMAGE_SUFFIXES)}"
            )
    if not files:
        where = "training" if split == "train" else "test"
        raise CustomDataError(f"{folder}: empty; class {cls!r} has no {where} images")
    return files


def read_image_folder(root: Path) -> tuple[Split, Split, tuple[str, ...]]:
    """The splits of ``root/{train,test}/<class>/*.png|jpg`` and the class names (sorted
    folder names of ``train``)."""
    if not root.is_dir():
        raise CustomDataError(f"{root}: no such folder (format folder reads a folder)")
    classes = _class_folders(root / "train", "train")
    extra = sorted(set(_class_folders(root / "test", "test")) - set(classes))
    if extra:
        raise CustomDataError(
            f"{root / 'test' / extra[0]}: class {extra[0]!r} is not in {root / 'train'}; every "
            "class needs training images"
        )
    splits = []
    first: tuple[tuple[int, ...], Path] | None = None  # the first image's shape and file
    for split in SPLITS:
        images, labels = [], []
        for label, cls in enumerate(classes):
            for path in _image_files(root / split / cls, split, cls):
                img = decode_image(path)
                first = first or (img.shape, path)
                if img.shape != first[0]:
                    raise CustomDataError(
                        f"{path}: an image of {_dims(img.shape)} (h x w x channels), but "
                        f"{first[1]} is {_dims(first[0])}; all images must have one size and "
                        "be all greyscale or all colour"
                    )
                images.append(img)
                labels.append(label)
        where = str(root / split)
        splits.append(
            make_split(np.stack(images), np.asarray(labels, dtype=np.int64), where, where)
        )
    return splits[0], splits[1], tuple(classes)


# --------------------------------------------------------------------------------------
# checksums and the fingerprint that reruns the preparation when the files change
# --------------------------------------------------------------------------------------
_SUM_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")


def expected_checksums(entry: Mapping[str, Any]) -> list[tuple[Path, str, str]]:
    """(file, SHA-256 hex digest, where the digest was given) for every checksum of a config
    entry: ``sha256`` (one digest of the .npz, or file -> digest relative to ``path``, for an
    npz to its folder) and the lines of a ``checksums`` file (``<digest>  <file>``, the file
    relative to the checksum file's folder)."""
    path = Path(entry["path"]).expanduser()
    base = path.parent if entry["format"] == "npz" else path
    out: list[tuple[Path, str, str]] = []
    given = entry.get("sha256")
    if isinstance(given, str):
        if entry["format"] != "npz":
            raise CustomDataError(
                f"{entry['name']}: sha256 is one digest, but format {entry['format']} reads a "
                "folder; map each file to its digest"
            )
        out.append((path, given.lower(), f"the sha256 of dataset {entry['name']}"))
    elif isinstance(given, Mapping):
        for rel, digest in given.items():
            out.append((base / rel, str(digest).lower(), f"the sha256 of dataset {entry['name']}"))
    if entry.get("checksums"):
        sums = Path(entry["checksums"]).expanduser()
        if not sums.is_file():
            raise CustomDataError(
                f"{sums}: checksum file not found (config key checksums of dataset {entry['name']})"
            )
        for number, line in enumerate(sums.read_text().splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            match = _SUM_LINE.fullmatch(line)
            if match is None:
                raise CustomDataError(
                    f"{sums}, line {number}: not '<sha256 digest>  <file>' (sha256sum's "
                    f"format): {line[:60]!r}"
                )
            out.append(
                (sums.parent / match.group(2), match.group(1).lower(), f"{sums}, line {number}")
            )
    return out


def verify_checksums(entry: Mapping[str, Any]) -> None:
    """Raise :class:`CustomDataError` unless every file with a checksum in ``entry`` exists
    and has that SHA-256 (over its bytes as stored, ``.gz`` files included)."""
    for path, digest, where in expected_checksums(entry):
        if not path.is_file():
            raise CustomDataError(f"{path}: not found, but {where} gives its checksum")
        try:
            got = content_digest(path, "sha256", gunzip=False)
        except ChecksumError as exc:
            raise CustomDataError(str(exc)) from exc
        if got != digest:
            raise CustomDataError(
                f"{path}: SHA-256 mismatch (the file has {got[:12]}..., {where} says "
                f"{digest[:12]}...): the file changed or is damaged; replace it, or update the "
                "checksum if the change is intended"
            )


def source_files(entry: Mapping[str, Any]) -> list[Path]:
    """The existing files that :func:`load_custom` reads for ``entry`` (checksum file
    included), sorted."""
    path = Path(entry["path"]).expanduser()
    files: list[Path] = []
    if entry["format"] == "npz":
        files = [path] if path.is_file() else []
    elif entry["format"] == "idx" and path.is_dir():
        files = [
            p
            for p in path.iterdir()
            if p.is_file()
            and re.fullmatch(r"(train|t10k)-(images-idx[34]|labels-idx1)-ubyte(\.gz)?", p.name)
        ]
    elif entry["format"] == "folder":
        for split in SPLITS:
            for dirpath, dirnames, filenames in os.walk(path / split):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                files += [Path(dirpath, f) for f in filenames if not f.startswith(".")]
    if entry.get("checksums") and Path(entry["checksums"]).expanduser().is_file():
        files.append(Path(entry["checksums"]).expanduser())
    return sorted(files)


def fingerprint(entry: Mapping[str, Any] | None) -> str:
    """A digest of the names, sizes and modification times of the files of ``entry`` (""
    for a registered dataset, ``entry`` None): the prepare_data rule's param, so that the
    dataset is read again when, and only when, one of its files changes (is added, removed,
    rewritten or touched), as ``make`` does for its inputs."""
    if entry is None:
        return ""
    root = Path(entry["path"]).expanduser()
    h = hashlib.sha256()
    for path in source_files(entry):
        stat = path.stat()
        rel = os.path.relpath(path, root if root.is_dir() else root.parent)
        h.update(f"{rel}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def check_fits_training(ds: Dataset, settings: Sequence[str], arch: str, crop: int) -> None:
    """Raise :class:`CustomDataError` if the config cannot train on ``ds``: the ``augment``
    setting (random crops of ``crop`` pixels a side) and the ResNet need images (h, w, c),
    and the crops must fit in them."""
    needs = [
        what
        for what, on in (
            ("train.settings augment", "augment" in settings),
            ("model.arch resnet", arch == "resnet"),
        )
        if on
    ]
    if needs and len(ds.shape) != 3:
        raise CustomDataError(
            f"{ds.name}: flat vectors of shape ({ds.shape[0]},), but {' and '.join(needs)} "
            "need images (h, w, c); store the images as (n, h, w) or (n, h, w, c)"
        )
    if "augment" in settings and crop > min(ds.shape[:2]):
        raise CustomDataError(
            f"{ds.name}: train.crop = {crop} is larger than the images "
            f"({ds.shape[0]} x {ds.shape[1]}); set train.crop to at most {min(ds.shape[:2])}"
        )
