"""Join guarantees, upper bounds and model identifiers into the per-instance Parquet."""

from crosslip.io import run_script


def main() -> None:
    from crosslip.stages.instances import instances_stage

    instances_stage(
        snakemake.input.certify,
        snakemake.input.attack,
        snakemake.input.metrics,
        snakemake.wildcards.model,
        snakemake.output[0],
    )


run_script(snakemake.log[0], main)
