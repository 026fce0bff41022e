"""The bracket between guarantees and upper bounds for one dataset and model family, a
panel per setting."""

from crosslip.io import run_script
from crosslip.report import plot_bracket, read_summary


def main() -> None:
    wc = snakemake.wildcards
    plot_bracket(
        read_summary(snakemake.input.summary),
        snakemake.output.png,
        snakemake.output.pdf,
        wc.dataset,
        wc.family,
    )


run_script(snakemake.log[0], main)
