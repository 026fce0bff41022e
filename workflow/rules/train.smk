rule train:
    input:
        data=f"{RESULTS}/data/{{dataset}}.npz",
        lib=lib("train", "models", "regularizers", "kernels", "kernel_train", "augment", "attacks", "resnet", "softplus", "checkpoints"),
    output:
        model=f"{RESULTS}/models/{{dataset}}/{{model}}/model.pt",
        metrics=f"{RESULTS}/models/{{dataset}}/{{model}}/metrics.json",
    params:
        hyper=lambda wc: GRID[wc.model],
        device=config["device"],
    threads: 2
    resources:
        mem_mb=4000,
        runtime=120,
        # One GPU per training job: counted by Snakemake only where a limit is given
        # (--resources gpu=N, profiles/local-gpu), unlimited otherwise; on SLURM it becomes
        # sbatch --gpus=1 (profiles/slurm). Which device the job uses is config `device`.
        gpu=1,
    log:
        f"{RESULTS}/logs/train/{{dataset}}/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{dataset}}/{{model}}.tsv"
    conda:
        ENV
    script:
        "../scripts/train.py"
