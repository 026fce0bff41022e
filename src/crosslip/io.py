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

from .errors import CrosslipError


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
    """Send log records to ``log_file`` and stderr."""
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

    An expected error (:class:`~crosslip.errors.CrosslipError`: missing data, checksum
    mismatch, a bad configuration value, a damaged input file) is logged as its one-line
    message, without a traceback: the message says what to fix. Any other exception (a bug,
    or a failure of the machine such as a full disk) is logged with its full traceback.
    Either way the process exits with status 1, so Snakemake marks the job failed (its
    outputs are never half-written: every writer renames a finished temporary file).
    ``threads`` sets torch's intra-op threads; torch is imported only then, so that a script
    that does not compute with it (tables, figures) does not load it.
    """
    log = setup_logging(log_file)
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    try:
        main()
    except CrosslipError as exc:
        log.error("%s", exc)
        sys.exit(1)
    except Exception:
        log.exception("unexpected error")
        sys.exit(1)
