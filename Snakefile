# crosslip: formal robustness guarantees (Hein & Andriushchenko, NIPS 2017) as a workflow.
#   data -> train (one job per grid point) -> certify (lower bounds) + attack (upper bounds)
#        -> per-instance Parquet -> tables and figures
# Run: snakemake --cores all            (embedded default, config.yaml)
#      snakemake --cores all --configfile <preset.yaml>
from pathlib import Path


configfile: str(Path(workflow.basedir) / "config.yaml")


include: "workflow/rules/common.smk"
wildcard_constraints:
    dataset="|".join(DATASETS),
    model="|".join(sorted(GRID)).replace(".", r"\."),


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    input:
        rules.aggregate.output,
    default_target: True
