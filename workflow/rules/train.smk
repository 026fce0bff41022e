# The training rules, made by this one definition: `train`, one job per model (wildcards
# dataset and model), and one rule per batch of networks that need training and share a
# setting (train.batch_grid; crosslip.jobs.batches): trained as one batched model, with the
# model, metrics and log files of the per-model jobs as its outputs. Rules without
# wildcards take precedence over `train` for their files. One definition: Snakemake sees
# the same code and params for a model whichever rule trains it, so a model may move
# between them without being retrained (docs/architecture.md).
for job in training_rules():

    rule:
        name:
            job["name"]
        input:
            data=job["data"],
        output:
            model=job["model"],
            metrics=job["metrics"],
        log:
            job["log"],
        benchmark:
            job["benchmark"]
        wildcard_constraints:
            model=one_of(GRID),
        priority: job["priority"]
        conda:
            ENV
        threads: JOB_THREADS
        resources:
            **job["resources"],
        params:
            # with the model id, the whole training spec (crosslip.config.specs.spec_from_tracked)
            tracked=job["tracked"],
            code=code("train.py"),
            device=config["device"],
            memory_gb=config["kernel"]["memory_gb"],
            batch_grid=config["train"]["batch_grid"],
        script:
            "../scripts/train.py"

    # what --set-threads and --set-resources give `train` (crosslip.jobs.resources)
    take_overrides(workflow, job["name"], "train")


# A model trained elsewhere (config external_models) takes a training job's place: read
# without running code from it, checked against its dataset, stored with its metrics
# (crosslip.models.external). The file is an input: a changed file imports it again.
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
