"""Aggregation of the per-instance results into tables and figures (Section 5).

Means of guarantees and upper bounds are taken over the *correctly classified* evaluated
points (a guarantee certifies the decision, which is only worth certifying when right);
``attack_success_rate`` is over the same points, and ``mean_upper_bound`` (and every other
upper-bound mean) averages the successful attacks only; ``max_ratio_global_local`` and
``n_global_above_local`` are taken over the same points. ``share_best_l2_<method>`` is how
often each L2 method (:data:`~crosslip.results_schema.L2_UPPER_METHODS`) gave the smallest
verified upper bound, over the same points where one did. ``share_exact_<norm>`` is the
share of the same points whose best certificate is within 1% of the best upper bound
(:func:`crosslip.certified_accuracy.share_exact`). A diverged model keeps its row with
status ``diverged`` and empty means.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .certified_accuracy import accuracy_columns, accuracy_row, share_exact
from .config.schema import default
from .io import atomic_path
from .jobs.selection import method_of

if TYPE_CHECKING:
    import matplotlib.pyplot as plt

from .norms import NORMS
from .results_schema import (
    L2_UPPER_METHODS,
    MEAN_COLUMNS,
    MODEL_KEYS,
    UPPER_COLUMNS,
    model_keys,
)

SUMMARY_COLUMNS = [
    *MODEL_KEYS,
    "n_eval",
    "n_correct",
    *[f"mean_{c}" for c in MEAN_COLUMNS],
    "mean_upper_bound",
    "attack_success_rate",
    *[f"mean_{c}" for c in UPPER_COLUMNS],
    *[f"share_best_l2_{m}" for m in L2_UPPER_METHODS],
    "max_ratio_global_local",
    "n_global_above_local",
    *[f"share_exact_{norm}" for norm in NORMS],
]
TABLE1_COLUMNS = [
    "dataset",
    "setting",
    "regularizer",
    "model_id",
    "test_error",
    "n_correct",
    "mean_ratio_global_local",
    "mean_ratio_all_models",
]
KERNEL_TABLE_COLUMNS = [
    "dataset",
    "method",
    "model_id",
    "kernel_a",
    "lam",
    "test_error",
    "n_correct",
    "mean_upper_bound",
    "mean_upper_bound_linf",
    "mean_guarantee_local",
    "attack_success_rate",
]
#: Names of the paper's Table 1 / kernel table rows.
REG_LABEL = {
    "none": "None",
    "dropout": "Dropout",
    "weight_decay": "Weight Dec.",
    "cross_lipschitz": "Cross Lip.",
    "certified_margin": "Cert. Margin",
    "kernel_logreg": "K-LogReg",
    "kernel_cl": "K-CL",
}

REG_STYLE = {
    "none": ("tab:gray", "o"),
    "weight_decay": ("tab:blue", "s"),
    "dropout": ("tab:green", "^"),
    "cross_lipschitz": ("tab:red", "D"),
    "certified_margin": ("tab:cyan", "X"),
    "kernel_logreg": ("tab:purple", "v"),
    "kernel_cl": ("tab:orange", "P"),
}


def _n_global_above_local(ok: pd.DataFrame) -> float:
    """Section 5 found the global guarantee "always worse" than the local one: the number of
    points where ``guarantee_global > guarantee_local`` (NaN when no point has both)."""
    both = ok[["guarantee_global", "guarantee_local"]].dropna()
    if not len(both):
        return np.nan
    return float((both["guarantee_global"] > both["guarantee_local"]).sum())


def _best_shares(ok: pd.DataFrame) -> dict[str, float]:
    """How often each L2 method gave the smallest verified upper bound, over the points of
    ``ok`` where one did (NaN when none did)."""
    best = ok["upper_bound_l2_best_method"].dropna()
    return {
        f"share_best_l2_{m}": (best == m).mean() if len(best) else float("nan")
        for m in L2_UPPER_METHODS
    }


def summarize(
    instances: pd.DataFrame, radii: Mapping[str, Sequence[float]] | None = None
) -> pd.DataFrame:
    """One row per model: test error and mean bounds (see module docstring), then the
    certified accuracy and its attack bound at each radius of ``radii`` (norm -> radii;
    default: the schema's ``certify.radii``; :mod:`crosslip.certified_accuracy`)."""
    radii = default("certify.radii") if radii is None else radii
    rows = []
    for key, g in instances.groupby(MODEL_KEYS, dropna=False, sort=True):
        ok = g[g["correct"].fillna(False).astype(bool)]
        rows.append(
            {
                **dict(zip(MODEL_KEYS, key, strict=True)),
                "n_eval": len(g),
                "n_correct": len(ok),
                **{f"mean_{c}": ok[c].mean() for c in MEAN_COLUMNS},
                "mean_upper_bound": ok["upper_bound"].mean(),
                "attack_success_rate": ok["attack_success"].mean() if len(ok) else float("nan"),
                **{f"mean_{c}": ok[c].mean() for c in UPPER_COLUMNS},
                **_best_shares(ok),
                "max_ratio_global_local": ok["ratio_global_local"].max(),
                "n_global_above_local": _n_global_above_local(ok),
                **{f"share_exact_{norm}": share_exact(g, norm) for norm in NORMS},
                **accuracy_row(g, radii),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS + accuracy_columns(radii))


def add_diverged(summary: pd.DataFrame, metrics: list[dict]) -> pd.DataFrame:
    """Add a row for every model without instances (e.g. diverged), so none is dropped."""
    have = set(zip(summary["dataset"], summary["model_id"], strict=True))
    extra = []
    for m in metrics:
        if (m["dataset"], m["model_id"]) in have:
            continue
        extra.append({**model_keys(m, m["model_id"]), "n_eval": 0, "n_correct": 0})
    if not extra:
        return summary
    return pd.concat([summary, pd.DataFrame(extra)], ignore_index=True)[SUMMARY_COLUMNS]


def table1(summary: pd.DataFrame) -> pd.DataFrame:
    """Table 1 of the paper: the mean ratio ``alpha_global / alpha_local`` of the L2
    guarantees (global constant vs Proposition 2.3) per dataset and regularizer, for the
    model with the lowest test error of that regularizer (the paper reports the best
    parameters), next to the mean over all its models. Means over correctly classified
    points with a positive local guarantee."""
    ok = summary[(summary["status"] == "ok") & summary["mean_ratio_global_local"].notna()]
    ok = ok[ok["family"] == "mlp"]
    rows = []
    for (ds, setting, reg), g in ok.groupby(["dataset", "setting", "regularizer"], sort=True):
        best = g.sort_values(["test_error", "model_id"]).iloc[0]
        rows.append(
            {
                "dataset": ds,
                "setting": setting,
                "regularizer": reg,
                "model_id": best["model_id"],
                "test_error": best["test_error"],
                "n_correct": best["n_correct"],
                "mean_ratio_global_local": best["mean_ratio_global_local"],
                "mean_ratio_all_models": g["mean_ratio_global_local"].mean(),
            }
        )
    return pd.DataFrame(rows, columns=TABLE1_COLUMNS)


def kernel_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The kernel table of Section 5: per dataset, the Gaussian-kernel model with the lowest
    test error of each regularizer (K-LogReg, K-CL), and, where the grid holds Kernel-LogReg
    with lambda = 0, the best unregularized one ("No Reg."); its test error, mean L2 upper
    bound (the paper's search, Section 4) and mean L2 guarantee (Proposition 2.2)."""
    ok = summary[(summary["status"] == "ok") & (summary["family"] == "kernel")]
    rows = []
    groups = [
        ("No Reg.", ok[(ok["regularizer"] == "kernel_logreg") & (ok["lam"] == 0)]),
        ("K-LogReg", ok[(ok["regularizer"] == "kernel_logreg") & (ok["lam"] > 0)]),
        ("K-CL", ok[ok["regularizer"] == "kernel_cl"]),
    ]
    for ds in sorted(set(ok["dataset"])):
        for method, g in groups:
            g = g[g["dataset"] == ds]
            if not len(g):
                continue
            best = g.sort_values(["test_error", "model_id"]).iloc[0]
            rows.append(
                {"method": method, **{c: best[c] for c in KERNEL_TABLE_COLUMNS if c != "method"}}
            )
    return pd.DataFrame(rows, columns=KERNEL_TABLE_COLUMNS)


def read_summary(path: Path | str) -> pd.DataFrame:
    """Read ``tables/summary.csv`` back with its column types."""
    return pd.read_csv(
        path,
        dtype={
            "dataset": str,
            "model_id": str,
            "family": str,
            "regularizer": str,
            "setting": str,
            "status": str,
        },
    )


def write_tables(
    table: pd.DataFrame, csv: Path | str, md: Path | str, tex: Path | str | None = None
) -> None:
    """Write a table as CSV, Markdown and (optionally) a LaTeX ``tabular`` (atomically)."""
    with atomic_path(csv) as tmp:
        table.to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        tmp.write_text(table.to_markdown(index=False, floatfmt=".4g") + "\n")
    if tex is not None:
        with atomic_path(tex) as tmp:
            tmp.write_text(
                table.to_latex(index=False, float_format="%.4g", na_rep="--", escape=True)
            )


FAMILY_LABEL = {
    "mlp": "one hidden layer, softplus",
    "resnet": "ResNet",
    "kernel": "Gaussian kernel",
    "external": "trained elsewhere",
}


@functools.cache
def _pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend, imported when a figure is first drawn (once
    per process): the summary and table jobs import this module too, and pyplot costs them
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


SETTING_ORDER = ["plain", "augment", "adversarial"]
SETTING_LABEL = {
    "plain": "plain",
    "augment": "data augmentation",
    "adversarial": "adversarial training",
}


def ordered_settings(present: set[str]) -> list[str]:
    """The settings in ``present`` in Section 5's order (others after, sorted); ``["plain"]``
    when there are none."""
    ordered = [s for s in SETTING_ORDER if s in present] + sorted(present - set(SETTING_ORDER))
    return ordered or ["plain"]


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
    means over correctly classified points (:func:`summarize`)."""
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


#: The norms as axis labels write them.
NORM_TEX = {"l1": "L_1", "l2": "L_2", "linf": "L_\\infty"}


def model_label(row: Mapping) -> str:
    """A model's name in a legend: its regularizer and grid value (lambda, dropout's keep
    probability), or its id for a model trained elsewhere."""
    reg = row["regularizer"]
    if reg == "external":
        return str(row["model_id"])
    if reg == "none" or pd.isna(row.get("lam", np.nan)):
        return REG_LABEL.get(reg, reg)
    tag = "keep" if reg == "dropout" else "λ"
    return f"{REG_LABEL.get(reg, reg)} {tag}={row['lam']:g}"


def plot_certified_accuracy(
    instances: pd.DataFrame, png: Path | str, pdf: Path | str, dataset: str, family: str
) -> None:
    """Certified accuracy against the radius (:mod:`crosslip.certified_accuracy`): a row per
    setting, a column per norm with certificates or upper bounds; per model the certified
    accuracy (solid) and the attack's bound on it (dashed), colour per regularizer (a shade
    per model of one regularizer). The legend sits below the panels, clear of the data."""
    from .certified_accuracy import attack_share, certified_share, curve_radii

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


#: Column order of the illustration (the paper's: K-SVM, K-CL, NN-WD, NN-DO, NN-CL).
ILLUSTRATION_ORDER = [
    "kernel_logreg",
    "kernel_cl",
    "none",
    "weight_decay",
    "dropout",
    "cross_lipschitz",
    "certified_margin",
]


def load_examples(paths: list[str]) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """``(dataset, model_id) ->`` the arrays of ``examples/{dataset}/{model}.npz`` (models
    without samples, e.g. diverged, are left out). Raises ValueError for a file without the
    true labels (written by an older version: rerun its attack job)."""
    out = {}
    for path in map(Path, paths):
        with np.load(path, allow_pickle=False) as z:
            if "x" in z.files:
                if "label" not in z.files:
                    raise ValueError(
                        f"{path}: adversarial samples without the true labels (key 'label'); "
                        "delete the file and rerun the workflow to attack the model again"
                    )
                out[(path.parent.name, path.stem)] = {k: z[k] for k in z.files}
    return out


def _image(flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A flat sample as an image: (h, w) for grey (``shape`` (h, w) or (h, w, 1)),
    (h, w, 3) for colour, a single row otherwise."""
    if len(shape) == 3 and shape[2] == 1:
        shape = shape[:2]
    if len(shape) == 2 or (len(shape) == 3 and shape[2] == 3):
        return np.clip(flat.reshape(shape), -1, 1)
    return flat.reshape(1, -1)


def _class_name(example: dict[str, np.ndarray], label: int | np.integer) -> str:
    """The name of class ``label`` in an example's ``class_names``, else the number ("$"
    escaped: titles are matplotlib mathtext)."""
    names, k = example.get("class_names"), int(label)
    name = str(names[k]) if names is not None and 0 <= k < len(names) else str(k)
    return name.replace("$", r"\$")


#: Column titles of the illustration: the methods of the kernel table and of Table 1.
METHOD_LABEL = {**REG_LABEL, "kernel_noreg": "K No Reg."}
#: Columns of figures/adversarial_samples.csv: one row per test point shown and model.
ILLUSTRATION_COLUMNS = [
    "dataset",
    "test_index",
    "label",
    "method",
    "model_id",
    "pred",
    "adv_class",
    "attack_success",
    "norm_l2",
]


def illustration_models(
    summary: pd.DataFrame, examples: dict[str, dict[str, np.ndarray]], dataset: str
) -> list[tuple[str, str]]:
    """The illustration's columns, ``(method, model_id)``: per method
    (:func:`crosslip.jobs.selection.method_of`: the regularizer, Kernel-LogReg with lambda = 0
    apart), the plain-setting model of ``dataset`` with the lowest test error (ties broken
    by the id) among those with samples in ``examples`` (model id -> arrays), kernel methods
    first as in the paper (K-LogReg, K-CL, then the networks)."""
    ok = summary[
        (summary["status"] == "ok")
        & (summary["dataset"] == dataset)
        & (summary["setting"] == "plain")  # the paper's figure: plain setting
        & summary["model_id"].isin(list(examples))
    ].sort_values(["test_error", "model_id"])
    methods = [
        method_of({"regularizer": r, "lam": 0.0 if pd.isna(lam) else lam})
        for r, lam in zip(ok["regularizer"], ok["lam"], strict=True)
    ]
    ok = ok.assign(method=methods)
    order = ILLUSTRATION_ORDER + sorted(set(methods) - set(ILLUSTRATION_ORDER))
    chosen = []
    for method in order:
        rows = ok[ok["method"] == method]
        if len(rows):
            chosen.append((method, str(rows.iloc[0]["model_id"])))
    return chosen


def common_correct_points(
    examples: dict[str, dict[str, np.ndarray]], model_ids: list[str], n: int
) -> list[int]:
    """Positions (into the stored candidates) of the first ``n`` test points that every
    model of ``model_ids`` classifies correctly (``pred == label``), in the order of the
    eval points. The models' candidates are the same test points (the first eval points);
    a model with fewer candidates limits the choice to its own. Raises ValueError where two
    models' candidates are different test points."""
    if not model_ids or n <= 0:
        return []
    m = min(len(examples[mid]["test_index"]) for mid in model_ids)
    first = examples[model_ids[0]]["test_index"][:m]
    for mid in model_ids[1:]:
        if not np.array_equal(examples[mid]["test_index"][:m], first):
            raise ValueError(
                f"the adversarial samples of {model_ids[0]} and {mid} are for different test "
                "points; all models of the illustration must be attacked on the same eval "
                "points (one attack.n_points for the whole run)"
            )
    correct = np.ones(m, dtype=bool)
    for mid in model_ids:
        ex = examples[mid]
        correct &= np.asarray(ex["pred"][:m]) == np.asarray(ex["label"][:m])
    return [int(i) for i in np.flatnonzero(correct)[:n]]


def illustration_record(
    dataset: str,
    examples: dict[str, dict[str, np.ndarray]],
    chosen: list[tuple[str, str]],
    points: list[int],
) -> pd.DataFrame:
    """One row per test point shown and model: what the figure draws
    (:data:`ILLUSTRATION_COLUMNS`)."""
    rows = []
    for i in points:
        for method, model_id in chosen:
            ex = examples[model_id]
            rows.append(
                {
                    "dataset": dataset,
                    "test_index": int(ex["test_index"][i]),
                    "label": int(ex["label"][i]),
                    "method": method,
                    "model_id": model_id,
                    "pred": int(ex["pred"][i]),
                    "adv_class": int(ex["adv_class"][i]),
                    "attack_success": bool(ex["success"][i]),
                    "norm_l2": float(ex["norm"][i]) if ex["success"][i] else float("nan"),
                }
            )
    return pd.DataFrame(rows, columns=ILLUSTRATION_COLUMNS)


def plot_adversarial_samples(
    summary: pd.DataFrame,
    examples: dict[tuple[str, str], dict],
    png: Path | str,
    pdf: Path | str,
    n_points: int = 2,
    csv: Path | str | None = None,
) -> pd.DataFrame:
    """The paper's illustration of adversarial samples (Section 5), for the first dataset
    (alphabetically) that has samples: one column per method, its plain-setting model with
    the lowest test error (:func:`illustration_models`: Gaussian-kernel models and networks
    side by side when the run trained both), and ``n_points`` test points that every model
    shown classifies correctly (:func:`common_correct_points`). Per point, the original and,
    per model, the L2 adversarial sample of Section 4 with its predicted class and
    ``||delta||_2`` (top row) and the perturbation (bottom row). Classes are shown by the
    names stored with the samples (``class_names``, e.g. the folder names of a folder
    dataset), else by number. ``examples``: from :func:`load_examples`. Returns (and writes
    to ``csv``, when given) the record of what is shown (:func:`illustration_record`)."""
    datasets = sorted({ds for ds, _ in examples})
    ds = datasets[0] if datasets else ""
    examples = {m: ex for (d, m), ex in examples.items() if d == ds}
    chosen = illustration_models(summary, examples, ds)
    points = common_correct_points(examples, [m for _, m in chosen], n_points)
    record = illustration_record(ds, examples, chosen, points)
    cols = 1 + len(chosen)
    rows = max(len(points), 1)
    fig, axes = _pyplot().subplots(2 * rows, cols, figsize=(1.9 * cols, 4.0 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for row, i in enumerate(points):
        top, bottom = axes[2 * row], axes[2 * row + 1]
        first = examples[chosen[0][1]]
        shape = tuple(int(s) for s in first["shape"])
        top[0].imshow(_image(first["x"][i], shape), cmap="gray", vmin=0, vmax=1)
        top[0].set_title(
            f"original, test #{int(first['test_index'][i])}\n"
            f"class {_class_name(first, first['label'][i])}",
            fontsize=8,
        )
        for c, (method, model_id) in enumerate(chosen, start=1):
            ex, name = examples[model_id], METHOD_LABEL.get(method, method)
            if not ex["success"][i]:
                top[c].set_title(f"{name}\nno sample found", fontsize=8)
                continue
            top[c].imshow(_image(ex["adv"][i], shape), cmap="gray", vmin=0, vmax=1)
            top[c].set_title(
                f"{name}\npred {_class_name(ex, ex['pred'][i])} -> "
                f"{_class_name(ex, ex['adv_class'][i])}"
                f"\n$\\|\\delta\\|_2$ = {float(ex['norm'][i]):.2f}",
                fontsize=8,
            )
            lim = float(np.abs(ex["delta"][i]).max()) or 1.0
            pert = _image(ex["delta"][i], shape)
            pert = pert.mean(-1) if pert.ndim == 3 else pert  # colour: mean over channels
            bottom[c].imshow(pert, cmap="seismic", vmin=-lim, vmax=lim)
            bottom[c].set_title("perturbation", fontsize=8)
    if not chosen:
        axes[0, 0].text(0.5, 0.5, "no model with samples", ha="center", va="center")
    elif not points:
        axes[0, 0].text(
            0.02,
            0.5,
            "no stored test point is classified\ncorrectly by every model "
            "(raise attack.example_candidates)",
            ha="left",
            va="center",
            fontsize=8,
        )
    _save(fig, png, pdf)
    if csv is not None:
        with atomic_path(csv) as tmp:
            record.to_csv(tmp, index=False)
    return record


def training_curves(metrics: list[dict], dataset: str, family: str) -> list[dict]:
    """The training curves of ``dataset``'s models of ``family``, from their metrics (the
    ``metrics.json`` of each model, :func:`crosslip.training.single.train` and
    :func:`crosslip.training.kernel.train_kernel`), sorted by model id: per model ``model_id``,
    ``regularizer``, ``setting``, ``status`` and ``x`` (epochs for networks, objective
    evaluations of L-BFGS for kernel models), ``loss`` (the objective: cross-entropy plus
    lambda times the penalty), ``penalty`` and ``train_error`` (networks; None for kernel
    models), as arrays of the finite values."""
    out = []
    for met in metrics:
        keys = model_keys(met, met["model_id"])
        if keys["dataset"] != dataset or keys["family"] != family:
            continue
        curve = met.get("curve") or []
        step = "epoch" if family != "kernel" else "evaluation"
        x = np.array([c[step] for c in curve], dtype=float)
        cols = {
            k: np.array([c.get(k, np.nan) for c in curve], dtype=float)
            for k in ("loss", "penalty", "train_error")
        }
        keep = np.isfinite(cols["loss"])
        out.append(
            {
                "model_id": keys["model_id"],
                "regularizer": keys["regularizer"],
                "setting": keys["setting"],
                "status": keys["status"],
                "x": x[keep],
                **{k: v[keep] for k, v in cols.items()},
            }
        )
        if family == "kernel":
            out[-1]["train_error"] = None
    return sorted(out, key=lambda c: c["model_id"])


def plot_training_curves(
    metrics: list[dict], png: Path | str, pdf: Path | str, dataset: str, family: str
) -> None:
    """Training curves of one dataset and model family (:func:`training_curves`), one line
    per model, colour per regularizer. Networks: a row per setting, with the mean training
    objective per epoch (log scale) and the training error after each epoch; kernel models
    (L-BFGS): the objective and the penalty at each evaluation of the objective. Diverged
    models are drawn dashed, up to their last finite value."""
    from matplotlib.ticker import MaxNLocator

    curves = training_curves(metrics, dataset, family)
    kernel = family == "kernel"
    present = {c["setting"] for c in curves}
    settings = ordered_settings(present)
    panels = [("loss", "training objective")]
    panels += (
        [("penalty", "penalty (without lambda)")]
        if kernel
        else [("train_error", "training error (%)")]
    )
    fig, axes = _pyplot().subplots(
        len(settings), 2, figsize=(10, 3.6 * len(settings)), squeeze=False
    )
    for row, setting in zip(axes, settings, strict=True):
        part = [c for c in curves if c["setting"] == setting]
        for ax, (col, label) in zip(row, panels, strict=True):
            seen = set()
            for c in part:
                y = c[col] * (100 if col == "train_error" else 1)
                color, marker = REG_STYLE.get(c["regularizer"], ("black", "x"))
                name = REG_LABEL.get(c["regularizer"], c["regularizer"])
                ax.plot(
                    c["x"],
                    y,
                    color=color,
                    alpha=0.8,
                    lw=1.2,
                    ls="-" if c["status"] == "ok" else "--",
                    marker=marker if len(y) < 12 else None,
                    ms=4,
                    label=None if name in seen else name,
                )
                seen.add(name)
            values = np.concatenate([c[col] for c in part]) if part else np.zeros(0)
            if col != "train_error" and len(values) and (values > 0).all():
                ax.set_yscale("log")
            ax.set_xlabel("L-BFGS evaluation of the objective" if kernel else "epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(label)
            what = f": {len(part)} model(s)"
            _title_panel(ax, dataset, setting, family, what, not part, "no model trained")
            if part:
                ax.legend(fontsize=8)
    n_div = sum(c["status"] != "ok" for c in curves)
    if n_div:
        fig.text(0.01, 0.01, f"{n_div} diverged model(s), dashed", fontsize=8)
    _save(fig, png, pdf)
