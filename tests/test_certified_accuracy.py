"""Certified accuracy and its attack bound in the summary (crosslip.certified_accuracy),
against a plain loop over the instances, and never above the attack's."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from crosslip.certified_accuracy import accuracy_columns
from crosslip.report.tables import summarize
from crosslip.results_schema import INSTANCE_SCHEMA

RADII = {"l2": [0.5, 1.0, 1.58], "l1": [1.0, 4.0], "linf": [0.01, 0.1]}


def random_instances(seed: int, n: int = 250) -> pd.DataFrame:
    """Per-instance rows of three models: certificates below every upper bound, some
    missing (no certificate, no sample found), some points wrong."""
    rng = np.random.default_rng(seed)
    frames = []
    for m in range(3):
        row = {"dataset": "d", "model_id": f"m{m}", "family": "mlp", "regularizer": "none"}
        row.update(lr=0.2, lam=0.0, kernel_a=np.nan, seed=0, setting="plain", status="ok")
        df = pd.DataFrame([row] * n)
        df["test_error"] = 0.1
        df["correct"] = rng.random(n) < 0.85
        df["pred"] = 1.0
        only_attacked = rng.random(n) < 0.1  # attacked, not certified: not evaluated
        df.loc[only_attacked, "pred"] = np.nan
        df.loc[only_attacked, "correct"] = False
        scale = {"l2": 1.0, "l1": 3.0, "linf": 0.05}
        for norm, s in scale.items():
            cert = rng.exponential(s, n)
            cert[rng.random(n) < 0.05] = np.nan
            df[f"guarantee_{norm}_best"] = cert
            ups = [np.where(np.isnan(cert), s, cert) * (1 + rng.exponential(0.4, n)) for _ in "ab"]
            for u in ups:
                u[rng.random(n) < 0.05] = np.nan
            if norm == "l2":
                df["upper_bound_l2_best"] = np.fmin(*ups)
            else:
                df[f"upper_bound_{norm}"], df[f"upper_bound_{norm}_refined"] = ups
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    for col in INSTANCE_SCHEMA.names:  # the rest of the schema, empty
        if col not in out:
            out[col] = np.nan
    return out


def by_loop(rows: pd.DataFrame, norm: str, eps: float) -> tuple[float, float]:
    """(certified, attack) accuracy of one model's rows, point by point, over the rows
    with a prediction."""
    rows = rows[rows["pred"].notna()]
    cert = att = 0
    for _, r in rows.iterrows():
        g = r[f"guarantee_{norm}_best"]
        if norm == "l2":
            ups = [r["upper_bound_l2_best"]]
        else:
            ups = [r[f"upper_bound_{norm}"], r[f"upper_bound_{norm}_refined"]]
        found = [u for u in ups if not math.isnan(u)]
        if r["correct"] and not math.isnan(g) and g >= eps:
            cert += 1
        if r["correct"] and (not found or min(found) > eps):
            att += 1
    return cert / len(rows), att / len(rows)


@pytest.mark.parametrize("seed", [0, 1])
def test_columns_equal_a_plain_count_and_never_exceed_the_attack(seed):
    inst = random_instances(seed)
    summary = summarize(inst, RADII)
    assert list(summary.columns[-len(accuracy_columns(RADII)) :]) == accuracy_columns(RADII)
    for _, row in summary.iterrows():
        rows = inst[inst["model_id"] == row["model_id"]]
        for norm, radii in RADII.items():
            for eps in radii:
                cert, att = by_loop(rows, norm, eps)
                assert row[f"certified_accuracy_{norm}_{eps:g}"] == pytest.approx(cert)
                assert row[f"attack_accuracy_{norm}_{eps:g}"] == pytest.approx(att)
                assert cert <= att


def test_a_norm_without_certificates_or_attacks_has_empty_columns():
    inst = random_instances(2)
    inst["guarantee_linf_best"] = np.nan
    inst[["upper_bound_l1", "upper_bound_l1_refined"]] = np.nan
    row = summarize(inst, RADII).iloc[0]
    assert math.isnan(row["certified_accuracy_linf_0.1"])
    assert not math.isnan(row["attack_accuracy_linf_0.1"])
    assert math.isnan(row["attack_accuracy_l1_1"])
    assert not math.isnan(row["certified_accuracy_l1_1"])


def test_column_names_follow_the_radii_as_written():
    assert accuracy_columns({"l2": [1.58, 1.0]}) == [
        "certified_accuracy_l2_1.58",
        "attack_accuracy_l2_1.58",
        "certified_accuracy_l2_1",
        "attack_accuracy_l2_1",
    ]
    with pytest.raises(ValueError, match="l3"):
        accuracy_columns({"l3": [1.0]})


def test_exact_points_and_their_share_equal_a_plain_check():
    """A point is exact where its best certificate is within 1% of its best upper bound;
    the summary's share counts them among the correct points."""
    from crosslip.certified_accuracy import exact_points

    inst = random_instances(3)
    # some certificates right at the upper bound: exact
    close = inst.index[::7]
    inst.loc[close, "guarantee_l2_best"] = inst.loc[close, "upper_bound_l2_best"] * 0.995
    flags = exact_points(inst, "l2")
    for i, r in inst.iterrows():
        g, u = r["guarantee_l2_best"], r["upper_bound_l2_best"]
        if math.isnan(g) or math.isnan(u):
            assert flags[i] is None
        else:
            assert flags[i] == (g >= 0.99 * u)
    summary = summarize(inst, RADII)
    for _, row in summary.iterrows():
        rows = inst[(inst["model_id"] == row["model_id"]) & inst["correct"]]
        want = np.mean([f is True for f in exact_points(rows, "l2")])
        assert row["share_exact_l2"] == pytest.approx(want) and want > 0


def test_exactness_is_judged_in_the_box_that_the_attacks_search():
    """The attacks keep their samples in the box, so a point is exact where its box
    certificate (at least the ball's) meets the upper bound; the certified accuracy stays
    the ball's."""
    from crosslip.certified_accuracy import best_upper_bound, certified_share, exact_points

    inst = random_instances(4)
    up = best_upper_bound(inst, "linf")
    inst["guarantee_linf_best"] = up * 0.5  # the ball: far below every upper bound
    inst["guarantee_linf_best_box"] = up * 0.995  # the box: at it
    inst.loc[inst.index[::5], "guarantee_linf_best_box"] = np.nan  # no box: the ball's
    flags = exact_points(inst, "linf")
    known = up.notna()
    box_known = inst["guarantee_linf_best_box"].notna()
    assert all(flags[known & box_known] == True)  # noqa: E712
    assert all(flags[known & ~box_known] == False)  # noqa: E712
    assert flags[~known].isna().all()
    ball_only = inst.drop(columns=["guarantee_linf_best_box"])
    eps = np.array([0.01, 0.05])
    assert np.array_equal(
        certified_share(inst, "linf", eps), certified_share(ball_only, "linf", eps)
    )
    assert not any(f is True for f in exact_points(ball_only, "linf"))
