"""Pipeline stages without Snakemake: a diverged model keeps its row, files are atomic."""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from crosslip.attacks import min_norm_attack
from crosslip.config.schema import default
from crosslip.data import Dataset, save_prepared
from crosslip.io.files import write_json
from crosslip.models import SoftplusNet
from crosslip.models.checkpoints import load_model, save_model
from crosslip.models.kernels import GaussianKernelModel
from crosslip.models.resnet import ResNet
from crosslip.pipeline import (
    attack_stage,
    certify_stage,
    eval_indices,
    instances_stage,
    train_stage,
)
from crosslip.report.tables import add_diverged, kernel_table, summarize, table1
from crosslip.results_schema import INSTANCE_SCHEMA, L2_UPPER_METHODS
from crosslip.stages.attack import best_l2_upper_bound

from .helpers import random_net


def tiny_dataset(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(40, 6)) / 255).astype(np.float32)
    y = rng.integers(0, 3, size=40).astype(np.int64)
    ds = Dataset("toy", x[:30], y[:30], x[30:], y[30:], (6,), 3)
    save_prepared(ds, tmp_path / "toy.npz")
    return tmp_path / "toy.npz"


def run_stages(tmp_path, status, net=None):
    data = tiny_dataset(tmp_path)
    net = random_net(6, 3, 8, 0, 4.0).float() if net is None else net  # varied predictions
    save_model(net, tmp_path / "model.pt")
    cfg = {"regularizer": "none", "lr": 0.1, "lam": 0.0, "seed": 0}
    metrics = {
        "status": status,
        "dataset": "toy",
        "model_id": "m",
        "config": cfg,
        "test_error": None if status != "ok" else 0.5,
    }
    write_json(metrics, tmp_path / "metrics.json")
    certify_stage(
        data,
        tmp_path / "model.pt",
        tmp_path / "metrics.json",
        tmp_path / "c.parquet",
        n_points=6,
        rtol=1e-3,
    )
    attack_stage(
        data,
        tmp_path / "model.pt",
        tmp_path / "metrics.json",
        tmp_path / "a.parquet",
        n_points=6,
        rtol=1e-3,
        max_steps=20,
    )
    df = instances_stage(
        tmp_path / "c.parquet",
        tmp_path / "a.parquet",
        tmp_path / "metrics.json",
        "m",
        tmp_path / "i.parquet",
    )
    return df, metrics


def test_stages_write_the_instance_schema(tmp_path):
    df, _ = run_stages(tmp_path, "ok")
    table = pq.read_table(tmp_path / "i.parquet")
    assert table.schema.equals(INSTANCE_SCHEMA, check_metadata=False)
    assert len(df) == 6 and list(df["test_index"]) == list(eval_indices(10, 6))
    ok = df["attack_success"]
    for col in ("guarantee_local", "guarantee_global", "guarantee_l2", "guarantee_l2_box"):
        assert (df.loc[ok, "upper_bound"] >= df.loc[ok, col]).all(), col
    assert (df["local_bound"] == "prop2.3").all()
    assert df["float32_agrees"].dtype == bool
    assert df.loc[df["margin"].abs() > 1e-4, "float32_agrees"].all()
    for p in ("l2", "l1", "linf"):  # refined never worse; every bound above its guarantee
        paper = df["upper_bound" if p == "l2" else f"upper_bound_{p}"]
        refined = df[f"upper_bound_{p}_refined"]
        assert paper.notna().any() and (refined <= paper).all()
        assert (refined.dropna() >= df.loc[refined.notna(), f"guarantee_{p}_box"]).all()
    assert (df["guarantee_l2"] >= df[["guarantee_local", "guarantee_global"]].max(axis=1)).all()
    for p in ("l2", "l1", "linf"):
        assert (df[f"guarantee_{p}_box"] >= df[f"guarantee_{p}"]).all()
        assert df[f"guarantee_{p}"].notna().all()
    # the minimal-norm attack (on by default), from the refined samples, and the best bound
    l2 = df[list(L2_UPPER_METHODS.values())]
    mn, refined = df["upper_bound_l2_min_norm"], df["upper_bound_l2_refined"]
    assert mn.notna().sum() >= refined.notna().sum() > 0
    assert (mn[refined.notna()] <= refined.dropna() * (1 + 1e-4)).all()
    assert (mn.dropna() >= df.loc[mn.notna(), "guarantee_l2_box"]).all()
    assert np.array_equal(df["upper_bound_l2_best"], l2.min(axis=1), equal_nan=True)
    found = df["upper_bound_l2_best"].notna()
    chosen = [
        df.loc[i, L2_UPPER_METHODS[m]]
        for i, m in df.loc[found, "upper_bound_l2_best_method"].items()
    ]
    assert np.array_equal(chosen, df.loc[found, "upper_bound_l2_best"])
    assert df.loc[~found, "upper_bound_l2_best_method"].isna().all()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_best_l2_upper_bound_is_the_smallest_and_names_the_earlier_method_on_a_tie():
    nan = np.nan
    df = pd.DataFrame(
        {
            "upper_bound": [1.0, 2.0, nan, 3.0, nan],
            "upper_bound_l2_refined": [1.0, 1.5, nan, 3.0, nan],
            "upper_bound_l2_min_norm": [1.0, 1.2, 0.7, 2.5, nan],
        }
    )
    best, method = best_l2_upper_bound(df)
    assert np.array_equal(best, [1.0, 1.2, 0.7, 2.5, nan], equal_nan=True)
    assert list(method) == ["paper", "min_norm", "min_norm", "min_norm", None]
    best, method = best_l2_upper_bound(df.drop(columns="upper_bound_l2_min_norm"))  # off
    assert np.array_equal(best, [1.0, 1.5, nan, 3.0, nan], equal_nan=True)
    assert list(method) == ["paper", "refined", None, "paper", None]
    best, method = best_l2_upper_bound(df.iloc[:0])
    assert best.shape == method.shape == (0,)


def test_min_norm_steps_0_turns_the_attack_off(tmp_path):
    data = tiny_dataset(tmp_path)
    save_model(random_net(6, 3, 8, 0, 4.0).float(), tmp_path / "model.pt")
    cfg = {"regularizer": "none", "lr": 0.1, "lam": 0.0, "seed": 0}
    write_json(
        {"status": "ok", "dataset": "toy", "model_id": "m", "config": cfg, "test_error": 0.5},
        tmp_path / "metrics.json",
    )
    inputs = (data, tmp_path / "model.pt", tmp_path / "metrics.json", tmp_path / "a.parquet")
    df = attack_stage(*inputs, n_points=6, rtol=1e-3, max_steps=20, norms=("l2",), min_norm_steps=0)
    assert df["upper_bound_l2_min_norm"].isna().all()
    both = df[["upper_bound", "upper_bound_l2_refined"]]
    assert np.array_equal(df["upper_bound_l2_best"], both.min(axis=1), equal_nan=True)
    assert set(df["upper_bound_l2_best_method"].dropna()) <= {"paper", "refined"}
    df = attack_stage(*inputs, n_points=6, rtol=1e-3, max_steps=20, norms=("linf",))
    assert df["upper_bound_l2_best"].isna().all()  # no L2: no best L2 bound
    assert df["upper_bound_l2_best_method"].isna().all()
    table = pq.read_table(tmp_path / "a.parquet")
    assert table.schema.field("upper_bound_l2_best_method").type in (pa.string(), pa.null())


def test_the_attack_settings_are_one_object_with_the_schemas_defaults():
    """The attack rule's params are the settings' fields (the minimal-norm attack's as
    ``min_norm_<field>``), their defaults the schema's, and the stage and the attack have
    no default of their own."""
    from crosslip.attacks.settings import DEFAULT_SETTINGS, FLAT_NAMES, AttackSettings
    from crosslip.jobs.batches import EVALUATION_PARAMS

    assert sorted(FLAT_NAMES) == sorted(EVALUATION_PARAMS["attack"])
    params = {name: default(key) for name, key in EVALUATION_PARAMS["attack"].items()}
    assert AttackSettings.from_params({**params, "code": "x"}) == DEFAULT_SETTINGS
    for name, key in EVALUATION_PARAMS["attack"].items():
        if name.startswith("min_norm_"):
            got = getattr(DEFAULT_SETTINGS.min_norm, name.removeprefix("min_norm_"))
        else:
            got = getattr(DEFAULT_SETTINGS, name)
        want = default(key)
        assert got == (tuple(want) if isinstance(want, list) else want), name
    changed = DEFAULT_SETTINGS.but(min_norm_steps=7, rtol=0.01)
    assert changed.min_norm.steps == 7 and changed.rtol == 0.01
    for fn in (attack_stage, min_norm_attack):
        names = inspect.signature(fn).parameters
        assert not {"steps", "targets", "min_norm_steps", "refine_steps"} & set(names)
    with pytest.raises(TypeError):
        DEFAULT_SETTINGS.but(min_norm_stepz=3)


def test_kernel_models_get_the_proposition_22_guarantee(tmp_path):
    rng = np.random.default_rng(1)
    centers = torch.as_tensor(rng.random((12, 6)))
    model = GaussianKernelModel(centers, 3, gamma=2.0)
    with torch.no_grad():  # each centre votes for one class: nearest-centre-like regions
        model.coef.copy_(torch.eye(3, dtype=torch.float64).repeat(1, 4))
    df, _ = run_stages(tmp_path, "ok", model)
    loaded = load_model(tmp_path / "model.pt")
    assert isinstance(loaded, GaussianKernelModel) and torch.equal(loaded.coef, model.coef)
    assert (df["local_bound"] == "prop2.2").all()
    assert (df["guarantee_local"] > 0).all() and (df["guarantee_l2"] == df["guarantee_local"]).all()
    assert df[["guarantee_global", "guarantee_l1", "guarantee_linf_box"]].isna().all().all()
    ok = df["attack_success"]
    assert ok.any() and (df.loc[ok, "upper_bound"] >= df.loc[ok, "guarantee_local"]).all()


def test_a_point_where_float32_decides_otherwise_gets_no_guarantee(tmp_path):
    """Class 1 wins in float64 by ``1e-9 - exp(10 (x_0 + b))``; cast to float32, both logits
    round to 1.0, the tie goes to class 0. The threshold b splits the eval points: where
    ``x_0`` is large, class 0 wins by far in both precisions."""
    data = tiny_dataset(tmp_path)
    from crosslip.data import load_prepared

    x0 = np.sort(load_prepared(data).x_test[eval_indices(10, 6), 0].astype(np.float64))
    cut = 0.5 * (x0[2] + x0[3])  # three points on each side
    b = np.log(1e-9) / 10 - cut  # float64: class 1 iff exp(10 (x_0 + b)) < 1e-9
    net = SoftplusNet(6, 2, hidden=1, alpha=10.0, bias=True).double().eval()
    with torch.no_grad():
        net.hidden_layer.weight.copy_(torch.tensor([[1.0, 0, 0, 0, 0, 0]], dtype=torch.float64))
        net.hidden_layer.bias.fill_(b)
        net.output_layer.weight.copy_(torch.tensor([[10.0], [0.0]], dtype=torch.float64))
        net.output_layer.bias.copy_(torch.tensor([1.0, 1.0 + 1e-9], dtype=torch.float64))
    df, _ = run_stages(tmp_path, "ok", net)
    assert pq.read_table(tmp_path / "i.parquet").schema.equals(
        INSTANCE_SCHEMA, check_metadata=False
    )
    with torch.no_grad():
        x = torch.as_tensor(load_prepared(data).x_test[df["test_index"].to_numpy()])
        pred32 = net.float()(x.float()).argmax(1).numpy()
    assert (df["float32_agrees"].to_numpy() == (pred32 == df["pred"].to_numpy())).all()
    split = df["float32_agrees"]
    assert split.any() and (~split).any()
    assert (df.loc[~split, "pred"] == 1).all() and (df.loc[split, "pred"] == 0).all()
    for col in (
        "guarantee_local",
        "guarantee_global",
        "guarantee_l2",
        "guarantee_l1",
        "guarantee_linf",
        "guarantee_l2_box",
        "guarantee_l1_box",
        "guarantee_linf_box",
    ):
        assert (df.loc[~split, col] == 0).all(), col  # float64 alone would certify these
        assert (df.loc[split, col] > 0).all(), col
    assert (df.loc[~split, "bound_class"] == -1).all()


def test_diverged_model_has_no_instances_but_keeps_its_summary_row(tmp_path):
    df, metrics = run_stages(tmp_path, "diverged")
    assert len(df) == 0
    assert pq.read_table(tmp_path / "i.parquet").schema.equals(
        INSTANCE_SCHEMA, check_metadata=False
    )
    summary = add_diverged(summarize(df), [metrics])
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["status"] == "diverged" and row["n_eval"] == 0


def test_eval_indices_are_a_fixed_sorted_subset():
    a = eval_indices(1000, 200)
    assert len(a) == 200 and np.all(np.diff(a) > 0) and np.array_equal(a, eval_indices(1000, 200))
    assert np.array_equal(eval_indices(50, 200), np.arange(50))


def test_table1_takes_the_best_model_per_regularizer():
    rows = []
    for reg, err, ratio in (
        ("none", 0.02, 0.7),
        ("none", 0.03, 0.5),
        ("cross_lipschitz", 0.025, 0.2),
    ):
        rows.append(
            {
                "dataset": "mnist",
                "model_id": f"{reg}-{err}",
                "regularizer": reg,
                "setting": "plain",
                "family": "mlp",
                "status": "ok",
                "test_error": err,
                "n_correct": 10,
                "mean_ratio_global_local": ratio,
            }
        )
    rows.append(
        {
            **rows[0],
            "model_id": "bad",
            "status": "diverged",
            "test_error": None,
            "mean_ratio_global_local": None,
        }
    )
    t = table1(pd.DataFrame(rows)).set_index("regularizer")
    assert t.loc["none", "mean_ratio_global_local"] == 0.7
    assert t.loc["none", "mean_ratio_all_models"] == 0.6
    assert t.loc["cross_lipschitz", "model_id"] == "cross_lipschitz-0.025"


def test_kernel_table_takes_the_best_model_per_method():
    rows = [
        {
            "dataset": "mnist",
            "model_id": f"{reg}-{lam}-{err}",
            "family": "kernel",
            "regularizer": reg,
            "lam": lam,
            "kernel_a": 1.0,
            "status": "ok",
            "test_error": err,
            "n_correct": 10,
            "mean_upper_bound": 2.0 + err,
            "mean_upper_bound_linf": 0.1 + err,
            "mean_guarantee_local": 0.05,
            "attack_success_rate": 1.0,
        }
        for reg, lam, err in (
            ("kernel_logreg", 0.0, 0.03),
            ("kernel_logreg", 1e-6, 0.02),
            ("kernel_logreg", 1e-5, 0.01),
            ("kernel_cl", 0.1, 0.015),
            ("kernel_cl", 1.0, 0.04),
        )
    ]
    rows.append({**rows[2], "model_id": "bad", "status": "diverged", "test_error": 0.0})
    rows.append(
        {**rows[2], "model_id": "net", "family": "mlp", "regularizer": "none", "test_error": 0.001}
    )
    t = kernel_table(pd.DataFrame(rows)).set_index("method")
    assert list(t.index) == ["No Reg.", "K-LogReg", "K-CL"]
    assert list(t["model_id"]) == [
        "kernel_logreg-0.0-0.03",
        "kernel_logreg-1e-05-0.01",
        "kernel_cl-0.1-0.015",
    ]
    assert t.loc["K-CL", "mean_upper_bound"] == 2.015
    assert t.loc["K-CL", "mean_upper_bound_linf"] == 0.115  # the paper's Linf column


def test_a_resnet_trains_in_the_stage_and_gets_upper_bounds_but_no_guarantee(tmp_path):
    rng = np.random.default_rng(2)
    x = (rng.integers(0, 256, size=(96, 64)) / 255).astype(np.float32)
    y = (x.reshape(96, 8, 8)[:, :4].mean((1, 2)) > 0.5).astype(np.int64)  # top half bright
    save_prepared(Dataset("img", x[:64], y[:64], x[64:], y[64:], (8, 8, 1), 2), tmp_path / "d.npz")
    params = {
        "arch": "resnet",
        "resnet_blocks": 1,
        "regularizer": "cross_lipschitz",
        "lam": 1e-3,
        "lr": 0.1,
        "epochs": 2,
        "batch_size": 16,
        "seed": 0,
    }
    met = train_stage(tmp_path / "d.npz", params, "m", tmp_path / "m.pt", tmp_path / "m.json")
    assert met["status"] == "ok" and met["config"]["arch"] == "resnet"
    net = load_model(tmp_path / "m.pt")
    assert isinstance(net, ResNet) and net.depth() == 8
    cert = certify_stage(
        tmp_path / "d.npz",
        tmp_path / "m.pt",
        tmp_path / "m.json",
        tmp_path / "c.parquet",
        n_points=8,
        rtol=1e-3,
    )
    assert (cert["local_bound"] == "none").all() and cert["guarantee_local"].isna().all()
    att = attack_stage(
        tmp_path / "d.npz",
        tmp_path / "m.pt",
        tmp_path / "m.json",
        tmp_path / "a.parquet",
        n_points=8,
        rtol=1e-2,
        max_steps=10,
        norms=("l2",),
        refine_steps=1,
        min_norm_steps=20,
        min_norm_restarts=1,
    )
    assert att["upper_bound"].notna().any()
    ok = att["upper_bound_l2_refined"].notna()
    mn, refined = att.loc[ok, "upper_bound_l2_min_norm"], att.loc[ok, "upper_bound_l2_refined"]
    assert ok.any() and (mn <= refined * (1 + 1e-4)).all()
