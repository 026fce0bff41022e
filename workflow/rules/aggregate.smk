# Model selection, then the tables and figures of Section 5, each a rule over the per-instance
# results (via the per-model summary). Outputs marked report() go into
# `snakemake --report report.html`. They take seconds, as does the per-model join of
# guarantees and upper bounds (rule instances, evaluate.smk): on a cluster they run where
# Snakemake runs, not as batch jobs, unless config local_aggregation is false.
if config["local_aggregation"]:

    localrules:
        instances,
        select_models,
        summary,
        table1,
        kernel_table,
        figure_bounds,
        figure_bracket,
        figure_certified_accuracy,
        figure_adversarial,
        figure_training,


checkpoint select_models:
    input:
        metrics=all_models(f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json"),
    output:
        f"{RESULTS}/selected_models.json",
    log:
        f"{RESULTS}/logs/select_models.log",
    conda:
        ENV
    params:
        code=code("select_models.py"),
    script:
        "../scripts/select_models.py"


rule summary:
    input:
        instances=evaluated(f"{RESULTS}/instances/{{dataset}}/{{model}}.parquet"),
        metrics=all_models(f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json")
        + external_models(f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json"),
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
    params:
        radii=config["certify"]["radii"],
        code=code("summary.py"),
    script:
        "../scripts/summary.py"


rule table1:
    input:
        summary=rules.summary.output.csv,
    output:
        csv=report(
            f"{RESULTS}/tables/table1_global_local.csv",
            caption="../report/table1.rst",
            category="Tables",
        ),
        md=f"{RESULTS}/tables/table1_global_local.md",
        tex=f"{RESULTS}/tables/table1_global_local.tex",
    log:
        f"{RESULTS}/logs/table1.log",
    conda:
        ENV
    params:
        table="table1",
        code=code("table.py"),
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
    log:
        f"{RESULTS}/logs/kernel_table.log",
    params:
        table="kernel",
        code=code("table.py"),


rule figure_bounds:
    input:
        summary=rules.summary.output.csv,
    output:
        png=report(
            f"{RESULTS}/figures/bounds_vs_error/{{dataset}}-{{family}}.png",
            caption="../report/bounds_vs_error.rst",
            category="Figures",
            subcategory="{dataset}",
            labels={"family": "{family}"},
        ),
        pdf=f"{RESULTS}/figures/bounds_vs_error/{{dataset}}-{{family}}.pdf",
    log:
        f"{RESULTS}/logs/figure_bounds/{{dataset}}-{{family}}.log",
    conda:
        ENV
    params:
        figure="bounds_vs_error",
        code=code("figure_bounds.py"),
    script:
        "../scripts/figure_bounds.py"


rule figure_bracket:
    input:
        summary=rules.summary.output.csv,
    output:
        png=report(
            f"{RESULTS}/figures/bracket/{{dataset}}-{{family}}.png",
            caption="../report/bracket.rst",
            category="Figures",
            subcategory="{dataset}: bracket",
            labels={"family": "{family}"},
        ),
        pdf=f"{RESULTS}/figures/bracket/{{dataset}}-{{family}}.pdf",
    log:
        f"{RESULTS}/logs/figure_bracket/{{dataset}}-{{family}}.log",
    conda:
        ENV
    params:
        figure="bracket",
        code=code("figure_bounds.py"),
    script:
        "../scripts/figure_bounds.py"


rule figure_certified_accuracy:
    input:
        instances=evaluated(f"{RESULTS}/instances/{{dataset}}/{{model}}.parquet"),
    output:
        png=report(
            f"{RESULTS}/figures/certified_accuracy/{{dataset}}-{{family}}.png",
            caption="../report/certified_accuracy.rst",
            category="Figures",
            subcategory="{dataset}: certified accuracy",
            labels={"family": "{family}"},
        ),
        pdf=f"{RESULTS}/figures/certified_accuracy/{{dataset}}-{{family}}.pdf",
    log:
        f"{RESULTS}/logs/figure_certified_accuracy/{{dataset}}-{{family}}.log",
    conda:
        ENV
    params:
        code=code("figure_accuracy.py"),
    script:
        "../scripts/figure_accuracy.py"


rule figure_adversarial:
    input:
        summary=rules.summary.output.csv,
        examples=evaluated(f"{RESULTS}/examples/{{dataset}}/{{model}}.npz"),
    output:
        png=report(
            f"{RESULTS}/figures/adversarial_samples.png",
            caption="../report/adversarial_samples.rst",
            category="Figures",
        ),
        pdf=f"{RESULTS}/figures/adversarial_samples.pdf",
        csv=f"{RESULTS}/figures/adversarial_samples.csv",
    log:
        f"{RESULTS}/logs/figure_adversarial.log",
    conda:
        ENV
    params:
        n_points=config["attack"]["n_examples"],
        code=code("figure_adversarial.py"),
    script:
        "../scripts/figure_adversarial.py"


rule figure_training:
    input:
        # metrics.json of every model of the dataset in the family (kernel specs: no arch)
        metrics=lambda wc: [
            f"{RESULTS}/models/{wc.dataset}/{m}/metrics.json"
            for m, spec in sorted(GRID.items())
            if getattr(spec, "arch", "kernel") == wc.family
        ],
    output:
        png=report(
            f"{RESULTS}/figures/training/{{dataset}}-{{family}}.png",
            caption="../report/training_curves.rst",
            category="Training",
            subcategory="{dataset}",
            labels={"family": "{family}"},
        ),
        pdf=f"{RESULTS}/figures/training/{{dataset}}-{{family}}.pdf",
    log:
        f"{RESULTS}/logs/figure_training/{{dataset}}-{{family}}.log",
    conda:
        ENV
    params:
        code=code("figure_training.py"),
    script:
        "../scripts/figure_training.py"
