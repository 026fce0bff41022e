"""A figure per dataset and model family (Section 5): bounds against test error, a row per
setting, or the bracket between guarantees and upper bounds, a panel per setting
(params.figure names it: crosslip.report.figures.FAMILY_FIGURES)."""

from crosslip.io import run_script


def main() -> None:
    from crosslip.report.figures import FAMILY_FIGURES
    from crosslip.report.tables import read_summary

    wc = snakemake.wildcards
    FAMILY_FIGURES[snakemake.params.figure](
        read_summary(snakemake.input.summary),
        snakemake.output.png,
        snakemake.output.pdf,
        wc.dataset,
        wc.family,
    )


run_script(snakemake.log[0], main)
