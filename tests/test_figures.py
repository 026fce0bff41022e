"""The figures show every model: models at equal test error are set side by side, legends
sit outside the data, and the certified-accuracy curves are the summary's columns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from crosslip.certified_accuracy import accuracy_row, attack_share, certified_share
from crosslip.report import figures
from crosslip.report.style import REG_STYLE

REGS = ["none", "weight_decay", "dropout", "cross_lipschitz", "cross_lipschitz"]


def summary_with_ties() -> pd.DataFrame:
    """Five networks of one setting, three of them at the same test error (8.3%)."""
    rows = []
    for i, (reg, err) in enumerate(zip(REGS, [0.083, 0.083, 0.074, 0.083, 0.079], strict=True)):
        rows.append(
            {
                "dataset": "d",
                "family": "mlp",
                "setting": "plain",
                "status": "ok",
                "model_id": f"{reg}-{i}",
                "regularizer": reg,
                "lam": 1e-3 * (i + 1),
                "test_error": err,
                "mean_upper_bound": 1.0 + 0.1 * i,
                "mean_guarantee_local": 0.5 + 0.01 * i,
                "mean_guarantee_l2_best": 0.8 + 0.05 * i,
                "mean_upper_bound_l2_best": 0.95 + 0.05 * i,
            }
        )
    return pd.DataFrame(rows)


def drawn_figure(monkeypatch, plot, data) -> list:
    """The matplotlib figure that ``plot`` draws (kept open instead of saved)."""
    drawn = []
    monkeypatch.setattr(figures, "_save", lambda fig, png, pdf, rect=None: drawn.append(fig))
    plot(data, "unused.png", "unused.pdf", "d", "mlp")
    return drawn


def marker_positions(ax) -> np.ndarray:
    """Data coordinates of every scatter marker of the panel, (m, 2)."""
    parts = [c.get_offsets() for c in ax.collections if len(c.get_offsets())]
    return np.concatenate([np.asarray(p) for p in parts]) if parts else np.zeros((0, 2))


def assert_legend_clear_of_markers(fig, ax) -> None:
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    for x, y in ax.transData.transform(marker_positions(ax)):
        assert not legend.contains(x, y)


@pytest.mark.parametrize("plot", [figures.plot_bracket, figures.plot_bounds_vs_error])
def test_models_at_the_same_test_error_are_drawn_apart(monkeypatch, plot):
    (fig,) = drawn_figure(monkeypatch, plot, summary_with_ties())
    axes = [ax for ax in fig.axes if ax.collections]
    assert axes
    for ax in axes:
        xs = np.unique(np.round(marker_positions(ax)[:, 0], 9))
        assert len(xs) == len(REGS)  # one column of markers per model
        assert np.diff(np.sort(xs)).min() > 0.05  # visibly apart (test error in %)
    legends = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    for ax in legends:
        assert_legend_clear_of_markers(fig, ax)
    figures._pyplot().close(fig)


def test_dodge_spreads_only_points_that_collide_and_keeps_their_order():
    x = np.array([8.3, 8.3, 7.4, 8.3, 7.9])
    out = figures.dodge(x)
    assert out[2] == 7.4 and out[4] == 7.9  # alone: unmoved
    assert out[0] < out[1] < out[3] and np.isclose(out[[0, 1, 3]].mean(), 8.3)
    assert np.isclose(out[1] - out[0], out[3] - out[1])
    assert figures.dodge(np.array([1.0])).tolist() == [1.0]


def instances(seed: int, n: int = 300) -> pd.DataFrame:
    """Two models' random per-instance results, upper bounds above the certificates."""
    rng = np.random.default_rng(seed)
    frames = []
    for model in ("a", "b"):
        cert = rng.exponential(1.0, n)
        upper = cert * (1 + rng.exponential(0.5, n))
        upper[rng.random(n) < 0.05] = np.nan  # no sample found
        cert[rng.random(n) < 0.03] = np.nan  # no certificate
        frames.append(
            pd.DataFrame(
                {
                    "dataset": "d",
                    "family": "mlp",
                    "setting": "plain",
                    "status": "ok",
                    "model_id": model,
                    "regularizer": "none" if model == "a" else "certified_margin",
                    "lam": 0.0 if model == "a" else 1.0,
                    "correct": rng.random(n) < 0.9,
                    "guarantee_l2_best": cert,
                    "upper_bound_l2_best": upper,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def test_the_curves_are_the_summary_columns_and_never_cross(monkeypatch):
    inst = instances(0)
    (fig,) = drawn_figure(monkeypatch, figures.plot_certified_accuracy, inst)
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert len(lines) == 4  # per model: certified (solid), attack (dashed)
    solid = [ln for ln in lines if ln.get_linestyle() == "-"]
    dashed = [ln for ln in lines if ln.get_linestyle() == "--"]
    assert len(solid) == len(dashed) == 2
    from matplotlib.colors import to_rgba

    for model, reg in (("a", "none"), ("b", "certified_margin")):
        colour = to_rgba(REG_STYLE[reg][0])
        line = next(ln for ln in solid if to_rgba(ln.get_color())[:3] == colour[:3])
        att = next(ln for ln in dashed if to_rgba(ln.get_color())[:3] == colour[:3])
        one = inst[inst["model_id"] == model]
        radii = line.get_xdata()
        np.testing.assert_allclose(line.get_ydata(), 100 * certified_share(one, "l2", radii))
        np.testing.assert_allclose(att.get_ydata(), 100 * attack_share(one, "l2", radii))
    for s, d in zip(solid, dashed, strict=True):
        assert np.all(s.get_ydata() <= d.get_ydata())
    row = accuracy_row(one, {"l2": [0.5, 1.58]})
    assert row["certified_accuracy_l2_0.5"] == pytest.approx(
        certified_share(one, "l2", np.array([0.5]))[0]
    )
    figures._pyplot().close(fig)
