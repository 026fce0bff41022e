"""Certified radii (Theorem 2.1: L2, L1, Linf, box-constrained; the linear relaxation,
curvature and integrated certificates) for the eval points of one model, or of every model
of a setting in one process (certify.batch_models)."""

import logging
from pathlib import Path

from crosslip.io import run_script


def main() -> None:
    from crosslip.certify.settings import CertifySettings
    from crosslip.jobs.files import as_list
    from crosslip.stages.certification import certify_models_stage

    models = as_list(snakemake.input.model)
    jobs = [
        (Path(m).parent.name, m, metrics, out)
        for m, metrics, out in zip(
            models, as_list(snakemake.input.metrics), snakemake.output, strict=True
        )
    ]
    settings = CertifySettings.from_params(dict(snakemake.params.items()))
    done = certify_models_stage(snakemake.input.data, jobs, settings)
    for model_id, df in done.items():
        logging.getLogger("crosslip").info(
            "%d points, mean local guarantee %.4f",
            len(df),
            df["guarantee_local"].mean(),
            extra={"crosslip_model": model_id},
        )


run_script(list(snakemake.log), main, snakemake.threads)
