"""Numerics of the stages: a diverging model, ties, misclassified points, constant models,
degenerate Gaussian-kernel models and failed attacks give no NaN and lose no row."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from crosslip.attacks import upper_bound
from crosslip.certify import certify_softplus
from crosslip.data import Dataset, save_prepared
from crosslip.io.files import write_json
from crosslip.models import SoftplusNet
from crosslip.models.checkpoints import save_model
from crosslip.models.kernels import GaussianKernelModel
from crosslip.pipeline import attack_stage, certify_stage, instances_stage
from crosslip.report.tables import summarize
from crosslip.results_schema import GUARANTEE_COLUMNS, INSTANCE_SCHEMA, MEAN_COLUMNS, UPPER_COLUMNS

from .helpers import random_net

# --------------------------------------------------------------------------------------
# 4. numerics: ties, misclassified points, constant models, failed attacks
# --------------------------------------------------------------------------------------
# Existing: tests/test_certify.py::test_zero_margin_and_constant_model (Theorem 2.1's search
# alone), tests/test_train.py::test_diverging_run_is_recorded (train()),
# tests/test_stages.py::test_diverged_model_has_no_instances_but_keeps_its_summary_row (the
# stages). Here: certify_softplus and the stages on such models, and a sweep (section 6).


def tie_net() -> SoftplusNet:
    """Classes 0 and 1 have identical output rows: a tie (zero margin) at every point."""
    net = random_net(6, 3, 8, 0, 4.0)
    with torch.no_grad():
        net.output_layer.weight[1] = net.output_layer.weight[0]
        net.output_layer.bias[1] = net.output_layer.bias[0]
        net.output_layer.bias[2] = -100.0  # class 2 never wins
    return net


def constant_net(bias: tuple[float, ...]) -> SoftplusNet:
    """All weights zero: the output is ``bias`` everywhere (zeros: a three-way tie)."""
    net = SoftplusNet(6, 3, hidden=8, bias=True).double()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.output_layer.bias.copy_(torch.tensor(bias, dtype=torch.float64))
    return net.eval()


def points(n: int = 7) -> torch.Tensor:
    return torch.rand(n, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


GUARANTEES = [c for c in MEAN_COLUMNS if c.startswith("guarantee")]


@pytest.mark.parametrize("name", ["tie", "all-zero", "constant-output"])
def test_zero_margin_and_constant_models_get_defined_guarantees(name):
    """Zero margin (a tie, or a net whose weights are all zero): every guarantee is 0 and no
    class attains it (bound_class -1). A net whose output does not depend on the input but
    has a winner: every guarantee is +inf (no perturbation changes the decision)."""
    net = {
        "tie": tie_net,
        "all-zero": lambda: constant_net((0.0, 0.0, 0.0)),
        "constant-output": lambda: constant_net((1.0, 0.0, -1.0)),
    }[name]()
    res = certify_softplus(net, points())
    assert res["pred"].eq(0).all()  # the lower index wins a tie
    for col in GUARANTEES:
        g = res[col]
        assert not g.isnan().any(), col
        assert (g == (math.inf if name == "constant-output" else 0.0)).all(), (col, g)
    if name != "constant-output":
        assert res["margin"].eq(0).all() and res["bound_class"].eq(-1).all()


def test_constant_model_bound_class_is_not_the_predicted_class():
    res = certify_softplus(constant_net((1.0, 0.0, -1.0)), points())
    assert (res["bound_class"] != res["pred"]).all()


@pytest.mark.parametrize("gap", [1e-6, 1e-9, 1e-13])
def test_tiny_margin_gives_a_tiny_positive_finite_guarantee(gap):
    """A margin of 1e-6 or 1e-9 gets a tiny positive radius; at 1e-13 the margin is within
    the float64 forward error of the logits, so the sound certificate may be 0."""
    net = random_net(6, 3, 8, 1, 4.0)
    x = points(1)
    with torch.no_grad():  # lift the runner-up to within ``gap`` of the winner at x
        logits = net(x)[0]
        c, j = logits.argsort(descending=True)[:2].tolist()
        net.output_layer.bias[j] += logits[c] - logits[j] - gap
    res = certify_softplus(net, x)
    assert res["pred"].item() == c and 0 < res["margin"].item() < 2 * gap
    for col in GUARANTEES:
        g = res[col].item()
        assert 0 <= g < 1e3 * gap, (col, g)  # tiny and finite
        assert g > 0 or gap < 1e-10, (col, g)  # positive unless below rounding error
    ub = upper_bound(net, x, p=2)
    assert ub.success.item() and ub.norm.item() >= res["guarantee_l2"].item()


def toy_inputs(tmp_path: Path, y: np.ndarray, cfg: dict, test_error: float) -> np.ndarray:
    """A 6-pixel, 3-class prepared dataset (10 train, 10 test points with labels ``y``) and
    a metrics file in ``tmp_path``; returns all 20 points."""
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(20, 6)) / 255).astype(np.float32)
    save_prepared(Dataset("toy", x[:10], y[:10], x[10:], y[10:], (6,), 3), tmp_path / "toy.npz")
    write_json(
        {
            "status": "ok",
            "dataset": "toy",
            "model_id": "m",
            "test_error": test_error,
            "config": cfg,
        },
        tmp_path / "metrics.json",
    )
    return x


def run_stages(tmp_path: Path, name: str, model: torch.nn.Module) -> pd.DataFrame:
    """``model`` through certify_stage, attack_stage and instances_stage on the toy data
    (10 points); returns the instances, whose file must have the instance schema."""
    d = tmp_path / name
    save_model(model, d / "model.pt")
    args = (tmp_path / "toy.npz", d / "model.pt", tmp_path / "metrics.json")
    certify_stage(*args, d / "c.parquet", n_points=10, rtol=1e-3)
    attack_stage(*args, d / "a.parquet", n_points=10, rtol=1e-3, max_steps=20)
    df = instances_stage(
        d / "c.parquet", d / "a.parquet", tmp_path / "metrics.json", name, d / "i.parquet"
    )
    assert pq.read_table(d / "i.parquet").schema.equals(INSTANCE_SCHEMA, check_metadata=False)
    assert len(df) == 10
    return df


def test_stages_on_degenerate_models_write_defined_values(tmp_path):
    """Through certify_stage / attack_stage / instances_stage: a tie model, a constant model,
    misclassified points. Rows are kept; guarantees are finite or +inf, never NaN; failed
    attacks are rows with attack_success False and a null upper bound."""
    y = np.array([2] * 20, dtype=np.int64)  # every model predicts 0 or 1: all misclassified
    toy_inputs(tmp_path, y, {"regularizer": "none", "lr": 0.1, "lam": 0.0, "seed": 0}, 1.0)
    frames = {}
    for name, net in (
        ("tie", tie_net()),
        ("constant", constant_net((1.0, 0.0, -1.0))),
        ("zero", constant_net((0.0, 0.0, 0.0))),
    ):
        df = run_stages(tmp_path, name, net)
        assert not df["correct"].any()  # misclassified points are kept
        for col in [c for c in GUARANTEE_COLUMNS if c != "bound_class"]:
            assert df[col].notna().all(), (name, col)
        frames[name] = df
    assert (frames["tie"][GUARANTEES] == 0).all().all()
    assert (frames["zero"][GUARANTEES] == 0).all().all()
    assert np.isinf(frames["constant"][GUARANTEES].to_numpy()).all()
    failed = frames["constant"]  # nothing moves a constant model's decision
    assert not failed["attack_success"].any() and failed["upper_bound"].isna().all()
    assert (failed["adv_class"] == -1).all() and failed["upper_bound_l1"].isna().all()
    for df in frames.values():  # any attack that succeeded is a finite bound above the guarantee
        ok = df["attack_success"]
        assert np.isfinite(df.loc[ok, "upper_bound"]).all()
        assert (df.loc[ok, "upper_bound"] >= df.loc[ok, "guarantee_l2"]).all()
        assert df.loc[~ok, "upper_bound"].isna().all()


def kernel_model(kind: str, x: np.ndarray) -> GaussianKernelModel:
    """Degenerate Gaussian-kernel models on the centres ``x`` (3 classes): ``zero`` (the
    untrained model: a three-way tie everywhere), ``tie`` (classes 0 and 1 share their
    coefficients, class 2 is below both), ``underflow`` (a width so small that every kernel
    value away from the centres is exactly 0: a tie wherever the points are not centres),
    ``near`` (class 1's coefficients are class 0's lowered by 1e-6: tiny positive margins,
    yet class 0 wins everywhere)."""
    centers = torch.as_tensor(x, dtype=torch.float64)
    model = GaussianKernelModel(centers, 3, 1e6 if kind == "underflow" else 2.0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if kind != "zero":
            model.coef.copy_(torch.randn(3, len(x), generator=g, dtype=torch.float64))
            model.coef[1] = model.coef[0] - (1e-6 if kind == "near" else 0.0)
            model.coef[2] = model.coef[0] - 1.0  # f_2 < f_0 everywhere
    return model.eval()


def test_kernel_stages_on_degenerate_models_write_defined_values(tmp_path):
    """The kernel model through certify_stage / attack_stage / instances_stage: guarantees are
    0 with no bound class at a tie, finite and positive otherwise, never NaN; a tie's failed
    attack (no perturbation changes an argmax that a tie resolves to the lower index) is a row
    with a null upper bound; every successful attack lies outside the certified ball."""
    y = np.array([0, 1] * 10, dtype=np.int64)
    cfg = {"regularizer": "kernel_cl", "lr": None, "lam": 0.1, "seed": 0}
    x = toy_inputs(tmp_path, y, cfg, 0.5)
    frames = {}
    for kind in ("zero", "tie", "underflow", "near"):
        df = run_stages(tmp_path, kind, kernel_model(kind, x[:10]))
        assert (df["family"] == "kernel").all()
        for col in ("margin", "guarantee_local", "guarantee_l2", "radius_local"):
            assert df[col].notna().all() and (df[col] >= 0).all(), (kind, col)
        ok = df["attack_success"]
        assert (df.loc[ok, "upper_bound"] >= df.loc[ok, "guarantee_l2"]).all(), kind
        assert df.loc[~ok, "upper_bound"].isna().all() and (df.loc[~ok, "adv_class"] == -1).all()
        frames[kind] = df
    for kind in ("zero", "tie", "underflow"):
        df = frames[kind]
        assert (df["pred"] == 0).all() and (df["margin"] == 0).all(), kind
        assert (df["guarantee_l2"] == 0).all() and (df["bound_class"] == -1).all(), kind
    assert not frames["zero"]["attack_success"].any()  # a constant function: nothing moves it
    near = frames["near"]
    assert (
        (near["pred"] == 0).all() and (near["margin"] > 0).all() and (near["margin"] < 1e-4).all()
    )
    assert np.isfinite(near["guarantee_l2"]).all() and (near["guarantee_l2"] > 0).all()
    # class 1's margin is tiny but so is its gradient difference (both scale with the 1e-6
    # gap), so the guarantee need not be tiny and class 2 may attain it; since
    # f_0 - f_1 = 1e-6 sum_r k(x, x_r) > 0 everywhere, no attack can succeed either
    assert near["bound_class"].isin([1, 2]).all() and not near["attack_success"].any()


def test_failed_attacks_count_in_the_success_rate_not_in_the_mean():
    """summarize: means over the correctly classified points; attack_success_rate counts the
    failed attacks; mean_upper_bound averages the successful ones only."""
    n = 6
    df = pd.DataFrame(
        {
            "dataset": "toy",
            "model_id": "m",
            "family": "mlp",
            "regularizer": "none",
            "lr": 0.1,
            "lam": 0.0,
            "kernel_a": np.nan,
            "seed": 0,
            "setting": "plain",
            "status": "ok",
            "test_error": 0.5,
            "test_index": range(n),
            "correct": [True, True, True, True, False, False],
            "attack_success": [True, True, False, False, True, False],
            "upper_bound": [1.0, 3.0, np.nan, np.nan, 100.0, np.nan],
            "guarantee_local": [0.5, 1.0, 2.0, 0.0, 9.0, 9.0],
        }
    )
    for col in {*MEAN_COLUMNS, *UPPER_COLUMNS} - {"guarantee_local"}:
        df[col] = np.nan
    df["upper_bound_l2_best_method"] = ["paper", "paper", None, None, "paper", None]
    row = summarize(df).iloc[0]
    assert row["n_eval"] == 6 and row["n_correct"] == 4
    assert row["share_best_l2_paper"] == 1.0  # of the 2 correct points with a bound
    assert row["attack_success_rate"] == 0.5  # 2 of the 4 correct points; failures count
    assert row["mean_upper_bound"] == 2.0  # (1 + 3) / 2: successes only, misclassified out
    assert row["mean_guarantee_local"] == 0.875  # includes the 0 guarantee
