"""Export a finished run's small outputs into ``docs/reproduction/<run-name>/``.

A run folder holds copies of the workflow's tables and figures and a ``run.yaml`` that says
how they were made: the config files (their content), the effective config (schema defaults
filled in by :func:`crosslip.config.validate.validate`), the command, epochs, evaluated points per
model, the machine, the devices the models were trained on (their ``metrics.json``), dates,
the git commit, and the Snakemake benchmark seconds per rule and per job. The record
(:mod:`crosslip.reproduction.record`) is rendered from these folders alone.

A run made on another machine and copied here (only its tables, ``metrics.json`` files and
benchmark files kept) exports the same way: ``commit`` names the commit it ran at,
``results_written`` the day it ran, ``machine`` that machine (docs/reproduction-record.md).

Torch is imported only to name a GPU (:mod:`crosslip.machine`), and only when torch is
installed.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ..config.validate import merged_files, validate
from ..errors import ConfigError
from ..io.files import atomic_dir, sha256_of
from ..machine import git_commit, git_state, machine_description

RUN_FILE = "run.yaml"
#: Files copied from a results folder when present (paths relative to it).
TABLES = ["tables/summary.csv", "tables/table1_global_local.csv", "tables/kernel.csv"]
FIGURES = [
    "figures/bounds_vs_error/*.png",
    "figures/bracket/*.png",
    "figures/certified_accuracy/*.png",
    "figures/adversarial_samples.png",
]
#: Where a run folder keeps the model files of ``--weights``.
WEIGHTS_DIR = "models"
#: A run folder's hand-written note (not generated), shown under the record's "Where we
#: differ"; a forced export keeps it.
NOTES_FILE = "notes.md"
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


def run_commit(root: Path, commit: str | None = None) -> dict[str, Any]:
    """The checkout's state (:func:`crosslip.machine.git_state`); with ``commit`` (a run made
    elsewhere, at that commit, unchanged): that commit in full and ``dirty: False``, and
    :class:`ExportError` when the checkout does not have it."""
    if commit is None:
        return git_state(root)
    full = git_commit(root, commit)
    if not full:
        raise ExportError(f"--commit {commit}: not a commit of the checkout at {root}")
    return {"commit": full, "dirty": False}


def job_seconds(results: Path) -> dict[str, dict[str, Any]]:
    """Per rule, from Snakemake's benchmark files ``results/benchmarks/<rule>/**/*.tsv``: the
    number of jobs, the sum of their ``s`` (wall seconds of each job), and ``each``: every
    job's seconds by its file's path below the rule's folder without ``.tsv`` (for the
    training of a model, ``<dataset>/<model id>``). Jobs that ran in parallel are summed, so
    ``seconds`` is job time, not the run's elapsed time."""
    out: dict[str, dict[str, Any]] = {}
    bench = results / "benchmarks"
    for tsv in sorted(bench.glob("*/**/*.tsv")):
        rule, *rest = tsv.relative_to(bench).with_suffix("").parts
        try:
            s = float(pd.read_csv(tsv, sep="\t")["s"].astype(float).sum())
        except (KeyError, ValueError, pd.errors.ParserError) as err:
            raise ExportError(f"{tsv}: not a Snakemake benchmark file (column 's'): {err}") from err
        entry = out.setdefault(rule, {"jobs": 0, "seconds": 0.0, "each": {}})
        entry["jobs"] += 1
        entry["seconds"] = round(entry["seconds"] + s, 1)
        entry["each"]["/".join(rest)] = round(s, 2)
    return out


def devices_used(results: Path) -> dict[str, int]:
    """How many trained models name each device in ``models/<dataset>/<model>/metrics.json``
    (``{"cuda": 3}``); empty when no metrics file names one."""
    out: dict[str, int] = {}
    for path in sorted(results.glob("models/*/*/metrics.json")):
        try:
            device = json.loads(path.read_text()).get("device")
        except (OSError, ValueError) as err:
            raise ExportError(f"{path}: not a JSON metrics file: {err}") from err
        if device:
            out[str(device)] = out.get(str(device), 0) + 1
    return out


def benchmark_result(path: Path) -> dict[str, Any]:
    """The result of a ``benchmarks/*.py`` run from its output: the last line that is a JSON
    object (each benchmark prints one last)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ExportError(f"--benchmark {path}: cannot read it: {err}") from err
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    raise ExportError(f"--benchmark {path}: no line is a JSON object (a benchmark's output)")


def machine_from_text(text: str) -> str | dict[str, Any]:
    """``--machine``: a YAML mapping (``{cpu: ..., logical_cpus: 16, gpu: ...}``, the keys of
    :func:`machine_description` and ``software``) or free text."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return data if isinstance(data, dict) else text


def effective_config(paths: list[Path]) -> dict[str, Any]:
    """The config a run with ``--configfile <paths...>`` used, its schema defaults filled in
    (:func:`crosslip.config.validate.merged_files`, then ``validate``)."""
    try:
        return validate(merged_files(paths))
    except ConfigError as err:
        problems = " ".join(str(err).splitlines())
        raise ExportError(f"--config {' '.join(map(str, paths))}: {problems}") from err


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when inside it (as a command names it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def kept_benchmarks(dest: Path) -> dict[str, Any]:
    """The ``benchmarks`` of the run folder ``dest``'s run.yaml ({} where it has none)."""
    try:
        run = yaml.safe_load((dest / RUN_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except yaml.YAMLError as e:
        raise ExportError(
            f"{dest / RUN_FILE}: not YAML ({e.__class__.__name__}); mend or remove it "
            "before replacing the run folder with --force"
        ) from None
    benches = run.get("benchmarks") if isinstance(run, dict) else None
    return benches if isinstance(benches, dict) else {}


def export_run(
    results: Path | str,
    name: str,
    configs: list[Path | str],
    command: str,
    docs: Path | str = "docs",
    machine: str | dict[str, Any] | None = None,
    wall_time_s: float | None = None,
    force: bool = False,
    commit: str | None = None,
    results_written: str | None = None,
    pool: str | None = None,
    benchmarks: list[Path | str] | None = None,
    weights: list[str] | None = None,
) -> Path:
    """Copy the tables and figures of the finished run in ``results`` into
    ``<docs>/reproduction/<name>/`` and write its ``run.yaml``; return that folder.

    The arguments are the command line's (``python -m crosslip.reproduction export --help``):
    ``commit`` is ``--commit`` (default: this checkout's HEAD, :func:`run_commit`),
    ``results_written`` is ``--ran-on`` (default: the modification time of ``summary.csv``),
    ``benchmarks`` are kept in run.yaml by file name; the model files of the model ids
    ``weights`` (``--weights``) are copied to ``models/<model id>.pt``, their SHA-256 in
    run.yaml (``weights``). An existing run folder is replaced
    only with ``force``, and only once the new one is complete (:func:`atomic_dir`); the
    replacement keeps what an export cannot make again: the folder's hand-written
    :data:`NOTES_FILE` and the old run.yaml's ``benchmarks`` that ``benchmarks`` does not
    name anew.
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
    git = run_commit(Path.cwd(), commit)
    benches = {Path(b).stem: benchmark_result(Path(b)) for b in benchmarks or []}
    summary = pd.read_csv(summary_path)
    dest = docs / "reproduction" / name
    if dest.exists() and not force:
        raise ExportError(f"{dest} exists: choose another --name or pass --force to replace it")
    model_files = {}
    for model_id in weights or []:
        found = sorted(results.glob(f"models/*/{model_id}/model.pt"))
        if len(found) != 1:
            raise ExportError(
                f"--weights {model_id}: {'no' if not found else 'more than one'} "
                f"{results}/models/<dataset>/{model_id}/model.pt; name a model the run trained"
            )
        model_files[model_id] = found[0]
    old_benches = kept_benchmarks(dest) if dest.exists() else {}
    with atomic_dir(dest) as tmp:
        if (dest / NOTES_FILE).is_file():
            shutil.copyfile(dest / NOTES_FILE, tmp / NOTES_FILE)
        copied = []
        for pattern in TABLES + FIGURES:
            for src in sorted(results.glob(pattern)):
                target = tmp / src.relative_to(results)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)
                copied.append(str(src.relative_to(results)))
        kept = {}
        for model_id, src in model_files.items():
            target = tmp / WEIGHTS_DIR / f"{model_id}.pt"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            kept[model_id] = {
                "file": f"{WEIGHTS_DIR}/{model_id}.pt",
                "sha256": sha256_of(target),
            }
        evaluated = summary[summary["n_eval"] > 0]
        if results_written is None:
            mtime = dt.datetime.fromtimestamp(summary_path.stat().st_mtime, tz=dt.UTC)
            results_written = mtime.strftime("%Y-%m-%d %H:%M UTC")
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
            "devices": devices_used(results),
            "results_written": results_written,
            "exported": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
            "exported_from": _shown(results),
            "git": git,
            "pool": pool,
            "wall_time_s": wall_time_s,
            "job_seconds": job_seconds(results),
            "benchmarks": {**old_benches, **benches},
            "files": copied,
            "weights": kept,
            "config": cfg,
        }
        (tmp / RUN_FILE).write_text(dump_yaml(run))
    return dest
