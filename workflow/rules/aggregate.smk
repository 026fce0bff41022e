# Tables and figures of Section 5, each a rule from the per-instance results (via the
# per-model summary). Outputs marked report() go into `snakemake --report report.html`.
# They take seconds: on a cluster they run where Snakemake runs, not as batch jobs.
localrules:
    summary,
    table1,
    kernel_table,
    figure_bounds,
    figure_adversarial,


rule summary:
    input:
        instances=all_models(f"{RESULTS}/instances/{{dataset}}/{{model}}.parquet"),
        metrics=all_models(f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json"),
        lib=lib("report", "results_schema"),
    output:
        csv=report(
            f"{RESULTS}/tables/summary.csv",
            caption="../report/summary.rst",
            category="Tables",
        ),
        md=f"{RESULTS}/tables/summary.md",
        tex=f"{RESULTS}/tables/summary.tex",
    log:
        f"{RESULTS}/logs/summary.log",
    conda:
        ENV
    script:
        "../scripts/summary.py"


rule table1:
    input:
        summary=rules.summary.output.csv,
        lib=lib("report", "results_schema"),
    output:
        csv=report(
            f"{RESULTS}/tables/table1_global_local.csv",
            caption="../report/table1.rst",
            category="Tables",
        ),
        md=f"{RESULTS}/tables/table1_global_local.md",
        tex=f"{RESULTS}/tables/table1_global_local.tex",
    params:
        table="table1",
    log:
        f"{RESULTS}/logs/table1.log",
    conda:
        ENV
    script:
        "../scripts/table.py"


use rule table1 as kernel_table with:
    output:
        csv=report(
            f"{RESULTS}/tables/kernel.csv",
            caption="../report/kernel_table.rst",
            category="Tables",
        ),
        md=f"{RESULTS}/tables/kernel.md",
        tex=f"{RESULTS}/tables/kernel.tex",
    params:
        table="kernel",
    log:
        f"{RESULTS}/logs/kernel_table.log",


rule figure_bounds:
    input:
        summary=rules.summary.output.csv,
        lib=lib("report", "results_schema"),
    output:
        png=report(
            f"{RESULTS}/figures/bounds_vs_error/{{dataset}}-{{family}}-{{setting}}.png",
            caption="../report/bounds_vs_error.rst",
            category="Figures",
            subcategory="{dataset}",
            labels={"family": "{family}", "setting": "{setting}"},
        ),
        pdf=f"{RESULTS}/figures/bounds_vs_error/{{dataset}}-{{family}}-{{setting}}.pdf",
    log:
        f"{RESULTS}/logs/figure_bounds/{{dataset}}-{{family}}-{{setting}}.log",
    conda:
        ENV
    script:
        "../scripts/figure_bounds.py"


rule figure_adversarial:
    input:
        summary=rules.summary.output.csv,
        examples=all_models(f"{RESULTS}/examples/{{dataset}}/{{model}}.npz"),
        lib=lib("report", "results_schema"),
    output:
        png=report(
            f"{RESULTS}/figures/adversarial_samples.png",
            caption="../report/adversarial_samples.rst",
            category="Figures",
        ),
        pdf=f"{RESULTS}/figures/adversarial_samples.pdf",
    log:
        f"{RESULTS}/logs/figure_adversarial.log",
    conda:
        ENV
    script:
        "../scripts/figure_adversarial.py"
