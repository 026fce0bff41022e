"""Studies beside the runs: experiments that explain a gap, rendered into the record.

A study is a folder ``docs/reproduction/studies/<name>/`` holding ``notes.md`` (hand-written:
a first line ``# Title``, then the hypotheses and verdicts) and one or more ``*.json``
results, each written by a script in ``benchmarks/study_*.py`` with ``--out`` (the command,
date, commit and the script's JSON object under ``result``). The record shows each study's
notes, marked as not generated, and generates every table from the JSON results, so no
measured number is typed by hand.

Four kinds of result: ``benchmarks/study_guarantee_gap.py``'s, rows of figures per network
and checkpoint (:func:`guarantee_gap_tables`), ``benchmarks/study_bracket.py``'s
(``kind: bracket``), how much of the bracket between guarantee and upper bound each
certificate closes (:func:`bracket_tables`), and ``benchmarks/study_settings.py``'s
(``kind: settings``), plain against augment and adversarial training on the points both
networks get right (:func:`settings_tables`), and ``benchmarks/study_trust_region.py``'s
(``kind: trust_region``), the L2 curvature certificate minimised over the ball against a
run's certificates (:func:`trust_region_tables`); :func:`study_tables` picks by kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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


#: How a study row shows in each column of the guarantee-gap tables.
_COLUMNS: dict[str, Callable[[dict[str, Any]], str]] = {
    "network": _net,
    "epoch": lambda r: str(r["epoch"]),
    "test error": lambda r: pct(r["test_error"]),
    "guarantee": lambda r: num(r["mean_guarantee"]),
    "all points, errors 0": lambda r: num(r["mean_guarantee_all_zero"]),
    "on training points": lambda r: num(r["mean_guarantee_train"]),
    "upper bound, paper's procedure": lambda r: num(r.get("mean_upper_bound")),
    "refined": lambda r: num(r.get("mean_upper_bound_refined")),
    "minimal-norm attack": lambda r: num(r.get("mean_upper_bound_min_norm")),
    "best upper bound": lambda r: num(r.get("mean_upper_bound_best")),
    "best by paper / refined / min-norm": lambda r: _shares(r),
    "first-order m/L(0)": lambda r: num(r["mean_first_order"]),
    "gm guarantee": lambda r: num(r["gm_guarantee"]),
    "gm margin": lambda r: num(r["gm_margin"]),
    "gm L(0)": lambda r: num(r["gm_lip_point"]),
    "gm L(R*)/L(0)": lambda r: num(r["gm_growth"]),
    "real growth (ascent)": lambda r: num(r["mean_ascent_growth"]),
    "Prop. 2.3 / ascent": lambda r: num(r["mean_looseness"]),
    "units off / on / crossing": lambda r: (
        f"{r['share_off']:.2f} / {r['share_on']:.2f} / {r['share_crossing']:.2f}"
    ),
    "median α‖u_r‖": lambda r: num(r["median_unit_sharpness"]),
}


def _frame(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    """The ``columns`` (names of :data:`_COLUMNS`) of ``rows``, one table row each."""
    return pd.DataFrame({c: [_COLUMNS[c](r) for r in rows] for c in columns})


def guarantee_gap_tables(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The tables of one ``study_guarantee_gap.py`` result, each with its caption: the
    networks at the last checkpoint, each network against no regularization at the same
    learning rate and epoch, and every checkpoint."""
    rows = result["rows"]
    last = max(r["epoch"] for r in rows)
    end = _frame(
        [r for r in rows if r["epoch"] == last],
        [
            "network",
            "test error",
            "guarantee",
            "all points, errors 0",
            "on training points",
            "upper bound, paper's procedure",
            "refined",
            "minimal-norm attack",
            "best upper bound",
            "best by paper / refined / min-norm",
            "first-order m/L(0)",
            "gm guarantee",
            "gm margin",
            "gm L(0)",
            "gm L(R*)/L(0)",
            "real growth (ascent)",
            "Prop. 2.3 / ascent",
            "units off / on / crossing",
            "median α‖u_r‖",
        ],
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
    trend = _frame(
        rows,
        [
            "network",
            "epoch",
            "test error",
            "guarantee",
            "gm margin",
            "gm L(0)",
            "gm L(R*)/L(0)",
            "real growth (ascent)",
            "units off / on / crossing",
        ],
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


#: The certificates of a bracket study, as its tables name them.
BRACKET_NAMES = {
    "paper": "paper (Prop. 2.3)",
    "min_bound": "Theorem 2.1, tightest bound",
    "integrated": "integrated",
    "linear": "linear relaxation",
    "curvature": "curvature",
    "best": "best per point",
}


def bracket_tables(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The tables of one ``study_bracket.py`` result: per network the mean guarantee of
    each certificate with the bracket it leaves, and the share of the paper's bracket each
    closes with how often each gives the best guarantee."""
    rows, names = result["rows"], result["certificates"]
    means = pd.DataFrame(
        {
            "network": [r["network"] for r in rows],
            "test error": [pct(r["test_error"]) for r in rows],
            "best upper bound": [num(r["mean_upper_bound_best"]) for r in rows],
            **{
                BRACKET_NAMES.get(n, n): [
                    f"{num(r[f'mean_{n}'])} (×{r[f'bracket_{n}']:.2f})" for r in rows
                ]
                for n in names
            },
        }
    )
    closed = pd.DataFrame(
        {
            "network": [r["network"] for r in rows],
            **{
                BRACKET_NAMES.get(n, n): [f"{100 * r[f'closed_{n}']:.0f}%" for r in rows]
                for n in names
                if n != "paper"
            },
            "best by paper / tightest / integrated / linear / curvature": [
                " / ".join(f"{100 * r[f'share_best_{n}']:.0f}%" for n in names if n != "best")
                for r in rows
            ],
        }
    )
    return [
        (
            "Mean L2 guarantee per certificate over the correctly classified points, and "
            "the bracket it leaves (best upper bound over it)",
            means,
        ),
        (
            "Share of the paper's bracket each certificate closes "
            "(log(guarantee / paper's) / log(upper bound / paper's)), and how often each "
            "gives the best guarantee",
            closed,
        ),
    ]


def settings_tables(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The table of one ``study_settings.py`` result: per regularizer and setting, the
    means on the points both networks classify correctly (plain -> other, and the ratio)."""
    names = {
        "margin": "margin",
        "guarantee": "guarantee (Prop. 2.3)",
        "best_guarantee": "best sound guarantee",
        "upper_bound": "best upper bound",
    }

    def cell(r: dict[str, Any], n: str) -> str:
        return f"{num(r[f'{n}_plain'])} → {num(r[f'{n}_other'])} (×{r[f'{n}_ratio_common']:.2f})"

    rows = result["rows"]
    table = pd.DataFrame(
        {
            "network": [f"{r['regularizer']} {r['lam']:g}" for r in rows],
            "setting": [r["setting"] for r in rows],
            "points (both correct)": [r["common"] for r in rows],
            **{label: [cell(r, n) for r in rows] for n, label in names.items()},
            "guarantee, own points": [f"×{r['guarantee_ratio_own']:.2f}" for r in rows],
        }
    )
    return [
        (
            "Plain → the setting's network of the same regularizer, means over the test "
            "points both classify correctly (the ratio), and the guarantee's ratio over each "
            "network's own correct points as the claims take it",
            table,
        )
    ]


def trust_region_tables(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The table of one ``study_trust_region.py`` result: per network the curvature
    certificate in both forms, the run's best and the new best with their brackets, and
    the cost per point."""
    rows = result["rows"]
    table = pd.DataFrame(
        {
            "network": [r["network"] for r in rows],
            "points": [r["points"] for r in rows],
            "best upper bound": [num(r["mean_upper_bound_best"]) for r in rows],
            "curvature, λ_max form → minimised over the ball": [
                f"{num(r['mean_curvature_lambda_max'])} → {num(r['mean_curvature_trust_region'])}"
                for r in rows
            ],
            "best per point (bracket): run → with it": [
                f"{num(r['mean_best_run'])} (×{r['bracket_run']:.2f}) → "
                f"{num(r['mean_best'])} (×{r['bracket_best']:.2f})"
                for r in rows
            ],
            "paper's bracket closed": [
                f"{100 * r['closed_run']:.0f}% → {100 * r['closed_best']:.0f}%" for r in rows
            ],
            "points where it is best": [pct(r["share_trust_region_best"]) for r in rows],
            "seconds per point (× guarantee_l2's)": [
                f"{r['seconds_per_point_trust_region']:.3f} "
                f"(×{r['trust_region_vs_l2_seconds']:.0f})"
                for r in rows
            ],
        }
    )
    return [
        (
            f"The L2 curvature certificate minimised over the ball ({result['steps']} Lanczos "
            "steps) on each network's first correctly classified points, against the run's "
            "own certificates and best upper bounds (ratios of the means)",
            table,
        )
    ]


def study_tables(result: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The tables of a study result of any kind (module docstring)."""
    if result.get("kind") == "bracket":
        return bracket_tables(result)
    if result.get("kind") == "trust_region":
        return trust_region_tables(result)
    if result.get("kind") == "settings":
        return settings_tables(result)
    return guarantee_gap_tables(result)


def provenance(entry: dict[str, Any]) -> str:
    """One line: command, date, commit, machine and seconds of a study result."""
    res = entry["result"]
    if res.get("kind") in ("bracket", "settings", "trust_region"):
        machine = f"{res['machine']}; " if "machine" in res else ""
        return (
            f"`{entry['command']}`; {entry['date']}, commit `{entry['commit']}`; "
            f"{machine}from the per-instance results of `{res['results']}`"
        )
    return (
        f"`{entry['command']}`; {entry['date']}, commit `{entry['commit']}`; "
        f"{res['machine']}; {res['dataset']} ({res['n_train']} training digits), "
        f"{res['epochs']} epochs, checkpoints {', '.join(map(str, res['checkpoints']))}; "
        f"{res['points']} test points decomposed per checkpoint, {res['train_points']} "
        f"training points certified, {res['attack_points']} attacked at the last; "
        f"training {res['train_seconds'] / 60:.0f} min, evaluation "
        f"{res['eval_seconds'] / 60:.0f} min"
    )
