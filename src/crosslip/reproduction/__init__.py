"""The reproduction record: the paper's numbers beside ours (``docs/reproduction.md``).

* :mod:`~crosslip.reproduction.paper`: the numbers, settings and claims of Section 5, each
  with its line in the paper's LaTeX source;
* :mod:`~crosslip.reproduction.export`: copy a finished run's tables and figures, with a
  ``run.yaml`` (config, command, machine, commit, timings), into ``docs/reproduction/<name>/``;
* :mod:`~crosslip.reproduction.claims`: verdicts on the claims from those copies;
* :mod:`~crosslip.reproduction.record`: render ``docs/reproduction.md`` from the committed
  run folders alone.

Command line (``python -m crosslip.reproduction --help``)::

    python -m crosslip.reproduction export --results results/x --name x \\
        --config config/x.yaml --command "snakemake ... --configfile config/x.yaml"
    python -m crosslip.reproduction render          # or: make record

Torch-free (torch is imported only to name a GPU during export, if installed).
"""

from .claims import NOT_REPRODUCED, NOT_RUN, REPRODUCED, Run, Verdict, evaluate
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
    "render",
    "write_record",
]
