"""The reproduction record: the paper's numbers beside ours (``docs/reproduction.md``).

:mod:`~crosslip.reproduction.paper` holds the paper's numbers (``paper.yaml``),
:mod:`~crosslip.reproduction.export` copies a finished run into
``docs/reproduction/<name>/``, :mod:`~crosslip.reproduction.claims` judges the claims
(``claims.yaml``), :mod:`~crosslip.reproduction.targets` lists the runs
the record lacks, :mod:`~crosslip.reproduction.studies` renders the studies, and
:mod:`~crosslip.reproduction.record` renders the record (``record.md.j2``, its tables'
columns in ``record.yaml``).

Command line: ``python -m crosslip.reproduction {export,render} --help``;
docs/reproduction-record.md shows both in use (``make record`` renders).

Torch-free (torch is imported only to name a GPU during export, if installed).
"""

from .claims import NOT_REPRODUCED, NOT_RUN, REPRODUCED, Run, Verdict, evaluate, pool_runs
from .export import ExportError, export_run
from .record import render, write_record

__all__ = [
    "NOT_REPRODUCED",
    "NOT_RUN",
    "REPRODUCED",
    "ExportError",
    "Run",
    "Verdict",
    "evaluate",
    "export_run",
    "pool_runs",
    "render",
    "write_record",
]
