"""Certified accuracy at L2 1.58 on full MNIST against the field: the record's section that
places crosslip's networks beside other methods (``field.yaml`` beside this module: the
radius, the target and the other methods' numbers with their sources).

Per committed run with networks on full MNIST that reports the certified accuracy at the
radius (``certified_accuracy_l2_<radius>`` in its summary): every evaluated network, plain
setting, with its test error, certified accuracy and the attack's bound on it (the share
no verified sample within the radius breaks), and the verdict on the target: met where a
network with at most the target's test error reaches the target's certified accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ..certified_accuracy import radius_text
from . import claims as C

FIELD: dict[str, Any] = yaml.safe_load((Path(__file__).with_name("field.yaml")).read_text())


@dataclass
class FieldRun:
    """One run's networks at the radius (``rows``: the table's cells) and its verdict."""

    run: str
    points: str
    rows: pd.DataFrame
    met: bool
    best: str


def _pct(x: Any) -> str:
    return "–" if pd.isna(x) else f"{100 * float(x):.1f}%"


def anchors() -> pd.DataFrame:
    """The other methods' numbers, as the table shows them."""
    return pd.DataFrame(
        [
            {
                "method": a["method"],
                "certified accuracy": f"{100 * a['certified']:.2f}".rstrip("0").rstrip(".") + "%",
                "certified against": a["against"],
                "reference": a["reference"],
                "number from": a["source"],
            }
            for a in FIELD["anchors"]
        ]
    )


def certified_points(nets: pd.DataFrame) -> pd.Series:
    """The points each network was certified on (``n_certified``; ``n_eval`` in a summary
    written before that column, where both were the same)."""
    return nets["n_certified"] if "n_certified" in nets else nets["n_eval"]


def field_runs(units: list[C.Run]) -> list[FieldRun]:
    """The runs with networks on full MNIST whose summary has the certified accuracy at the
    radius, in record order."""
    eps = radius_text(float(FIELD["radius"]))
    cert, att = f"certified_accuracy_l2_{eps}", f"attack_accuracy_l2_{eps}"
    target = FIELD["target"]
    out = []
    for unit in units:
        if FIELD["dataset"] not in unit.datasets("mlp"):
            continue
        nets = unit.models(FIELD["dataset"], "mlp", "plain")
        if cert not in nets or nets[cert].isna().all():
            continue
        nets = nets.sort_values([cert, "model_id"], ascending=[False, True])
        rows = pd.DataFrame(
            {
                "method": [C.LABEL.get(m, m) for m in nets["method"]],
                "model": nets["model_id"],
                "test error": [C.pct(e) for e in nets["test_error"]],
                f"certified at {eps}": [_pct(v) for v in nets[cert]],
                f"attack's bound at {eps}": [_pct(v) for v in nets.get(att, pd.Series())],
                "mean best certificate": [
                    C.num(v) for v in C.column(nets, "mean_guarantee_l2_best")
                ],
                "points": [f"{int(n):,}" for n in certified_points(nets)],
            }
        )
        ok = nets[nets["test_error"] <= target["max_test_error"]]
        top = ok.iloc[0] if len(ok) else None
        met = top is not None and float(top[cert]) >= float(target["certified"])
        best = (
            "no network within the test error"
            if top is None
            else f"{_pct(top[cert])} ({C.LABEL.get(top['method'], top['method'])}, "
            f"test error {C.pct(top['test_error'])}, attack's bound {_pct(top.get(att))})"
        )
        points = ", ".join(sorted({f"{int(n):,}" for n in certified_points(nets)}))
        out.append(FieldRun(unit.name, points, rows, met, best))
    return out
