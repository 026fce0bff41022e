"""The reproduction record: the paper's numbers beside ours (``docs/reproduction.md``).

* :mod:`~crosslip.reproduction.paper`: the numbers, settings and claims of Section 5
  (``paper.yaml``), each with its line in the paper's LaTeX source;
* :mod:`~crosslip.reproduction.export`: copy a finished run's tables and figures, with a
  ``run.yaml`` (config, command, machine, commit, timings), into ``docs/reproduction/<name>/``;
* :mod:`~crosslip.reproduction.claims`: verdicts on the claims from those copies, by the
  table of criteria ``claims.yaml`` (runs exported with the same pool label evaluated as one);
* :mod:`~crosslip.reproduction.estimates`: the GPU time of the runs the record lacks,
  projected by :mod:`crosslip.projection` from the job seconds of the committed GPU runs;
* :mod:`~crosslip.reproduction.record`: render ``docs/reproduction.md`` (the template
  ``record.md.j2``) from the committed run folders (and the configs of the runs not yet made).

Command line (``python -m crosslip.reproduction --help``)::

    python -m crosslip.reproduction export --results results/x --name x \\
        --config config/x.yaml --command "snakemake ... --configfile config/x.yaml"
    # a run made elsewhere: its commit, day, machine (docs/reproduction-record.md)
    python -m crosslip.reproduction export ... --commit 0b2a5f5 --ran-on 2026-11-24 \\
        --machine "{cpu: ..., gpu: ...}" [--pool label] [--benchmark bench.log]
    python -m crosslip.reproduction render          # or: make record

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
