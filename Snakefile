# crosslip: formal robustness guarantees (Hein & Andriushchenko, NIPS 2017) as a workflow.
#   data -> train (one job per grid point) -> certify (lower bounds) + attack (upper bounds)
#        -> per-instance Parquet -> tables and figures
#      snakemake --report report.html   (after a run: tables and figures with captions)
# Run: snakemake --cores all            (embedded default, config.yaml)
#      snakemake --cores all --configfile <preset.yaml>
import re
from pathlib import Path


# The embedded default; a --configfile on the command line replaces it entirely (so a preset
# defines its whole grid instead of being merged into the default one).
if not workflow.overwrite_configfiles:

    configfile: str(Path(workflow.basedir) / "config.yaml")


include: "workflow/rules/common.smk"


# A run lock that dies with its holder: a killed run resumes with the same command, a second
# run for the same results folder is refused (docs/troubleshooting-resume.md).
from crosslip.runlock import guard_run

guard_run(workflow, config["results"])


wildcard_constraints:
    dataset="|".join(DATASETS),
    family="mlp|resnet|kernel",
    model="|".join(map(re.escape, sorted(GRID))),


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/aggregate.smk"


report: "workflow/report/workflow.rst"


rule all:
    input:
        crosslip_config.aggregate_targets(config),
    default_target: True
