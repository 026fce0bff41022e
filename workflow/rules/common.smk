# Config validation, the training grid and the targets come from the library
# (crosslip.config, tested on its own); code tracking from crosslip.jobs.tracking.
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError

from crosslip.errors import ConfigError
from crosslip.config.grid import (
    aggregate_targets,
    dataset_entry,
    dataset_names,
    tracked_params,
    training_grid,
)
from crosslip.config.validate import external_models, validate
from crosslip.jobs import selection as crosslip_selection
from crosslip.kernel_memory import check_config as check_kernel_memory
from crosslip.data.custom import fingerprint as data_fingerprint
from crosslip.jobs.resources import grid_batch_resources, job_resources, job_threads
from crosslip.jobs.snakemake_internals import take_overrides
from crosslip.jobs.tracking import code_digest
from crosslip.jobs import batches as crosslip_batches
from crosslip.jobs.batches import evaluation_batches, plan_batches

try:
    validate(config)
    check_kernel_memory(config)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

RESULTS = config["results"]
ENV = "../../environment.yml"
# threads of a training, certify or attack job: 1 below 4 cores (crosslip.jobs.resources);
# workflow.cores raises where none are given (a cluster executor, --report, --summary)
try:
    _CORES = workflow.cores
except WorkflowError:
    _CORES = None
JOB_THREADS = job_threads(_CORES)
DATASETS = dataset_names(config)
GRID = training_grid(config)
# models trained elsewhere: name -> config entry (crosslip.models.external)
EXTERNAL = external_models(config)
SCRIPTS = Path(workflow.basedir) / "workflow" / "scripts"
PACKAGE = Path(workflow.basedir) / "src" / "crosslip"


def code(script):
    """Digest of a script and the crosslip code it imports (from the package beside this
    Snakefile): a rule's params.code, so that a job reruns when, and only when, the code it
    runs changes (crosslip.jobs.tracking)."""
    return code_digest(SCRIPTS / script, PACKAGE if PACKAGE.is_dir() else None)


# what each training job receives (with the model id: the whole spec), and the networks
# trained as one batched model (rules in train.smk)
TRACKED = tracked_params(config)
TRAIN_BATCHES = plan_batches(config, GRID, code("train.py"))
# with certify.batch_models / attack.batch_models: one job per dataset, family and setting
CERTIFY_BATCHES = evaluation_batches(config, GRID, "certify")
ATTACK_BATCHES = evaluation_batches(config, GRID, "attack")


def evaluation_params(stage):
    """The params of a `certify` or `attack` job, per-model or batched alike (one
    definition: crosslip.jobs.batches.evaluation_params), with the code digest of its
    script."""
    return {
        **crosslip_batches.evaluation_params(config, stage),
        "code": code(f"{stage}.py"),
    }


def training_rules():
    """What differs between the training rules (workflow/rules/train.smk): `train`, one job
    per model, then one rule per batch of networks trained as one model."""
    per_model = {
        "name": "train",
        "data": f"{RESULTS}/data/{{dataset}}.npz",
        "model": f"{RESULTS}/models/{{dataset}}/{{model}}/model.pt",
        "metrics": f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
        "log": f"{RESULTS}/logs/train/{{dataset}}/{{model}}.log",
        "benchmark": f"{RESULTS}/benchmarks/train/{{dataset}}/{{model}}.tsv",
        # From the config and the model (crosslip.jobs.resources): kernel models the memory
        # budget kernel.memory_gb and a runtime from their flop count. One GPU per job
        # unless device is cpu: counted by Snakemake only where a limit is given
        # (--resources gpu=N, profiles/local-gpu), unlimited otherwise; on SLURM it becomes
        # sbatch --gpus=1 (profiles/slurm). Which device the job uses is config `device`.
        "resources": {
            "mem_mb": lambda wc: resources_of(wc, "train")["mem_mb"],
            "runtime": lambda wc: resources_of(wc, "train")["runtime"],
            "gpu": lambda wc: resources_of(wc, "train")["gpu"],
        },
        "tracked": lambda wc: TRACKED[wc.model],
        "priority": 0,
    }
    rules = [per_model]
    for batch in TRAIN_BATCHES:
        folder = f"{RESULTS}/models/{batch.dataset}"
        rules.append(
            {
                "name": batch.name,
                "data": f"{RESULTS}/data/{batch.dataset}.npz",
                "model": [f"{folder}/{m}/model.pt" for m in batch.models],
                "metrics": [f"{folder}/{m}/metrics.json" for m in batch.models],
                "log": [
                    f"{RESULTS}/logs/train/{batch.dataset}/{m}.log"
                    for m in batch.models
                ],
                "benchmark": f"{RESULTS}/benchmarks/train_grid/{batch.dataset}/"
                f"{batch.setting}-seed{batch.seed}.tsv",
                "resources": grid_batch_resources(
                    config, [GRID[m] for m in batch.models], batch.dataset
                ),
                # the very dict of the per-model jobs: Snakemake compares the repr
                "tracked": TRACKED[batch.models[0]],
                # a batch gates the evaluation of all its networks: it starts before the
                # jobs of single models that are ready at the same time
                "priority": len(batch.models),
            }
        )
    return rules


def batch_resources(batch, stage):
    """mem_mb, runtime and gpu of a batched certify or attack job: the most memory of one
    of its models, the sum of their runtimes, one GPU (crosslip.jobs.resources)."""
    each = [job_resources(config, GRID[m], batch.dataset, stage) for m in batch.models]
    return {
        "mem_mb": max(r["mem_mb"] for r in each),
        "runtime": sum(r["runtime"] for r in each),
        "gpu": max(r["gpu"] for r in each),
    }


def resources_of(wildcards, stage):
    """mem_mb, runtime and gpu of a train, certify or attack job (crosslip.jobs.resources);
    a model trained elsewhere (not in GRID) gets the networks' defaults."""
    return job_resources(config, GRID.get(wildcards.model), wildcards.dataset, stage)


def all_models(pattern):
    return expand(pattern, dataset=DATASETS, model=sorted(GRID), allow_missing=True)


def one_of(names):
    """A wildcard constraint matching exactly ``names`` (none: a regex that never matches,
    since Snakemake reads an empty constraint as no constraint)."""
    return "|".join(re.escape(n) for n in sorted(names)) or "(?!)"


def external_models(pattern):
    """``pattern`` filled in for every model trained elsewhere, on its own dataset."""
    return [
        pattern.format(dataset=e["dataset"], model=name)
        for name, e in sorted(EXTERNAL.items())
    ]


def evaluated(pattern):
    """``pattern`` filled in for every evaluated (dataset, model): all trained models, or
    with certify.models: best only those that the select_models checkpoint chose after
    training (the lowest test error per method); and every model trained elsewhere."""

    def paths(wildcards):
        if config["certify"]["models"] == "all" or not GRID:
            return all_models(pattern) + external_models(pattern)
        chosen = crosslip_selection.read_selected(
            checkpoints.select_models.get().output[0]
        )
        return [
            pattern.format(dataset=ds, model=m) for ds, m in chosen
        ] + external_models(pattern)

    return paths
