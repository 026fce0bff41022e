"""Bounds against test error for one dataset, model family and setting (Section 5)."""

from crosslip.io import run_script
from crosslip.report import plot_bounds_vs_error, read_summary


def main() -> None:
    wc = snakemake.wildcards
    plot_bounds_vs_error(read_summary(snakemake.input.summary), snakemake.output.png,
                         snakemake.output.pdf, wc.dataset, wc.family, wc.setting)  # fmt: skip


run_script(snakemake.log[0], main)
