"""Export a finished run's small outputs into ``docs/reproduction/<run-name>/``.

A run folder holds copies of the workflow's tables and figures and a ``run.yaml`` that says
how they were made: the config files (their content), the effective config (schema defaults
filled in by :func:`crosslip.config.validate`), the command, epochs, evaluated points per
model, the machine, dates, the git commit, and the Snakemake benchmark seconds per rule. The
record (:mod:`crosslip.reproduction.record`) is rendered from these folders alone.

Torch is imported only to name a GPU, and only when torch is installed.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from .. import config as crosslip_config

RUN_FILE = "run.yaml"
#: Files copied from a results folder when present (paths relative to it).
TABLES = ["tables/summary.csv", "tables/table1_global_local.csv", "tables/kernel.csv"]
FIGURES = ["figures/bounds_vs_error/*.png", "figures/adversarial_samples.png"]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ExportError(ValueError):
    """A run that cannot be exported; the message names the file or argument."""


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (config files) as ``|`` blocks."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(obj: Any) -> str:
    """``obj`` as YAML, keys in insertion order, multi-line strings as blocks."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def machine_description() -> dict[str, Any]:
    """The machine running this: CPU model and logical CPUs (``/proc/cpuinfo``), memory in
    GiB (``/proc/meminfo``), and the CUDA GPU torch sees (``None`` without torch or GPU)."""
    cpu, n_cpu = None, os.cpu_count()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    gpu = None
    try:
        import torch  # lazily: the module stays importable without torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {"cpu": cpu, "logical_cpus": n_cpu, "memory_gib": mem, "gpu": gpu}


def git_state(root: Path) -> dict[str, Any]:
    """``{"commit": <HEAD>, "dirty": <uncommitted changes to tracked files>}`` of the checkout
    at ``root`` (``None`` values outside a git checkout)."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
            )
        except (OSError, subprocess.CalledProcessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def job_seconds(results: Path) -> dict[str, dict[str, float]]:
    """Per rule, the number of jobs and the sum of their ``s`` (wall seconds of each job)
    from Snakemake's benchmark files ``results/benchmarks/<rule>/**/*.tsv``. Jobs that ran
    in parallel are summed, so this is job time, not the run's elapsed time."""
    out: dict[str, dict[str, float]] = {}
    bench = results / "benchmarks"
    for tsv in sorted(bench.glob("*/**/*.tsv")):
        rule = tsv.relative_to(bench).parts[0]
        try:
            s = pd.read_csv(tsv, sep="\t")["s"].astype(float)
        except (KeyError, ValueError, pd.errors.ParserError) as err:
            raise ExportError(f"{tsv}: not a Snakemake benchmark file (column 's'): {err}") from err
        entry = out.setdefault(rule, {"jobs": 0, "seconds": 0.0})
        entry["jobs"] += 1
        entry["seconds"] = round(entry["seconds"] + float(s.sum()), 1)
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Snakemake's merge of several ``--configfile`` files: mappings are merged key by key,
    anything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def effective_config(paths: list[Path]) -> dict[str, Any]:
    """The config a run with ``--configfile <paths...>`` used: the files merged in order, as
    Snakemake does, then validated with the schema's defaults filled in."""
    merged: dict[str, Any] = {}
    for path in paths:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ExportError(f"--config {path}: cannot read it as YAML: {err}") from err
        if not isinstance(data, dict):
            raise ExportError(f"--config {path}: expected a mapping of config keys")
        merged = _merge(merged, data)
    try:
        return crosslip_config.validate(merged)
    except crosslip_config.ConfigError as err:
        problems = " ".join(str(err).splitlines())
        raise ExportError(f"--config {' '.join(map(str, paths))}: {problems}") from err


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when inside it (as a command names it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def export_run(
    results: Path | str,
    name: str,
    configs: list[Path | str],
    command: str,
    docs: Path | str = "docs",
    machine: str | None = None,
    wall_time_s: float | None = None,
    force: bool = False,
) -> Path:
    """Copy the tables and figures of the finished run in ``results`` into
    ``<docs>/reproduction/<name>/`` and write its ``run.yaml``; return that folder.

    ``configs``: the ``--configfile`` files of the run, in order; ``command``: the exact
    command line; ``machine``: a description of the machine that ran it (default: this one,
    :func:`machine_description`); ``wall_time_s``: the run's elapsed seconds, if known.
    An existing run folder is replaced only with ``force``.
    """
    results, docs = Path(results), Path(docs)
    if not NAME_RE.match(name):
        raise ExportError(f"--name {name!r}: use letters, digits, '_', '.' and '-' only")
    summary_path = results / TABLES[0]
    if not summary_path.is_file():
        raise ExportError(
            f"{summary_path} not found: run the workflow to completion before "
            "exporting it (--results names its results folder)"
        )
    config_paths = [Path(c) for c in configs]
    if not config_paths:
        raise ExportError("--config: name the config file(s) the run used")
    for path in config_paths:
        if not path.is_file():
            raise ExportError(f"--config {path}: no such file")
    cfg = effective_config(config_paths)
    summary = pd.read_csv(summary_path)
    dest = docs / "reproduction" / name
    if dest.exists():
        if not force:
            raise ExportError(f"{dest} exists: choose another --name or pass --force to replace it")
        shutil.rmtree(dest)
    copied = []
    for pattern in TABLES + FIGURES:
        for src in sorted(results.glob(pattern)):
            target = dest / src.relative_to(results)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            copied.append(str(src.relative_to(results)))
    evaluated = summary[summary["n_eval"] > 0]
    mtime = dt.datetime.fromtimestamp(summary_path.stat().st_mtime, tz=dt.UTC)
    run = {
        "name": name,
        "command": command,
        "config_files": [{"path": _shown(p), "content": p.read_text()} for p in config_paths],
        "epochs": cfg["train"]["epochs"],
        "datasets": list(cfg["datasets"]),
        "models_trained": len(summary),
        "models_evaluated": len(evaluated),
        "evaluated_points_per_model": sorted({int(n) for n in evaluated["n_eval"]}),
        "machine": machine if machine is not None else machine_description(),
        "results_written": mtime.strftime("%Y-%m-%d %H:%M UTC"),
        "exported": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "git": git_state(Path.cwd()),
        "wall_time_s": wall_time_s,
        "job_seconds": job_seconds(results),
        "files": copied,
        "config": cfg,
    }
    dest.mkdir(parents=True, exist_ok=True)
    (dest / RUN_FILE).write_text(dump_yaml(run))
    return dest
