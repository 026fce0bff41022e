"""GTSRB, the German Traffic Sign Recognition Benchmark (Stallkamp et al. 2012): 43 classes.

The official archives of the INI benchmark (final training and test sets):

* ``GTSRB_Final_Training_Images.zip``: ``GTSRB/Final_Training/Images/000NN/*.ppm`` with one
  ``GT-000NN.csv`` per class folder;
* ``GTSRB_Final_Test_Images.zip``: ``GTSRB/Final_Test/Images/*.ppm`` (its csv has no labels);
* ``GTSRB_Final_Test_GT.zip``: ``GT-final_test.csv``, the test annotations with labels.

The csv files are ``;``-separated with the columns
``Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId``; the region of interest (ROI)
includes its end pixels ``Roi.X2`` and ``Roi.Y2``. Each P6 PPM image (15x15 to 250x250 pixels)
is cropped to its ROI and resized to ``SIZE x SIZE`` with Pillow's bilinear filter (which
averages over the whole footprint when shrinking), giving uint8 RGB images, channels last,
``shape = (32, 32, 3)``, flattened in (H, W, C) order and scaled to [0, 1]. Images are sorted
by (class, file name) in both splits. The archives are read in memory, never extracted.

There are 39,209 training and 12,630 test images; Hein & Andriushchenko (2017) write 34,209
training images, a typo. (torchvision downloads a re-packed ``GTSRB-Training_fixed.zip`` for
training; this module uses the archive as published with the benchmark.)
"""

from __future__ import annotations

import csv
import io
import re
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import DataFormatError
from .dataset import Dataset, register
from .fetch import RemoteFile, fetch_dataset

TRAIN_ZIP = "GTSRB_Final_Training_Images.zip"
TEST_ZIP = "GTSRB_Final_Test_Images.zip"
GT_ZIP = "GTSRB_Final_Test_GT.zip"
#: MD5 of each archive file as stored (as published with the benchmark and used by torchvision
#: for the two test archives).
MD5S = {
    TRAIN_ZIP: "f33fd80ac59bff73c82d25ab499e03a3",
    TEST_ZIP: "c7e4e6327067d32654124b0fe9e82185",
    GT_ZIP: "fe31e9c9270bbcd7b84b7f21a9d9d9e5",
}
BASE_URLS = ("https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/",)
TRAIN_DIR = "GTSRB/Final_Training/Images/"
TEST_DIR = "GTSRB/Final_Test/Images/"
GT_CSV = "GT-final_test.csv"
COLUMNS = ("Filename", "Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2", "ClassId")
SIZE = 32
NUM_CLASSES = 43
#: Official (train, test) sizes, checked by the registered loader.
COUNTS = (39209, 12630)
#: A member larger than this is refused (the largest image is about 190 kB).
MAX_MEMBER_BYTES = 16 << 20
_CLASS_CSV = re.compile(re.escape(TRAIN_DIR) + r"(\d{5})/GT-(\d{5})\.csv")


def remote_files(
    base_urls: Sequence[str] | None = None, md5s: Mapping[str, str] | None = None
) -> list[RemoteFile]:
    """The three official archives with their URLs and the MD5s of their stored bytes."""
    base_urls = BASE_URLS if base_urls is None else tuple(base_urls)
    md5s = MD5S if md5s is None else md5s
    return [
        RemoteFile(
            name,
            md5s[name],
            tuple(b + name for b in base_urls),
            decompressed=False,
            algorithm="md5",
        )
        for name in (TRAIN_ZIP, TEST_ZIP, GT_ZIP)
    ]


@dataclass(frozen=True)
class Annotation:
    """One csv row: image file name, ROI (x1, y1, x2, y2) with inclusive ends, class id."""

    filename: str
    roi: tuple[int, int, int, int]
    class_id: int


def parse_annotations(raw: bytes, source: str) -> list[Annotation]:
    """Rows of a GTSRB annotation csv; :class:`DataFormatError` naming ``source`` otherwise."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"{source}: not a text csv ({exc})") from exc
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=";", skipinitialspace=True)
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise DataFormatError(
            f"{source}: missing column(s) {', '.join(missing)}; the header must be "
            f"';'-separated and hold {', '.join(COLUMNS)}"
        )
    col = [header.index(c) for c in COLUMNS]
    rows = []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        try:
            name, x1, y1, x2, y2, cid = (row[i].strip() for i in col)
            roi = (int(x1), int(y1), int(x2), int(y2))
            class_id = int(cid)
        except (IndexError, ValueError) as exc:
            raise DataFormatError(f"{source}: line {line}: bad row {row!r} ({exc})") from exc
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise DataFormatError(f"{source}: line {line}: bad file name {name!r}")
        if not 0 <= class_id < NUM_CLASSES:
            raise DataFormatError(f"{source}: line {line}: ClassId {class_id} not in 0..42")
        if not (0 <= roi[0] <= roi[2] and 0 <= roi[1] <= roi[3]):
            raise DataFormatError(f"{source}: line {line}: empty or negative ROI {roi}")
        rows.append(Annotation(name, roi, class_id))
    return rows


def crop_resize(raw: bytes, roi: tuple[int, int, int, int], source: str, size: int) -> np.ndarray:
    """Decode a PPM image, crop it to ``roi`` (inclusive ends) -> uint8 (size, size, 3)."""
    try:
        with Image.open(io.BytesIO(raw)) as img:
            fmt = img.format
            img.load()
            rgb = img.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DataFormatError(f"{source}: not a readable PPM image ({exc})") from exc
    if fmt != "PPM":
        raise DataFormatError(f"{source}: expected a PPM image, got {fmt}")
    x1, y1, x2, y2 = roi
    if x2 >= rgb.width or y2 >= rgb.height:
        raise DataFormatError(f"{source}: ROI {roi} outside the {rgb.width}x{rgb.height} image")
    patch = rgb.crop((x1, y1, x2 + 1, y2 + 1)).resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(patch, dtype=np.uint8)


def _read(zf: zipfile.ZipFile, member: str, archive: Path) -> bytes:
    try:
        info = zf.getinfo(member)
    except KeyError:
        raise DataFormatError(f"{archive}: missing member {member}") from None
    if info.file_size > MAX_MEMBER_BYTES:
        raise DataFormatError(f"{archive}: {member} is too large ({info.file_size} B)")
    try:
        return zf.read(info)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError) as exc:
        raise DataFormatError(f"{archive}: {member} cannot be read ({exc})") from exc


def _open(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DataFormatError(f"{path}: not a readable zip archive ({exc})") from exc


def _images(
    zf: zipfile.ZipFile, archive: Path, items: list[tuple[str, Annotation]], size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Crop and resize the (member, annotation) pairs, sorted by (class, file name)."""
    if not items:
        raise DataFormatError(f"{archive}: no annotated images")
    items = sorted(items, key=lambda it: (it[1].class_id, it[1].filename))
    x = np.stack(
        [crop_resize(_read(zf, m, archive), a.roi, f"{archive}: {m}", size) for m, a in items]
    )
    return x, np.array([a.class_id for _, a in items], dtype=np.int64)


def read_training(path: Path, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Training archive -> (uint8 (n, size, size, 3), int64 (n,)), from the per-class csvs."""
    with _open(path) as zf:
        found = [(n, _CLASS_CSV.fullmatch(n)) for n in sorted(zf.namelist())]
        csvs = [(n, m) for n, m in found if m is not None]
        if not csvs:
            raise DataFormatError(
                f"{path}: no {TRAIN_DIR}NNNNN/GT-NNNNN.csv files; is it {TRAIN_ZIP}?"
            )
        items = []
        for member, m in csvs:
            source = f"{path}: {member}"
            if m.group(1) != m.group(2):
                raise DataFormatError(f"{source}: annotation file in the wrong class folder")
            for a in parse_annotations(_read(zf, member, path), source):
                if a.class_id != int(m.group(1)):
                    raise DataFormatError(f"{source}: {a.filename} has ClassId {a.class_id}")
                items.append((f"{TRAIN_DIR}{m.group(1)}/{a.filename}", a))
        return _images(zf, path, items, size)


def read_test(images: Path, ground_truth: Path, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Test images archive + ground-truth archive -> (uint8 (n, size, size, 3), int64 (n,))."""
    with _open(ground_truth) as gz:
        rows = parse_annotations(_read(gz, GT_CSV, ground_truth), f"{ground_truth}: {GT_CSV}")
    with _open(images) as zf:
        return _images(zf, images, [(TEST_DIR + a.filename, a) for a in rows], size)


def read_gtsrb_archives(
    paths: Mapping[str, Path],
    size: int = SIZE,
    counts: tuple[int, int] | None = None,
    name: str = "gtsrb",
) -> Dataset:
    """Build a :class:`Dataset` from the three (verified) archives, keyed by file name.

    ``x_*`` are float32 (n, size * size * 3) in [0, 1] in (H, W, C) order; ``counts`` =
    (train, test), when given, must match the number of images.
    """
    x_train, y_train = read_training(Path(paths[TRAIN_ZIP]), size)
    x_test, y_test = read_test(Path(paths[TEST_ZIP]), Path(paths[GT_ZIP]), size)
    return Dataset.from_pixels(
        name,
        (x_train, y_train),
        (x_test, y_test),
        (size, size, 3),
        NUM_CLASSES,
        counts,
        source=f"{paths[TRAIN_ZIP]}, {paths[TEST_ZIP]}",
    )


@register("gtsrb")
def load_gtsrb(
    cache_dir: Path,
    mirror_dir: Path | None = None,
    *,
    files: Sequence[RemoteFile] | None = None,
    counts: tuple[int, int] | None = COUNTS,
) -> Dataset:
    """GTSRB: mirror folder (``data.mirrors.gtsrb``), else cache, else the official URLs.

    ``files`` replaces the official specs (:func:`remote_files`) and ``counts`` the official
    sizes (``None``: any); both only for tests with small archives.
    """
    files = remote_files() if files is None else files
    paths = fetch_dataset("gtsrb", files, cache_dir, mirror_dir)
    return read_gtsrb_archives(paths, counts=counts)
