"""The runs the record lacks (:data:`TARGETS`, ``targets.yaml`` beside this module): what
each would add, the command that makes it, and its time on one GPU as projected by the one
estimator of the project, ``benchmarks/bench_preset.py``.

A projection is a committed ``bench_preset`` record (``docs/benchmarks/bench_preset*.json``,
written by ``benchmarks/perfdoc.py``) that ran on a CUDA device with the target's config
files, in the same order, and projected the same networks (:func:`projects`); the newest
one counts. ``bench_preset`` trains each setting's
batched grid for two short epoch counts and certifies and attacks a sample of points with
the workflow's own stage functions, then projects the whole config linearly
(docs/scaling.md). A target without such a record says so and gives the ``bench_preset``
command that would project it, or says that ``bench_preset`` cannot (kernel models,
ResNets, several datasets).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config.grid import dataset_names, networks_only, training_grid
from ..errors import ConfigError
from .export import ExportError, effective_config

#: The placeholder for the MNIST mirror in a command (``data.mirrors.mnist``, docs/data.md):
#: the folder that holds the four official MNIST files, for a machine that downloads nothing.
MNIST_MIRROR = "/path/to/mnist"
#: How a run not yet made is started: one job on the GPU at a time (the profile's ``gpu: 1``,
#: as ``bench_preset`` projects the jobs, one after another).
SNAKEMAKE = ".venv/bin/snakemake --profile profiles/local-gpu"
#: The committed records of ``benchmarks/bench_preset.py``, under the docs folder.
PROJECTIONS = "benchmarks/bench_preset*.json"

_DATA = yaml.safe_load(Path(__file__).with_name("targets.yaml").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Target:
    """A run the record lacks: ``configs`` (relative to the repository) in ``--configfile``
    order, and what it would add to the record."""

    key: str
    what: str
    configs: Sequence[str]
    adds: str
    figures: Sequence[str] = ()  # the paper's figures (labels) it would make
    claims: Sequence[str] = ()  # the claims (keys of paper.CLAIMS) only this run covers
    why_not_here: str = ""  # why no committed run made it, where it is the data
    see: str = ""  # where its cost is discussed, where bench_preset cannot project it


def _target(offline: str = "", why: str = "", **entry: Any) -> Target:
    """A target of ``targets.yaml``: no offline copy of the data ``offline``, and ``why``."""
    reasons = [_DATA["no_offline_copy"].format(data=offline) if offline else "", why]
    return Target(**entry, why_not_here="; ".join(r for r in reasons if r))


#: The runs the record lacks, in the record's order.
TARGETS = [_target(**t) for t in _DATA["targets"]]


@dataclass
class Missing:
    """A target with its command, the models it trains, whether ``bench_preset`` can project
    it (one dataset of one-hidden-layer networks), and the newest ``bench_preset`` record
    that projects it on a GPU (:func:`projects`; ``None`` where none does)."""

    target: Target
    command: str
    trained: int
    projectable: bool
    projection: dict[str, Any] | None = None


def projections(docs: Path) -> list[dict[str, Any]]:
    """The committed ``bench_preset`` records made on a CUDA device, newest first."""
    found = [json.loads(p.read_text()) for p in sorted(docs.glob(PROJECTIONS))]
    cuda = [r for r in found if r.get("date") and r.get("result", {}).get("device") == "cuda"]
    return sorted(cuda, key=lambda r: r["date"], reverse=True)


def projects(
    record: dict[str, Any], configs: Sequence[str], cfg: dict[str, Any], networks: int
) -> bool:
    """Whether the ``bench_preset`` record projects the config ``cfg`` (of ``networks``
    networks) of the files ``configs``: the same files in order, and neither ``--settings``,
    ``--hidden`` nor ``--dataset`` nor a changed preset made it project other networks."""
    r, train = record["result"], cfg["train"]
    wanted = {
        "configfiles": list(configs),
        "settings": train["settings"],
        "networks": networks,
        "hidden": cfg["model"]["hidden"],
        "epochs": train["epochs"],
        "dataset": dataset_names(cfg)[0],
    }
    return {**{k: r.get(k) for k in wanted}, "settings": list(r.get("settings") or ())} == wanted


def missing(target: Target, root: Path, records: list[dict[str, Any]]) -> Missing:
    """``target`` with its command and projection (its configs read under ``root``).
    Raises :class:`~crosslip.reproduction.export.ExportError` for a config that is missing
    or invalid."""
    cfg = effective_config([root / c for c in target.configs])
    command = f"{SNAKEMAKE} --configfile {' '.join(target.configs)}"
    names = dataset_names(cfg)
    if "mnist" in names and "mnist" not in ((cfg.get("data") or {}).get("mirrors") or {}):
        command += f' --config \'data={{"mirrors": {{"mnist": "{MNIST_MIRROR}"}}}}\''
    networks = len(training_grid(cfg))
    p = next((r for r in records if projects(r, target.configs, cfg, networks)), None)
    return Missing(target, command, len(names) * networks, networks_only(cfg), p)


def targets(docs: Path, root: Path) -> list[Missing | str]:
    """Per target, its :class:`Missing` or a one-line reason (such as a config missing under
    ``root``); the projections are read under ``docs``."""
    records = projections(docs)
    out: list[Missing | str] = []
    for t in TARGETS:
        try:
            out.append(missing(t, root, records))
        except (ExportError, ConfigError) as err:
            out.append(f"{t.key}: {err}")
    return out
