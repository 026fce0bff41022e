rule train:
    input:
        data=f"{RESULTS}/data/{{dataset}}.npz",
    output:
        model=f"{RESULTS}/models/{{dataset}}/{{model}}/model.pt",
        metrics=f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
    log:
        f"{RESULTS}/logs/train/{{dataset}}/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{dataset}}/{{model}}.tsv"
    wildcard_constraints:
        model=one_of(GRID),
    conda:
        ENV
    threads: 2
    resources:
        # From the config and the model (crosslip.job_resources): kernel models the memory
        # budget kernel.memory_gb and a runtime from their flop count. One GPU per job unless
        # device is cpu: counted by Snakemake only where a limit is given (--resources
        # gpu=N, profiles/local-gpu), unlimited otherwise; on SLURM it becomes sbatch
        # --gpus=1 (profiles/slurm). Which device the job uses is config `device`.
        mem_mb=lambda wc: resources_of(wc, "train")["mem_mb"],
        runtime=lambda wc: resources_of(wc, "train")["runtime"],
        gpu=lambda wc: resources_of(wc, "train")["gpu"],
    params:
        # with the model id, the whole training spec (crosslip.config.spec_from_tracked); a
        # batched job below has the same params, so a model may move between the two
        tracked=lambda wc: TRACKED[wc.model],
        code=code("train.py"),
        device=config["device"],
        memory_gb=config["kernel"]["memory_gb"],
    script:
        "../scripts/train.py"


# Networks of one setting that need training, trained as one batched model in one job
# (train.batch_grid; crosslip.train_batches): one rule per batch, with the models, metrics
# and logs of the per-model jobs as its outputs. Rules without wildcards take precedence
# over `train` for these files.
for batch in TRAIN_BATCHES:

    rule:
        name:
            batch.name
        input:
            data=f"{RESULTS}/data/{batch.dataset}.npz",
        output:
            model=[
                f"{RESULTS}/models/{batch.dataset}/{m}/model.pt" for m in batch.models
            ],
            metrics=[
                f"{RESULTS}/models/{batch.dataset}/{m}/metrics.json"
                for m in batch.models
            ],
        log:
            [f"{RESULTS}/logs/train/{batch.dataset}/{m}.log" for m in batch.models],
        benchmark:
            f"{RESULTS}/benchmarks/train_grid/{batch.dataset}/{batch.setting}-seed{batch.seed}.tsv"
        conda:
            ENV
        threads: 2
        resources:
            **grid_batch_resources(
                config, [GRID[m] for m in batch.models], batch.dataset
            ),
        params:
            tracked=batch.tracked,
            code=code("train.py"),
            device=config["device"],
            memory_gb=config["kernel"]["memory_gb"],
        script:
            "../scripts/train.py"

    as_train_rule(batch.name)


# A model trained elsewhere (config external_models) takes a training job's place: read
# without running code from it, checked against its dataset, stored with its metrics
# (crosslip.external). The file is an input: a changed file imports it again.
rule import_model:
    input:
        data=lambda wc: f"{RESULTS}/data/{EXTERNAL[wc.model]['dataset']}.npz",
        file=lambda wc: EXTERNAL[wc.model]["path"],
    output:
        model=f"{RESULTS}/models/{{dataset}}/{{model}}/model.pt",
        metrics=f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
    log:
        f"{RESULTS}/logs/import_model/{{dataset}}/{{model}}.log",
    wildcard_constraints:
        model=one_of(EXTERNAL),
    conda:
        ENV
    params:
        entry=lambda wc: EXTERNAL[wc.model],
        code=code("import_model.py"),
    script:
        "../scripts/import_model.py"
