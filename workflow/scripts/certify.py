"""Certified radii (Theorem 2.1: L2, L1, Linf, box-constrained) for one model's eval points."""

import logging

from crosslip.io import run_script
from crosslip.stages.certification import certify_stage


def main() -> None:
    df = certify_stage(
        snakemake.input.data,
        snakemake.input.model,
        snakemake.input.metrics,
        snakemake.output[0],
        n_points=snakemake.params.n_points,
        rtol=snakemake.params.rtol,
        kinds=list(snakemake.params.kinds),
        device=snakemake.params.device,
        memory_gb=snakemake.params.memory_gb,
    )
    logging.getLogger("crosslip").info(
        "%d points, mean local guarantee %.4f", len(df), df["guarantee_local"].mean()
    )


run_script(snakemake.log[0], main, snakemake.threads)
