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
    threads: JOB_THREADS
    resources:
        # crosslip.jobs.resources, as for training
        mem_mb=lambda wc: resources_of(wc, "certify")["mem_mb"],
        runtime=lambda wc: resources_of(wc, "certify")["runtime"],
        gpu=lambda wc: resources_of(wc, "certify")["gpu"],
    params:
        **evaluation_params("certify"),
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
    threads: JOB_THREADS
    resources:
        # crosslip.jobs.resources, as for training
        mem_mb=lambda wc: resources_of(wc, "attack")["mem_mb"],
        runtime=lambda wc: resources_of(wc, "attack")["runtime"],
        gpu=lambda wc: resources_of(wc, "attack")["gpu"],
    params:
        **evaluation_params("attack"),
    script:
        "../scripts/attack.py"


# With certify.batch_models / attack.batch_models: every trained model of one dataset,
# family and setting in one job (crosslip.jobs.batches.evaluation_batches), with the outputs
# and logs of the per-model jobs; rules without wildcards take precedence over those above.
# The same params as the per-model rule (evaluation_params), and what --set-threads and
# --set-resources give it (crosslip.jobs.snakemake_internals.take_overrides).
for batch in CERTIFY_BATCHES:

    rule:
        name:
            batch.name
        input:
            data=f"{RESULTS}/data/{batch.dataset}.npz",
            model=[
                f"{RESULTS}/models/{batch.dataset}/{m}/model.pt" for m in batch.models
            ],
            metrics=[
                f"{RESULTS}/models/{batch.dataset}/{m}/metrics.json"
                for m in batch.models
            ],
        output:
            [f"{RESULTS}/certify/{batch.dataset}/{m}.parquet" for m in batch.models],
        log:
            [f"{RESULTS}/logs/certify/{batch.dataset}/{m}.log" for m in batch.models],
        benchmark:
            f"{RESULTS}/benchmarks/certify_grid/{batch.dataset}/{batch.family}-{batch.setting}.tsv"
        conda:
            ENV
        threads: JOB_THREADS
        resources:
            **batch_resources(batch, "certify"),
        params:
            **evaluation_params("certify"),
        script:
            "../scripts/certify.py"

    take_overrides(workflow, batch.name, "certify")


for batch in ATTACK_BATCHES:

    rule:
        name:
            batch.name
        input:
            data=f"{RESULTS}/data/{batch.dataset}.npz",
            model=[
                f"{RESULTS}/models/{batch.dataset}/{m}/model.pt" for m in batch.models
            ],
            metrics=[
                f"{RESULTS}/models/{batch.dataset}/{m}/metrics.json"
                for m in batch.models
            ],
        output:
            table=[
                f"{RESULTS}/attack/{batch.dataset}/{m}.parquet" for m in batch.models
            ],
            examples=[
                f"{RESULTS}/examples/{batch.dataset}/{m}.npz" for m in batch.models
            ],
        log:
            [f"{RESULTS}/logs/attack/{batch.dataset}/{m}.log" for m in batch.models],
        benchmark:
            f"{RESULTS}/benchmarks/attack_grid/{batch.dataset}/{batch.family}-{batch.setting}.tsv"
        conda:
            ENV
        threads: JOB_THREADS
        resources:
            **batch_resources(batch, "attack"),
        params:
            **evaluation_params("attack"),
        script:
            "../scripts/attack.py"

    take_overrides(workflow, batch.name, "attack")


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
