"""Download, mirror and cache of dataset files with checksum verification.

A file is looked up, in this order, in a *mirror* folder given in the configuration (same file
names as the official distribution), in the cache folder, and finally downloaded from its
official locations into the cache. Every file is verified by the SHA-256 of its decompressed
content (gzip wrappers of the same data vary between mirrors). A download is written to a
temporary name and renamed only after its checksum matched, so an interrupted or corrupted
transfer never leaves a file that a later run would trust.
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


class DataUnavailableError(RuntimeError):
    """A dataset file could not be found in a mirror or cache, nor downloaded."""


class ChecksumError(RuntimeError):
    """A dataset file's content does not match its published checksum."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of an official distribution.

    ``sha256`` is the hash of the content after gunzip when ``name`` ends in ``.gz``
    (``decompressed=True``), else of the bytes as stored.
    """

    name: str
    sha256: str
    urls: tuple[str, ...]
    decompressed: bool = True


def content_sha256(path: Path, gunzip: bool | None = None) -> str:
    """SHA-256 of a file's content, gunzipped first if ``gunzip`` (default: name ends .gz)."""
    h = hashlib.sha256()
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
    got = content_sha256(path, spec.decompressed and spec.name.endswith(".gz"))
    if got != spec.sha256:
        raise ChecksumError(
            f"{path}: checksum mismatch (sha256 {got[:12]}…, expected {spec.sha256[:12]}…); "
            "delete the file and fetch it again"
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
            verify(candidate, spec)
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
