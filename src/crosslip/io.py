"""File helpers: atomic writes, JSON, logging for workflow scripts."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


def write_json(obj: Any, path: Path | str) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: Path | str) -> Any:
    return json.loads(Path(path).read_text())


def setup_logging(log_file: str | Path | None) -> logging.Logger:
    """Send log records (and uncaught exceptions, in one line) to ``log_file`` and stderr."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
        force=True,
    )
    return logging.getLogger("crosslip")


def run_script(log_file: str | Path | None, main: Any, threads: int | None = None) -> None:
    """Run a workflow script's ``main()`` with logging to ``log_file``.

    Errors a user can fix (missing data, checksum mismatch, bad value) are reported as one
    clear line, not a traceback; any other exception is logged in full to ``log_file``. The
    process exits with status 1 on error so Snakemake marks the job failed (its outputs
    are never half-written: every writer renames a finished temporary file).
    """
    import torch

    from .data.fetch import ChecksumError, DataUnavailableError

    log = setup_logging(log_file)
    if threads:
        torch.set_num_threads(int(threads))
    try:
        main()
    except (DataUnavailableError, ChecksumError, ValueError, KeyError, FileNotFoundError) as exc:
        log.error("%s", exc)
        sys.exit(1)
    except Exception:
        log.exception("unexpected error")
        sys.exit(1)
