"""Per-model summary of the per-instance results (CSV, Markdown, LaTeX)."""

from crosslip.io import read_json, run_script


def main() -> None:
    import pandas as pd

    from crosslip.report.tables import add_diverged, summarize, write_tables

    instances = pd.concat([pd.read_parquet(p) for p in snakemake.input.instances])
    summary = summarize(instances, snakemake.params.radii)
    summary = add_diverged(summary, [read_json(p) for p in snakemake.input.metrics])
    write_tables(summary, snakemake.output.csv, snakemake.output.md, snakemake.output.tex)


run_script(snakemake.log[0], main)
