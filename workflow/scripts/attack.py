"""Box-constrained L2/L1/Linf adversarial upper bounds (Section 4), paper and refined."""

import logging

from crosslip.io import run_script
from crosslip.stages.attack import attack_stage


def main() -> None:
    df = attack_stage(
        snakemake.input.data,
        snakemake.input.model,
        snakemake.input.metrics,
        snakemake.output.table,
        n_points=snakemake.params.n_points,
        rtol=snakemake.params.rtol,
        max_steps=snakemake.params.max_steps,
        norms=list(snakemake.params.norms),
        refine_steps=snakemake.params.refine_steps,
        device=snakemake.params.device,
        examples_out=snakemake.output.examples,
        n_examples=snakemake.params.n_examples,
    )
    logging.getLogger("crosslip").info(
        "%d points, mean upper bound %.4f", len(df), df["upper_bound"].mean()
    )


run_script(snakemake.log[0], main, snakemake.threads)
