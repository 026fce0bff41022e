"""Train one model of the grid."""

import logging

from crosslip.io import run_script
from crosslip.stages.training import train_stage


def main() -> None:
    metrics = train_stage(
        snakemake.input.data,
        snakemake.params.hyper,
        snakemake.wildcards.model,
        snakemake.output.model,
        snakemake.output.metrics,
        device=snakemake.params.device,
        memory_gb=snakemake.params.memory_gb,
    )
    logging.getLogger("crosslip").info(
        "status=%s test_error=%s seconds=%.1f device=%s",
        metrics["status"],
        metrics["test_error"],
        metrics["seconds"],
        metrics["device"],
    )


run_script(snakemake.log[0], main, snakemake.threads)
