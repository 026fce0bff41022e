"""The configuration schema (``schema.yaml``): loading it, its defaults, and a config's
problems in words, one line each (``config key <path>: <what is wrong>; allowed: <what is
allowed>``)."""

from __future__ import annotations

import copy
import difflib
import functools
import json
from collections.abc import Iterable
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).with_name("schema.yaml")


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


def default_field(dotted: str) -> Any:
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
            if "e" in value.lower()
            else f"; {value} arrived as text, as Snakemake's --config passes every value "
            "inside a mapping (e.g. certify={n_points: 1000}): put such settings in a YAML "
            "file and add it with --configfile"
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
