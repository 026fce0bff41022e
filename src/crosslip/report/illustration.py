"""The illustration of adversarial samples (Section 5): which models and test points it
shows, the record of what it shows, and the figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..io.files import atomic_path
from ..jobs.selection import method_of
from .figures import _pyplot, _save
from .style import METHOD_LABEL

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
