"""Fetch (mirror / cache / download, checksum-verified) and store one dataset."""

from crosslip.io import run_script
from crosslip.stages.data import prepare_data


def main() -> None:
    info = prepare_data(
        snakemake.wildcards.dataset,
        snakemake.output[0],
        cache=snakemake.params.cache,
        mirror=snakemake.params.mirror,
    )
    print(info)


run_script(snakemake.log[0], main)
