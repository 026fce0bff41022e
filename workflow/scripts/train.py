"""Train one model of the grid, or several networks of one setting as one batched model."""

import logging
from pathlib import Path

from crosslip.io import run_script


def main() -> None:
    from crosslip.config.specs import spec_from_tracked, spec_params
    from crosslip.jobs.files import as_list
    from crosslip.stages.training import train_grid_stage, train_stage

    models, metrics = as_list(snakemake.output.model), as_list(snakemake.output.metrics)
    ids = [Path(m).parent.name for m in models]
    # what Snakemake tracks (params.tracked) and the id state the whole spec
    specs = {m: spec_from_tracked(m, snakemake.params.tracked) for m in ids}
    if len(ids) == 1:
        done = {
            ids[0]: train_stage(
                snakemake.input.data,
                spec_params(specs[ids[0]]),
                ids[0],
                models[0],
                metrics[0],
                device=snakemake.params.device,
                memory_gb=snakemake.params.memory_gb,
                code=snakemake.params.code,
                grid=snakemake.params.batch_grid,
            )
        }
    else:
        done = train_grid_stage(
            snakemake.input.data,
            specs,
            dict(zip(ids, zip(models, metrics, strict=True), strict=True)),
            device=snakemake.params.device,
            code=snakemake.params.code,
        )
    for model_id, met in done.items():
        logging.getLogger("crosslip").info(
            "status=%s test_error=%s seconds=%.1f device=%s",
            met["status"],
            met["test_error"],
            met["seconds"],
            met["device"],
            extra={"crosslip_model": model_id},
        )


run_script(list(snakemake.log), main, snakemake.threads)
