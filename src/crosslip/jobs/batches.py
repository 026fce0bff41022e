"""Which models one job handles: networks of the grid trained together as one batched
model (:func:`plan_batches`), and, on request, the certification or the attacks of every
model of a setting in one process (:func:`evaluation_batches`); what a certify or attack job
receives as params, whichever rule runs it (:func:`evaluation_params`).

One-hidden-layer networks that share the dataset, the setting, the seed (hence the
initialisation and the batch order) and every other training setting differ only in their
regularizer, lambda (or dropout keep probability) and learning rate: their model ids say so,
and :func:`crosslip.config.grid.tracked_params` is the same for all of them. Such networks can be
trained as one :class:`crosslip.models.StackedSoftplusNet` in one process
(:func:`crosslip.training.grid.train_grid`), which on a GPU costs about as many kernel
launches per step as one network.

Snakemake decides what to run per output file, so the workflow groups only the networks
that **need training** (:func:`needs_training`: a file missing, or recorded with another
spec or other code than the current ones): a fresh grid trains in one job per setting, a
new grid value trains alone, and a finished network is never trained again because a
neighbour changed. A group of two or more becomes one job (:func:`plan_batches`, a rule of
its own in ``workflow/rules/train.smk``); every other network keeps the per-model ``train``
rule. Both rules run the same script with the same ``params``, so a network can move from one
to the other without Snakemake seeing a change (docs/architecture.md).

Torch-free: the Snakefile calls it while the workflow is planned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.grid import dataset_names, tracked_params
from ..config.specs import KernelTrainSpec, NetTrainSpec, spec_params
from ..families import model_family


@dataclass(frozen=True)
class TrainBatch:
    """One training job of several networks: its rule ``name``, the ``dataset``, the model
    ids (sorted) and the ``tracked`` params that they share."""

    name: str
    dataset: str
    setting: str
    seed: int
    models: tuple[str, ...]
    tracked: dict[str, Any] = field(compare=False, hash=False)


def model_folder(results: Path | str, dataset: str, model_id: str) -> Path:
    """``results/models/<dataset>/<model_id>``: where a model's files live."""
    return Path(results) / "models" / dataset / model_id


def needs_training(
    results: Path | str,
    dataset: str,
    model_id: str,
    spec: NetTrainSpec | KernelTrainSpec,
    code: str,
) -> bool:
    """Whether the network's files are missing or stale: ``model.pt`` or ``metrics.json``
    missing or unreadable, the spec or the code digest recorded in the metrics other than
    ``spec`` and ``code`` (the training job's ``params.code``), or the prepared data newer
    than the model: the cases in which Snakemake reruns the training job."""
    folder = model_folder(results, dataset, model_id)
    model, metrics = folder / "model.pt", folder / "metrics.json"
    try:
        recorded = json.loads(metrics.read_text())
        model_time = model.stat().st_mtime
    except (OSError, ValueError):
        return True
    if not isinstance(recorded, dict):
        return True
    if recorded.get("config") != spec_params(spec) or recorded.get("code") != code:
        return True
    data = Path(results) / "data" / f"{dataset}.npz"
    return data.exists() and data.stat().st_mtime > model_time


def batchable(spec: NetTrainSpec | KernelTrainSpec) -> bool:
    """One-hidden-layer networks are; ResNets and kernel models train one per job."""
    return isinstance(spec, NetTrainSpec) and spec.arch == "mlp"


def _rule_name(dataset: str, setting: str, seed: int, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", f"train_grid_{dataset}_{setting}_seed{seed}")
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def plan_batches(
    config: dict[str, Any],
    grid: Mapping[str, NetTrainSpec | KernelTrainSpec],
    code: str,
    fresh: bool = False,
) -> list[TrainBatch]:
    """The batched training jobs of a validated ``config`` (``grid``: its
    :func:`crosslip.config.grid.training_grid`; ``code``: the training job's code digest): per
    dataset, setting, seed and tracked params, the networks that :func:`needs_training`
    (every one with ``fresh``: as for an empty results folder), where there are two or more.
    None with ``train.batch_grid: false``."""
    if not config["train"].get("batch_grid", True):
        return []
    tracked = tracked_params(config)
    results = config["results"]
    groups: dict[tuple[str, str, int, str], list[str]] = {}
    for dataset in dataset_names(config):
        for model_id, spec in grid.items():
            if not batchable(spec):
                continue
            if not fresh and not needs_training(results, dataset, model_id, spec, code):
                continue
            assert isinstance(spec, NetTrainSpec)
            shared = json.dumps(tracked[model_id], sort_keys=True)
            groups.setdefault((dataset, spec.setting, spec.seed, shared), []).append(model_id)
    taken: set[str] = set()
    batches = []
    for (dataset, setting, seed, shared), models in groups.items():
        if len(models) > 1:
            name = _rule_name(dataset, setting, seed, taken)
            batches.append(
                TrainBatch(name, dataset, setting, seed, tuple(sorted(models)), json.loads(shared))
            )
    return batches


@dataclass(frozen=True)
class EvaluationBatch:
    """The models of one dataset, family and setting whose certification (or attacks) one
    job computes, one process on one device: its rule ``name``, the ``dataset`` and the
    model ids (sorted)."""

    name: str
    dataset: str
    family: str
    setting: str
    models: tuple[str, ...]


def evaluation_batches(
    config: dict[str, Any], grid: Mapping[str, NetTrainSpec | KernelTrainSpec], stage: str
) -> list[EvaluationBatch]:
    """The jobs of ``stage`` (``certify`` or ``attack``) that handle several models, where
    ``<stage>.batch_models`` asks for them: per dataset, family (mlp, resnet, kernel) and
    setting, every trained model of the grid, where there are two or more (a model alone,
    and models trained elsewhere, keep a job each).
    The batches are fixed by the grid, so adding a model or retraining one runs its whole
    batch again: a job that costs about its start-up on a GPU (docs/architecture.md)."""
    if not config[stage].get("batch_models", False):
        return []
    groups: dict[tuple[str, str, str], list[str]] = {}
    for dataset in dataset_names(config):
        for model_id, spec in grid.items():
            fields = spec_params(spec)
            family = model_family(fields)
            setting = fields.get("setting", "plain")
            groups.setdefault((dataset, family, setting), []).append(model_id)
    return [
        EvaluationBatch(
            re.sub(r"\W", "_", f"{stage}_grid_{dataset}_{family}_{setting}"),
            dataset,
            family,
            setting,
            tuple(sorted(models)),
        )
        for (dataset, family, setting), models in groups.items()
        if len(models) > 1
    ]


#: What a ``certify`` or ``attack`` job receives as ``params`` besides the code digest:
#: param name -> the config key it holds (:func:`evaluation_params`).
EVALUATION_PARAMS: dict[str, dict[str, str]] = {
    "certify": {
        "n_points": "certify.n_points",
        "rtol": "certify.rtol",
        "kinds": "certify.kinds",
        "tangent_steps": "certify.tangent_steps",
        "trust_region_steps": "certify.trust_region_steps",
        "expansion_steps": "certify.expansion_steps",
        "expansion_ascent_steps": "certify.expansion_ascent_steps",
        "integration_nodes": "certify.integration_nodes",
        "device": "device",
        "memory_gb": "kernel.memory_gb",
    },
    "attack": {
        "n_points": "attack.n_points",
        "rtol": "attack.rtol",
        "max_steps": "attack.max_steps",
        "norms": "attack.norms",
        "refine_steps": "attack.refine_steps",
        "min_norm_steps": "attack.min_norm_steps",
        "min_norm_targets": "attack.min_norm_targets",
        "min_norm_restarts": "attack.min_norm_restarts",
        "min_norm_tol": "attack.min_norm_tol",
        "min_norm_patience": "attack.min_norm_patience",
        "min_norm_prune": "attack.min_norm_prune",
        "n_examples": "attack.example_candidates",
        "device": "device",
    },
}


def evaluation_params(config: dict[str, Any], stage: str) -> dict[str, Any]:
    """The ``params`` of a ``certify`` or ``attack`` job of a validated ``config``, besides
    the code digest (:data:`EVALUATION_PARAMS`), for the per-model rule and the batched
    ones (:func:`evaluation_batches`) alike: a model is evaluated with the same settings
    whichever rule runs it, and Snakemake, which reruns a job whose params differ from
    those it recorded, sees none changed when a model moves between them (a move reruns it
    all the same, by Snakemake's other triggers: the job's set of input files and the text
    of its rule differ)."""
    if stage not in EVALUATION_PARAMS:
        raise ValueError(f"no evaluation stage {stage!r}: certify or attack")
    out = {}
    for name, key in EVALUATION_PARAMS[stage].items():
        value: Any = config
        for part in key.split("."):
            value = value[part]
        out[name] = value
    return out
