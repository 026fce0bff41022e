"""The illustration of adversarial samples (Section 5), and the record of what it shows."""

from crosslip.io import run_script


def main() -> None:
    from crosslip.report.illustration import load_examples, plot_adversarial_samples
    from crosslip.report.tables import read_summary

    plot_adversarial_samples(
        read_summary(snakemake.input.summary),
        load_examples(snakemake.input.examples),
        snakemake.output.png,
        snakemake.output.pdf,
        n_points=snakemake.params.n_points,
        csv=snakemake.output.csv,
    )


run_script(snakemake.log[0], main)
