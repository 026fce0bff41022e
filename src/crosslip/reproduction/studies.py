"""Studies beside the runs: experiments that explain a gap, rendered into the record.

A study is a folder ``docs/reproduction/studies/<name>/`` holding ``notes.md`` (hand-written:
a first line ``# Title``, then the hypotheses and verdicts) and one or more ``*.json``
results, each written by a script in ``benchmarks/study_*.py`` with ``--out`` (the command,
date, commit and the script's JSON object under ``result``). The record shows each study's
notes, marked as not generated, and generates every table from the JSON results, so no
measured number is typed by hand.

The only kind of result so far is ``benchmarks/study_guarantee_gap.py``'s: rows of figures
per network and checkpoint (:func:`guarantee_gap_tables`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .claims import num, pct

STUDIES_DIR = "studies"
NOTES_FILE = "notes.md"


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


def _net(row: dict[str, Any]) -> str:
    return row["network"]


def _ratio(a: float | None, b: float | None) -> str:
    """``a / b`` as a factor; ``–`` if either is missing or NaN or ``b`` is 0."""
    if a is None or b is None or not b or a != a or b != b:
        return "–"
    return f"×{a / b:.2f}"


def _shares(row: dict[str, Any]) -> str:
    """How often each L2 method gave the smallest upper bound (``–`` if not measured)."""
    keys = [f"share_best_{m}" for m in ("paper", "refined", "min_norm")]
    if any(row.get(k) is None for k in keys):
        return "–"
    return " / ".join(f"{100 * row[k]:.0f}%" for k in keys)


def guarantee_gap_tables(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The tables of one ``study_guarantee_gap.py`` result, each with its caption: the
    networks at the last checkpoint, each network against no regularization at the same
    learning rate and epoch, and every checkpoint."""
    rows = result["rows"]
    last = max(r["epoch"] for r in rows)
    final = [r for r in rows if r["epoch"] == last]
    end = pd.DataFrame(
        {
            "network": [_net(r) for r in final],
            "test error": [pct(r["test_error"]) for r in final],
            "guarantee": [num(r["mean_guarantee"]) for r in final],
            "all points, errors 0": [num(r["mean_guarantee_all_zero"]) for r in final],
            "on training points": [num(r["mean_guarantee_train"]) for r in final],
            "upper bound, paper's procedure": [num(r.get("mean_upper_bound")) for r in final],
            "refined": [num(r.get("mean_upper_bound_refined")) for r in final],
            "minimal-norm attack": [num(r.get("mean_upper_bound_min_norm")) for r in final],
            "best upper bound": [num(r.get("mean_upper_bound_best")) for r in final],
            "best by paper / refined / min-norm": [_shares(r) for r in final],
            "first-order m/L(0)": [num(r["mean_first_order"]) for r in final],
            "gm guarantee": [num(r["gm_guarantee"]) for r in final],
            "gm margin": [num(r["gm_margin"]) for r in final],
            "gm L(0)": [num(r["gm_lip_point"]) for r in final],
            "gm L(R*)/L(0)": [num(r["gm_growth"]) for r in final],
            "real growth (ascent)": [num(r["mean_ascent_growth"]) for r in final],
            "Prop. 2.3 / ascent": [num(r["mean_looseness"]) for r in final],
            "units off / on / crossing": [
                f"{r['share_off']:.2f} / {r['share_on']:.2f} / {r['share_crossing']:.2f}"
                for r in final
            ],
            "median α‖u_r‖": [num(r["median_unit_sharpness"]) for r in final],
        }
    )
    base = {(r["lr"], r["epoch"]): r for r in rows if r["regularizer"] == "none"}
    versus = []
    for r in rows:
        b = base.get((r["lr"], r["epoch"]))
        if r["regularizer"] == "none" or b is None:
            continue
        versus.append(
            {
                "network": _net(r),
                "epoch": str(r["epoch"]),
                "guarantee": _ratio(r["mean_guarantee"], b["mean_guarantee"]),
                "gm guarantee": _ratio(r["gm_guarantee"], b["gm_guarantee"]),
                "= gm margin": _ratio(r["gm_margin"], b["gm_margin"]),
                "/ gm L(0)": _ratio(r["gm_lip_point"], b["gm_lip_point"]),
                "/ gm growth": _ratio(r["gm_growth"], b["gm_growth"]),
                "first-order m/L(0)": _ratio(r["mean_first_order"], b["mean_first_order"]),
                "upper bound, paper's": _ratio(
                    r.get("mean_upper_bound"), b.get("mean_upper_bound")
                ),
                "best upper bound": _ratio(
                    r.get("mean_upper_bound_best"), b.get("mean_upper_bound_best")
                ),
            }
        )
    trend = pd.DataFrame(
        {
            "network": [_net(r) for r in rows],
            "epoch": [str(r["epoch"]) for r in rows],
            "test error": [pct(r["test_error"]) for r in rows],
            "guarantee": [num(r["mean_guarantee"]) for r in rows],
            "gm margin": [num(r["gm_margin"]) for r in rows],
            "gm L(0)": [num(r["gm_lip_point"]) for r in rows],
            "gm L(R*)/L(0)": [num(r["gm_growth"]) for r in rows],
            "real growth (ascent)": [num(r["mean_ascent_growth"]) for r in rows],
            "units off / on / crossing": [
                f"{r['share_off']:.2f} / {r['share_on']:.2f} / {r['share_crossing']:.2f}"
                for r in rows
            ],
        }
    )
    return [
        (f"At the last checkpoint (epoch {last})", end),
        (
            "Against no regularization at the same learning rate and epoch (ratios; the "
            "geometric mean of the guarantee is the margin's over L(0)'s over the growth's)",
            pd.DataFrame(versus),
        ),
        ("Every checkpoint", trend),
    ]


def provenance(entry: dict[str, Any]) -> str:
    """One line: command, date, commit, machine and seconds of a study result."""
    res = entry["result"]
    return (
        f"`{entry['command']}`; {entry['date']}, commit `{entry['commit']}`; "
        f"{res['machine']}; {res['dataset']} ({res['n_train']} training digits), "
        f"{res['epochs']} epochs, checkpoints {', '.join(map(str, res['checkpoints']))}; "
        f"{res['points']} test points decomposed per checkpoint, {res['train_points']} "
        f"training points certified, {res['attack_points']} attacked at the last; "
        f"training {res['train_seconds'] / 60:.0f} min, evaluation "
        f"{res['eval_seconds'] / 60:.0f} min"
    )
