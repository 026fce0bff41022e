# Config validation, the training grid and the targets come from the library
# (crosslip.config, tested on its own); code tracking from crosslip.tracking.
from pathlib import Path

from snakemake.exceptions import WorkflowError

from crosslip import config as crosslip_config
from crosslip import selection as crosslip_selection
from crosslip.data.custom import fingerprint as data_fingerprint
from crosslip.tracking import code_digest

if not workflow.modifier.skip_validation:
    try:
        crosslip_config.validate(config)
    except crosslip_config.ConfigError as exc:
        raise WorkflowError(str(exc)) from None

RESULTS = config["results"]
ENV = "../../environment.yml"
DATASETS = crosslip_config.dataset_names(config)
GRID = crosslip_config.training_grid(config)
GPUS = crosslip_config.gpus_per_job(config)  # gpu resource of train, certify, attack
SCRIPTS = Path(workflow.basedir) / "workflow" / "scripts"
PACKAGE = Path(workflow.basedir) / "src" / "crosslip"


def code(script):
    """Digest of a script and the crosslip code it imports (from the package beside this
    Snakefile): a rule's params.code, so that a job reruns when, and only when, the code it
    runs changes (crosslip.tracking)."""
    return code_digest(SCRIPTS / script, PACKAGE if PACKAGE.is_dir() else None)


def all_models(pattern):
    return expand(pattern, dataset=DATASETS, model=sorted(GRID), allow_missing=True)


def evaluated(pattern):
    """``pattern`` filled in for every evaluated (dataset, model): all trained models, or
    with certify.models: best only those that the select_models checkpoint chose after
    training (the lowest test error per method)."""

    def paths(wildcards):
        if config["certify"]["models"] == "all":
            return all_models(pattern)
        chosen = crosslip_selection.read_selected(
            checkpoints.select_models.get().output[0]
        )
        return [pattern.format(dataset=ds, model=m) for ds, m in chosen]

    return paths
