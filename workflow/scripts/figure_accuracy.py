"""Certified accuracy against the radius per dataset and model family: a row per setting,
a column per norm (crosslip.report.figures.plot_certified_accuracy)."""

from crosslip.io import run_script


def main() -> None:
    import pandas as pd

    from crosslip.report.figures import plot_certified_accuracy

    instances = pd.concat([pd.read_parquet(p) for p in snakemake.input.instances])
    wc = snakemake.wildcards
    plot_certified_accuracy(
        instances, snakemake.output.png, snakemake.output.pdf, wc.dataset, wc.family
    )


run_script(snakemake.log[0], main)
