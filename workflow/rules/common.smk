# Config validation, the training grid, and helpers shared by all rules.
import itertools
from pathlib import Path

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml", set_default=True)

RESULTS = config["results"]
ENV = "../../environment.yml"
LIB = Path(workflow.basedir) / "src" / "crosslip"


def lib(*modules):
    """Library files to list as inputs, so that editing one reruns its jobs: a module
    ``name`` is ``name.py``, a package ``name`` is every ``.py`` file in it."""
    files = []
    for m in modules:
        pkg = LIB / m
        files += sorted(map(str, pkg.glob("*.py"))) if pkg.is_dir() else [str(LIB / f"{m}.py")]
    return files


def fmt_num(x):
    return f"{x:g}"


def training_grid():
    """model_id -> training parameters: for every net regularizer x lr x lambda x seed x
    setting (``-augment`` / ``-adversarial`` appended to the id), and every kernel
    regularizer x a x lambda x seed."""
    tr, mo = config["train"], config["model"]
    grid = {}
    for reg, spec in tr["grid"].items():
        lambdas = [0.0] if reg == "none" else spec["lambda"]
        if reg == "none" and any(v != 0 for v in spec["lambda"]):
            raise ValueError(
                f"config key train.grid.none.lambda must be [0.0] (got {spec['lambda']})"
            )
        for lr, lam, seed, setting in itertools.product(
            spec["lr"], lambdas, tr["seeds"], tr["settings"]
        ):
            model_id = f"{reg}-lr{fmt_num(lr)}-lam{fmt_num(lam)}-seed{seed}"
            if setting != "plain":
                model_id += f"-{setting}"
            grid[model_id] = dict(
                setting=setting,
                crop=tr["crop"],
                adv_norm=tr["adv_norm"],
                adv_fraction=float(tr["adv_fraction"]),
                regularizer=reg,
                lr=float(lr),
                lam=float(lam),
                seed=int(seed),
                epochs=tr["epochs"],
                batch_size=tr["batch_size"],
                lr_decay=tr["lr_decay"],
                lr_decay_epochs=list(tr["lr_decay_epochs"]),
                arch=mo["arch"],
                hidden=mo["hidden"],
                alpha=float(mo["alpha"]),
                bias=mo["bias"],
                resnet_blocks=mo["resnet_blocks"],
                resnet_width=mo["resnet_width"],
            )
    kern = config["kernel"]
    for reg, spec in kern.get("grid", {}).items():
        for a, lam, seed in itertools.product(spec["a"], spec["lambda"], tr["seeds"]):
            model_id = f"{reg}-a{fmt_num(a)}-lam{fmt_num(lam)}-seed{seed}"
            grid[model_id] = dict(
                regularizer=reg,
                a=float(a),
                lam=float(lam),
                seed=int(seed),
                n_centers=kern["n_centers"],
                neighbours=kern["neighbours"],
                max_iter=kern["max_iter"],
            )
    return grid


GRID = training_grid()
DATASETS = config["datasets"]


def all_models(pattern):
    return expand(pattern, dataset=DATASETS, model=sorted(GRID), allow_missing=True)

