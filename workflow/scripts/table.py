"""A table of Section 5 from the summary: Table 1 (``table1``) or the kernel table."""

from crosslip.io import run_script


def main() -> None:
    from crosslip.report.tables import kernel_table, read_summary, table1, write_tables

    tables = {"table1": table1, "kernel": kernel_table}
    table = tables[snakemake.params.table](read_summary(snakemake.input.summary))
    write_tables(table, snakemake.output.csv, snakemake.output.md, snakemake.output.tex)


run_script(snakemake.log[0], main)
