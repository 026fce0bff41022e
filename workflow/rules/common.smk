# Config validation, the training grid and the targets come from the library
# (crosslip.config, tested on its own); code tracking from crosslip.tracking.
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError

from crosslip import config as crosslip_config
from crosslip import selection as crosslip_selection
from crosslip.data.custom import fingerprint as data_fingerprint
from crosslip.job_resources import grid_batch_resources, job_resources
from crosslip.tracking import code_digest
from crosslip.train_batches import plan_batches

if not workflow.modifier.skip_validation:
    try:
        crosslip_config.validate(config)
    except crosslip_config.ConfigError as exc:
        raise WorkflowError(str(exc)) from None

RESULTS = config["results"]
ENV = "../../environment.yml"
DATASETS = crosslip_config.dataset_names(config)
GRID = crosslip_config.training_grid(config)
# models trained elsewhere: name -> config entry (crosslip.external)
EXTERNAL = crosslip_config.external_models(config)
SCRIPTS = Path(workflow.basedir) / "workflow" / "scripts"
PACKAGE = Path(workflow.basedir) / "src" / "crosslip"


def code(script):
    """Digest of a script and the crosslip code it imports (from the package beside this
    Snakefile): a rule's params.code, so that a job reruns when, and only when, the code it
    runs changes (crosslip.tracking)."""
    return code_digest(SCRIPTS / script, PACKAGE if PACKAGE.is_dir() else None)


# what each training job receives (with the model id: the whole spec), and the networks
# trained as one batched model (rules in train.smk)
TRACKED = crosslip_config.tracked_params(config)
TRAIN_BATCHES = plan_batches(config, GRID, code("train.py"))


def as_train_rule(name):
    """A batched training rule takes what --set-threads and --set-resources (also in a
    profile, e.g. profiles/slurm's GPU partition) give the rule `train`, as Snakemake
    applies them to `train` (tests/test_grid_batches.py checks it in a dry run)."""
    settings = workflow.resource_settings
    batch_rule = workflow.get_rule(name)
    threads = settings._parsed_overwrite_threads.get("train")
    if threads is not None:
        batch_rule.resources["_cores"] = threads
    batch_rule.resources.update(settings._parsed_overwrite_resources.get("train", {}))


def resources_of(wildcards, stage):
    """mem_mb, runtime and gpu of a train, certify or attack job (crosslip.job_resources);
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
