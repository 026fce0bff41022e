"""Download, mirror and cache of dataset files with checksum verification.

A file is looked up, in this order, in a *mirror* folder given in the configuration (same file
names as the official distribution), in the cache folder, and finally downloaded from its
official locations into the cache. Every file is verified against its published checksum
(:class:`RemoteFile`: SHA-256 or MD5), by default over the decompressed content of a ``.gz``
file (gzip wrappers of the same data vary between mirrors), or over the bytes as stored where
the publisher hashed the archive itself (CIFAR-10's ``.tar.gz``, GTSRB's ``.zip``). A download
is written to a temporary name and renamed only after its checksum matched, so an interrupted
or corrupted transfer never leaves a file that a later run would trust.

The data layer raises :class:`~crosslip.errors.DataUnavailableError` (not found nor
downloadable), :class:`~crosslip.errors.ChecksumError` (wrong content) and
:class:`~crosslip.errors.DataFormatError` (a verified file whose content is not what the loader
expects), expected errors of :mod:`crosslip.errors` (re-exported here).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ChecksumError, DataFormatError, DataUnavailableError

__all__ = [
    "ChecksumError",
    "DataFormatError",
    "DataUnavailableError",
    "RemoteFile",
    "content_digest",
    "fetch_dataset",
    "fetch_files",
    "verify",
]


#: Hex digest length of each supported checksum algorithm.
DIGEST_HEX_LENGTH = {"sha256": 64, "md5": 32}


@dataclass(frozen=True)
class RemoteFile:
    """One file of an official distribution and its published checksum.

    ``checksum`` is the lowercase hex digest under ``algorithm`` (``"sha256"`` or ``"md5"``)
    of the content after gunzip when ``name`` ends in ``.gz`` and ``decompressed`` is true (the
    default), else of the bytes as stored (set ``decompressed=False`` for a checksum published
    for the archive file itself, such as the MD5 of ``cifar-10-python.tar.gz``).
    """

    name: str
    checksum: str
    urls: tuple[str, ...]
    decompressed: bool = True
    algorithm: str = "sha256"

    def __post_init__(self) -> None:
        size = DIGEST_HEX_LENGTH.get(self.algorithm)
        if size is None:
            raise ValueError(
                f"{self.name}: unsupported checksum algorithm {self.algorithm!r}; "
                f"use one of {', '.join(DIGEST_HEX_LENGTH)}"
            )
        if len(self.checksum) != size or self.checksum.strip("0123456789abcdef"):
            raise ValueError(
                f"{self.name}: {self.algorithm} checksum must be {size} lowercase hex digits, "
                f"got {self.checksum!r}"
            )

    @property
    def gunzip(self) -> bool:
        """Whether the checksum is over the gunzipped content rather than the stored bytes."""
        return self.decompressed and self.name.endswith(".gz")


def content_digest(path: Path, algorithm: str = "sha256", gunzip: bool | None = None) -> str:
    """Hex digest of a file's content, gunzipped first if ``gunzip`` (default: name ends .gz).

    Raises :class:`ChecksumError` when the file cannot be read (truncated or damaged gzip).
    """
    h = hashlib.new(algorithm, usedforsecurity=False)  # md5: integrity, not security
    if gunzip is None:
        gunzip = Path(path).suffix == ".gz"
    opener = gzip.open if gunzip else open
    try:
        with opener(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except (OSError, EOFError, zlib.error) as exc:  # truncated, damaged or not gzip
        raise ChecksumError(f"{path}: cannot be read ({exc})") from exc
    return h.hexdigest()


def verify(path: Path, spec: RemoteFile) -> None:
    """Raise :class:`ChecksumError` unless ``path`` holds exactly the published content."""
    got = content_digest(path, spec.algorithm, spec.gunzip)
    if got != spec.checksum:
        raise ChecksumError(
            f"{path}: checksum mismatch ({spec.algorithm} {got[:12]}…, expected "
            f"{spec.checksum[:12]}…); delete the file and fetch it again"
        )


def _download(url: str, dest: Path, spec: RemoteFile, timeout: float) -> None:
    """Stream ``url`` to a temporary file beside ``dest``, verify it, then rename it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "crosslip"})
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(req, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            copied = 0
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                copied += len(chunk)
            if length is not None and copied != int(length):
                raise OSError(f"transfer interrupted: {copied} of {length} bytes")
        verify(Path(tmp), spec)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)


def fetch_files(
    files: Sequence[RemoteFile],
    cache_dir: Path,
    mirror_dir: Path | None = None,
    dataset: str = "dataset",
    mirror_key: str = "data.mirrors",
    timeout: float = 60.0,
) -> dict[str, Path]:
    """Return verified local paths for ``files``: from the mirror, the cache, or downloaded.

    Raises :class:`DataUnavailableError` naming every missing file, the folders to put them
    in and the configuration key of the mirror, and :class:`ChecksumError` for a mirror file
    whose content is wrong (a mirror is never modified).
    """
    cache_dir = Path(cache_dir)
    paths: dict[str, Path] = {}
    failures: list[str] = []
    for spec in files:
        if mirror_dir is not None and (Path(mirror_dir) / spec.name).is_file():
            candidate = Path(mirror_dir) / spec.name
            try:
                verify(candidate, spec)
            except ChecksumError as exc:
                raise ChecksumError(
                    f"{exc} (the mirror of config key '{mirror_key}'; a mirror is never "
                    "modified: replace the file there with the official one)"
                ) from exc
            paths[spec.name] = candidate
            continue
        cached = cache_dir / spec.name
        if cached.is_file():
            try:
                verify(cached, spec)
                paths[spec.name] = cached
                continue
            except ChecksumError:
                cached.unlink()  # corrupt cache entry: fetch again
        errors = []
        for url in spec.urls:
            try:
                _download(url, cached, spec, timeout)
                paths[spec.name] = cached
                break
            except (
                ChecksumError,
                urllib.error.URLError,
                http.client.HTTPException,
                OSError,
                TimeoutError,
            ) as exc:
                errors.append(f"{url}: {exc}")
        else:
            failures.append(f"  {spec.name}  ({'; '.join(errors) or 'no URL'})")
    if failures:
        where = f"{mirror_dir} (the mirror) or {cache_dir}" if mirror_dir else str(cache_dir)
        raise DataUnavailableError(
            f"{dataset}: could not obtain these files:\n" + "\n".join(failures) + "\n"
            f"Place the official files (same names) in {where}, or set the config key "
            f"'{mirror_key}' to a folder that holds them."
        )
    return paths


def fetch_dataset(
    name: str, files: Sequence[RemoteFile], cache_dir: Path, mirror_dir: Path | None = None
) -> dict[str, Path]:
    """:func:`fetch_files` for a registered dataset: cached in ``cache_dir/name``, mirrored
    under the config key ``data.mirrors.<name>``."""
    return fetch_files(
        files,
        cache_dir=Path(cache_dir) / name,
        mirror_dir=mirror_dir,
        dataset=name,
        mirror_key=f"data.mirrors.{name}",
    )
