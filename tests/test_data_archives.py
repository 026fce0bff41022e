"""Tests of the archive datasets ``cifar10`` and ``gtsrb`` and of the restricted unpickler.

Tiny archives in the exact official formats are written to tmp_path (CIFAR-10: a ``.tar.gz``
of Python-2-style protocol-2 pickles; GTSRB: zips of P6 PPM images with ``;``-separated
annotation csvs). They are served by a ``ThreadingHTTPServer`` on 127.0.0.1 and fetched by the
real download code with their real MD5 passed explicitly; "no network" is a loopback port that
is bound but not listening. Nothing here reaches the internet.
"""

from __future__ import annotations

import builtins
import codecs
import gzip
import hashlib
import io
import os
import pickle
import struct
import subprocess
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from crosslip.data import (
    ChecksumError,
    DataFormatError,
    DataUnavailableError,
    UnsafePickleError,
    available,
    load_dataset,
)
from crosslip.data import cifar10 as cifar_mod
from crosslip.data import gtsrb as gtsrb_mod
from crosslip.data.augment import to_images
from crosslip.data.fetch import RemoteFile, content_digest, fetch_files
from crosslip.data.unpickle import load_restricted

from .helpers import files_in

SCHEMA = Path(__file__).resolve().parents[1] / "src" / "crosslip" / "config" / "schema.yaml"

# --------------------------------------------------------------------------------------
# helpers: hashing, HTTP server, closed port
# --------------------------------------------------------------------------------------


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def no_internet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to open a URL (for the official, non-local specs)."""

    def refuse(req, *args, **kwargs):
        url = req.full_url if isinstance(req, urllib.request.Request) else req
        raise AssertionError(f"network access attempted: {url}")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


# --------------------------------------------------------------------------------------
# CIFAR-10 builders: Python-2-style pickles in a .tar.gz
# --------------------------------------------------------------------------------------


class Py2Pickler(pickle._Pickler):  # type: ignore[name-defined]
    """Protocol-2 pickler writing ``str`` and ``bytes`` as Python 2 ``str`` (BINSTRING), as
    cPickle did for the official batches."""

    dispatch: ClassVar[dict] = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_py2_str(self, obj: str | bytes) -> None:
        data = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<I", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def py2_pickle(obj: object) -> bytes:
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    # numpy 1.x (and Python 2) name the module numpy.core.multiarray.
    return buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


CIFAR_BATCHES = [*cifar_mod.TRAIN_BATCHES, cifar_mod.TEST_BATCH]
KNOWN = {"batch": "data_batch_2", "index": 1, "row": 5, "col": 7, "rgb": (11, 22, 33)}


def cifar_batch(k: int, n: int = 3) -> dict[bytes, object]:
    """Batch ``k`` in the official dict layout: ``data`` rows are R, G, B 32x32 planes."""
    rng = np.random.default_rng(k)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    data[0, :3] = (0, 255, 128)  # both extremes in every batch
    if CIFAR_BATCHES[k] == KNOWN["batch"]:
        offset = KNOWN["row"] * 32 + KNOWN["col"]  # written by plane arithmetic, not reshape
        for channel, value in enumerate(KNOWN["rgb"]):
            data[KNOWN["index"], channel * 1024 + offset] = value
    return {
        b"batch_label": f"batch {k + 1} of 6".encode(),
        b"labels": [int(v) for v in (np.arange(n) + 3 * k) % 10],
        b"data": data,
        b"filenames": [f"img_{k}_{i}.png".encode() for i in range(n)],
    }


def cifar_members(**changes: bytes | None) -> dict[str, bytes]:
    """Official member names -> bytes; ``changes`` (keyed by batch name) replace or drop."""
    folder = cifar_mod.FOLDER
    members = {
        f"{folder}/batches.meta": py2_pickle(
            {b"num_cases_per_batch": 10000, b"label_names": [b"airplane"] * 10, b"num_vis": 3072}
        )
    }
    for k, name in enumerate(CIFAR_BATCHES):
        # the data batches as Python 2 wrote them; the test batch as Python 3 does (protocol 2)
        dump = py2_pickle if name != cifar_mod.TEST_BATCH else lambda o: pickle.dumps(o, 2)
        members[f"{folder}/{name}"] = dump(cifar_batch(k))
    for name, data in changes.items():
        members.pop(f"{folder}/{name}")
        if data is not None:
            members[f"{folder}/{name}"] = data
    return members


@cache
def tiny_cifar() -> bytes:
    return tar_gz(cifar_members())


# --------------------------------------------------------------------------------------
# GTSRB builders: zips of PPM images and ';'-separated csvs
# --------------------------------------------------------------------------------------

HEADER = ("Filename", "Width", "Height", "Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2", "ClassId")
BORDER = (0, 0, 255)
EDGE = (0, 255, 0)


@dataclass(frozen=True)
class Sign:
    """A tiny image: ``fill`` inside the ROI (inclusive), ``BORDER`` outside; ``edge`` paints
    the last ROI column and row in ``EDGE`` instead."""

    filename: str
    class_id: int
    width: int
    height: int
    roi: tuple[int, int, int, int]
    fill: tuple[int, int, int]
    edge: bool = False

    def pixels(self) -> np.ndarray:
        img = np.empty((self.height, self.width, 3), np.uint8)
        img[:] = BORDER
        x1, y1, x2, y2 = self.roi
        img[y1 : y2 + 1, x1 : x2 + 1] = self.fill
        if self.edge:
            img[y1 : y2 + 1, x2] = EDGE
            img[y2, x1 : x2 + 1] = EDGE
        return img

    def ppm(self) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(self.pixels()).save(buf, format="PPM")
        assert buf.getvalue().startswith(b"P6")  # binary RGB, as the official images
        return buf.getvalue()

    def row(self, with_class: bool = True) -> list[str]:
        cells = [self.filename, str(self.width), str(self.height), *map(str, self.roi)]
        return cells + [str(self.class_id)] * with_class


# Listed out of order on purpose: the loader sorts by (class, file name).
TRAIN_SIGNS = (
    Sign("00000_00001.ppm", 42, 64, 50, (6, 5, 57, 44), (90, 80, 70)),
    Sign("00000_00001.ppm", 0, 40, 36, (5, 6, 30, 28), (200, 10, 30)),
    Sign("00000_00000.ppm", 0, 29, 31, (5, 5, 23, 25), (255, 255, 255)),
    Sign("00000_00000.ppm", 1, 15, 15, (2, 3, 12, 11), (0, 0, 0)),
    Sign("00000_00000.ppm", 42, 45, 38, (4, 5, 39, 32), (250, 0, 0), edge=True),
)
TEST_SIGNS = (
    Sign("00000.ppm", 3, 17, 23, (1, 2, 15, 20), (10, 20, 30)),
    Sign("00001.ppm", 1, 33, 33, (3, 3, 29, 29), (120, 0, 200)),
    Sign("00002.ppm", 3, 50, 41, (5, 5, 44, 35), (1, 2, 3)),
)
SORTED_TRAIN = sorted(TRAIN_SIGNS, key=lambda s: (s.class_id, s.filename))
SORTED_TEST = sorted(TEST_SIGNS, key=lambda s: (s.class_id, s.filename))


def csv_bytes(rows: list[list[str]], header: tuple[str, ...] = HEADER) -> bytes:
    return "".join(";".join(r) + "\r\n" for r in [list(header), *rows]).encode()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def gtsrb_members() -> dict[str, dict[str, bytes]]:
    """Official archive name -> {member name -> bytes} of the tiny GTSRB."""
    train: dict[str, bytes] = {"GTSRB/Readme-Images.txt": b"readme"}
    for cid in sorted({s.class_id for s in TRAIN_SIGNS}):
        folder = f"{gtsrb_mod.TRAIN_DIR}{cid:05d}/"
        signs = [s for s in TRAIN_SIGNS if s.class_id == cid]
        for s in signs:
            train[folder + s.filename] = s.ppm()
        train[f"{folder}GT-{cid:05d}.csv"] = csv_bytes([s.row() for s in signs])
    test = {gtsrb_mod.TEST_DIR + s.filename: s.ppm() for s in TEST_SIGNS}
    test[gtsrb_mod.TEST_DIR + "GT-final_test.test.csv"] = csv_bytes(
        [s.row(with_class=False) for s in TEST_SIGNS], HEADER[:-1]
    )
    gt = {gtsrb_mod.GT_CSV: csv_bytes([s.row() for s in TEST_SIGNS])}
    return {gtsrb_mod.TRAIN_ZIP: train, gtsrb_mod.TEST_ZIP: test, gtsrb_mod.GT_ZIP: gt}


@cache
def tiny_gtsrb() -> dict[str, bytes]:
    return {name: zip_bytes(members) for name, members in gtsrb_members().items()}


# --------------------------------------------------------------------------------------
# the two datasets behind one interface, for the download/mirror tests
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tiny:
    name: str
    files: dict[str, bytes]  # official file name -> tiny content
    specs: Callable[..., list[RemoteFile]]  # (base_urls, {name: md5}) -> specs
    load: Callable[..., object]
    n_train: int
    n_test: int

    def md5s(self, **wrong: bytes) -> dict[str, str]:
        """Real MD5 of each tiny file; ``wrong`` (file name -> other bytes) hashes those."""
        return {n: md5(wrong.get(n, data)) for n, data in self.files.items()}

    def fetch_specs(self, base: str, **wrong: bytes) -> list[RemoteFile]:
        return self.specs((base,), self.md5s(**wrong))


TINY = {
    "cifar10": lambda: Tiny(
        "cifar10",
        {cifar_mod.ARCHIVE: tiny_cifar()},
        lambda urls, sums: cifar_mod.remote_files(urls, md5=sums[cifar_mod.ARCHIVE]),
        cifar_mod.load_cifar10,
        15,
        3,
    ),
    "gtsrb": lambda: Tiny(
        "gtsrb",
        tiny_gtsrb(),
        lambda urls, sums: gtsrb_mod.remote_files(urls, md5s=sums),
        gtsrb_mod.load_gtsrb,
        len(TRAIN_SIGNS),
        len(TEST_SIGNS),
    ),
}


@pytest.fixture(params=sorted(TINY))
def tiny(request) -> Tiny:
    return TINY[request.param]()


def load_tiny(t: Tiny, cache_dir: Path, specs: list[RemoteFile], mirror: Path | None = None):
    return t.load(cache_dir, mirror, files=specs, counts=None)


# --------------------------------------------------------------------------------------
# 1. checksum match: download over HTTP and load
# --------------------------------------------------------------------------------------


def test_cifar10_download_and_load(tmp_path, server):
    server.put_all({cifar_mod.ARCHIVE: tiny_cifar()})
    cache = tmp_path / "downloads"
    specs = cifar_mod.remote_files((server.url,), md5=md5(tiny_cifar()))
    ds = cifar_mod.load_cifar10(cache, files=specs, counts=None)

    assert files_in(cache / "cifar10") == [cifar_mod.ARCHIVE]  # cache_dir/cifar10, no .part
    assert (cache / "cifar10" / cifar_mod.ARCHIVE).read_bytes() == tiny_cifar()
    assert server.requests == ["/" + cifar_mod.ARCHIVE]
    assert ds.name == "cifar10" and ds.shape == (32, 32, 3) and ds.num_classes == 10
    assert ds.x_train.shape == (15, 3072) and ds.x_test.shape == (3, 3072)
    assert ds.x_train.dtype == ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == ds.y_test.dtype == np.int64
    for x in (ds.x_train, ds.x_test):
        assert x.min() == 0.0 and x.max() == 1.0  # scaled by 255
        np.testing.assert_array_equal(x * 255, np.rint(x * 255))
    # Labels in batch order: data_batch_1..5, then test_batch.
    assert ds.y_train.tolist() == [int(v) for k in range(5) for v in (np.arange(3) + 3 * k) % 10]
    assert ds.y_test.tolist() == [5, 6, 7]
    # Every image: the R, G, B planes interleaved to (H, W, C).
    for k in range(6):
        planes = cifar_batch(k)[b"data"].reshape(3, 3, 32, 32)
        want = planes.transpose(0, 2, 3, 1).reshape(3, -1) / np.float32(255)
        got = ds.x_train[3 * k : 3 * k + 3] if k < 5 else ds.x_test
        np.testing.assert_array_equal(got, want.astype(np.float32))


def test_cifar10_known_pixel_lands_where_to_images_expects(tmp_path):
    path = tmp_path / cifar_mod.ARCHIVE
    path.write_bytes(tiny_cifar())
    ds = cifar_mod.read_cifar10_archive(path)
    i = 3 * CIFAR_BATCHES.index(KNOWN["batch"]) + KNOWN["index"]
    r, c = KNOWN["row"], KNOWN["col"]
    flat = ds.x_train[i] * 255
    for k, value in enumerate(KNOWN["rgb"]):
        assert flat[(32 * r + c) * 3 + k] == value  # channels last: (H, W, C) flattened
    img = to_images(torch.from_numpy(ds.x_train), ds.shape) * 255  # (n, C, H, W)
    assert img.shape == (15, 3, 32, 32)
    assert img[i, :, r, c].tolist() == list(KNOWN["rgb"])


def test_cifar10_official_counts_are_enforced(tmp_path):
    path = tmp_path / cifar_mod.ARCHIVE
    path.write_bytes(tiny_cifar())
    with pytest.raises(DataFormatError, match=r"15 training and 3 test images, expected 50000"):
        cifar_mod.read_cifar10_archive(path, counts=cifar_mod.COUNTS)
    assert len(cifar_mod.read_cifar10_archive(path, counts=(15, 3)).x_train) == 15


def test_gtsrb_download_and_load(tmp_path, server):
    server.put_all(tiny_gtsrb())
    cache = tmp_path / "downloads"
    specs = gtsrb_mod.remote_files((server.url,), {n: md5(b) for n, b in tiny_gtsrb().items()})
    ds = gtsrb_mod.load_gtsrb(cache, files=specs, counts=None)

    assert files_in(cache / "gtsrb") == sorted(tiny_gtsrb())
    assert sorted(server.requests) == sorted("/" + n for n in tiny_gtsrb())
    assert ds.name == "gtsrb" and ds.shape == (32, 32, 3) and ds.num_classes == 43
    assert ds.x_train.shape == (5, 3072) and ds.x_test.shape == (3, 3072)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.y_train.tolist() == [0, 0, 1, 42, 42]  # sorted by (class, file name)
    assert ds.y_test.tolist() == [1, 3, 3]
    assert [s.fill for s in SORTED_TEST] == [(120, 0, 200), (10, 20, 30), (1, 2, 3)]
    # A solid ROI gives a solid 32x32 image of its colour: the border is cropped away and
    # the channels are last (R, G, B per pixel). Upscaled (15x15) and shrunk ROIs alike.
    images = [ds.x_train.reshape(-1, 32, 32, 3), ds.x_test.reshape(-1, 32, 32, 3)]
    for imgs, signs in zip(images, (SORTED_TRAIN, SORTED_TEST), strict=True):
        for img, sign in zip(imgs, signs, strict=True):
            if not sign.edge:
                np.testing.assert_array_equal(img * 255, np.broadcast_to(sign.fill, img.shape))


def test_gtsrb_roi_includes_its_last_column_and_row(tmp_path):
    """Roi.X2 / Roi.Y2 are inclusive: the EDGE-coloured last column and row show, the BORDER
    just outside does not."""
    paths = {}
    for name, data in tiny_gtsrb().items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(data)
    ds = gtsrb_mod.read_gtsrb_archives(paths)
    (i,) = [k for k, s in enumerate(SORTED_TRAIN) if s.edge]
    img = ds.x_train[i].reshape(32, 32, 3) * 255
    assert (img[..., 2] == 0).all()  # no blue border pixel was included
    assert (img[:, -1, 1] > 50).all() and (img[-1, :, 1] > 50).all()  # the green edge shows
    np.testing.assert_array_equal(img[:20, :20], np.broadcast_to((250, 0, 0), (20, 20, 3)))


def test_gtsrb_size_and_counts(tmp_path):
    paths = {}
    for name, data in tiny_gtsrb().items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(data)
    small = gtsrb_mod.read_gtsrb_archives(paths, size=8)
    assert small.shape == (8, 8, 3) and small.x_train.shape == (5, 192)
    with pytest.raises(DataFormatError, match=r"5 training and 3 test images, expected 39209"):
        gtsrb_mod.read_gtsrb_archives(paths, counts=gtsrb_mod.COUNTS)


# --------------------------------------------------------------------------------------
# 2. checksum mismatch
# --------------------------------------------------------------------------------------


def test_checksum_mismatch_leaves_no_file(tmp_path, server, tiny):
    server.put_all(tiny.files)
    first = next(iter(tiny.files))
    cache = tmp_path / "cache"
    specs = tiny.fetch_specs(server.url, **{first: b"other content"})
    with pytest.raises(DataUnavailableError) as info:
        load_tiny(tiny, cache, specs)
    msg = str(info.value)
    assert msg.startswith(f"{tiny.name}:")
    assert first in msg and "checksum mismatch (md5" in msg
    assert md5(b"other content")[:12] in msg
    # Neither the bad file nor a temporary; the verified others are kept for the next run.
    assert files_in(cache / tiny.name) == sorted(set(tiny.files) - {first})


def test_md5_is_of_the_stored_archive_not_its_decompressed_content(tmp_path, server):
    """A tar.gz is verified as stored: the MD5 of its gunzipped tar must not be accepted."""
    server.put_all({cifar_mod.ARCHIVE: tiny_cifar()})
    wrong = cifar_mod.remote_files((server.url,), md5=md5(gzip.decompress(tiny_cifar())))
    with pytest.raises(DataUnavailableError, match="checksum mismatch"):
        cifar_mod.load_cifar10(tmp_path / "c", files=wrong, counts=None)
    assert files_in(tmp_path / "c" / "cifar10") == []
    spec = cifar_mod.remote_files(md5=md5(tiny_cifar()))[0]
    assert not spec.gunzip and spec.algorithm == "md5"
    path = tmp_path / "a.tar.gz"
    path.write_bytes(tiny_cifar())
    assert content_digest(path, "md5", gunzip=False) == md5(tiny_cifar())


# --------------------------------------------------------------------------------------
# 3. interrupted transfer
# --------------------------------------------------------------------------------------


def test_interrupted_transfer_leaves_no_file_and_rerun_succeeds(tmp_path, server, tiny):
    server.put_all(tiny.files)
    server.truncated.update(tiny.files)
    cache = tmp_path / "cache"
    specs = tiny.fetch_specs(server.url)
    with pytest.raises(DataUnavailableError) as info:
        load_tiny(tiny, cache, specs)
    msg = str(info.value)
    assert "interrupted" in msg
    for name in tiny.files:
        assert name in msg
    assert files_in(cache / tiny.name) == []  # no partial file, no temporary

    server.truncated.clear()  # the server is fixed
    ds = load_tiny(tiny, cache, specs)
    assert (len(ds.x_train), len(ds.x_test)) == (tiny.n_train, tiny.n_test)
    assert files_in(cache / tiny.name) == sorted(tiny.files)


# --------------------------------------------------------------------------------------
# 4. missing file, no network
# --------------------------------------------------------------------------------------


def test_missing_file_404_names_files_folders_and_key(tmp_path, server, tiny):
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    with pytest.raises(DataUnavailableError) as info:
        load_tiny(tiny, cache, tiny.fetch_specs(server.url), mirror)
    msg = str(info.value)
    assert msg.startswith(f"{tiny.name}:")
    for name in tiny.files:
        assert name in msg
    assert "404" in msg
    assert str(mirror) in msg and str(cache / tiny.name) in msg
    assert f"'data.mirrors.{tiny.name}'" in msg
    assert files_in(cache / tiny.name) == [] and files_in(mirror) == []


def test_no_network_names_files_folder_and_key(tmp_path, closed_port, tiny):
    cache = tmp_path / "cache"
    with pytest.raises(DataUnavailableError) as info:
        load_tiny(tiny, cache, tiny.fetch_specs(f"http://127.0.0.1:{closed_port}/"))
    msg = str(info.value)
    for name in tiny.files:
        assert name in msg
    assert "refused" in msg.lower()
    assert str(cache / tiny.name) in msg and f"'data.mirrors.{tiny.name}'" in msg
    assert files_in(cache / tiny.name) == []


# --------------------------------------------------------------------------------------
# 5. mirror folder
# --------------------------------------------------------------------------------------


def test_mirror_is_used_without_download(tmp_path, server, tiny):
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    for name, data in tiny.files.items():
        (mirror / name).write_bytes(data)
    ds = load_tiny(tiny, cache, tiny.fetch_specs(server.url), mirror)
    assert (len(ds.x_train), len(ds.x_test)) == (tiny.n_train, tiny.n_test)
    assert server.requests == []
    assert not cache.exists()
    assert files_in(mirror) == sorted(tiny.files)


def test_corrupt_mirror_file_raises_and_is_kept(tmp_path, server, tiny):
    server.put_all(tiny.files)  # a good copy is reachable, but a bad mirror is an error
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    for name, data in tiny.files.items():
        (mirror / name).write_bytes(data)
    last = sorted(tiny.files)[-1]
    bad = bytearray(tiny.files[last])
    bad[len(bad) // 2] ^= 0xFF
    (mirror / last).write_bytes(bytes(bad))
    with pytest.raises(ChecksumError) as info:
        load_tiny(tiny, cache, tiny.fetch_specs(server.url), mirror)
    assert str(mirror / last) in str(info.value) and "checksum mismatch" in str(info.value)
    assert (mirror / last).read_bytes() == bytes(bad)  # neither modified nor deleted
    assert files_in(mirror) == sorted(tiny.files)
    assert server.requests == [] and files_in(cache / tiny.name) == []


# --------------------------------------------------------------------------------------
# 6. malicious pickles
# --------------------------------------------------------------------------------------


def _payload(kind: str, marker: Path) -> tuple[Callable[..., object], tuple]:
    """A harmless call that creates ``marker`` (used by ``__reduce__``)."""
    if kind == "os.system":
        return os.system, (f"touch '{marker}'",)
    if kind == "builtins.eval":
        return builtins.eval, (f"open({str(marker)!r}, 'w').close()",)
    return subprocess.Popen, (["touch", str(marker)],)


class Evil:
    def __init__(self, kind: str, marker: Path):
        self.kind, self.marker = kind, marker

    def __reduce__(self):
        return _payload(self.kind, self.marker)


GLOBALS = {
    "os.system": f"{os.system.__module__}.system",
    "builtins.eval": "builtins.eval",
    "subprocess.Popen": "subprocess.Popen",
}


@pytest.mark.parametrize("kind", sorted(GLOBALS))
def test_malicious_pickle_is_refused_before_running(tmp_path, kind):
    marker = tmp_path / "marker"
    evil = pickle.dumps({b"data": Evil(kind, marker), b"labels": [0, 1, 2]}, protocol=2)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    archive = tar_gz(cifar_members(data_batch_1=evil))
    (mirror / cifar_mod.ARCHIVE).write_bytes(archive)
    specs = cifar_mod.remote_files((), md5=md5(archive))  # checksum fine: content is hostile
    with pytest.raises(UnsafePickleError) as info:
        cifar_mod.load_cifar10(tmp_path / "cache", mirror, files=specs, counts=None)
    msg = str(info.value)
    assert str(mirror / cifar_mod.ARCHIVE) in msg and "data_batch_1" in msg
    assert GLOBALS[kind] in msg
    assert isinstance(info.value, DataFormatError) and isinstance(info.value, ValueError)
    assert not marker.exists()


@pytest.mark.parametrize("kind", sorted(GLOBALS))
def test_malicious_payload_would_run_under_plain_pickle(tmp_path, kind):
    """Control for the test above: the payload is live (an unrestricted load runs it)."""
    marker = tmp_path / "marker"
    out = pickle.loads(pickle.dumps(Evil(kind, marker), protocol=2))
    if isinstance(out, subprocess.Popen):
        out.wait(timeout=10)
    assert marker.exists()


def test_codecs_encode_only_for_latin1():
    class Rot13:
        def __reduce__(self):
            return codecs.encode, ("abc", "rot13")

    with pytest.raises(UnsafePickleError, match=r"^src\.pkl: .*rot13"):
        load_restricted(pickle.dumps(Rot13(), protocol=2), "src.pkl")
    assert load_restricted(pickle.dumps(b"\x00\xff", protocol=2), "ok.pkl") == b"\x00\xff"


def test_restricted_unpickler_reads_numpy_arrays_of_both_pickle_styles():
    arr = np.arange(24, dtype=np.uint8).reshape(2, 12)
    for raw in (py2_pickle({b"data": arr}), pickle.dumps({b"data": arr}, protocol=2)):
        out = load_restricted(raw, "x")
        np.testing.assert_array_equal(out[b"data"], arr)
        assert out[b"data"].dtype == np.uint8
    with pytest.raises(DataFormatError, match=r"^trunc: not a readable pickle"):
        load_restricted(pickle.dumps({b"data": arr}, protocol=2)[:-5], "trunc")


# --------------------------------------------------------------------------------------
# 7. malformed content
# --------------------------------------------------------------------------------------


def _batch(**changes: object) -> bytes:
    batch = cifar_batch(0)
    for key, value in changes.items():
        if value is None:
            del batch[key.encode()]
        else:
            batch[key.encode()] = value
    return py2_pickle(batch)


CIFAR_DEFECTS = {
    "wrong-shape": ({"data_batch_3": _batch(data=np.zeros((3, 3000), np.uint8))}, "data_batch_3"),
    "wrong-dtype": ({"data_batch_1": _batch(data=np.zeros((3, 3072), np.int64))}, "uint8"),
    "label-range": ({"test_batch": _batch(labels=[0, 10, 1])}, r"test_batch: labels outside"),
    "label-count": ({"data_batch_2": _batch(labels=[0, 1])}, r"data_batch_2: 'labels' must"),
    "missing-key": ({"data_batch_4": _batch(labels=None)}, r"data_batch_4: missing key"),
    "missing-batch": ({"data_batch_5": None}, r"missing member.*data_batch_5"),
    "not-a-dict": ({"data_batch_1": py2_pickle([1, 2])}, r"data_batch_1: expected a dict"),
    "not-a-pickle": ({"data_batch_1": b"garbage"}, r"data_batch_1: not a readable pickle"),
}


@pytest.mark.parametrize("defect", sorted(CIFAR_DEFECTS))
def test_cifar10_malformed_content_names_the_file(tmp_path, defect):
    changes, pattern = CIFAR_DEFECTS[defect]
    path = tmp_path / cifar_mod.ARCHIVE
    path.write_bytes(tar_gz(cifar_members(**changes)))
    with pytest.raises(DataFormatError, match=pattern) as info:
        cifar_mod.read_cifar10_archive(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "extra", ["../evil", "/etc/evil", "cifar-10-batches-py/../../evil"], ids=["dotdot", "abs", "x"]
)
def test_cifar10_unsafe_member_names_are_refused(tmp_path, extra):
    path = tmp_path / cifar_mod.ARCHIVE
    path.write_bytes(tar_gz({extra: b"x", **cifar_members()}))
    with pytest.raises(DataFormatError, match="unsafe member name") as info:
        cifar_mod.read_cifar10_archive(path)
    assert str(path) in str(info.value) and extra in str(info.value)
    assert not (tmp_path.parent / "evil").exists()


def test_cifar10_not_an_archive(tmp_path):
    path = tmp_path / cifar_mod.ARCHIVE
    path.write_bytes(gzip.compress(b"not a tar file" * 100))
    with pytest.raises(DataFormatError, match=r"not a readable \.tar\.gz") as info:
        cifar_mod.read_cifar10_archive(path)
    assert str(path) in str(info.value)


def _edit_gtsrb(archive: str, member: str, data: bytes | None) -> dict[str, bytes]:
    members = gtsrb_members()
    if data is None:
        del members[archive][member]
    else:
        members[archive][member] = data
    return {name: zip_bytes(m) for name, m in members.items()}


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 36)).save(buf, format="PNG")
    return buf.getvalue()


TR, TE, GT = gtsrb_mod.TRAIN_ZIP, gtsrb_mod.TEST_ZIP, gtsrb_mod.GT_ZIP
C1 = f"{gtsrb_mod.TRAIN_DIR}00001/"
C42 = f"{gtsrb_mod.TRAIN_DIR}00042/"
ROW = ["00000_00000.ppm", "15", "15", "2", "3", "12", "11"]
GTSRB_DEFECTS = {
    "csv-missing-column": (
        TR,
        C1 + "GT-00001.csv",
        csv_bytes([[*ROW[:5], ROW[6], "1"]], HEADER[:5] + HEADER[6:]),
        C1 + r"GT-00001.csv: missing column\(s\) Roi.X2",
    ),
    "gt-missing-classid": (
        GT,
        "GT-final_test.csv",
        csv_bytes([s.row(False) for s in TEST_SIGNS], HEADER[:-1]),
        r"GT-final_test.csv: missing column\(s\) ClassId",
    ),
    "class-out-of-range": (
        GT,
        "GT-final_test.csv",
        csv_bytes([[*TEST_SIGNS[0].row()[:-1], "43"]]),
        r"GT-final_test.csv: line 2: ClassId 43",
    ),
    "class-in-wrong-folder": (
        TR,
        C1 + "GT-00001.csv",
        csv_bytes([[*ROW, "2"]]),
        r"GT-00001.csv: .*ClassId 2",
    ),
    "not-an-integer": (
        TR,
        C1 + "GT-00001.csv",
        csv_bytes([[*ROW[:3], "two", *ROW[4:], "1"]]),
        r"GT-00001.csv: line 2: bad row",
    ),
    "image-missing": (
        TR,
        C42 + "00000_00001.ppm",
        None,
        r"missing member .*00042/00000_00001\.ppm",
    ),
    "test-image-missing": (TE, gtsrb_mod.TEST_DIR + "00002.ppm", None, r"Images/00002\.ppm"),
    "roi-outside-image": (
        TR,
        C1 + "GT-00001.csv",
        csv_bytes([[*ROW[:5], "15", "11", "1"]]),
        r"00001/00000_00000\.ppm: ROI \(2, 3, 15, 11\) outside the 15x15 image",
    ),
    "not-a-ppm": (TR, C1 + "00000_00000.ppm", _png(), r"00000_00000\.ppm: expected a PPM"),
    "not-an-image": (TR, C1 + "00000_00000.ppm", b"P6\n", r"00000_00000\.ppm: not a readable"),
    "gt-csv-missing": (GT, "GT-final_test.csv", None, r"missing member GT-final_test\.csv"),
    "path-in-filename": (
        TR,
        C1 + "GT-00001.csv",
        csv_bytes([["../00042/00000_00000.ppm", *ROW[1:], "1"]]),
        r"GT-00001.csv: line 2: bad file name",
    ),
}


@pytest.mark.parametrize("defect", sorted(GTSRB_DEFECTS))
def test_gtsrb_malformed_content_names_the_file(tmp_path, defect):
    archive, member, data, pattern = GTSRB_DEFECTS[defect]
    paths = {}
    for name, content in _edit_gtsrb(archive, member, data).items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(content)
    with pytest.raises(DataFormatError, match=pattern) as info:
        gtsrb_mod.read_gtsrb_archives(paths)
    assert str(paths[archive]) in str(info.value)


def test_gtsrb_training_zip_without_class_csvs(tmp_path):
    members = gtsrb_members()
    train = {k: v for k, v in members[TR].items() if not k.endswith(".csv")}
    paths = {}
    for name, m in {**members, TR: train}.items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(zip_bytes(m))
    with pytest.raises(DataFormatError, match=r"no GTSRB/Final_Training/Images/NNNNN/GT-NNNNN"):
        gtsrb_mod.read_gtsrb_archives(paths)
    paths[TR].write_bytes(b"PK not really a zip")
    with pytest.raises(DataFormatError, match="not a readable zip archive") as info:
        gtsrb_mod.read_gtsrb_archives(paths)
    assert str(paths[TR]) in str(info.value)


# --------------------------------------------------------------------------------------
# 8. the registry uses the official specs
# --------------------------------------------------------------------------------------


def _official(name: str) -> list[RemoteFile]:
    return cifar_mod.remote_files() if name == "cifar10" else gtsrb_mod.remote_files()


@pytest.mark.usefixtures("no_internet")
def test_registry_enforces_the_official_checksums(tmp_path, tiny):
    """load_dataset(name) goes through the registry with the official MD5s: tiny files in the
    mirror are refused (a loader that skipped verification would read them)."""
    assert tiny.name in available()
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name, data in tiny.files.items():
        (mirror / name).write_bytes(data)
    first = _official(tiny.name)[0]
    with pytest.raises(ChecksumError) as info:
        load_dataset(tiny.name, cache_dir=tmp_path / "cache", mirror_dir=mirror)
    msg = str(info.value)
    assert str(mirror / first.name) in msg
    assert f"md5 {md5(tiny.files[first.name])[:12]}…, expected {first.checksum[:12]}…" in msg
    assert files_in(mirror) == sorted(tiny.files)
    assert not (tmp_path / "cache").exists()


def test_official_specs():
    (cifar,) = cifar_mod.remote_files()
    assert cifar == RemoteFile(
        "cifar-10-python.tar.gz",
        "c58f30108f718f92721af3b95e74349a",
        ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
        decompressed=False,
        algorithm="md5",
    )
    base = "https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/"
    specs = gtsrb_mod.remote_files()
    assert [(s.name, s.checksum, s.urls, s.algorithm, s.gunzip) for s in specs] == [
        (
            "GTSRB_Final_Training_Images.zip",
            "f33fd80ac59bff73c82d25ab499e03a3",
            (base + "GTSRB_Final_Training_Images.zip",),
            "md5",
            False,
        ),
        (
            "GTSRB_Final_Test_Images.zip",
            "c7e4e6327067d32654124b0fe9e82185",
            (base + "GTSRB_Final_Test_Images.zip",),
            "md5",
            False,
        ),
        (
            "GTSRB_Final_Test_GT.zip",
            "fe31e9c9270bbcd7b84b7f21a9d9d9e5",
            (base + "GTSRB_Final_Test_GT.zip",),
            "md5",
            False,
        ),
    ]
    assert cifar_mod.COUNTS == (50000, 10000) and gtsrb_mod.COUNTS == (39209, 12630)
    assert gtsrb_mod.SIZE == 32


def test_config_schema_accepts_the_new_datasets():
    full = yaml.safe_load(SCHEMA.read_text())
    schema = full["properties"]
    assert {"cifar10", "gtsrb"} <= set(full["$defs"]["registered_dataset"]["enum"])
    mirrors = schema["data"]["properties"]["mirrors"]["propertyNames"]["enum"]
    assert {"mnist", "cifar10", "gtsrb"} <= set(mirrors)


def test_remote_file_checksum_spec():
    assert RemoteFile("a.gz", "0" * 64, ()).checksum == "0" * 64
    with pytest.raises(ValueError, match="32 lowercase hex"):
        RemoteFile("a.zip", "0" * 64, (), algorithm="md5")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        RemoteFile("a.zip", "C58F30108F718F92721AF3B95E74349A" * 2, ())
    with pytest.raises(ValueError, match="unsupported checksum algorithm 'sha1'"):
        RemoteFile("a.zip", "0" * 40, (), algorithm="sha1")


def test_fetch_md5_file_from_cache_without_network(tmp_path, closed_port):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "x.zip").write_bytes(b"zip bytes")
    spec = RemoteFile(
        "x.zip", md5(b"zip bytes"), (f"http://127.0.0.1:{closed_port}/x",), algorithm="md5"
    )
    assert fetch_files([spec], cache_dir=cache) == {"x.zip": cache / "x.zip"}
