"""Box-constrained L2/L1/Linf adversarial upper bounds (Section 4), paper and refined, and
the minimal-norm L2 attack with the best L2 bound per point, for one model or for every
model of a setting in one process (attack.batch_models)."""

import logging
from pathlib import Path

from crosslip.io import run_script


def main() -> None:
    from crosslip.jobs.files import as_list
    from crosslip.stages.attack import attack_models_stage

    models = as_list(snakemake.input.model)
    outputs = zip(
        models,
        as_list(snakemake.input.metrics),
        as_list(snakemake.output.table),
        as_list(snakemake.output.examples),
        strict=True,
    )
    done = attack_models_stage(
        snakemake.input.data,
        [(Path(m).parent.name, m, metrics, table, ex) for m, metrics, table, ex in outputs],
        n_points=snakemake.params.n_points,
        rtol=snakemake.params.rtol,
        max_steps=snakemake.params.max_steps,
        norms=list(snakemake.params.norms),
        refine_steps=snakemake.params.refine_steps,
        min_norm_steps=snakemake.params.min_norm_steps,
        min_norm_targets=snakemake.params.min_norm_targets,
        min_norm_restarts=snakemake.params.min_norm_restarts,
        min_norm_tol=snakemake.params.min_norm_tol,
        min_norm_patience=snakemake.params.min_norm_patience,
        min_norm_prune=snakemake.params.min_norm_prune,
        device=snakemake.params.device,
        n_examples=snakemake.params.n_examples,
    )
    for model_id, df in done.items():
        logging.getLogger("crosslip").info(
            "%d points, mean upper bound %.4f (paper), %.4f (best L2)",
            len(df),
            df["upper_bound"].mean(),
            df["upper_bound_l2_best"].mean(),
            extra={"crosslip_model": model_id},
        )


run_script(list(snakemake.log), main, snakemake.threads)
