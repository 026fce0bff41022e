"""Fetch (mirror / cache / download, checksum-verified) a registered dataset, or read and
check a dataset of your own, and store it."""

from crosslip.io import run_script


def main() -> None:
    from crosslip.config.grid import families
    from crosslip.stages.data import prepare_data

    # What training will ask of the images, read from the config and not passed as params: a
    # change of the settings must not prepare the data again (the train jobs check it too).
    cfg = snakemake.config
    training = {
        "settings": sorted({s for fam, s in families(cfg) if fam != "kernel"}),
        "arch": cfg["model"]["arch"],
        "crop": cfg["train"]["crop"],
    }
    info = prepare_data(
        snakemake.wildcards.dataset,
        snakemake.output[0],
        cache=snakemake.params.cache,
        mirror=snakemake.params.mirror,
        source=snakemake.params.source,
        training=training,
    )
    print(info)


run_script(snakemake.log[0], main)
