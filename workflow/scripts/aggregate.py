"""Summary table and Table 1 (CSV, Markdown); bounds-versus-error and adversarial-sample figures."""

import pandas as pd

from crosslip.io import read_json, run_script
from crosslip.report import (
    add_diverged,
    load_examples,
    plot_adversarial_samples,
    plot_bounds_vs_error,
    summarize,
    table1,
    write_tables,
)


def main() -> None:
    instances = pd.concat([pd.read_parquet(p) for p in snakemake.input.instances])
    summary = add_diverged(summarize(instances), [read_json(p) for p in snakemake.input.metrics])
    write_tables(summary, snakemake.output.csv, snakemake.output.md)
    write_tables(table1(summary), snakemake.output.table1_csv, snakemake.output.table1_md)
    plot_bounds_vs_error(summary, snakemake.output.png, snakemake.output.pdf)
    examples = load_examples(snakemake.input.examples)
    plot_adversarial_samples(summary, examples, snakemake.output.adv_png,
                             snakemake.output.adv_pdf)  # fmt: skip


run_script(snakemake.log[0], main)
