# A registered dataset is fetched (mirror, cache or download); a dataset of your own
# (crosslip.data.custom) is read from its files and checked. `files` (names, sizes and
# modification times of those files) reruns the job when they change. The preparations run
# first (priority), so bad data stops the run before training starts.
rule prepare_data:
    output:
        f"{RESULTS}/data/{{dataset}}.npz",
    log:
        f"{RESULTS}/logs/prepare_data/{{dataset}}.log",
    priority: 50
    conda:
        ENV
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        cache=config["data"]["cache"],
        mirror=lambda wc: config["data"]["mirrors"].get(wc.dataset),
        source=lambda wc: dataset_entry(config, wc.dataset),
        files=lambda wc: data_fingerprint(dataset_entry(config, wc.dataset)),
        code=code("prepare_data.py"),
    script:
        "../scripts/prepare_data.py"
