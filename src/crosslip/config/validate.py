"""A config checked against the schema, with its defaults filled in, and the checks that a
schema cannot express (datasets, the grid, models trained elsewhere). Whether kernel models
fit ``kernel.memory_gb`` the Snakefile checks next
(:func:`crosslip.kernel_memory.check_config`)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

from ..errors import ConfigError
from .grid import dataset_names, net_grid, training_grid
from .schema import load_schema, problems


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Validate ``config`` against the schema and fill in its defaults, in place; returns it.

    Raises one :class:`ConfigError` listing every problem, one line each (:func:`problems`),
    followed by the consistency checks that a schema cannot express (:func:`training_grid`).
    """
    schema = load_schema()
    # the keys each external model states itself, before the schema's defaults fill them in
    given = [set(e) if isinstance(e, dict) else set() for e in config.get("external_models") or []]
    base = Draft202012Validator
    set_properties = base.VALIDATORS["properties"]

    def properties_with_defaults(validator, properties, instance, node):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from set_properties(validator, properties, instance, node)

    checker = validators.extend(base, {"properties": properties_with_defaults})(schema)
    errors = sorted(checker.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    lines = list(dict.fromkeys(line for e in errors for line in problems(e, schema)))
    if lines:
        raise ConfigError(
            f"invalid config ({len(lines)} problem{'s' * (len(lines) > 1)}; every key is "
            f"documented in docs/configuration.md):\n" + "\n".join(lines)
        )
    dataset_names(config)  # the checks beyond the schema
    training_grid(config)
    for stage in ("certify", "attack"):
        if config[stage]["batch_models"] and config["certify"]["models"] != "all":
            raise ConfigError(
                f"config key {stage}.batch_models: true needs certify.models: all (the "
                "best models are chosen after training, too late to form the batches); set "
                f"{stage}.batch_models: false or certify.models: all"
            )
    kinds = set(config["certify"]["kinds"])
    beyond = sorted(kinds & {"linear", "curvature", "integrated"})
    if beyond and not kinds & {"l2", "l1", "linf"}:
        raise ConfigError(
            f"config key certify.kinds: {', '.join(beyond)} are computed for each requested "
            "norm, and none is requested; add l2, l1 or linf to certify.kinds"
        )
    softplus_keys_of_state_dicts_only(external_models(config), given)
    return config


# --------------------------------------------------------------------------------------
# models trained elsewhere
# --------------------------------------------------------------------------------------
#: File endings that imply an external model's format (crosslip.models.external uses the same).
MODEL_SUFFIX_FORMATS = {
    ".npz": "kernel_npz",
    ".pt": "state_dict",
    ".pth": "state_dict",
    ".pt2": "torch_export",
}


def external_models(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> entry (a copy, with its ``format`` filled in) of the config's
    ``external_models``, checked beyond the schema; raises :class:`ConfigError` naming the
    key for a dataset the config does not list, a missing file, a name used twice (also up
    to letter case) or by a trained model, and a format that the file ending does not
    imply and the entry does not give."""
    datasets = dataset_names(config)
    trained = {m.casefold() for m in training_grid(config)} if _trains(config) else set()
    out: dict[str, dict[str, Any]] = {}
    seen: dict[str, int] = {}
    for i, entry in enumerate(config.get("external_models", [])):
        key = f"config key external_models[{i}]"
        name = entry["name"]
        first = seen.setdefault(name.casefold(), i)
        if first != i:
            raise ConfigError(
                f"{key}.name: {name!r} is already used by external_models[{first}]; give "
                "every model its own name (names that differ only in letter case clash as "
                "file names)"
            )
        if name.casefold() in trained:
            raise ConfigError(
                f"{key}.name: {name!r} is the id of a model this config trains; choose another"
            )
        if entry["dataset"] not in datasets:
            raise ConfigError(
                f"{key}.dataset: {entry['dataset']!r} is not one of the config's datasets "
                f"({', '.join(datasets)}); add it to datasets or fix the name"
            )
        path = Path(entry["path"]).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{key}.path: {entry['path']} not found (relative paths are taken from the "
                f"working directory, {Path.cwd()})"
            )
        fmt = entry.get("format") or MODEL_SUFFIX_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ConfigError(
                f"{key}.format: missing, and the ending {path.suffix!r} of {entry['path']} "
                "implies none (.npz kernel_npz, .pt and .pth state_dict, .pt2 torch_export); "
                "give format: state_dict, kernel_npz, torch_export or torchscript"
            )
        out[name] = {**copy.deepcopy(entry), "format": fmt}
    return out


def softplus_keys_of_state_dicts_only(
    entries: dict[str, dict[str, Any]], given: list[set[str]]
) -> None:
    """``beta`` and ``threshold`` describe a state dict's ``nn.Softplus``; on a kernel,
    exported (its graph states its own) or TorchScript model they would configure nothing,
    so stating them there is an error (the
    schema fills in their defaults for every entry: ``given`` holds the keys each entry of
    ``external_models`` stated itself, in order)."""
    for i, (entry, keys) in enumerate(zip(entries.values(), given, strict=True)):
        stated = sorted(keys & {"beta", "threshold"})
        if stated and entry["format"] != "state_dict":
            own = " (its graph states its own)" if entry["format"] == "torch_export" else ""
            raise ConfigError(
                f"config key external_models[{i}].{stated[0]}: {' and '.join(stated)} "
                f"describe a state dict's nn.Softplus; the {entry['format']} model "
                f"{entry['name']!r} has none to configure{own}. Remove "
                f"{' and '.join(stated)} from this entry"
            )


def _trains(config: dict[str, Any]) -> bool:
    return bool(
        any(net_grid(config, s) for s in config["train"]["settings"])
        or config["kernel"].get("grid")
    )


def merged_files(paths: Sequence[Path | str]) -> dict[str, Any]:
    """The config files of ``snakemake --configfile <paths...>`` merged in order as Snakemake
    merges them (mappings key by key, anything else replaced), not validated; an empty file
    adds nothing. Raises :class:`~crosslip.errors.ConfigError` naming a file that is not a
    YAML mapping."""
    from snakemake.utils import update_config  # lazily: the jobs need no Snakemake

    merged: dict[str, Any] = {}
    for path in map(Path, paths):
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"config file {path}: cannot read it as YAML: {err}") from err
        if not isinstance(data, dict | None):
            raise ConfigError(f"config file {path}: expected a mapping of config keys")
        update_config(merged, data or {})
    return merged
