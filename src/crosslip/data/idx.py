"""Reader for the IDX format of the MNIST distribution.

An IDX file starts with a 4-byte magic number ``0x00 0x00 <dtype> <ndim>`` followed by
``ndim`` big-endian int32 dimensions and the row-major data.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from ..errors import DataFormatError

_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class IdxFormatError(DataFormatError):
    """The bytes are not a well-formed IDX file."""


def parse_idx(raw: bytes, name: str = "<bytes>") -> np.ndarray:
    """Parse decompressed IDX bytes into an array of the stored shape and dtype."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise IdxFormatError(f"{name}: not an IDX file (bad magic number)")
    code, ndim = raw[2], raw[3]
    if code not in _DTYPES:
        raise IdxFormatError(f"{name}: unknown IDX data type 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IdxFormatError(f"{name}: truncated IDX header")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    if any(s < 0 for s in shape):
        raise IdxFormatError(f"{name}: negative dimension in IDX header {shape}")
    dtype = _DTYPES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise IdxFormatError(
            f"{name}: IDX size mismatch: header promises {expected} bytes, file has {len(raw)}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file, gzip-compressed (``.gz``) or not."""
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise IdxFormatError(f"{path}: damaged gzip file ({exc})") from exc
    return parse_idx(raw, str(path))
