"""Files that a reader never sees half-written (atomic writes of a file or a folder), JSON,
and the arrays of .npz files, read without unpickling."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CrosslipError

if TYPE_CHECKING:
    import numpy as np


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success.

    A crash or kill while writing leaves no file under the final name, so Snakemake (and
    any reader) never mistakes a half-written output for a finished one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: Path | str) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success it takes the name
    ``path``, and what was there is removed only once the new folder is in place. An error
    while writing leaves ``path`` as it was; a kill between the two renames leaves the old
    folder as ``.<name>.*.old`` beside it, which the next call puts back first (and removes,
    where a kill after the second rename left it beside the new folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    orphans = sorted(path.parent.glob(f".{path.name}.*.old"), key=lambda p: p.stat().st_mtime)
    if orphans and not path.exists():
        orphans.pop().rename(path)
    for orphan in orphans:  # older than the folder in place: a kill after the second rename
        _remove(orphan)
    tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
    tmp.mkdir()  # the umask's mode, as any folder (mkdtemp's would be 0700)
    old = tmp.with_suffix(".old")
    try:
        yield tmp
        if path.exists():
            path.rename(old)
        tmp.rename(path)
    finally:
        if old.exists() and not path.exists():
            old.rename(path)  # the new folder did not take its place: the old one back
        shutil.rmtree(tmp, ignore_errors=True)
        _remove(old)


def _remove(path: Path) -> None:
    """Remove ``path``, a folder with what it holds or a file, if it is there."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_json(obj: Any, path: Path | str) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: Path | str) -> Any:
    return json.loads(Path(path).read_text())


def read_npz_array(
    npz: Any, key: str, path: Path | str, error: type[CrosslipError], advice: str
) -> np.ndarray:
    """``npz[key]`` of a file opened with ``np.load(path, allow_pickle=False)``, as a numpy
    array. An array of Python objects (a pickle: unpickling can run code) or a damaged member
    raises ``error`` naming the file and the array; ``advice`` says what to save instead.
    The one rule for datasets (``crosslip.data.custom``) and models (``crosslip.models.external``)
    of one's own."""
    try:
        return npz[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise error(
                f"{path}: array {key} holds Python objects (a pickle); refused: unpickling can "
                f"run code. {advice}"
            ) from exc
        raise error(f"{path}: array {key} cannot be read ({exc})") from exc
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise error(
            f"{path}: array {key} cannot be read ({exc}); the file is damaged or truncated"
        ) from exc


def sha256_of(path: Path | str) -> str:
    """The SHA-256 hex digest of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
