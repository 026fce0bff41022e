rule aggregate:
    input:
        instances=all_models(f"{RESULTS}/instances/{{dataset}}/{{model}}.parquet"),
        metrics=all_models(f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json"),
        lib=lib("report"),
    output:
        csv=f"{RESULTS}/tables/summary.csv",
        md=f"{RESULTS}/tables/summary.md",
        table1_csv=f"{RESULTS}/tables/table1_global_local.csv",
        table1_md=f"{RESULTS}/tables/table1_global_local.md",
        png=f"{RESULTS}/figures/bounds_vs_error.png",
        pdf=f"{RESULTS}/figures/bounds_vs_error.pdf",
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        ENV
    script:
        "../scripts/aggregate.py"
