"""The workflow's configuration: validation, defaults and the training grid.

One source states every key: the JSON schema ``config.schema.yaml`` beside this module (type,
range, default and meaning of each key). This module

* validates a config against it and fills in the defaults (:func:`validate`), reporting every
  problem on one line that names the key path, what is wrong and what is allowed
  (``config key train.grid.svm: not allowed; allowed keys: none, weight_decay, ...``);
* expands the grids into typed training specs, one per training job (:func:`training_grid`:
  model id -> :class:`NetTrainSpec` or :class:`KernelTrainSpec`), whose defaults are read from
  the schema too;
* lists the outputs a config calls for (:func:`families`, :func:`aggregate_targets`).

It imports neither torch nor Snakemake, so the Snakefile parses fast and tests call it
directly.
"""

from __future__ import annotations

import copy
import difflib
import functools
import itertools
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

from .errors import ConfigError
from .families import ARCHS, EXTERNAL, KERNEL_REGULARIZERS, NET_REGULARIZERS
from .norms import NORMS

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")

#: Section 5's settings of the networks, initialisations, norms and attacks of adversarial
#: training (``train.adv_attack``: crosslip.training.adversarial).
SETTINGS = ("plain", "augment", "adversarial")
INITS = ("authors", "pytorch")
ADV_NORM_NAMES = tuple(NORMS)
ADV_ATTACKS = ("one_step", "search")

__all__ = ["KERNEL_REGULARIZERS", "NET_REGULARIZERS", "ConfigError", "validate"]


@functools.cache
def load_schema() -> dict[str, Any]:
    """The parsed schema (cached; treat it as read-only)."""
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a local ``$ref`` replaced by its target (siblings of ``$ref`` win)."""
    while node.get("$ref", "").startswith("#/"):
        target = root
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def schema_node(dotted: str) -> dict[str, Any]:
    """The schema of the key ``dotted`` (e.g. ``train.epochs``, ``$defs.grid.lr``)."""
    root = load_schema()
    node = root
    parts = dotted.split(".")
    if parts[0] == "$defs":
        node, parts = root["$defs"][parts[1]], parts[2:]
    for part in parts:
        node = _resolve(node, root)["properties"][part]
    return _resolve(node, root)


def default(dotted: str) -> Any:
    """The schema's default of the key ``dotted`` (a fresh copy), e.g.
    ``default("train.epochs") == 200``."""
    node = schema_node(dotted)
    if "default" not in node:
        raise KeyError(f"the schema gives no default for {dotted}")
    return copy.deepcopy(node["default"])


def _default_field(dotted: str) -> Any:
    value = default(dotted)
    if isinstance(value, list | dict):
        return field(default_factory=lambda: copy.deepcopy(value))
    return field(default=value)


# --------------------------------------------------------------------------------------
# validation messages
# --------------------------------------------------------------------------------------
_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
}


def _show(value: Any) -> str:
    """A config value as the user wrote it in YAML (JSON spelling), shortened."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def key_path(parts: Iterable[str | int]) -> str:
    """``train.grid.none.lr[0]`` from jsonschema's path parts."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def allowed(node: dict[str, Any], root: dict[str, Any]) -> str:
    """What a schema node accepts, in words: ``an integer >= 1``, ``one of a, b``, ..."""
    node = _resolve(node, root)
    if "anyOf" in node:
        return ", or ".join(allowed(branch, root) for branch in node["anyOf"])
    if "enum" in node:
        return "one of " + ", ".join(map(str, node["enum"]))
    kind = node.get("type")
    text = _TYPE_WORDS.get(kind, "a value")
    bounds = [f"{op} {node[k]:g}" for k, op in _BOUNDS.items() if k in node]
    if bounds:
        text += " " + " and ".join(bounds)
    if kind == "array":
        if node.get("minItems"):
            text += f" of at least {node['minItems']} item" + "s" * (node["minItems"] > 1)
        if node.get("uniqueItems"):
            text += ", no duplicates"
        if "items" in node:
            text += f", each {allowed(node['items'], root)}"
    if kind == "object" and node.get("additionalProperties") is False:
        text += " with keys among " + ", ".join(node.get("properties", {}))
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        text += ", each value " + allowed(node["additionalProperties"], root)
    if "pattern" in node and "description" in node:
        text += " (" + " ".join(node["description"].split()) + ")"
    return text


def _closest(word: Any, choices: Iterable[Any]) -> str:
    near = difflib.get_close_matches(str(word), list(map(str, choices)), n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def problems(error: Any, root: dict[str, Any]) -> list[str]:
    """One line per problem of a jsonschema ``error``: ``config key <path>: <what is wrong>;
    allowed: <what is allowed>`` (``root``: the whole schema)."""
    path, node, value = list(error.absolute_path), error.schema, error.instance
    key = key_path(path)
    kind = error.validator
    if kind == "anyOf":
        return _any_of_problems(error, root)
    if "propertyNames" in error.relative_schema_path:  # a key name outside an enum
        names = error.validator_value if kind == "enum" else []
        return [
            f"config key {key_path([*path, value])}: not allowed; allowed keys: "
            + ", ".join(map(str, names))
        ]
    if kind == "additionalProperties":
        known = list(node.get("properties", {}))
        return [
            f"config key {key_path([*path, k])}: not allowed; allowed keys: "
            f"{', '.join(known) or 'none'}{_closest(k, known)}"
            for k in value
            if k not in known
        ]
    if kind == "required":
        props = node.get("properties", {})
        return [
            f"config key {key_path([*path, k])}: missing; it is required: "
            f"{allowed(props.get(k, {}), root)}"
            for k in error.validator_value
            if k not in value
        ]
    if kind in _BOUNDS:
        what = "out of range"
    else:
        what = {
            "type": "wrong type",
            "enum": "not an allowed value",
            "pattern": "not allowed",
            "minItems": "empty list" if not value else "too few items",
            "uniqueItems": "duplicate items",
            "not": "not allowed",
        }.get(kind, error.message)
    hint = _closest(value, node["enum"]) if kind == "enum" else ""
    if kind == "type" and isinstance(value, str) and _is_number(value):
        hint = (
            f"; YAML reads {value} as text: write numbers with a dot and a signed exponent, "
            "e.g. 1.0e-3 or 1.0e+6"
        )
    return [
        f"config key {key or '(top level)'}: {what} ({_show(value)}); "
        f"allowed: {allowed(node, root)}{hint}"
    ]


def _any_of_problems(error: Any, root: dict[str, Any]) -> list[str]:
    """The problems of a value that matches no branch of an ``anyOf``: those of the one
    branch whose type the value has (``mnist3`` -> the registered names; a mapping -> the
    keys of a dataset of your own), else one line naming every branch."""
    branches = error.schema["anyOf"]
    here = list(error.absolute_path)
    by_branch: dict[int, list[Any]] = {i: [] for i in range(len(branches))}
    for sub in error.context:
        by_branch[sub.relative_schema_path[0]].append(sub)
    fitting = [
        i
        for i, subs in by_branch.items()
        if not any(s.validator == "type" and list(s.absolute_path) == here for s in subs)
    ]
    if len(fitting) != 1:
        return [
            f"config key {key_path(here) or '(top level)'}: wrong type ({_show(error.instance)}); "
            f"allowed: {allowed(error.schema, root)}"
        ]
    chosen = fitting[0]
    lines = [line for sub in by_branch[chosen] for line in problems(sub, root)]
    others = [allowed(b, root) for i, b in enumerate(branches) if i != chosen]
    if not isinstance(error.instance, dict | list) and others:  # e.g. a misspelt name
        lines = [f"{line}; or {', or '.join(others)}" for line in lines]
    return lines


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
    from .jobs.kernel_memory import config_problems  # torch-free; imports nothing from here

    memory = config_problems(config)
    if memory:
        raise ConfigError("kernel models do not fit kernel.memory_gb:\n" + "\n".join(memory))
    return config


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


# --------------------------------------------------------------------------------------
# models trained elsewhere
# --------------------------------------------------------------------------------------
#: File endings that imply an external model's format (crosslip.models.external uses the same).
MODEL_SUFFIX_FORMATS = {".npz": "kernel_npz", ".pt": "state_dict", ".pth": "state_dict"}


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
                "implies none (.npz kernel_npz, .pt and .pth state_dict); give format: "
                "state_dict, kernel_npz or torchscript"
            )
        out[name] = {**copy.deepcopy(entry), "format": fmt}
    return out


def softplus_keys_of_state_dicts_only(
    entries: dict[str, dict[str, Any]], given: list[set[str]]
) -> None:
    """``beta`` and ``threshold`` describe a state dict's ``nn.Softplus``; on a kernel or
    TorchScript model they would configure nothing, so stating them there is an error (the
    schema fills in their defaults for every entry: ``given`` holds the keys each entry of
    ``external_models`` stated itself, in order)."""
    for i, (entry, keys) in enumerate(zip(entries.values(), given, strict=True)):
        stated = sorted(keys & {"beta", "threshold"})
        if stated and entry["format"] != "state_dict":
            raise ConfigError(
                f"config key external_models[{i}].{stated[0]}: {' and '.join(stated)} "
                f"describe a state dict's nn.Softplus; the {entry['format']} model "
                f"{entry['name']!r} has none to configure. Remove {' and '.join(stated)} "
                "from this entry"
            )


def _trains(config: dict[str, Any]) -> bool:
    return bool(
        any(net_grid(config, s) for s in config["train"]["settings"])
        or config["kernel"].get("grid")
    )


# --------------------------------------------------------------------------------------
# typed training specs
# --------------------------------------------------------------------------------------
@dataclass
class NetTrainSpec:
    """Hyperparameters of one network training job (SGD, Section 5). Defaults: the schema's.

    ``lam`` weighs the penalty of ``weight_decay`` and ``cross_lipschitz`` and is 0 for
    ``none`` and ``dropout``; dropout networks keep each hidden unit with probability
    ``keep_hidden`` and each input coordinate with ``keep_input`` in training (1 = no dropout;
    other regularizers keep everything). The learning rate is multiplied by ``lr_decay``
    after each fraction ``lr_decay_at`` of all updates. ``tf32``: on CUDA, float32 products
    and convolutions of the training may use TF32 (:func:`crosslip.device.tf32`).
    """

    regularizer: str = "none"
    lam: float = 0.0
    lr: float = 0.2
    keep_hidden: float = 1.0
    keep_input: float = 1.0
    epochs: int = _default_field("train.epochs")
    batch_size: int = _default_field("train.batch_size")
    seed: int = 0
    hidden: int = _default_field("model.hidden")
    alpha: float = _default_field("model.alpha")
    bias: bool = _default_field("model.bias")
    init: str = _default_field("model.init")
    lr_decay: float = _default_field("train.lr_decay")
    lr_decay_at: list[float] = _default_field("train.lr_decay_at")
    arch: str = _default_field("model.arch")
    resnet_blocks: int = _default_field("model.resnet_blocks")
    resnet_width: int = _default_field("model.resnet_width")
    setting: str = "plain"
    crop: int = _default_field("train.crop")
    adv_norm: str = _default_field("train.adv_norm")
    adv_fraction: float = _default_field("train.adv_fraction")
    adv_attack: str = _default_field("train.adv_attack")
    tf32: bool = _default_field("train.tf32")

    def __post_init__(self) -> None:
        _one_of("regularizer", self.regularizer, NET_REGULARIZERS)
        _one_of("arch", self.arch, ARCHS)
        _one_of("setting", self.setting, SETTINGS)
        _one_of("adv_norm", self.adv_norm, ADV_NORM_NAMES)
        _one_of("adv_attack", self.adv_attack, ADV_ATTACKS)
        _one_of("init", self.init, INITS)
        if self.regularizer in ("none", "dropout") and self.lam != 0:
            raise ConfigError(f"regularizer {self.regularizer!r} takes lambda = 0 (got {self.lam})")
        for name in ("keep_hidden", "keep_input"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"{name} is a keep probability in (0, 1]; got {value}")
            if self.regularizer != "dropout" and value != 1:
                raise ConfigError(f"{name} = {value} needs regularizer 'dropout'")
        if any(not 0 < f < 1 for f in self.lr_decay_at):
            raise ConfigError(f"lr_decay_at takes fractions in (0, 1); got {self.lr_decay_at}")

    @property
    def hyperparameter(self) -> float:
        """The grid's value of the regularizer: ``keep_hidden`` for dropout, else ``lam``."""
        return self.keep_hidden if self.regularizer == "dropout" else self.lam


@dataclass
class KernelTrainSpec:
    """Hyperparameters of one Gaussian-kernel training job (L-BFGS, Sections 3.1 and 5)."""

    regularizer: str = "kernel_cl"
    lam: float = 1e-2
    a: float = 1.0
    n_centers: int = _default_field("kernel.n_centers")
    neighbours: int = _default_field("kernel.neighbours")
    max_iter: int = _default_field("kernel.max_iter")
    tol: float = 1e-7
    seed: int = 0

    def __post_init__(self) -> None:
        _one_of("kernel regularizer", self.regularizer, KERNEL_REGULARIZERS)


def _one_of(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {what} {value!r}; allowed: {', '.join(choices)}")


def fmt_num(x: float) -> str:
    """A number as it appears in a model id (``1e-05``, ``0.2``)."""
    return f"{x:g}"


def net_model_id(regularizer: str, lr: float, value: float, seed: int, setting: str) -> str:
    """The id of a network: ``<regularizer>-lr<lr>-lam<lambda>-seed<seed>`` (``keep<p>``
    instead of ``lam`` for dropout), ``-augment`` / ``-adversarial`` appended outside the
    plain setting; the numbers as :func:`fmt_num` writes them."""
    tag = "keep" if regularizer == "dropout" else "lam"
    model_id = f"{regularizer}-lr{fmt_num(lr)}-{tag}{fmt_num(value)}-seed{seed}"
    return model_id if setting == "plain" else f"{model_id}-{setting}"


def kernel_model_id(regularizer: str, a: float, lam: float, seed: int) -> str:
    """The id of a Gaussian-kernel model: ``<regularizer>-a<a>-lam<lambda>-seed<seed>``."""
    return f"{regularizer}-a{fmt_num(a)}-lam{fmt_num(lam)}-seed{seed}"


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


_NET_ID = re.compile(
    r"^(?P<reg>[a-z_]+)-lr(?P<lr>.+?)-(?P<tag>lam|keep)(?P<value>.+?)-seed(?P<seed>\d+)"
    r"(?:-(?P<setting>augment|adversarial))?$"
)
_KERNEL_ID = re.compile(r"^(?P<reg>kernel_[a-z]+)-a(?P<a>.+?)-lam(?P<lam>.+?)-seed(?P<seed>\d+)$")
#: The fields of a training spec that the model id states (with ``keep_input``, which
#: follows from the regularizer and ``train.keep_input``).
NET_ID_FIELDS = ("regularizer", "lam", "lr", "keep_hidden", "keep_input", "seed", "setting")
KERNEL_ID_FIELDS = ("regularizer", "a", "lam", "seed")


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


def spec_from_tracked(model_id: str, tracked: dict[str, Any]) -> NetTrainSpec | KernelTrainSpec:
    """The training spec of ``model_id`` from its id and :func:`tracked_params`."""
    if m := _KERNEL_ID.match(model_id):
        return KernelTrainSpec(
            regularizer=m["reg"],
            a=float(m["a"]),
            lam=float(m["lam"]),
            seed=int(m["seed"]),
            **tracked,
        )
    m = _NET_ID.match(model_id)
    if m is None:
        raise ValueError(f"{model_id!r} is not the id of a network or kernel model of a grid")
    rest = dict(tracked)
    keep_input = rest.pop("dropout_keep_input")
    dropout, value = m["reg"] == "dropout", float(m["value"])
    return NetTrainSpec(
        regularizer=m["reg"],
        lr=float(m["lr"]),
        lam=0.0 if dropout else value,
        keep_hidden=value if dropout else 1.0,
        keep_input=keep_input if dropout else 1.0,
        seed=int(m["seed"]),
        setting=m["setting"] or "plain",
        **rest,
    )


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


def preset_networks(
    preset: Path | str, setting: str, hidden: int, epochs: int
) -> list[NetTrainSpec]:
    """The networks that the config file ``preset`` trains in ``setting``, with
    ``model.hidden`` and ``train.epochs`` replaced: Cross-Lipschitz first, then by learning
    rate and lambda (the grids the benchmarks time)."""
    config = yaml.safe_load(Path(preset).read_text())
    config["train"]["settings"] = [setting]
    config.setdefault("model", {})["hidden"] = hidden
    config["train"]["epochs"] = epochs
    nets = [s for s in training_grid(validate(config)).values() if isinstance(s, NetTrainSpec)]
    return sorted(nets, key=lambda s: (s.regularizer != "cross_lipschitz", s.lr, s.lam))


def spec_params(spec: NetTrainSpec | KernelTrainSpec) -> dict[str, Any]:
    """A spec as the plain dict a training job receives (``params.hyper``)."""
    return asdict(spec)


def spec_from_params(params: dict[str, Any]) -> NetTrainSpec | KernelTrainSpec:
    """The spec back from :func:`spec_params`."""
    cls = KernelTrainSpec if params["regularizer"] in KERNEL_REGULARIZERS else NetTrainSpec
    return cls(**params)


# --------------------------------------------------------------------------------------
# what a config produces
# --------------------------------------------------------------------------------------
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
    dataset for the one-hidden-layer networks (a panel per setting), the illustration, and
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
    targets += [f"{res}/figures/adversarial_samples.{ext}" for ext in ("png", "pdf")]
    targets += [
        f"{res}/figures/training/{ds}-{fam}.{ext}"
        for ds in dataset_names(config)
        for fam in sorted(fams)
        for ext in ("png", "pdf")
    ]
    return targets


# --------------------------------------------------------------------------------------
# the configuration reference (docs/configuration.md), generated from the schema
# --------------------------------------------------------------------------------------
def _reference_rows(
    node: dict[str, Any], root: dict[str, Any], path: str, required: bool = False
) -> list[list[str]]:
    """Table rows (key, accepts, default, meaning) of ``node`` and every key below it."""
    node = _resolve(node, root)
    rows = []
    if path:
        dflt = f"`{json.dumps(node['default'])}`" if "default" in node else "—"
        dflt = "required" if required else dflt
        text = " ".join(node.get("description", "").split())
        accepts = "a string (see its meaning)" if "pattern" in node else allowed(node, root)
        rows.append([f"`{path}`", accepts.replace("|", "\\|"), dflt, text])
    needed = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        key = f"{path}.{name}" if path else name
        rows += _reference_rows(sub, root, key, name in needed)
    return rows


def reference_markdown() -> str:
    """docs/configuration.md: every key of the schema with what it accepts, its default and
    its meaning, in the schema's order."""
    root = load_schema()
    rows = _reference_rows(root, root, "")
    grids = []
    for name in ("grid", "dropout_grid", "kernel_grid"):
        grids += _reference_rows(root["$defs"][name], root, f"<{name}>")
    external = _reference_rows(root["$defs"]["external_model"], root, "external_models[]")
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by `python -m crosslip.config` from src/crosslip/config.schema.yaml;",
        "     do not edit: tests/test_config.py checks that it is up to date -->",
        "",
        "Every key of the workflow's config, validated before any job runs (a bad key or value",
        "stops the run with one line per problem that names the key). Keys left out take the",
        "default. `config.yaml` is the embedded default run; a `--configfile` replaces it",
        "entirely (see [presets](presets.md)).",
        "",
        "| key | accepts | default | meaning |",
        "|---|---|---|---|",
        *["| " + " | ".join(r) + " |" for r in rows],
        "",
        "## Grids",
        "",
        "`train.grid` and each `train.grid_by_setting.<setting>` map a regularizer (`none`,",
        "`weight_decay`, `cross_lipschitz`: a `<grid>`; `dropout`: a `<dropout_grid>`) to its",
        "values; `kernel.grid` maps `kernel_logreg` and `kernel_cl` to a `<kernel_grid>`. One",
        "training job runs per combination of the listed values and `train.seeds`.",
        "",
        "| key | accepts | default | meaning |",
        "|---|---|---|---|",
        *["| " + " | ".join(r) + " |" for r in grids],
        "",
        "## Models trained elsewhere",
        "",
        "Each entry of `external_models` ([your own models](your-own-models.md)):",
        "",
        "| key | accepts | default | meaning |",
        "|---|---|---|---|",
        *["| " + " | ".join(r) + " |" for r in external[1:]],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown(), end="")
