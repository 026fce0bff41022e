rule certify:
    input:
        data=f"{RESULTS}/data/{{dataset}}.npz",
        model=f"{RESULTS}/models/{{dataset}}/{{model}}/model.pt",
        metrics=f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
    output:
        f"{RESULTS}/certify/{{dataset}}/{{model}}.parquet",
    log:
        f"{RESULTS}/logs/certify/{{dataset}}/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/certify/{{dataset}}/{{model}}.tsv"
    conda:
        ENV
    threads: 2
    resources:
        # crosslip.job_resources, as for training
        mem_mb=lambda wc: resources_of(wc, "certify")["mem_mb"],
        runtime=lambda wc: resources_of(wc, "certify")["runtime"],
        gpu=lambda wc: resources_of(wc, "certify")["gpu"],
    params:
        n_points=config["certify"]["n_points"],
        rtol=config["certify"]["rtol"],
        kinds=config["certify"]["kinds"],
        device=config["device"],
        memory_gb=config["kernel"]["memory_gb"],
        code=code("certify.py"),
    script:
        "../scripts/certify.py"


rule attack:
    input:
        data=f"{RESULTS}/data/{{dataset}}.npz",
        model=f"{RESULTS}/models/{{dataset}}/{{model}}/model.pt",
        metrics=f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
    output:
        table=f"{RESULTS}/attack/{{dataset}}/{{model}}.parquet",
        examples=f"{RESULTS}/examples/{{dataset}}/{{model}}.npz",
    log:
        f"{RESULTS}/logs/attack/{{dataset}}/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/attack/{{dataset}}/{{model}}.tsv"
    conda:
        ENV
    threads: 2
    resources:
        # crosslip.job_resources, as for training
        mem_mb=lambda wc: resources_of(wc, "attack")["mem_mb"],
        runtime=lambda wc: resources_of(wc, "attack")["runtime"],
        gpu=lambda wc: resources_of(wc, "attack")["gpu"],
    params:
        n_points=config["attack"]["n_points"],
        rtol=config["attack"]["rtol"],
        max_steps=config["attack"]["max_steps"],
        norms=config["attack"]["norms"],
        refine_steps=config["attack"]["refine_steps"],
        min_norm_steps=config["attack"]["min_norm_steps"],
        min_norm_targets=config["attack"]["min_norm_targets"],
        min_norm_restarts=config["attack"]["min_norm_restarts"],
        n_examples=config["attack"]["example_candidates"],
        device=config["device"],
        code=code("attack.py"),
    script:
        "../scripts/attack.py"


rule instances:
    input:
        certify=f"{RESULTS}/certify/{{dataset}}/{{model}}.parquet",
        attack=rules.attack.output.table,
        metrics=f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
    output:
        f"{RESULTS}/instances/{{dataset}}/{{model}}.parquet",
    log:
        f"{RESULTS}/logs/instances/{{dataset}}/{{model}}.log",
    conda:
        ENV
    params:
        code=code("instances.py"),
    script:
        "../scripts/instances.py"
