# crosslip: formal robustness guarantees (Hein & Andriushchenko, NIPS 2017) as a workflow.
#   data -> train (one job per grid point) -> certify (lower bounds) + attack (upper bounds)
#        -> per-instance Parquet -> tables and figures
#      snakemake --report report.html   (after a run: tables and figures with captions)
# Run: snakemake --cores all            (embedded default, config.yaml)
#      snakemake --cores all --configfile <preset.yaml>
import re
import sys
import time
from pathlib import Path

from crosslip.io import logs as crosslip_logs

# The embedded default, where no --configfile gives a config (every config names its
# datasets): a preset replaces it entirely and defines its whole grid, instead of being
# merged into the default one. --config values apply on top either way.
if "datasets" not in config:

    configfile: str(Path(workflow.basedir) / "config.yaml")


include: "workflow/rules/common.smk"


# A run lock that dies with its holder: a killed run resumes with the same command, a second
# run for the same results folder is refused (docs/troubleshooting-resume.md).
from crosslip.jobs.runlock import guard_run

guard_run(config["results"])


wildcard_constraints:
    dataset="|".join(DATASETS),
    family="mlp|resnet|kernel|external",
    model=one_of([*GRID, *EXTERNAL]),


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/aggregate.smk"


report: "workflow/report/workflow.rst"


# A failed job's one-line reason on the terminal, whatever executes the jobs (locally their
# stderr may be hidden among other output; on SLURM it goes to the cluster's job files):
# read from the log files with an ERROR written since this start (crosslip.io.logs).
_STARTED = time.time()


onerror:
    jobs = crosslip_logs.recent_failed_logs(f"{RESULTS}/logs", _STARTED)
    for line in crosslip_logs.failure_lines(jobs):
        print(line, file=sys.stderr)


# What the run found, and where its tables and figures are (crosslip.run_summary).
onsuccess:
    from crosslip.run_summary import summary_lines

    print(
        "\n".join(summary_lines(RESULTS, config["certify"]["radii"].get("l2", [])))
    )


rule all:
    default_target: True
    input:
        aggregate_targets(config),
