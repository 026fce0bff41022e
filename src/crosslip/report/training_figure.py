"""The training curves of a dataset's models of one family, from their metrics, and their
figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..results_schema import model_keys
from .figures import _pyplot, _save, _title_panel
from .style import REG_LABEL, REG_STYLE, ordered_settings


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
