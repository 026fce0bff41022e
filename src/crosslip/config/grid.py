"""What a config asks for: its datasets, the training grid expanded into one spec per
training job (model id -> :class:`~.specs.NetTrainSpec` or :class:`~.specs.KernelTrainSpec`),
the params each training job tracks, and the tables and figures it produces."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from ..errors import ConfigError
from ..families import EXTERNAL
from .schema import load_schema
from .specs import (
    KERNEL_ID_FIELDS,
    NET_ID_FIELDS,
    KernelTrainSpec,
    NetTrainSpec,
    fmt_num,
    kernel_model_id,
    net_model_id,
)


# --------------------------------------------------------------------------------------
# datasets: registered names and datasets of your own
# --------------------------------------------------------------------------------------
def registered_datasets() -> list[str]:
    """The names of the registered datasets, as the schema lists them."""
    return list(load_schema()["$defs"]["registered_dataset"]["enum"])


def dataset_names(config: dict[str, Any]) -> list[str]:
    """The names of the config's datasets, in order: a registered name as written, a dataset
    of your own by its ``name``. Raises :class:`ConfigError` when two names are equal up to
    letter case (they name files and folders under ``results``)."""
    names = [ds if isinstance(ds, str) else ds["name"] for ds in config["datasets"]]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        first = seen.setdefault(name.casefold(), i)
        if first != i:
            raise ConfigError(
                f"config key datasets[{i}]: the name {name!r} is already used by "
                f"datasets[{first}] ({names[first]!r}); give every dataset its own name "
                "(names that differ only in letter case clash as file names)"
            )
    registered = {r.casefold(): r for r in registered_datasets()}
    for i, ds in enumerate(config["datasets"]):
        if isinstance(ds, dict) and ds["name"].casefold() in registered:
            raise ConfigError(
                f"config key datasets[{i}].name: {ds['name']!r} is the registered dataset "
                f"{registered[ds['name'].casefold()]!r} up to letter case; choose another name"
            )
        if isinstance(ds, dict) and isinstance(ds.get("sha256"), str) and ds["format"] != "npz":
            raise ConfigError(
                f"config key datasets[{i}].sha256: one digest is for a single .npz file, and "
                f"format {ds['format']} reads a folder: map each file (relative to path) to its "
                "digest, e.g. sha256: {train-images-idx3-ubyte.gz: <digest>}, or give checksums"
            )
    return names


def dataset_entry(config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config's entry of the dataset of your own called ``name`` (a mapping with
    ``name``, ``format``, ``path`` and optional ``sha256``, ``checksums``), or None for a
    registered dataset. Raises KeyError for a name that the config does not list."""
    for ds in config["datasets"]:
        if ds == name:
            return None
        if isinstance(ds, dict) and ds["name"] == name:
            return copy.deepcopy(ds)
    raise KeyError(f"dataset {name!r} is not in the config's datasets")


def _exact_in_ids(key: str, values: Iterable[float]) -> None:
    """Model ids carry the grid values (:func:`net_model_id`); a value that its id does not
    give back exactly would name two models alike or train another value than it says."""
    for i, v in enumerate(values):
        if float(fmt_num(v)) != v:
            raise ConfigError(
                f"config key {key}[{i}]: {v!r} is written {fmt_num(v)} in model ids, which "
                f"is another number; give it with at most 6 significant digits (e.g. "
                f"{fmt_num(v)})"
            )


def tracked_params(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Model id -> the rest of its training spec: every field that the id does not state
    (:data:`NET_ID_FIELDS`, :data:`KERNEL_ID_FIELDS`), and for networks
    ``dropout_keep_input`` (``train.keep_input``, what dropout networks keep of their
    input). A training job receives exactly this as its ``params``, and
    :func:`spec_from_tracked` gives the spec back, so Snakemake retrains a model when, and
    only when, its spec changes; networks of one setting and seed share it, which lets one
    job train several of them (:mod:`crosslip.jobs.batches`)."""
    keep_input = float(config["train"]["keep_input"])
    out: dict[str, dict[str, Any]] = {}
    for model_id, spec in training_grid(config).items():
        fields = asdict(spec)
        if isinstance(spec, NetTrainSpec):
            tracked = {k: v for k, v in fields.items() if k not in NET_ID_FIELDS}
            tracked["dropout_keep_input"] = keep_input
        else:
            tracked = {k: v for k, v in fields.items() if k not in KERNEL_ID_FIELDS}
        out[model_id] = tracked
    return out


def net_grid(config: dict[str, Any], setting: str) -> dict[str, Any]:
    """The network grid of one setting: ``train.grid_by_setting[setting]`` where given (the
    paper changes grids between settings), else ``train.grid``."""
    return config["train"].get("grid_by_setting", {}).get(setting, config["train"]["grid"])


def training_grid(config: dict[str, Any]) -> dict[str, NetTrainSpec | KernelTrainSpec]:
    """Model id -> training spec, for a validated ``config``: every setting x network
    regularizer x lr x lambda (keep_hidden for dropout) x seed (``-augment`` /
    ``-adversarial`` appended to the id), and every kernel regularizer x a x lambda x seed.
    A ``train.grid_by_setting`` entry for a setting that ``train.settings`` does not train is
    ignored (so one override can restrict every preset). Raises :class:`ConfigError` for what
    the schema cannot check."""
    tr, mo, kern = config["train"], config["model"], config["kernel"]
    grid: dict[str, NetTrainSpec | KernelTrainSpec] = {}
    common = dict(
        epochs=tr["epochs"],
        batch_size=tr["batch_size"],
        lr_decay=float(tr["lr_decay"]),
        lr_decay_at=[float(f) for f in tr["lr_decay_at"]],
        arch=mo["arch"],
        hidden=mo["hidden"],
        alpha=float(mo["alpha"]),
        bias=mo["bias"],
        init=mo["init"],
        resnet_blocks=mo["resnet_blocks"],
        resnet_width=mo["resnet_width"],
        crop=tr["crop"],
        adv_norm=tr["adv_norm"],
        adv_fraction=float(tr["adv_fraction"]),
        adv_attack=tr["adv_attack"],
        adv_search_rtol=float(tr["adv_search_rtol"]),
        adv_search_steps=int(tr["adv_search_steps"]),
        certified_radius=float(tr["certified_radius"]),
        certified_warmup=float(tr["certified_warmup"]),
        tf32=tr["tf32"],
    )
    for setting in tr["settings"]:
        for reg, spec in net_grid(config, setting).items():
            if reg == "none" and any(v != 0 for v in spec["lambda"]):
                raise ConfigError(
                    f"config key train.grid.none.lambda must be [0.0] (got {spec['lambda']})"
                )
            values = spec["keep_hidden"] if reg == "dropout" else spec["lambda"]
            values = [0.0] if reg == "none" else values
            by_setting = setting in tr.get("grid_by_setting", {})
            where = f"train.grid_by_setting.{setting}" if by_setting else "train.grid"
            _exact_in_ids(f"{where}.{reg}.lr", spec["lr"])
            value_key = "keep_hidden" if reg == "dropout" else "lambda"
            _exact_in_ids(f"{where}.{reg}.{value_key}", values)
            for lr, value, seed in itertools.product(spec["lr"], values, tr["seeds"]):
                model_id = net_model_id(reg, lr, value, seed, setting)
                dropout = reg == "dropout"
                grid[model_id] = NetTrainSpec(
                    regularizer=reg,
                    lam=0.0 if dropout else float(value),
                    keep_hidden=float(value) if dropout else 1.0,
                    keep_input=float(tr["keep_input"]) if dropout else 1.0,
                    lr=float(lr),
                    seed=int(seed),
                    setting=setting,
                    **common,
                )
    for reg, spec in kern.get("grid", {}).items():
        _exact_in_ids(f"kernel.grid.{reg}.a", spec["a"])
        _exact_in_ids(f"kernel.grid.{reg}.lambda", spec["lambda"])
        for a, lam, seed in itertools.product(spec["a"], spec["lambda"], tr["seeds"]):
            grid[kernel_model_id(reg, a, lam, seed)] = KernelTrainSpec(
                regularizer=reg,
                a=float(a),
                lam=float(lam),
                seed=int(seed),
                n_centers=kern["n_centers"],
                neighbours=kern["neighbours"],
                max_iter=kern["max_iter"],
            )
    if not grid and not config.get("external_models"):
        raise ConfigError(
            "the config trains no model: give train.grid (networks) or kernel.grid "
            "(Gaussian-kernel models) at least one regularizer, or list external_models"
        )
    return grid


# --------------------------------------------------------------------------------------
# what a config produces
# --------------------------------------------------------------------------------------
def networks_only(config: dict[str, Any]) -> bool:
    """Whether ``config`` trains one dataset of one-hidden-layer networks and nothing else:
    what ``benchmarks/bench_preset.py`` projects."""
    grid = training_grid(config).values()
    mlp = [s for s in grid if isinstance(s, NetTrainSpec) and s.arch == "mlp"]
    return len(dataset_names(config)) == 1 and len(mlp) == len(grid) > 0


def families(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(family, setting) pairs the config trains: networks (``model.arch``: mlp or resnet)
    in each setting with a non-empty grid, Gaussian-kernel models in the plain setting."""
    arch, settings = config["model"]["arch"], config["train"]["settings"]
    pairs = [(arch, s) for s in settings if net_grid(config, s)]
    if config["kernel"].get("grid"):
        pairs.append(("kernel", "plain"))
    return pairs


def aggregate_targets(config: dict[str, Any]) -> list[str]:
    """Every table and figure the config calls for: the summary, Table 1 (one-hidden-layer
    networks), the kernel table (kernel models), one bounds-versus-error figure per dataset
    and family (a row per setting), the bracket between guarantees and upper bounds per
    dataset for the one-hidden-layer networks (a panel per setting), their certified accuracy
    against the radius (a row per setting, a column per norm), the illustration, and
    the training curves per dataset and family; models trained elsewhere add one bounds
    and one bracket figure (family ``external``) per dataset they are listed with."""
    res = config["results"]
    fams = {fam for fam, _ in families(config)}
    tables = ["summary"]
    tables += ["table1_global_local"] if "mlp" in fams else []
    tables += ["kernel"] if "kernel" in fams else []
    targets = [f"{res}/tables/{t}.{ext}" for t in tables for ext in ("csv", "md", "tex")]
    targets += [
        f"{res}/figures/bounds_vs_error/{ds}-{fam}.{ext}"
        for ds in dataset_names(config)
        for fam in sorted(fams)
        for ext in ("png", "pdf")
    ]
    external = sorted({e["dataset"] for e in config.get("external_models", [])})
    targets += [
        f"{res}/figures/bounds_vs_error/{ds}-{EXTERNAL}.{ext}"
        for ds in external
        for ext in ("png", "pdf")
    ]
    certified = sorted(fams & {"mlp"}) + ([EXTERNAL] if external else [])
    targets += [
        f"{res}/figures/bracket/{ds}-{fam}.{ext}"
        for fam in certified
        for ds in (external if fam == EXTERNAL else dataset_names(config))
        for ext in ("png", "pdf")
    ]
    targets += [
        f"{res}/figures/certified_accuracy/{ds}-{fam}.{ext}"
        for fam in certified
        for ds in (external if fam == EXTERNAL else dataset_names(config))
        for ext in ("png", "pdf")
    ]
    targets += [f"{res}/figures/adversarial_samples.{ext}" for ext in ("png", "pdf")]
    targets += [
        f"{res}/figures/training/{ds}-{fam}.{ext}"
        for ds in dataset_names(config)
        for fam in sorted(fams)
        for ext in ("png", "pdf")
    ]
    return targets
