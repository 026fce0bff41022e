"""Choose the models to certify: the lowest test error per method (certify.models: best)."""

import logging

from crosslip.io import read_json, run_script


def main() -> None:
    from crosslip.jobs.selection import select_best, write_selected

    chosen = select_best(read_json(p) for p in snakemake.input.metrics)
    write_selected(chosen, snakemake.output[0])
    logging.getLogger("crosslip").info("%d models chosen: %s", len(chosen), chosen)


run_script(snakemake.log[0], main)
