"""Bounds against test error for one dataset and model family, a row per setting (Section 5)."""

from crosslip.io import run_script
from crosslip.report import plot_bounds_vs_error, read_summary


def main() -> None:
    wc = snakemake.wildcards
    plot_bounds_vs_error(
        read_summary(snakemake.input.summary),
        snakemake.output.png,
        snakemake.output.pdf,
        wc.dataset,
        wc.family,
    )


run_script(snakemake.log[0], main)
