"""Box-constrained L2/L1/Linf adversarial upper bounds (Section 4), paper and refined, and
the minimal-norm L2 attack with the best L2 bound per point."""

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
        min_norm_steps=snakemake.params.min_norm_steps,
        min_norm_targets=snakemake.params.min_norm_targets,
        min_norm_restarts=snakemake.params.min_norm_restarts,
        device=snakemake.params.device,
        examples_out=snakemake.output.examples,
        n_examples=snakemake.params.n_examples,
    )
    logging.getLogger("crosslip").info(
        "%d points, mean upper bound %.4f (paper), %.4f (best L2)",
        len(df),
        df["upper_bound"].mean(),
        df["upper_bound_l2_best"].mean(),
    )


run_script(snakemake.log[0], main, snakemake.threads)
