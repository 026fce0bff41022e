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
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=4000,
        runtime=120,
        # One GPU per job unless config `device` is cpu (as certify and attack): counted by
        # Snakemake only where a limit is given (--resources gpu=N, profiles/local-gpu),
        # unlimited otherwise; on SLURM it becomes sbatch --gpus=1 (profiles/slurm).
        gpu=GPUS,
    params:
        hyper=lambda wc: crosslip_config.spec_params(GRID[wc.model]),
        code=code("train.py"),
        device=config["device"],
    script:
        "../scripts/train.py"
