"""Every use crosslip makes of Snakemake beyond its documented interface, in one place.

The workflow otherwise uses only what Snakemake documents: the Snakefile's directives, the
``config`` and ``workflow.cores`` (``workflow.basedir``, ``onsuccess``, ``onerror``),
``--config``, ``--configfile`` and profiles. Two features need more, and each access below
has a test (``tests/test_snakemake_internals.py``) that fails with a message naming it when
a Snakemake release changes it (docs/architecture.md, "Snakemake's interface"):

* :func:`command_line`: the run lock (:mod:`.runlock`) must know, while the Snakefile is
  parsed, whether the command runs jobs (a dry run, ``--unlock``, ``--lint`` ... must not
  take it) and whether this process is a run's main process or one of its job processes
  (``--mode``). Snakemake tells the workflow neither before it has read its own lock files,
  which a killed run's stale ones would make it refuse. This reads the process's command
  line with Snakemake's own parser, ``snakemake.cli.parse_args`` (profiles applied as
  Snakemake applies them): a function of its CLI module, not of its documented API.
* :func:`take_overrides`: a batched rule (``train_grid_*``, ``certify_grid_*``,
  ``attack_grid_*``) takes the ``--set-threads`` and ``--set-resources`` given to its
  stage's per-model rule. It reads ``workflow.resource_settings``'s ``overwrite_threads``
  and ``overwrite_resources`` and writes the rule's ``resources`` (``_cores``: its threads),
  as ``Workflow.rule`` does for the rule the overrides name. There is no public means: an
  override applies to the rule of its name only, while that rule is registered; the batched
  rules' names come from the grid, so a profile cannot name them.

Nothing here replaces a method of a Snakemake class or reads a stack frame.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from typing import Any


def is_snakemake_command(argv: list[str]) -> bool:
    """Whether ``argv`` (a process's ``sys.argv``) runs Snakemake's command line: the
    ``snakemake`` script or ``python -m snakemake``."""
    if not argv:
        return False
    first = os.path.normpath(argv[0])
    return os.path.basename(first) == "snakemake" or first.endswith(
        os.path.join("snakemake", "__main__.py")
    )


def command_line(argv: list[str] | None = None) -> argparse.Namespace | None:
    """The Snakemake command line of this process (``argv``: default ``sys.argv``) parsed
    by ``snakemake.cli.parse_args``, with its profiles applied; None where this process is
    not Snakemake's command (the Python API, a test) or the line does not parse (Snakemake
    itself reports that)."""
    argv = sys.argv if argv is None else argv
    if not is_snakemake_command(argv):
        return None
    from snakemake.cli import parse_args

    try:  # argparse prints and exits on a line it cannot parse: Snakemake reports it
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            _, args = parse_args(list(argv[1:]))
    except SystemExit:
        return None
    return args if isinstance(args, argparse.Namespace) else None


def is_main_process(args: argparse.Namespace) -> bool:
    """Whether ``args`` start a run's main process: Snakemake's ``--mode`` is its default,
    not ``subprocess`` or ``remote`` (the processes that run a job, e.g. every SLURM job)."""
    from snakemake_interface_executor_plugins.settings import ExecMode

    return getattr(args, "mode", None) in (None, ExecMode.DEFAULT)


def take_overrides(workflow: Any, rule: str, of: str) -> None:
    """Give the rule named ``rule`` what ``--set-threads`` and ``--set-resources`` (on the
    command line or in a profile: profiles/slurm's GPU partition) give the rule named ``of``,
    as Snakemake gives them to ``of``. Call it right after ``rule`` is defined
    (``workflow``: the Snakefile's ``workflow``); the module docstring says what it reads
    and writes."""
    settings = workflow.resource_settings
    target = workflow.get_rule(rule)
    threads = settings.overwrite_threads.get(of)
    if threads is not None:
        target.resources["_cores"] = threads
    target.resources.update(settings.overwrite_resources.get(of, {}))
