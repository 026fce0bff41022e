rule prepare_data:
    output:
        f"{RESULTS}/data/{{dataset}}.npz",
    params:
        cache=config["data"]["cache"],
        mirror=lambda wc: config["data"]["mirrors"].get(wc.dataset),
        code=code("prepare_data.py"),
    log:
        f"{RESULTS}/logs/prepare_data/{{dataset}}.log",
    conda:
        ENV
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../scripts/prepare_data.py"
