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

from crosslip import io as crosslip_io

# The embedded default; a --configfile on the command line replaces it entirely (so a preset
# defines its whole grid instead of being merged into the default one).
if not workflow.overwrite_configfiles:

    configfile: str(Path(workflow.basedir) / "config.yaml")


include: "workflow/rules/common.smk"


# A run lock that dies with its holder: a killed run resumes with the same command, a second
# run for the same results folder is refused (docs/troubleshooting-resume.md).
from crosslip.jobs.runlock import guard_run

guard_run(workflow, config["results"])

# Under the job server (make run), each script job's process hands its script to the server
# before Snakemake's preamble imports Snakemake: python -m crosslip.handoff SCRIPT.
from crosslip.handoff import serve_script_jobs

serve_script_jobs()


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
# read from each failed job's log file (crosslip.io.failure_lines). The jobs come from the
# scheduler, or, where it does not say, from the logs with an ERROR written since this start.
_STARTED = time.time()


onerror:
    scheduler = getattr(workflow, "scheduler", None)
    failed = getattr(scheduler, "failed", None)
    if failed:
        jobs = [
            (
                job.rule.name,
                ", ".join(f"{k}={v}" for k, v in job.wildcards.items()),
                list(job.log),
            )
            for job in sorted(failed, key=lambda j: (j.rule.name, str(j.wildcards)))
            if hasattr(job, "rule")
        ]
    else:
        jobs = crosslip_io.recent_failed_logs(f"{RESULTS}/logs", _STARTED)
    for line in crosslip_io.failure_lines(jobs):
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
