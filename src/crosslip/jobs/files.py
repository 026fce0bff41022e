"""A job's files as the train, certify and attack scripts receive them: one path from a
per-model rule, several from a batched one (:mod:`crosslip.jobs.batches`).

A module of its own, imported only by those scripts, so that it enters only their code
digests (:mod:`crosslip.jobs.tracking`).
"""

from __future__ import annotations

from collections.abc import Iterable


def as_list(files: str | Iterable[str]) -> list[str]:
    """``files`` as a list: ``[files]`` for one path, else its paths in order."""
    return [files] if isinstance(files, str) else list(files)
