"""A model trained elsewhere (config external_models), checked and stored as a model file."""

import logging

from crosslip.io import run_script


def main() -> None:
    from crosslip.stages.external import import_model_stage

    met = import_model_stage(
        snakemake.input.data,
        dict(snakemake.params.entry),
        snakemake.output.model,
        snakemake.output.metrics,
    )
    logging.getLogger("crosslip").info(
        "%s (%s): test error %.4f, guarantees: %s",
        met["model_id"],
        met["config"]["format"],
        met["test_error"],
        met["config"]["guarantees"],
    )


run_script(snakemake.log[0], main)
