"""Studies in the reproduction record (crosslip.reproduction.studies): a study's notes and
the tables generated from its JSON results, the committed study results against their own
identities, and the study script at a tiny size."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from crosslip.reproduction import render
from crosslip.reproduction.studies import load_studies, study_tables

from .helpers import ROOT, run_benchmark

STUDIES = ROOT / "docs" / "reproduction" / "studies"


def row(network: str, regularizer: str, epoch: int, scale: float) -> dict:
    """A study row whose figures are ``scale`` times a base (margin twice as much)."""
    return {
        "epoch": epoch,
        "network": network,
        "regularizer": regularizer,
        "lr": 0.5,
        "n_points": 10,
        "n_correct": 9,
        "test_error": 0.0125,
        "mean_guarantee": 0.5 * scale,
        "mean_guarantee_all_zero": 0.45 * scale,
        "mean_guarantee_train": 0.6 * scale,
        "gm_guarantee": 0.4 * scale,
        "gm_margin": 4.0 * scale**2,
        "gm_lip_point": 5.0 * scale,
        "gm_growth": 2.0,
        "mean_margin": 4.0,
        "mean_lip_point": 5.0,
        "mean_lip_radius": 10.0,
        "mean_growth": 2.0,
        "mean_first_order": 0.9 * scale,
        "mean_ascent_growth": 1.1,
        "mean_looseness": 1.8,
        "mean_radius": 0.5,
        "share_off": 0.5,
        "share_on": 0.25,
        "share_crossing": 0.125,
        "median_unit_sharpness": 12.0,
        "norm_w": 3.0,
        "norm_u": 30.0,
        "eval_seconds": 1.0,
        **(
            {
                "attack_points": 10,
                "mean_upper_bound": 1.5 * scale,
                "mean_upper_bound_refined": 1.4 * scale,
                "mean_upper_bound_min_norm": 1.3 * scale,
                "mean_upper_bound_best": 1.25 * scale,
                "share_best_paper": 0.1,
                "share_best_refined": 0.2,
                "share_best_min_norm": 0.7,
            }
            if epoch == 2
            else {}
        ),
    }


def result() -> dict:
    rows = [
        row(name, reg, epoch, scale)
        for epoch in (1, 2)
        for name, reg, scale in [("none 0 lr 0.5", "none", 1.0), ("cl", "cross_lipschitz", 0.8)]
    ]
    return {
        "machine": "a test machine",
        "dataset": "mnist5k",
        "n_train": 4000,
        "epochs": 2,
        "checkpoints": [1, 2],
        "points": 10,
        "train_points": 5,
        "attack_points": 10,
        "train_seconds": 120.0,
        "eval_seconds": 60.0,
        "rows": rows,
    }


def test_a_study_renders_its_notes_and_generated_tables(tmp_path: Path) -> None:
    folder = tmp_path / "docs" / "reproduction" / "studies" / "gap"
    folder.mkdir(parents=True)
    (folder / "notes.md").write_text("# Why the gap\n\nA hypothesis, and its verdict.\n")
    entry = {"command": "python study.py", "date": "today", "commit": "abc", "result": result()}
    (folder / "run-a.json").write_text(json.dumps(entry))
    (study,) = load_studies(tmp_path / "docs" / "reproduction")
    assert (study.name, study.title) == ("gap", "Why the gap")
    assert study.notes == "A hypothesis, and its verdict."
    md = render(tmp_path / "docs", root=ROOT)
    part = md[md.index("## Studies") :]
    assert "### Why the gap" in part and "A hypothesis, and its verdict." in part
    assert "#### Result `run-a.json`" in part and "`python study.py`; today, commit `abc`" in part
    end, versus, trend = study_tables(result())
    assert "epoch 2" in end[0] and list(end[1]["network"]) == ["none 0 lr 0.5", "cl"]
    assert list(end[1]["upper bound, paper's procedure"]) == ["1.50", "1.20"]
    assert list(end[1]["minimal-norm attack"]) == ["1.30", "1.04"]
    assert list(end[1]["best upper bound"]) == ["1.25", "1.00"]
    assert list(end[1]["best by paper / refined / min-norm"]) == ["10% / 20% / 70%"] * 2
    # CL against none at each epoch: 0.8 on the guarantee, 0.64 / 0.8 / 1 on its factors
    assert list(versus[1]["epoch"]) == ["1", "2"]
    assert list(versus[1]["guarantee"]) == ["×0.80", "×0.80"]
    assert list(versus[1]["= gm margin"]) == ["×0.64", "×0.64"]
    assert list(versus[1]["/ gm L(0)"]) == ["×0.80", "×0.80"]
    assert list(versus[1]["/ gm growth"]) == ["×1.00", "×1.00"]
    assert list(versus[1]["upper bound, paper's"]) == ["–", "×0.80"]
    assert list(versus[1]["best upper bound"]) == ["–", "×0.80"]
    assert len(trend[1]) == 4
    for _, frame in (end, versus, trend):
        for cell in frame.iloc[0]:
            assert str(cell) in part


def test_no_study_no_section(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    assert "## Studies" not in render(tmp_path / "docs", root=ROOT)


def committed(kind: str = "guarantee_gap") -> list[tuple[str, dict]]:
    """The committed study results of ``kind`` (``study_tables``: ``bracket`` or the
    guarantee-gap study's)."""
    found = [(p.name, json.loads(p.read_text())) for p in sorted(STUDIES.glob("*/*.json"))]
    found = [(n, e) for n, e in found if e["result"].get("kind", "guarantee_gap") == kind]
    if not found:
        pytest.skip("no study result is committed")
    return found


def test_committed_study_results_add_up() -> None:
    """The geometric mean of each network's guarantee is its margin's over L(0)'s over the
    growth's (to the search's tolerance and the points that have all three), and the mean
    over all points with 0 for errors is the mean over the correct ones times their share."""
    for name, entry in committed():
        for r in entry["result"]["rows"]:
            rebuilt = r["gm_margin"] / r["gm_lip_point"] / r["gm_growth"]
            assert math.isclose(rebuilt, r["gm_guarantee"], rel_tol=2e-3), (name, r["network"])
            share = r["n_correct"] / r["n_points"]
            assert math.isclose(
                r["mean_guarantee_all_zero"], r["mean_guarantee"] * share, rel_tol=1e-9
            )
            assert r["mean_first_order"] >= r["mean_guarantee"]
            assert r["gm_growth"] >= 1 and r["mean_ascent_growth"] >= 1


@pytest.mark.slow  # trains a tiny grid: the full tier
def test_the_study_script_runs_and_ends_with_one_json_line(tmp_path: Path) -> None:
    out = run_benchmark(
        "study_guarantee_gap.py",
        *("--hidden", "16", "--epochs", "2", "--checkpoints", "1", "2", "--points", "20"),
        *("--train-points", "8", "--attack-points", "6", "--ascent-steps", "3"),
        *("--networks", "none:0:0.5", "cross_lipschitz:1e-2:0.5", "--threads", "1"),
        *("--device", "cpu", "--out", str(tmp_path / "r.json")),
    )
    res = json.loads(out[-1])
    assert res["device"] == "cpu" and res["checkpoints"] == [1, 2]
    assert [(r["epoch"], r["regularizer"]) for r in res["rows"]] == [
        (1, "none"),
        (1, "cross_lipschitz"),
        (2, "none"),
        (2, "cross_lipschitz"),
    ]
    last = [r for r in res["rows"] if r["epoch"] == 2]
    for r in last:
        # every method found bounds, and the shares of the methods add up to 1
        means = [r[f"mean_upper_bound{k}"] for k in ("", "_refined", "_min_norm", "_best")]
        assert all(0 < m < math.inf for m in means), means
        shares = [r[f"share_best_{k}"] for k in ("paper", "refined", "min_norm")]
        assert math.isclose(sum(shares), 1.0)
    assert json.loads((tmp_path / "r.json").read_text())["result"] == res
    tables = study_tables(res)
    assert len(tables) == 3


def instances(model: str, reg: str, paper: float, best: float, upper: float) -> pd.DataFrame:
    """Four correctly classified points and one error of a network with these means."""
    return pd.DataFrame(
        {
            "dataset": "mnist5k",
            "model_id": model,
            "family": "mlp",
            "regularizer": reg,
            "test_error": 0.2,
            "correct": [True] * 4 + [False],
            "guarantee_local": [paper] * 4 + [9.0],
            "guarantee_l2": [paper] * 4 + [9.0],
            "guarantee_l2_integrated": [paper] * 4 + [9.0],
            "guarantee_l2_linear": [best] * 4 + [9.0],
            "guarantee_l2_curvature": [paper] * 4 + [9.0],
            "guarantee_l2_best": [best] * 4 + [9.0],
            "guarantee_l2_best_method": ["linear"] * 4 + [None],
            "upper_bound_l2_best": [upper] * 4 + [0.0],
        }
    )


def test_the_bracket_study_measures_what_each_certificate_closes(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "instances" / "mnist5k"
    folder.mkdir(parents=True)
    cl_rows = instances("cl", "cross_lipschitz", 0.5, 1.0, 2.0)
    cl_rows["guarantee_l2_best_box"] = [1.6] * 4 + [9.0]  # the box: more than the ball
    cl_rows.to_parquet(folder / "cl.parquet")
    instances("none", "none", 0.5, 0.5, 0.5 * math.e).to_parquet(folder / "none.parquet")
    out = tmp_path / "bracket.json"
    lines = run_benchmark(
        "study_bracket.py", "--results", str(tmp_path / "results"), "--out", str(out)
    )
    res = json.loads(lines[-1])
    assert json.loads(out.read_text())["result"] == res and res["kind"] == "bracket"
    cl, none = res["rows"]
    assert cl["n_correct"] == 4 and cl["bracket_paper"] == 4.0 and cl["bracket_best"] == 2.0
    assert math.isclose(cl["closed_linear"], 0.5) and cl["closed_curvature"] == 0
    assert cl["share_best_linear"] == 1.0 and cl["share_best_paper"] == 0.0
    assert math.isclose(none["bracket_best"], math.e) and none["closed_best"] == 0
    # every norm's bracket: L2's from its best certificate and upper bound, no L1 or Linf
    assert cl["bracket_best_l2"] == 2.0 and cl["share_exact_l2"] == 0.0
    assert math.isclose(none["bracket_best_l2"], math.e)
    assert math.isnan(cl["bracket_best_l1"]) and math.isnan(cl["share_exact_linf"])
    # the box's bracket (the attacks search the box): its certificate where the run has one
    assert math.isclose(cl["bracket_box_l2"], 1.25) and math.isclose(none["bracket_box_l2"], math.e)
    tables = study_tables(res)
    assert [len(frame) for _, frame in tables] == [2, 2, 2]
    assert "×2.00" in tables[0][1]["best per point"].iloc[0]
    assert tables[1][1]["linear relaxation"].iloc[0] == "50%"
    assert tables[2][1]["l2"].iloc[0] == "1.00 (×2.00); 1.60 (×1.25) / 2.00, 0% exact"


def test_the_settings_study_compares_on_the_points_both_networks_get_right(tmp_path: Path) -> None:
    """Plain against augment: the means are taken on the points both classify correctly
    (the augmented network is right on one more point, whose small guarantee the claims'
    means include and the study's common means leave out)."""
    folder = tmp_path / "results" / "instances" / "mnist5k"
    folder.mkdir(parents=True)
    plain = instances("n", "none", 0.5, 0.6, 1.0).assign(setting="plain", lam=0.0)
    plain["test_index"], plain["margin"] = range(5), 4.0
    other = plain.assign(setting="augment", model_id="n-augment")
    other["correct"] = True
    other["guarantee_local"] = [0.25] * 4 + [0.05]
    plain.to_parquet(folder / "n.parquet")
    other.to_parquet(folder / "n-augment.parquet")
    out = tmp_path / "settings.json"
    lines = run_benchmark(
        "study_settings.py", "--results", str(tmp_path / "results"), "--out", str(out)
    )
    res = json.loads(lines[-1])
    assert json.loads(out.read_text())["result"] == res and res["kind"] == "settings"
    (row,) = res["rows"]
    assert (row["setting"], row["common"], row["correct_other"]) == ("augment", 4, 5)
    assert row["guarantee_ratio_common"] == 0.5 and row["margin_ratio_common"] == 1.0
    assert math.isclose(row["guarantee_ratio_own"], (0.25 * 4 + 0.05) / 5 / 0.5)
    ((_, table),) = study_tables(res)
    assert table["guarantee (Prop. 2.3)"].iloc[0] == "0.500 → 0.250 (×0.50)"


def test_the_committed_trust_region_study_adds_up_and_renders() -> None:
    """``study_trust_region.py``'s committed result: the new best is the larger of the
    run's best and the new certificate per point (so never below either mean), the brackets
    are the upper bound's mean over them, and the record renders its table."""
    path = ROOT / "docs/reproduction/studies/guarantee-gap/mnist5k-200ep-trust-region.json"
    res = json.loads(path.read_text())["result"]
    assert res["kind"] == "trust_region" and len(res["rows"]) == 5
    for r in res["rows"]:
        assert r["mean_best"] >= max(r["mean_best_run"], r["mean_curvature_trust_region"])
        assert r["mean_curvature_trust_region"] >= r["mean_curvature_lambda_max"]
        assert math.isclose(r["bracket_best"], r["mean_upper_bound_best"] / r["mean_best"])
        assert math.isclose(r["bracket_run"], r["mean_upper_bound_best"] / r["mean_best_run"])
    ((title, table),) = study_tables(res)
    assert "minimised over the ball" in title and len(table) == 5
    assert table["best per point (bracket): run → with it"].str.contains("→").all()


def finished_run_files(res: Path, net, n: int, seed: int):
    """The files a finished run leaves for the studies to read, under ``res``: ``n``
    random 6-pixel digits of 3 classes as mnist5k's prepared data (test = training split)
    and ``net`` as the model ``net``. Returns the digits (n, 6)."""
    import numpy as np

    from crosslip.data.dataset import Dataset, save_prepared
    from crosslip.models.checkpoints import save_model

    gen = np.random.default_rng(seed)
    x = gen.integers(0, 256, (n, 6)).astype(np.float32) / 255
    y = gen.integers(0, 3, n)
    (res / "data").mkdir(parents=True)
    save_prepared(Dataset("mnist5k", x, y, x, y, (6,), 3), res / "data" / "mnist5k.npz")
    save_model(net, res / "models" / "mnist5k" / "net" / "model.pt")
    return x


def test_the_trust_region_study_runs_on_a_finished_runs_files(tmp_path: Path) -> None:
    """A results folder as the workflow leaves it (prepared data, a model, its instances):
    the study certifies the first correct points again and relates them to the run's."""
    import torch

    from .helpers import random_net

    res = tmp_path / "results"
    net = random_net(6, 3, 10, 4, 2.0)
    x = finished_run_files(res, net.float(), 12, seed=0)
    with torch.no_grad():
        pred = net.double()(torch.as_tensor(x, dtype=torch.float64)).argmax(1).numpy()
    frame = instances("net", "cross_lipschitz", 0.1, 0.2, 5.0).iloc[:4]
    frame = pd.concat([frame] * 3, ignore_index=True)
    frame["test_index"], frame["pred"], frame["setting"] = range(12), pred, "plain"
    (res / "instances" / "mnist5k").mkdir(parents=True)
    frame.to_parquet(res / "instances" / "mnist5k" / "net.parquet")
    out = tmp_path / "tr.json"
    lines = run_benchmark(
        "study_trust_region.py",
        "--results",
        str(res),
        "--points",
        "6",
        "--steps",
        "4",
        "--out",
        str(out),
    )
    result = json.loads(lines[-1])
    assert json.loads(out.read_text())["result"] == result and result["kind"] == "trust_region"
    (row,) = result["rows"]
    assert row["points"] == 6 and math.isclose(row["mean_best_run"], 0.2)
    assert row["mean_best"] >= max(0.2, row["mean_curvature_trust_region"])
    assert row["mean_curvature_trust_region"] >= row["mean_curvature_lambda_max"]
    assert math.isclose(row["bracket_best"], 5.0 / row["mean_best"])


def test_the_soundness_study_finds_no_sample_inside_a_certified_ball(tmp_path: Path) -> None:
    """On a finished run's files, the strong attack's samples are verified and never closer
    than the run's certificates; a certificate made too large is caught as a violation."""
    import torch

    from crosslip.certify import certify_softplus

    from .helpers import random_net

    res = tmp_path / "results"
    net = random_net(6, 3, 10, 4, 2.0, bias=False).double()
    x = finished_run_files(res, net, 10, seed=1)
    cert = certify_softplus(net, torch.as_tensor(x, dtype=torch.float64), kinds=("l2", "linf"))
    frame = instances("net", "cross_lipschitz", 0.1, 0.2, 5.0).iloc[:1]
    frame = pd.concat([frame] * 10, ignore_index=True)
    frame["test_index"], frame["setting"] = range(10), "plain"
    frame["pred"] = cert["pred"].numpy()
    frame["correct"] = True
    for norm in ("l2", "linf"):
        frame[f"guarantee_{norm}_best"] = cert[f"guarantee_{norm}_best"].numpy()
    frame.loc[0, "guarantee_linf_best"] = 10.0  # a certificate far too large: caught
    (res / "instances" / "mnist5k").mkdir(parents=True)
    frame.to_parquet(res / "instances" / "mnist5k" / "net.parquet")
    lines = run_benchmark(
        "study_soundness.py",
        *("--results", str(res), "--points", "10", "--norms", "l2", "linf"),
        *("--steps", "30", "--restarts", "1"),
    )
    result = json.loads(lines[-1])
    rows = {r["norm"]: r for r in result["rows"]}
    assert result["kind"] == "soundness" and set(rows) == {"l2", "linf"}
    assert rows["l2"]["violations"] == 0 and rows["l2"]["found"] == 10
    assert rows["l2"]["ratio_min"] >= 1.0
    assert rows["linf"]["violations"] == 1 and result["violations"] == 1


def test_the_committed_soundness_study_finds_no_violation_and_renders() -> None:
    """``study_soundness.py``'s committed result on the networks trained for the
    certificate: no verified sample inside any best certificate's ball (every ratio of the
    attack to the certificate at least 1), and the record renders one row per network and
    norm."""
    path = ROOT / "docs/reproduction/studies/soundness/mnist-certified.json"
    res = json.loads(path.read_text())["result"]
    assert res["kind"] == "soundness" and res["violations"] == 0
    assert {r["norm"] for r in res["rows"]} == {"l2", "l1", "linf"}
    for r in res["rows"]:
        assert r["violations"] == 0 and r["ratio_min"] >= 1.0, (r["network"], r["norm"])
        assert 0 < r["found"] <= r["points"]
    ((title, table),) = study_tables(res)
    assert "thorough budget" in title and len(table) == len(res["rows"])
    assert (table["violations"] == "0").all()
