rule certify:
    input:
        data=f"{RESULTS}/data/{{dataset}}.npz",
        model=f"{RESULTS}/models/{{dataset}}/{{model}}/model.pt",
        metrics=f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
    output:
        f"{RESULTS}/certify/{{dataset}}/{{model}}.parquet",
    params:
        n_points=config["certify"]["n_points"],
        rtol=config["certify"]["rtol"],
        kinds=config["certify"]["kinds"],
        device=config["device"],
        memory_gb=config["kernel"]["memory_gb"],
        code=code("certify.py"),
    threads: 2
    resources:
        # crosslip.job_resources: kernel models need their memory budget and, unless device
        # is cpu, a GPU of their own; networks 4,000 MB on the CPU.
        mem_mb=lambda wc: job_resources(config, GRID[wc.model], wc.dataset, "certify")["mem_mb"],
        runtime=lambda wc: job_resources(config, GRID[wc.model], wc.dataset, "certify")["runtime"],
        gpu=lambda wc: job_resources(config, GRID[wc.model], wc.dataset, "certify")["gpu"],
    log:
        f"{RESULTS}/logs/certify/{{dataset}}/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/certify/{{dataset}}/{{model}}.tsv"
    conda:
        ENV
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
    params:
        n_points=config["attack"]["n_points"],
        rtol=config["attack"]["rtol"],
        max_steps=config["attack"]["max_steps"],
        norms=config["attack"]["norms"],
        refine_steps=config["attack"]["refine_steps"],
        n_examples=config["attack"]["n_examples"],
        device=config["device"],
        code=code("attack.py"),
    threads: 2
    resources:
        mem_mb=lambda wc: job_resources(config, GRID[wc.model], wc.dataset, "attack")["mem_mb"],
        runtime=lambda wc: job_resources(config, GRID[wc.model], wc.dataset, "attack")["runtime"],
        gpu=lambda wc: job_resources(config, GRID[wc.model], wc.dataset, "attack")["gpu"],
    log:
        f"{RESULTS}/logs/attack/{{dataset}}/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/attack/{{dataset}}/{{model}}.tsv"
    conda:
        ENV
    script:
        "../scripts/attack.py"


rule instances:
    input:
        certify=f"{RESULTS}/certify/{{dataset}}/{{model}}.parquet",
        attack=rules.attack.output.table,
        metrics=f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
    output:
        f"{RESULTS}/instances/{{dataset}}/{{model}}.parquet",
    params:
        code=code("instances.py"),
    log:
        f"{RESULTS}/logs/instances/{{dataset}}/{{model}}.log",
    conda:
        ENV
    script:
        "../scripts/instances.py"
