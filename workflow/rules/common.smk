# Config validation, the training grid, and helpers shared by all rules.
import difflib
import itertools
import json
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator, validators
from snakemake.exceptions import WorkflowError


SCHEMA = Path(workflow.basedir, "workflow", "schemas", "config.schema.yaml")


def _show(value):
    """A config value as the user wrote it in YAML (JSON spelling), shortened."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _key_path(parts):
    """``train.grid.none.lr[0]`` from jsonschema's path parts."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
}


def _allowed(schema, root):
    """What a schema node accepts, in words: ``an integer >= 1``, ``one of a, b``, ...
    (``root``: the whole schema, for local ``$ref``s)."""
    while schema.get("$ref", "").startswith("#/"):
        target = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    kind = schema.get("type")
    text = TYPE_WORDS.get(kind, "a value")
    bounds = [f"{op} {schema[k]:g}" for k, op in BOUNDS.items() if k in schema]
    if bounds:
        text += " " + " and ".join(bounds)
    if kind == "array":
        if schema.get("minItems"):
            text += f" of at least {schema['minItems']} item" + "s" * (schema["minItems"] > 1)
        if schema.get("uniqueItems"):
            text += ", no duplicates"
        if "items" in schema:
            text += f", each {_allowed(schema['items'], root)}"
    if kind == "object" and schema.get("additionalProperties") is False:
        text += " with keys among " + ", ".join(schema.get("properties", {}))
    if "pattern" in schema and "description" in schema:
        text += " (" + " ".join(schema["description"].split()) + ")"
    return text


def _closest(word, choices):
    near = difflib.get_close_matches(str(word), list(map(str, choices)), n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def config_problems(error, root):
    """One line per problem of a jsonschema ``error``: ``config key <path>: <what is wrong>;
    allowed: <what is allowed>`` (``root``: the whole schema)."""
    path, schema, value = list(error.absolute_path), error.schema, error.instance
    key = _key_path(path)
    kind = error.validator
    if "propertyNames" in error.relative_schema_path:  # a key name outside an enum
        names = error.validator_value if kind == "enum" else []
        allowed = ", ".join(map(str, names))
        return [f"config key {_key_path([*path, value])}: not allowed; allowed keys: {allowed}"]
    if kind == "additionalProperties":
        known = list(schema.get("properties", {}))
        return [
            f"config key {_key_path([*path, k])}: not allowed; allowed keys: "
            f"{', '.join(known) or 'none'}{_closest(k, known)}"
            for k in value
            if k not in known
        ]
    if kind == "required":
        props = schema.get("properties", {})
        return [
            f"config key {_key_path([*path, k])}: missing; it is required: "
            f"{_allowed(props.get(k, {}), root)}"
            for k in error.validator_value
            if k not in value
        ]
    if kind in BOUNDS:
        what = "out of range"
    else:
        what = {
            "type": "wrong type",
            "enum": "not an allowed value",
            "pattern": "not allowed",
            "minItems": "empty list" if not value else "too few items",
            "uniqueItems": "duplicate items",
        }.get(kind, error.message)
    hint = _closest(value, schema["enum"]) if kind == "enum" else ""
    if kind == "type" and isinstance(value, str) and _is_number(value):
        hint = (
            f"; YAML reads {value} as text: write numbers with a dot and a signed exponent, "
            "e.g. 1.0e-3 or 1.0e+6"
        )
    return [
        f"config key {key or '(top level)'}: {what} ({_show(value)}); "
        f"allowed: {_allowed(schema, root)}{hint}"
    ]


def _shown_path(path):
    path = Path(path).resolve()
    base = Path(workflow.basedir).resolve()
    return path.relative_to(base) if path.is_relative_to(base) else path


def validate_config(config, schema_file=SCHEMA):
    """Validate ``config`` against the JSON schema and fill in its defaults, in place (as
    ``snakemake.utils.validate(..., set_default=True)``). Raises one WorkflowError listing
    every problem, one line each, naming the key path and the allowed values, e.g.
    ``config key train.grid.svm: not allowed; allowed keys: none, weight_decay, ...``."""
    schema = yaml.safe_load(Path(schema_file).read_text())
    base = Draft202012Validator
    set_properties = base.VALIDATORS["properties"]

    def properties_with_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(name, sub["default"])
        yield from set_properties(validator, properties, instance, schema)

    checker = validators.extend(base, {"properties": properties_with_defaults})(schema)
    errors = sorted(checker.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    lines = list(dict.fromkeys(line for e in errors for line in config_problems(e, schema)))
    if lines:
        raise WorkflowError(
            f"invalid config ({len(lines)} problem{'s' * (len(lines) > 1)}; every key is "
            f"documented in {_shown_path(schema_file)}):\n" + "\n".join(lines)
        )
    return config


if not workflow.modifier.skip_validation:
    validate_config(config)

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


def net_grid(setting):
    """The network grid of one setting: ``train.grid_by_setting[setting]`` where given
    (the paper changes grids between settings), else ``train.grid``."""
    return config["train"].get("grid_by_setting", {}).get(setting, config["train"]["grid"])


def training_grid():
    """model_id -> training parameters: for every setting x net regularizer x lr x lambda x
    seed (``-augment`` / ``-adversarial`` appended to the id), and every kernel
    regularizer x a x lambda x seed."""
    tr, mo = config["train"], config["model"]
    unknown = set(tr.get("grid_by_setting", {})) - set(tr["settings"])
    if unknown:
        raise ValueError(
            f"config key train.grid_by_setting names settings {sorted(unknown)} that are not in "
            f"train.settings {tr['settings']}; add them there or remove their grids"
        )
    grid = {}
    for setting in tr["settings"]:
        for reg, spec in net_grid(setting).items():
            lambdas = [0.0] if reg == "none" else spec["lambda"]
            if reg == "none" and any(v != 0 for v in spec["lambda"]):
                raise ValueError(
                    f"config key train.grid.none.lambda must be [0.0] (got {spec['lambda']})"
                )
            for lr, lam, seed in itertools.product(spec["lr"], lambdas, tr["seeds"]):
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
    if not grid:
        raise ValueError(
            "the config trains no model: give train.grid (networks) or kernel.grid "
            "(Gaussian-kernel models) at least one regularizer"
        )
    return grid


GRID = training_grid()
DATASETS = config["datasets"]


def all_models(pattern):
    return expand(pattern, dataset=DATASETS, model=sorted(GRID), allow_missing=True)


def families():
    """(family, setting) pairs the config trains: networks (``model.arch``: mlp or resnet)
    in each setting with a non-empty grid, Gaussian-kernel models in the plain setting."""
    pairs = [(config["model"]["arch"], s) for s in config["train"]["settings"] if net_grid(s)]
    if config["kernel"].get("grid"):
        pairs.append(("kernel", "plain"))
    return pairs


def figure_files(ext):
    """One bounds-versus-error figure per dataset, model family and setting (Section 5)."""
    return [
        f"{RESULTS}/figures/bounds_vs_error/{ds}-{fam}-{setting}.{ext}"
        for ds in DATASETS
        for fam, setting in families()
    ]


def aggregate_targets():
    """Every table and figure the config calls for: the summary, Table 1 (one-hidden-layer
    networks), the kernel table (kernel models), the figures and the illustration."""
    fams = {fam for fam, _ in families()}
    tables = ["summary"]
    tables += ["table1_global_local"] if "mlp" in fams else []
    tables += ["kernel"] if "kernel" in fams else []
    targets = expand(f"{RESULTS}/tables/{{table}}.{{ext}}", table=tables, ext=["csv", "md", "tex"])
    targets += figure_files("png") + figure_files("pdf")
    targets += expand(f"{RESULTS}/figures/adversarial_samples.{{ext}}", ext=["png", "pdf"])
    return targets
