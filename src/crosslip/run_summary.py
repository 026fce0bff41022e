"""What a finished run found, in a few lines: the end of ``snakemake``'s output.

Per model (at most :data:`MAX_MODELS`, the rest counted): test error, the mean best L2
certificate and the mean best L2 upper bound over the correctly classified evaluated points,
and the certified accuracy at the first L2 radius of ``certify.radii``; then where the
tables, the figures and the HTML report are. Read from ``tables/summary.csv`` alone, so it
costs no model and no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from .certified_accuracy import radius_text

#: Models listed by name; a larger run says how many more the summary table has.
MAX_MODELS = 12


def _percent(value: float) -> str:
    return "-" if pd.isna(value) else f"{100 * value:.1f}%"


def _radius(value: float) -> str:
    return "-" if pd.isna(value) else f"{value:.3g}"


def summary_lines(results: Path | str, l2_radii: Sequence[float]) -> list[str]:
    """The lines (module docstring) for the run whose output folder is ``results``; a short
    note where the summary table does not exist (yet)."""
    results = Path(results)
    table = results / "tables" / "summary.csv"
    if not table.is_file():
        return [f"crosslip: no summary yet ({table} is missing)"]
    summary = pd.read_csv(table)
    eps = l2_radii[0] if len(l2_radii) else None
    acc = f"certified_accuracy_l2_{radius_text(eps)}" if eps is not None else None
    rows = []
    for _, r in summary.iterrows():
        rows.append(
            {
                "dataset": r["dataset"],
                "model": r["model_id"],
                "test error": _percent(r["test_error"]),
                "best certificate": _radius(r.get("mean_guarantee_l2_best", float("nan"))),
                "best attack": _radius(r.get("mean_upper_bound_l2_best", float("nan"))),
                **({f"certified at {eps:g}": _percent(r.get(acc, float("nan")))} if acc else {}),
            }
        )
    shown = pd.DataFrame(rows[:MAX_MODELS])
    lines = [
        f"crosslip: {len(summary)} model(s); means over correctly classified points, L2",
        *shown.to_string(index=False).splitlines(),
    ]
    if len(rows) > MAX_MODELS:
        lines.append(f"... and {len(rows) - MAX_MODELS} more in {results}/tables/summary.md")
    figures = results / "figures"
    kinds = sorted({p.stem for p in figures.iterdir()}) if figures.is_dir() else []
    lines += [
        f"tables:  {results}/tables/ (summary.md: every column; .csv, .tex)",
        f"figures: {figures}/ ({', '.join(kinds) or 'none yet'})",
        f"report:  snakemake --report {results}/report.html (the same --configfile)",
    ]
    return lines
