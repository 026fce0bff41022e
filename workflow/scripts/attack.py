"""Box-constrained L2/L1/Linf adversarial upper bounds (Section 4), paper and refined, and
the minimal-norm L2 attack with the best L2 bound per point, for one model or for every
model of a setting in one process (attack.batch_models)."""

import logging
from pathlib import Path

from crosslip.io import run_script


def main() -> None:
    from crosslip.attacks.settings import AttackSettings
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
    settings = AttackSettings.from_params(dict(snakemake.params.items()))
    jobs = [(Path(m).parent.name, m, metrics, table, ex) for m, metrics, table, ex in outputs]
    done = attack_models_stage(snakemake.input.data, jobs, settings)
    for model_id, df in done.items():
        logging.getLogger("crosslip").info(
            "%d points, mean upper bound %.4f (paper), %.4f (best L2)",
            len(df),
            df["upper_bound"].mean(),
            df["upper_bound_l2_best"].mean(),
            extra={"crosslip_model": model_id},
        )


run_script(list(snakemake.log), main, snakemake.threads)
