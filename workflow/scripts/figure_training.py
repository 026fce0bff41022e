"""Training curves (objective and training error per epoch; objective per L-BFGS
evaluation for kernel models) of one dataset and model family."""

from crosslip.io import read_json, run_script


def main() -> None:
    from crosslip.report.training_figure import plot_training_curves

    wc = snakemake.wildcards
    plot_training_curves(
        [read_json(p) for p in snakemake.input.metrics],
        snakemake.output.png,
        snakemake.output.pdf,
        wc.dataset,
        wc.family,
    )


run_script(snakemake.log[0], main)
