"""Datasets of your own declared in the config (IDX folder, .npz, folder of images): read
exactly like MNIST, bad input refused with one message naming the file before any training and
without a prepared file, and the whole workflow on three such datasets at once."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from crosslip.config.grid import aggregate_targets, dataset_entry, dataset_names
from crosslip.config.validate import validate
from crosslip.data import CustomDataError, Dataset, available, load_custom, load_prepared
from crosslip.data.custom import check_fits_training, fingerprint
from crosslip.errors import ConfigError
from crosslip.pipeline import prepare_data
from crosslip.report import illustration
from crosslip.report.illustration import plot_adversarial_samples
from crosslip.training.core import TrainConfig
from crosslip.training.single import train

from .helpers import dry_run_jobs, fields, run_snakemake, snakemake_cmd
from .workflow_helpers import BASE, THREADS, changed, files_under, offline_env

H, W = 10, 12  # an image size other than MNIST's 28 x 28
K = 3
SHAPES = ("circle", "cross", "square")  # the folder dataset's class names


# --------------------------------------------------------------------------------------
# writers of tiny datasets in the three formats
# --------------------------------------------------------------------------------------
def pattern_images(labels: np.ndarray, seed: int, channels: int = 0) -> np.ndarray:
    """uint8 images (n, H, W[, channels]): a bright bar whose place depends on the class,
    plus noise (learnable in one epoch)."""
    rng = np.random.default_rng(seed)
    shape = (len(labels), H, W) + ((channels,) if channels else ())
    x = rng.integers(0, 60, size=shape)
    for i, c in enumerate(labels):
        x[i, :, 4 * c : 4 * c + 4] += 180
    return np.clip(x, 0, 255).astype(np.uint8)


def balanced_labels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n) % K)


def idx_bytes(a: np.ndarray) -> bytes:
    """``a`` (uint8) as an IDX file: magic 0x00 0x00 0x08 ndim, big-endian dims, data."""
    return bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}i", *a.shape) + a.tobytes()


def write_idx(
    folder: Path,
    n_train: int = 30,
    n_test: int = 15,
    gz: bool = True,
    labels: tuple[np.ndarray, np.ndarray] | None = None,
) -> Path:
    """MNIST's four files (greyscale idx3, H x W) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ytr, yte = labels or (balanced_labels(n_train, 1), balanced_labels(n_test, 2))
    arrays = {
        "train-images-idx3-ubyte": pattern_images(ytr, 3),
        "train-labels-idx1-ubyte": ytr.astype(np.uint8),
        "t10k-images-idx3-ubyte": pattern_images(yte, 4),
        "t10k-labels-idx1-ubyte": yte.astype(np.uint8),
    }
    for name, a in arrays.items():
        raw = idx_bytes(a)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            (folder / name).write_bytes(raw)
    return folder


def npz_arrays(n_train: int = 30, n_test: int = 15) -> dict[str, np.ndarray]:
    """Float colour images (n, H, W, 3) in [0, 1] and named classes."""
    ytr, yte = balanced_labels(n_train, 5), balanced_labels(n_test, 6)
    return {
        "x_train": pattern_images(ytr, 7, channels=3).astype(np.float32) / 255,
        "y_train": ytr,
        "x_test": pattern_images(yte, 8, channels=3).astype(np.float64) / 255,
        "y_test": yte,
        "class_names": np.array(["low", "mid", "high"]),
    }


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def write_folder(root: Path, n_train: int = 10, n_test: int = 5, mode: str = "RGB") -> Path:
    """train/<shape>/*.png and test/<shape>/*.png (one .jpg per class in train), H x W."""
    for split, n, seed in (("train", n_train, 9), ("test", n_test, 10)):
        for c, name in enumerate(SHAPES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            imgs = pattern_images(np.full(n, c), seed + 10 * c, channels=3)
            for i, img in enumerate(imgs):
                suffix = ".jpg" if split == "train" and i == 0 else ".png"
                Image.fromarray(img).convert(mode).save(folder / f"{i:03d}{suffix}")
    return root


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------
# 1. reading: shape, classes and names from the data
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [True, False])
def test_idx_folder_reads_like_mnist(tmp_path, gz):
    folder = write_idx(tmp_path / "digits", gz=gz)
    ds = load_custom({"name": "digits", "format": "idx", "path": str(folder)})
    assert ds.name == "digits" and ds.shape == (H, W, 1) and ds.num_classes == K
    assert ds.class_names == ("0", "1", "2")
    assert ds.x_train.shape == (30, H * W) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (15, H * W)
    raw = pattern_images(balanced_labels(30, 1), 3)
    np.testing.assert_array_equal(ds.x_train, raw.reshape(30, -1) / np.float32(255))
    np.testing.assert_array_equal(ds.y_train, balanced_labels(30, 1))


def test_idx4_colour_images(tmp_path):
    folder = write_idx(tmp_path / "c", gz=False)
    for split, seed in (("train", 11), ("t10k", 12)):
        (folder / f"{split}-images-idx3-ubyte").unlink()
        y = np.frombuffer((folder / f"{split}-labels-idx1-ubyte").read_bytes()[8:], np.uint8)
        (folder / f"{split}-images-idx4-ubyte").write_bytes(
            idx_bytes(pattern_images(y, seed, channels=3))
        )
    ds = load_custom({"name": "c", "format": "idx", "path": str(folder)})
    assert ds.shape == (H, W, 3) and ds.dim == H * W * 3


def test_npz_float_colour_with_class_names(tmp_path):
    arrays = npz_arrays()
    path = write_npz(tmp_path / "scans.npz", **arrays)
    ds = load_custom({"name": "scans", "format": "npz", "path": str(path)})
    assert ds.shape == (H, W, 3) and ds.num_classes == K
    assert ds.class_names == ("low", "mid", "high")
    # channels-last order kept: row i is the (H, W, 3) image flattened
    np.testing.assert_allclose(ds.x_test[4].reshape(H, W, 3), arrays["x_test"][4], atol=1e-7)


@pytest.mark.parametrize(
    ("x_shape", "expected"), [((H, W), (H, W, 1)), ((H * W,), (H * W,)), ((H, W, 2), (H, W, 2))]
)
def test_npz_image_shapes(tmp_path, x_shape, expected):
    ytr, yte = balanced_labels(12, 0), balanced_labels(6, 1)
    rng = np.random.default_rng(0)
    path = write_npz(
        tmp_path / "a.npz",
        x_train=rng.integers(0, 256, (12, *x_shape), dtype=np.uint8),
        y_train=ytr,
        x_test=rng.integers(0, 256, (6, *x_shape), dtype=np.uint8),
        y_test=yte,
    )
    ds = load_custom({"name": "a", "format": "npz", "path": str(path)})
    assert ds.shape == expected and ds.class_names == ("0", "1", "2")


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_folder_of_images_keeps_sorted_class_names(tmp_path, mode):
    root = write_folder(tmp_path / "shapes", mode=mode)
    (root / "train" / "circle" / ".DS_Store").write_bytes(b"\0")  # hidden files are skipped
    ds = load_custom({"name": "shapes", "format": "folder", "path": str(root)})
    assert ds.class_names == SHAPES and ds.num_classes == K
    assert ds.shape == (H, W, 3 if mode == "RGB" else 1)
    assert len(ds.y_train) == 30 and len(ds.y_test) == 15
    np.testing.assert_array_equal(np.bincount(ds.y_test), [5, 5, 5])
    png = np.asarray(Image.open(root / "test" / "cross" / "002.png").convert(mode))
    np.testing.assert_array_equal(
        ds.x_test[5 + 2].reshape(png.shape if mode == "RGB" else (H, W)), png / np.float32(255)
    )


def test_prepared_file_keeps_shape_names_and_float_pixels(tmp_path):
    path = write_npz(tmp_path / "scans.npz", **npz_arrays())
    ds = load_custom({"name": "scans", "format": "npz", "path": str(path)})
    out = tmp_path / "results" / "data" / "scans.npz"
    info = prepare_data(
        "scans",
        out,
        cache="unused",
        mirror=None,
        source={"name": "scans", "format": "npz", "path": str(path)},
    )
    assert info["shape"] == [H, W, 3] and info["class_names"] == ["low", "mid", "high"]
    back = load_prepared(out)
    assert back.class_names == ds.class_names and back.shape == ds.shape
    np.testing.assert_array_equal(back.x_train, ds.x_train)  # 8-bit values: exact
    # floats that are not k/255 are stored as float32, not rounded to 8 bits
    arrays = npz_arrays()
    arrays["x_train"] = np.random.default_rng(0).random(arrays["x_train"].shape)
    write_npz(path, **arrays)
    prepare_data("scans", out, "unused", None, {"name": "s", "format": "npz", "path": str(path)})
    np.testing.assert_array_equal(
        load_prepared(out).x_train, arrays["x_train"].reshape(30, -1).astype(np.float32)
    )


# --------------------------------------------------------------------------------------
# 2. checksums
# --------------------------------------------------------------------------------------
def test_checksums_are_verified(tmp_path):
    folder = write_idx(tmp_path / "d")
    files = sorted(p.name for p in folder.iterdir())
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("".join(f"{sha256(folder / f)}  d/{f}\n" for f in files))
    good = {f: sha256(folder / f) for f in files}
    entry = {"name": "d", "format": "idx", "path": str(folder)}
    load_custom({**entry, "sha256": good})
    load_custom({**entry, "checksums": str(sums)})
    bad = {**good, files[0]: "0" * 64}
    with pytest.raises(CustomDataError, match=rf"{folder / files[0]}: SHA-256 mismatch"):
        load_custom({**entry, "sha256": bad})
    sums.write_text(sums.read_text().replace(good[files[2]], "f" * 64))
    with pytest.raises(CustomDataError, match=rf"{folder / files[2]}: SHA-256 mismatch.*line 3"):
        load_custom({**entry, "checksums": str(sums)})
    sums.write_text("not a checksum line\n")
    with pytest.raises(CustomDataError, match=r"SHA256SUMS, line 1: not '<sha256 digest>  <file>'"):
        load_custom({**entry, "checksums": str(sums)})
    with pytest.raises(CustomDataError, match=r"nothere.gz: not found, but the sha256"):
        load_custom({**entry, "sha256": {"nothere.gz": "0" * 64}})
    npz = write_npz(tmp_path / "s.npz", **npz_arrays())
    load_custom({"name": "s", "format": "npz", "path": str(npz), "sha256": sha256(npz)})
    with pytest.raises(CustomDataError, match=r"s.npz: SHA-256 mismatch"):
        load_custom({"name": "s", "format": "npz", "path": str(npz), "sha256": "a" * 64})


# --------------------------------------------------------------------------------------
# 3. bad input: one message naming the file and what is wrong; no prepared file
# --------------------------------------------------------------------------------------
def _idx_with(folder: Path, **labels) -> Path:
    ytr = labels.get("train", balanced_labels(30, 1))
    yte = labels.get("test", balanced_labels(15, 2))
    return write_idx(folder, labels=(ytr, yte), n_train=len(ytr), n_test=len(yte))


def _npz_with(path: Path, **changes) -> Path:
    arrays = {k: v for k, v in {**npz_arrays(), **changes}.items() if v is not None}
    return write_npz(path, **arrays)


def _folder_then(root: Path, change) -> Path:
    write_folder(root)
    change(root)
    return root


def _truncate(path: Path, keep: float = 0.5) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])


def _evil_pickle(path: Path, marker: Path) -> Path:
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(Evil()))
    return path


def _object_array_npz(path: Path) -> Path:
    arrays = npz_arrays()
    arrays["x_train"] = np.array([{"a": 1}] * 30, dtype=object)
    return write_npz(path, **arrays)


def _empty(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _empty_out(folder: Path) -> None:
    for p in folder.iterdir():
        p.unlink()


def _rm(path: Path) -> None:
    path.unlink()


def _bad_png(root: Path, size: tuple[int, int] = (W, H), mode: str = "RGB") -> None:
    Image.new(mode, size).save(root / "test" / "circle" / "zz.png")


#: (id, format, writer(tmp_path) -> data path, substrings of the message (``{path}`` = the
#: data path)). Each is a distinct bad input.
BAD_DATA = [
    # missing split
    (
        "idx-missing-test-labels",
        "idx",
        lambda t: (_rm(write_idx(t / "d") / "t10k-labels-idx1-ubyte.gz"), t / "d")[1],
        ["{path}: missing the test split's labels: none of t10k-labels-idx1-ubyte"],
    ),
    (
        "npz-missing-x-test",
        "npz",
        lambda t: _npz_with(t / "s.npz", x_test=None),
        ["{path}: missing array(s) x_test (the test split)"],
    ),
    (
        "folder-missing-test",
        "folder",
        lambda t: _folder_then(t / "f", lambda r: os.rename(r / "test", r / "tests")),
        ["{path}/test: missing (the test split)"],
    ),
    ("missing-path", "npz", lambda t: t / "nothere.npz", ["{path}: no such file"]),
    # labels out of range
    (
        "npz-negative-label",
        "npz",
        lambda t: _npz_with(t / "s.npz", y_train=np.r_[-1, balanced_labels(29, 5)]),
        ["{path}: y_train: label -1 (item 0) is negative"],
    ),
    (
        "npz-label-beyond-class-names",
        "npz",
        lambda t: _npz_with(t / "s.npz", y_test=np.r_[3, balanced_labels(14, 6)]),
        ["{path}: y_test: label 3 (item 0) is out of range: 3 classes, so labels 0..2"],
    ),
    (
        "idx-labels-not-contiguous",
        "idx",
        lambda t: _idx_with(
            t / "d", train=balanced_labels(30, 1) * 2, test=balanced_labels(15, 2) * 2
        ),
        ["train-labels-idx1-ubyte.gz: class 1 has no training images", "contiguous classes 0..4"],
    ),
    (
        "npz-float-labels",
        "npz",
        lambda t: _npz_with(t / "s.npz", y_train=balanced_labels(30, 5).astype(float)),
        ["{path}: y_train: labels of type float64; expected integers"],
    ),
    (
        "npz-one-class",
        "npz",
        lambda t: _npz_with(
            t / "s.npz", y_train=np.zeros(30, int), y_test=np.zeros(15, int), class_names=None
        ),
        ["{path}: y_train: a single class"],
    ),
    # a class with no test images
    (
        "npz-class-without-test-images",
        "npz",
        lambda t: _npz_with(t / "s.npz", y_test=np.arange(15) % 2),
        ["{path}: y_test: class 2 ('high') has no test images"],
    ),
    (
        "folder-class-without-test-folder",
        "folder",
        lambda t: _folder_then(t / "f", lambda r: os.rename(r / "test" / "cross", r / "x")),
        ["{path}/test/cross: missing; class 'cross' has no test images"],
    ),
    (
        "folder-class-empty-test-folder",
        "folder",
        lambda t: _folder_then(t / "f", lambda r: _empty_out(r / "test" / "square")),
        ["{path}/test/square: empty; class 'square' has no test images"],
    ),
    # images of different shapes
    (
        "folder-different-sizes",
        "folder",
        lambda t: _folder_then(t / "f", lambda r: _bad_png(r, (W, H + 1))),
        [
            "{path}/test/circle/zz.png: an image of 11 x 12 x 3",
            "is 10 x 12 x 3",
            "must have one size",
        ],
    ),
    (
        "folder-grey-among-colour",
        "folder",
        lambda t: _folder_then(t / "f", lambda r: _bad_png(r, mode="L")),
        ["{path}/test/circle/zz.png: an image of 10 x 12 x 1", "is 10 x 12 x 3"],
    ),
    (
        "npz-different-shapes",
        "npz",
        lambda t: _npz_with(t / "s.npz", x_test=np.zeros((15, H, W - 1, 3), np.uint8)),
        [
            "{path}: x_test: images of shape 10 x 11 x 3, "
            "but those of {path}: x_train are 10 x 12 x 3"
        ],
    ),
    (
        "npz-labels-count",
        "npz",
        lambda t: _npz_with(t / "s.npz", y_test=balanced_labels(14, 6)),
        ["{path}: y_test: 14 labels for the 15 images of {path}: x_test"],
    ),
    # values outside [0, 1]
    (
        "npz-values-above-one",
        "npz",
        lambda t: _npz_with(t / "s.npz", x_train=npz_arrays()["x_train"] * 255),
        ["{path}: x_train: pixel values outside [0, 1] (min 0, max 2", "first in image 0"],
    ),
    (
        "npz-values-negative",
        "npz",
        lambda t: _npz_with(t / "s.npz", x_test=npz_arrays()["x_test"] - 0.5),
        ["{path}: x_test: pixel values outside [0, 1] (min -0.5"],
    ),
    (
        "npz-infinite",
        "npz",
        lambda t: _npz_with(
            t / "s.npz",
            x_test=np.where(
                np.arange(15)[:, None, None, None] == 7, np.inf, npz_arrays()["x_test"]
            ),
        ),
        ["{path}: x_test: pixel values outside [0, 1]", "max inf; first in image 7"],
    ),
    (
        "npz-int64-pixels",
        "npz",
        lambda t: _npz_with(t / "s.npz", x_train=np.zeros((30, H, W), np.int64)),
        ["{path}: x_train: pixels of type int64; store them as uint8"],
    ),
    # NaN
    (
        "npz-nan",
        "npz",
        lambda t: _npz_with(
            t / "s.npz",
            x_train=np.where(
                np.arange(30)[:, None, None, None] >= 4, np.nan, npz_arrays()["x_train"]
            ),
        ),
        ["{path}: x_train: NaN pixels in 26 image(s), the first image 4"],
    ),
    # pickles
    (
        "npz-object-array",
        "npz",
        lambda t: _object_array_npz(t / "s.npz"),
        ["{path}: array x_train holds Python objects (a pickle); refused"],
    ),
    (
        "npz-is-a-pickle",
        "npz",
        lambda t: _evil_pickle(t / "s.npz", t / "pwned"),
        ["{path}: not a .npz of arrays (a pickle or an unknown format); refused"],
    ),
    # truncated files
    (
        "idx-truncated-gzip",
        "idx",
        lambda t: (_truncate(write_idx(t / "d") / "train-images-idx3-ubyte.gz"), t / "d")[1],
        ["{path}/train-images-idx3-ubyte.gz: damaged gzip file"],
    ),
    (
        "idx-truncated-plain",
        "idx",
        lambda t: (_truncate(write_idx(t / "d", gz=False) / "t10k-images-idx3-ubyte"), t / "d")[1],
        ["{path}/t10k-images-idx3-ubyte: IDX size mismatch"],
    ),
    (
        "npz-truncated",
        "npz",
        lambda t: (_truncate(write_npz(t / "s.npz", **npz_arrays())), t / "s.npz")[1],
        ["{path}: not a readable .npz"],
    ),
    (
        "folder-truncated-png",
        "folder",
        lambda t: _folder_then(t / "f", lambda r: _truncate(r / "train" / "cross" / "004.png")),
        ["{path}/train/cross/004.png: cannot decode the image"],
    ),
    # empty folders
    (
        "folder-empty",
        "folder",
        lambda t: _empty(t / "f"),
        ["{path}/train: missing (the train split)"],
    ),
    (
        "folder-empty-train",
        "folder",
        lambda t: (_empty(t / "f" / "train"), _empty(t / "f" / "test"), t / "f")[2],
        ["{path}/train: empty; expected one folder per class"],
    ),
    (
        "folder-empty-class",
        "folder",
        lambda t: _folder_then(t / "f", lambda r: _empty_out(r / "train" / "cross")),
        ["{path}/train/cross: empty; class 'cross' has no training images"],
    ),
    (
        "idx-empty-folder",
        "idx",
        lambda t: _empty(t / "d"),
        ["{path}: missing the train split's images: none of train-images-idx3-ubyte"],
    ),
    # other files where images belong
    (
        "folder-stray-file",
        "folder",
        lambda t: _folder_then(t / "f", lambda r: (r / "test/cross/notes.txt").write_text("x")),
        ["{path}/test/cross/notes.txt: not an image file"],
    ),
    (
        "folder-16-bit",
        "folder",
        lambda t: _folder_then(
            t / "f",
            lambda r: Image.fromarray(np.zeros((H, W), np.uint16)).save(
                r / "train" / "circle" / "000.png"
            ),
        ),
        ["{path}/train/circle/000.png: Pillow mode I;16 (more than 8 bits per pixel)"],
    ),
    (
        "folder-transparent",
        "folder",
        lambda t: _folder_then(
            t / "f",
            lambda r: Image.new("RGBA", (W, H), (9, 9, 9, 10)).save(
                r / "test" / "square" / "001.png"
            ),
        ),
        ["{path}/test/square/001.png: transparent pixels"],
    ),
]


@pytest.mark.parametrize("case", BAD_DATA, ids=[c[0] for c in BAD_DATA])
def test_bad_data_is_refused_with_one_message_and_no_file(tmp_path, case):
    _, fmt, make, expected = case
    path = make(tmp_path / "data")
    entry = {"name": "mine", "format": fmt, "path": str(path)}
    out = tmp_path / "results" / "data" / "mine.npz"
    with pytest.raises(CustomDataError) as info:
        prepare_data("mine", out, cache=str(tmp_path / "cache"), mirror=None, source=entry)
    msg = str(info.value)
    assert "\n" not in msg and isinstance(info.value, ValueError)
    for text in expected:
        assert text.format(path=path) in msg, f"{text.format(path=path)!r} not in:\n{msg}"
    assert files_under(tmp_path / "results") == []  # nothing half-written, no temporaries
    assert not (tmp_path / "data" / "pwned").exists()  # the pickle's code never ran


def test_good_files_next_to_the_bad_cases_pass(tmp_path):
    """The writers of the bad cases, unchanged, give valid data (so each case fails for the
    one thing it changes)."""
    for fmt, path in (
        ("idx", write_idx(tmp_path / "d")),
        ("npz", _npz_with(tmp_path / "s.npz")),
        ("folder", write_folder(tmp_path / "f")),
    ):
        load_custom({"name": "ok", "format": fmt, "path": str(path)})


# --------------------------------------------------------------------------------------
# 4. the config: entries, names and messages; what training asks of the images
# --------------------------------------------------------------------------------------
ENTRIES = [
    "mnist5k",
    {"name": "mydigits", "format": "idx", "path": "/data/mydigits"},
    {"name": "scans", "format": "npz", "path": "scans.npz"},
    {"name": "signs", "format": "folder", "path": "data/signs"},
]


def test_config_accepts_registered_names_and_entries():
    cfg = validate(changed(BASE, datasets=ENTRIES))
    assert dataset_names(cfg) == ["mnist5k", "mydigits", "scans", "signs"]
    assert dataset_entry(cfg, "mnist5k") is None
    assert dataset_entry(cfg, "scans") == {"name": "scans", "format": "npz", "path": "scans.npz"}
    with pytest.raises(KeyError, match="'other' is not in the config's datasets"):
        dataset_entry(cfg, "other")
    targets = aggregate_targets(cfg)
    for name in ("mydigits", "scans", "signs"):
        assert f"results/figures/bounds_vs_error/{name}-mlp.png" in targets


def test_schema_lists_exactly_the_registered_datasets():
    from crosslip.config.grid import registered_datasets

    assert sorted(registered_datasets()) == available()


BAD_ENTRIES = [
    ({"name": "mnist", "format": "idx", "path": "x"}, "config key datasets[0].name: not allowed"),
    (
        {"name": "MNIST", "format": "idx", "path": "x"},
        "config key datasets[0].name: 'MNIST' is the registered dataset 'mnist' up to letter case",
    ),
    ({"name": "../up", "format": "idx", "path": "x"}, "config key datasets[0].name: not allowed"),
    (
        {"name": "a", "format": "png", "path": "x"},
        'config key datasets[0].format: not an allowed value ("png"); allowed: one of idx, npz',
    ),
    (
        {"name": "a", "format": "idx", "path": "x", "sha256": "0" * 64},
        "config key datasets[0].sha256: one digest is for a single .npz file",
    ),
]


@pytest.mark.parametrize(("entry", "message"), BAD_ENTRIES, ids=[e[1][:40] for e in BAD_ENTRIES])
def test_bad_dataset_entries_are_rejected(entry, message):
    with pytest.raises(ConfigError) as info:
        validate(changed(BASE, datasets=[entry]))
    assert message in str(info.value)


def test_training_checks_the_image_shape(tmp_path):
    flat = Dataset(
        "flat",
        np.zeros((6, 20), np.float32),
        np.arange(6) % 3,
        np.zeros((3, 20), np.float32),
        np.arange(3),
        (20,),
        3,
    )
    check_fits_training(flat, ["plain", "adversarial"], "mlp", 24)
    with pytest.raises(
        CustomDataError,
        match=r"flat: flat vectors of shape \(20,\), but "
        r"train.settings augment need images \(h, w, c\)",
    ):
        check_fits_training(flat, ["plain", "augment"], "mlp", 24)
    with pytest.raises(CustomDataError, match=r"model\.arch resnet need images"):
        check_fits_training(flat, ["plain"], "resnet", 24)
    ds = load_custom({"name": "d", "format": "idx", "path": str(write_idx(tmp_path / "d"))})
    check_fits_training(ds, ["augment"], "mlp", 8)
    with pytest.raises(
        CustomDataError,
        match=r"d: train.crop = 24 is larger than the images "
        r"\(10 x 12\); set train.crop to at most 10",
    ):
        check_fits_training(ds, ["augment"], "mlp", 24)
    # the train job refuses too (the settings may change after the data was prepared)
    cfg = TrainConfig(epochs=1, hidden=4, setting="augment", crop=11)
    with pytest.raises(ValueError, match=r"train.crop = 11 is larger than the images"):
        train(cfg, ds)
    res = train(TrainConfig(epochs=1, hidden=4, setting="augment", crop=8), ds)
    assert res.model.U.shape == (4, 8 * 8)  # the net takes 8 x 8 crops


def test_fingerprint_follows_the_files(tmp_path):
    root = write_folder(tmp_path / "f")
    entry = {"name": "f", "format": "folder", "path": str(root)}
    first = fingerprint(entry)
    assert first == fingerprint(entry) and fingerprint(None) == ""
    (root / "train" / "cross" / ".hidden").write_text("x")  # skipped by the reader too
    assert fingerprint(entry) == first
    img = root / "test" / "cross" / "001.png"
    st = img.stat()
    os.utime(img, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert fingerprint(entry) != first


def test_illustration_shows_class_names(tmp_path, monkeypatch):
    titles: list[str] = []
    save = illustration._save

    def capture(fig, png, pdf):
        titles.extend(a.get_title() for a in fig.axes)
        save(fig, png, pdf)

    monkeypatch.setattr(illustration, "_save", capture)  # where the figure looks it up
    summary = pd.DataFrame(
        {
            "status": ["ok"],
            "dataset": ["signs"],
            "setting": ["plain"],
            "test_error": [0.1],
            "model_id": ["m"],
            "regularizer": ["none"],
            "lam": [0.0],
        }
    )
    x = np.full((1, H * W * 3), 0.5)
    examples = {
        ("signs", "m"): {
            "test_index": np.array([4]),
            "label": np.array([2]),
            "x": x,
            "adv": x,
            "delta": x * 0,
            "pred": np.array([2]),
            "adv_class": np.array([1]),
            "norm": np.array([0.3]),
            "success": np.array([True]),
            "shape": np.array([H, W, 3]),
            "class_names": np.array(["circle", "$5 coin", "square"]),
        }
    }
    plot_adversarial_samples(summary, examples, tmp_path / "a.png", tmp_path / "a.pdf")
    assert any("pred square -> \\$5 coin" in t for t in titles), titles  # $ escaped
    assert (tmp_path / "a.png").stat().st_size > 0


# --------------------------------------------------------------------------------------
# 5. the workflow on three datasets of one's own at once
# --------------------------------------------------------------------------------------
def e2e_config(work: Path) -> dict:
    write_idx(work / "in" / "tinyidx")
    npz = write_npz(work / "in" / "scans.npz", **npz_arrays())
    root = write_folder(work / "in" / "pngs")
    sums = root / "SHA256SUMS"
    sums.write_text(
        "".join(f"{sha256(p)}  {p.relative_to(root)}\n" for p in sorted(root.rglob("*.png"))[:4])
    )
    return {
        "datasets": [
            {"name": "pngs", "format": "folder", "path": "in/pngs", "checksums": str(sums)},
            {"name": "scans", "format": "npz", "path": "in/scans.npz", "sha256": sha256(npz)},
            {"name": "tinyidx", "format": "idx", "path": str(work / "in" / "tinyidx")},
        ],
        "model": {"hidden": 8},
        "train": {
            "epochs": 1,
            "batch_size": 8,
            "crop": 8,
            "grid": {"none": {"lr": [0.2], "lambda": [0.0]}},
        },
        "certify": {"n_points": 4, "kinds": ["local", "global", "l2"]},
        "attack": {"n_points": 4, "norms": ["l2"], "refine_steps": 0, "n_examples": 1},
    }


def run(work: Path, cfg: dict, *args: str) -> subprocess.CompletedProcess:
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = snakemake_cmd(work, "--cores", "2", *args, configfile=work / "config.yaml") + THREADS
    return run_snakemake(cmd, timeout=1800, env=offline_env())


@pytest.mark.slow
def test_workflow_on_idx_npz_and_folder_datasets(tmp_path):
    cfg = e2e_config(tmp_path)
    t0 = time.perf_counter()
    proc = run(tmp_path, cfg)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    res = tmp_path / "results"
    for target in aggregate_targets(validate(cfg)):
        assert (tmp_path / target).is_file(), target
    expected = [
        ("pngs", (H, W, 3), SHAPES),
        ("scans", (H, W, 3), ("low", "mid", "high")),
        ("tinyidx", (H, W, 1), ("0", "1", "2")),
    ]
    for name, shape, names in expected:
        ds = load_prepared(res / "data" / f"{name}.npz")
        assert (ds.shape, ds.class_names, ds.num_classes) == (shape, names, K)
        with np.load(res / "examples" / name / "none-lr0.2-lam0-seed0.npz") as ex:
            assert tuple(ex["class_names"]) == names
            assert tuple(ex["shape"]) == shape
    inst = pd.concat(pd.read_parquet(p) for p in (res / "instances").rglob("*.parquet"))
    assert sorted(inst["dataset"].unique()) == ["pngs", "scans", "tinyidx"]
    assert set(inst["family"]) == {"mlp"} and len(inst) == 3 * 4
    ok = inst[inst["correct"]]
    # soundness across the stages: no attack below a guarantee
    assert (ok["guarantee_local"] <= ok["upper_bound"].fillna(np.inf) + 1e-6).all()
    assert (ok["guarantee_local"] > 0).any()  # guarantees were computed, not left empty
    assert inst["label"].between(0, K - 1).all()
    summary = pd.read_csv(res / "tables" / "summary.csv")
    assert set(summary["dataset"]) == {"pngs", "scans", "tinyidx"}
    print(f"workflow on three datasets of one's own: {seconds:.1f} s")
    # nothing to redo; touching one data file prepares (only) that dataset again
    again = run(tmp_path, cfg, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]
    png = tmp_path / "in" / "pngs" / "test" / "square" / "000.png"
    os.utime(png, ns=(png.stat().st_atime_ns, png.stat().st_mtime_ns + 10**9))
    again = run(tmp_path, cfg, "-n")
    prepared = [
        fields(j["wildcards"]) for j in dry_run_jobs(again.stdout) if j["rule"] == "prepare_data"
    ]
    assert prepared == [{"dataset": "pngs"}], again.stdout[-3000:]


@pytest.mark.slow
def test_workflow_stops_at_bad_data_before_training(tmp_path):
    cfg = changed(
        e2e_config(tmp_path), datasets=[{"name": "scans", "format": "npz", "path": "in/scans.npz"}]
    )
    _npz_with(tmp_path / "in" / "scans.npz", x_test=np.full((15, H, W, 3), np.nan))
    proc = run(tmp_path, cfg)
    assert proc.returncode != 0
    res = tmp_path / "results"
    log = (res / "logs" / "prepare_data" / "scans.log").read_text()
    assert "in/scans.npz: x_test: NaN pixels in 15 image(s), the first image 0" in log
    assert "Traceback" not in log
    assert [p for p in files_under(res) if not p.startswith("logs")] == []  # no data, no models
