"""The figures drawn per dataset and model family (:data:`FAMILY_FIGURES`: the bounds
against test error, the bracket of each model's minimal perturbation) and the certified
accuracy against the radius, with the helpers that every figure of the report uses:
matplotlib's pyplot, imported when a figure is first drawn, and the writing of a figure."""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..io.files import atomic_path
from ..norms import NORMS
from .style import (
    FAMILY_LABEL,
    NORM_TEX,
    REG_LABEL,
    REG_STYLE,
    SETTING_LABEL,
    model_label,
    ordered_settings,
)

if TYPE_CHECKING:
    import matplotlib.pyplot as plt


@functools.cache
def _pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend, imported when a figure is first drawn (once
    per process): the summary and table jobs import this package too, and pyplot costs them
    0.45 s of CPU each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def _save(
    fig: plt.Figure, png: Path | str, pdf: Path | str, rect: tuple[float, ...] | None = None
) -> None:
    """Lay the panels out (inside ``rect`` of the figure, where given), write the PNG and the
    PDF atomically, close the figure."""
    fig.tight_layout(rect=rect)
    for path in (png, pdf):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=Path(path).suffix[1:], dpi=120)
    _pyplot().close(fig)


def dodge(x: np.ndarray, share: float = 0.04, least: float = 0.06) -> np.ndarray:
    """Positions ``x`` (n,) moved apart so that models at (nearly) the same test error stay
    visible side by side: points closer than the step to their neighbour form a group, spread
    evenly by the step around the group's mean, in the order given. The step is ``share`` of
    the range of ``x``, at least ``least`` (in the units of ``x``)."""
    x = np.asarray(x, dtype=float)
    out = x.copy()
    finite = np.flatnonzero(np.isfinite(x))
    if len(finite) < 2:
        return out
    step = max(share * float(np.ptp(x[finite])), least)
    order = finite[np.argsort(x[finite], kind="stable")]
    groups = [[order[0]]]
    for i in order[1:]:
        if x[i] - x[groups[-1][-1]] < step:
            groups[-1].append(i)
        else:
            groups.append([i])
    for g in groups:
        g = sorted(g)  # the order given
        out[g] = x[g].mean() + (np.arange(len(g)) - (len(g) - 1) / 2) * step
    return out


def _outside_legend(ax: plt.Axes, **kwargs) -> None:
    """The legend to the right of the panel, outside it, so that it covers no data."""
    kwargs.setdefault("fontsize", 8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)


def _title_panel(
    ax: plt.Axes,
    dataset: str,
    setting: str,
    family: str,
    what: str,
    empty: bool,
    note: str = "no model evaluated",
) -> None:
    """A panel's title (dataset, setting, family, then ``what``, which starts with its own
    separator), its grid, and ``note`` in its middle where ``empty``."""
    ax.set_title(
        f"{dataset} ({SETTING_LABEL.get(setting, setting)}), "
        f"{FAMILY_LABEL.get(family, family)}{what}",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    if empty:
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)


def plot_bounds_vs_error(
    summary: pd.DataFrame, png: Path | str, pdf: Path | str, dataset: str, family: str
) -> None:
    """The figure of Section 5 for one dataset and model family, laid out as the paper's:
    one row per setting (plain, data augmentation, adversarial training, those present),
    each with the mean L2 upper bound (left) and the mean L2 guarantee (right) against test
    error, one marker per model (each hyperparameter combination), colour and shape per
    regularizer. ResNets have no guarantee: the upper-bound panel only."""
    sel = summary[(summary["dataset"] == dataset) & (summary["family"] == family)]
    present = set(sel["setting"])
    settings = ordered_settings(present)
    panels = [("mean_upper_bound", "Adversarial resistance (upper bound), $L_2$")]
    if family != "resnet":
        panels.append(("mean_guarantee_local", "Robustness guarantee (lower bound), $L_2$"))
    fig, axes = _pyplot().subplots(
        len(settings),
        len(panels),
        figsize=(5 * len(panels) + 1.6, 3.8 * len(settings)),
        squeeze=False,
    )
    for row, setting in zip(axes, settings, strict=True):
        part = sel[sel["setting"] == setting]
        data = part[(part["status"] == "ok") & part["mean_upper_bound"].notna()]
        xs = pd.Series(dodge(100 * data["test_error"].to_numpy()), index=data.index)
        for ax, (col, title) in zip(row, panels, strict=True):
            for reg, g in data.groupby("regularizer"):
                color, marker = REG_STYLE.get(reg, ("black", "x"))
                ax.scatter(
                    xs[g.index],
                    g[col],
                    c=color,
                    marker=marker,
                    s=40,
                    label=REG_LABEL.get(reg, reg),
                )
            ax.set_xlabel("test error (%)")
            ax.set_ylabel(col.replace("_", " "))
            _title_panel(ax, dataset, setting, family, f"\n{title}", empty=not len(data))
        if len(data):
            _outside_legend(row[-1])
    n_div = int((sel["status"] != "ok").sum())
    if n_div:
        fig.text(0.01, 0.01, f"{n_div} diverged model(s) not shown", fontsize=8)
    _save(fig, png, pdf)


#: The bracket figure's four means: (column, label, filled marker, L2 upper bound).
BRACKET_MEANS = [
    ("mean_guarantee_local", "paper's guarantee (Prop. 2.3)", False, False),
    ("mean_guarantee_l2_best", "best guarantee", True, False),
    ("mean_upper_bound", "paper's upper bound (Section 4)", False, True),
    ("mean_upper_bound_l2_best", "best upper bound", True, True),
]


def plot_bracket(
    summary: pd.DataFrame, png: Path | str, pdf: Path | str, dataset: str, family: str
) -> None:
    """Where each model's minimal L2 adversarial perturbation lies: one panel per setting,
    for each model (at its test error) the paper's guarantee and the best sound guarantee
    below, the paper's upper bound and the best verified upper bound above, joined by a
    line from the best guarantee to the best upper bound (the bracket that the
    certificates beyond the paper narrow), and above it the share of its points certified
    to within 1% of their best upper bound (``share_exact_l2``). Colour per regularizer;
    means over correctly classified points (:func:`~crosslip.report.tables.summarize`)."""
    sel = summary[(summary["dataset"] == dataset) & (summary["family"] == family)]
    sel = sel[sel["status"] == "ok"]
    present = set(sel["setting"])
    settings = ordered_settings(present)
    fig, axes = _pyplot().subplots(
        1, len(settings), figsize=(7.2 * len(settings), 4.2), squeeze=False
    )
    for ax, setting in zip(axes[0], settings, strict=True):
        part = sel[sel["setting"] == setting]
        xs = dodge(100 * part["test_error"].to_numpy())
        for x, (_, row) in zip(xs, part.iterrows(), strict=True):
            color, _ = REG_STYLE.get(row["regularizer"], ("black", "x"))
            bottom = row.get("mean_guarantee_l2_best", np.nan)
            top = row.get("mean_upper_bound_l2_best", np.nan)
            ax.plot([x, x], [bottom, top], color=color, alpha=0.5)
            exact = row.get("share_exact_l2", np.nan)
            if pd.notna(exact) and pd.notna(top):  # the share known to 1%, above the bar
                ax.annotate(
                    f"{100 * exact:.0f}%",
                    (x, top),
                    xytext=(0, 9),
                    textcoords="offset points",
                    ha="center",
                    fontsize=6,
                    color=color,
                )
            for col, _, filled, upper in BRACKET_MEANS:
                ax.scatter(
                    [x],
                    [row.get(col, np.nan)],
                    marker="v" if upper else "^",
                    s=45,
                    facecolors=color if filled else "none",
                    edgecolors=color,
                )
        handles = [
            _pyplot().Line2D(
                [],
                [],
                ls="",
                marker="v" if up else "^",
                mfc="k" if fill else "none",
                mec="k",
                label=label,
            )
            for _, label, fill, up in BRACKET_MEANS
        ]
        handles += [
            _pyplot().Line2D(
                [], [], color=REG_STYLE.get(r, ("black", "x"))[0], label=REG_LABEL.get(r, r)
            )
            for r in sorted(set(part["regularizer"]))
        ]
        _outside_legend(ax, handles=handles, fontsize=7)
        ax.set_xlabel("test error (%)")
        ax.set_ylabel("mean L2 radius")
        title = "\nguarantees (below) and upper bounds (above)"
        _title_panel(ax, dataset, setting, family, title, empty=not len(part))
    _save(fig, png, pdf)


def plot_certified_accuracy(
    instances: pd.DataFrame, png: Path | str, pdf: Path | str, dataset: str, family: str
) -> None:
    """Certified accuracy against the radius (:mod:`crosslip.certified_accuracy`): a row per
    setting, a column per norm with certificates or upper bounds; per model the certified
    accuracy (solid) and the attack's bound on it (dashed), colour per regularizer (a shade
    per model of one regularizer). The legend sits below the panels, clear of the data."""
    from ..certified_accuracy import attack_share, certified_share, curve_radii

    sel = instances[(instances["dataset"] == dataset) & (instances["family"] == family)]
    settings = ordered_settings(set(sel["setting"]))
    norms = [
        n
        for n in NORMS
        if f"guarantee_{n}_best" in sel and sel[f"guarantee_{n}_best"].notna().any()
    ] or ["l2"]
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(settings),
        len(norms),
        figsize=(4.6 * len(norms), 3.6 * len(settings) + 0.9),
        squeeze=False,
    )
    handles: dict[str, object] = {}
    for row, setting in zip(axes, settings, strict=True):
        part = sel[sel["setting"] == setting]
        models = part.groupby("model_id", sort=True)
        firsts = [g.iloc[0] for _, g in models]
        order = sorted(
            range(len(firsts)), key=lambda i: (firsts[i]["regularizer"], firsts[i]["lam"])
        )
        for ax, norm in zip(row, norms, strict=True):
            radii = curve_radii(part, norm) if len(part) else np.linspace(0, 1, 2)
            shade: dict[str, int] = {}
            for i in order:
                first, rows = firsts[i], models.get_group(firsts[i]["model_id"])
                reg = first["regularizer"]
                color = REG_STYLE.get(reg, ("black", "x"))[0]
                k = shade[reg] = shade.get(reg, -1) + 1
                alpha = max(1.0 - 0.25 * k, 0.35)
                label = model_label(first)
                cert = certified_share(rows, norm, radii)
                att = attack_share(rows, norm, radii)
                (line,) = ax.plot(radii, 100 * cert, color=color, alpha=alpha, lw=1.6)
                ax.plot(radii, 100 * att, color=color, alpha=alpha, lw=1.2, ls="--")
                handles.setdefault(label, line)
            ax.set_xlabel(f"radius ε (${NORM_TEX[norm]}$)")
            ax.set_ylabel("accuracy (%)")
            ax.set_ylim(0, 100)
            ax.set_xlim(left=0)
            title = "\ncertified (solid) and attack bound (dashed)"
            _title_panel(ax, dataset, setting, family, title, empty=not len(part))
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="lower center",
            ncol=min(len(handles), 4),
            fontsize=8,
            frameon=False,
        )
    _save(fig, png, pdf, rect=(0, 0.45 / (3.6 * len(settings) + 0.45), 1, 1))


#: The figures drawn per dataset and model family, by name (workflow/scripts/figure_bounds.py).
FAMILY_FIGURES = {"bounds_vs_error": plot_bounds_vs_error, "bracket": plot_bracket}
