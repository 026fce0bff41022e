"""Studies beside the runs: experiments that explain a gap, rendered into the record.

A study is a folder ``docs/reproduction/studies/<name>/`` holding ``notes.md`` (hand-written:
a first line ``# Title``, then the hypotheses and verdicts) and one or more ``*.json``
results, each written by a script in ``benchmarks/study_*.py`` with ``--out`` (the command,
date, commit and the script's JSON object under ``result``). The record shows each study's
notes, marked as not generated, and generates every table from the JSON results, so no
measured number is typed by hand.

The tables of each kind of result are data, ``studies.yaml`` beside this module:
``benchmarks/study_guarantee_gap.py``'s rows of figures per network and checkpoint,
``study_settings.py``'s plain against augment and adversarial training on the points both
networks get right, ``study_trust_region.py``'s L2 curvature certificate minimised over the
ball against a run's certificates, and ``study_bracket.py``'s share of the bracket between
guarantee and upper bound each certificate closes (:func:`bracket_tables`, a column per
certificate); :func:`study_tables` picks by kind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from .claims import cells

STUDIES_DIR = "studies"
NOTES_FILE = "notes.md"
#: The tables of each kind of study result (``studies.yaml``).
TABLES = yaml.safe_load(Path(__file__).with_name("studies.yaml").read_text(encoding="utf-8"))


@dataclass
class Study:
    """One study folder: its name, notes (title line removed) and results by file name."""

    name: str
    title: str
    notes: str
    results: dict[str, dict[str, Any]]


def load_studies(runs_dir: Path) -> list[Study]:
    """The studies under ``<runs_dir>/studies/``, sorted by folder name."""
    base = runs_dir / STUDIES_DIR
    studies = []
    for folder in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        notes_path = folder / NOTES_FILE
        text = notes_path.read_text() if notes_path.is_file() else f"# {folder.name}\n"
        first, _, rest = text.partition("\n")
        title = first.lstrip("#").strip() or folder.name
        results = {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
        studies.append(Study(folder.name, title, rest.strip("\n"), results))
    return studies


def _ratio(a: Any, b: Any) -> float | None:
    """``a / b``; ``None`` where either is not a number (or NaN) or ``b`` is 0."""
    numbers = all(isinstance(x, int | float) and x == x for x in (a, b))
    return a / b if numbers and b else None


def _last(result: dict[str, Any]) -> int | None:
    """The last checkpoint of a guarantee-gap result (``None`` for other kinds)."""
    return max(r["epoch"] for r in result["rows"]) if "kind" not in result else None


def _rows(result: dict[str, Any], which: str) -> list[dict[str, Any]]:
    """The rows a table shows (``studies.yaml``): ``all``, ``last`` or ``versus``."""
    rows = result["rows"]
    if which == "last":
        return [r for r in rows if r["epoch"] == _last(result)]
    if which == "all":
        return rows
    base = {(r["lr"], r["epoch"]): r for r in rows if r["regularizer"] == "none"}
    return [
        {
            **{k: _ratio(v, b.get(k)) for k, v in r.items()},
            "network": r["network"],
            "epoch": r["epoch"],
        }
        for r in rows
        if r["regularizer"] != "none" and (b := base.get((r["lr"], r["epoch"]))) is not None
    ]


def bracket_tables(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The tables of one ``study_bracket.py`` result: per network the mean guarantee of
    each certificate with the bracket it leaves, and the share of the paper's bracket each
    closes with how often each gives the best guarantee."""
    rows, names = result["rows"], result["certificates"]
    label = {n: TABLES["bracket"]["certificates"].get(n, n) for n in names}
    shares = " / ".join(f"{{share_best_{n}:.0%}}" for n in names if n != "best")
    means = {
        "network": "{network}",
        "test error": "{test_error:.2%}",
        "best upper bound": "{mean_upper_bound_best:num}",
        **{label[n]: f"{{mean_{n}:num}} (×{{bracket_{n}:.2f}})" for n in names},
    }
    closed = {
        "network": "{network}",
        **{label[n]: f"{{closed_{n}:.0%}}" for n in names if n != "paper"},
        "best by paper / tightest / integrated / linear / curvature": shares,
    }
    first, second, third, fourth = (t["caption"] for t in TABLES["bracket"]["tables"])
    out = [(first, cells(rows, means)), (second, cells(rows, closed))]
    if all("bracket_box_l1" in r for r in rows):  # the ball's and the box's brackets
        norms = {
            "network": "{network}",
            **{
                norm: f"{{mean_best_{norm}:num}} (×{{bracket_best_{norm}:.2f}}); "
                f"{{mean_best_box_{norm}:num}} (×{{bracket_box_{norm}:.2f}}) / "
                f"{{mean_upper_bound_{norm}:num}}, {{share_exact_{norm}:.0%}} exact"
                for norm in ("l2", "l1", "linf")
            },
        }
        out.append((fourth, cells(rows, norms)))
    elif all("bracket_best_l1" in r for r in rows):  # every norm's bracket (older results)
        norms = {
            "network": "{network}",
            **{
                norm: f"{{mean_best_{norm}:num}} / {{mean_upper_bound_{norm}:num}} "
                f"(×{{bracket_best_{norm}:.2f}}, {{share_exact_{norm}:.0%}} exact)"
                for norm in ("l2", "l1", "linf")
            },
        }
        out.append((third, cells(rows, norms)))
    return out


def study_tables(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The tables of a study result of any kind (module docstring), each with its caption."""
    kind = result.get("kind", "guarantee_gap")
    if kind == "bracket":
        return bracket_tables(result)
    spec = TABLES[kind]
    out = []
    for t in spec["tables"]:
        columns = t.get("cells", spec["cells"])
        columns = {c: columns[c] for c in t.get("columns", columns)}
        caption = t["caption"].format(**result, last=_last(result))
        out.append((caption, cells(_rows(result, t.get("rows", "all")), columns)))
    return out
