"""Running a workflow script: :func:`run_script` hands the job to the job server where one
runs it, then runs the script's ``main()`` with the job's logging, its errors reported.
Every workflow job's process loads it before the hand-off: it imports the standard library
and crosslip's light modules only (the errors, the logging, a job's side of the server)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CrosslipError
from ..jobserver.handoff import hand_off
from .logs import setup_logging


def run_script(
    log_file: str | Path | Sequence[str | Path] | None, main: Any, threads: int | None = None
) -> None:
    """Run a workflow script's ``main()`` with logging to ``log_file`` (one file, or one per
    model of a job that trains several: :func:`~crosslip.io.logs.setup_logging`).

    An expected error (:class:`~crosslip.errors.CrosslipError`: missing data, checksum
    mismatch, a bad configuration value, a damaged input file) is logged as its one-line
    message, without a traceback: the message says what to fix. Any other exception (a bug,
    or a failure of the machine such as a full disk) is logged with its full traceback.
    Either way the process exits with status 1, so Snakemake marks the job failed (its
    outputs are never half-written: every writer renames a finished temporary file).
    ``threads`` sets torch's intra-op threads; torch is imported only then, so that a script
    that does not compute with it (tables, figures) does not load it.

    First, where a job server runs the jobs (:mod:`crosslip.jobserver.server`) and the script
    has not been handed to it before its first line (:mod:`crosslip.jobserver.handoff`), the whole
    script runs again in a fork of it, and this process exits as the fork does
    (:func:`~crosslip.jobserver.handoff.hand_off`): a workflow script imports what it computes
    with in ``main()``, after this hand-off. In a fork of the server it does nothing.
    """
    hand_off()
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
