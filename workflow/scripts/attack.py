"""Box-constrained L2 adversarial upper bounds (Section 4) for one model."""

import logging

from crosslip.io import run_script
from crosslip.pipeline import attack_stage


def main() -> None:
    df = attack_stage(
        snakemake.input.data,
        snakemake.input.model,
        snakemake.input.metrics,
        snakemake.output[0],
        n_points=snakemake.params.n_points,
        rtol=snakemake.params.rtol,
        max_steps=snakemake.params.max_steps,
        device=snakemake.params.device,
    )
    logging.getLogger("crosslip").info(
        "%d points, mean upper bound %.4f", len(df), df["upper_bound"].mean()
    )


run_script(snakemake.log[0], main, snakemake.threads)
