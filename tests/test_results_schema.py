"""The results schema and its column groups agree with each other and with the norms."""

from __future__ import annotations

import math

import pytest

from crosslip.norms import NORMS, P_VALUES, check_p, norm_p
from crosslip.report.tables import SUMMARY_COLUMNS
from crosslip.results_schema import (
    ATTACK_COLUMNS,
    CERTIFY_COLUMNS,
    GUARANTEE_COLUMNS,
    INSTANCE_SCHEMA,
    JOINED_COLUMNS,
    MEAN_COLUMNS,
    MODEL_KEYS,
    UPPER_COLUMNS,
    upper_bound_column,
)


def test_every_schema_column_comes_from_exactly_one_group():
    """A column is a model key, written by the certification or the attack stage, or
    computed at the join; only ``test_index`` (the join key) is in both stages."""
    groups = {
        "MODEL_KEYS": MODEL_KEYS,
        "CERTIFY_COLUMNS": CERTIFY_COLUMNS[1:],
        "ATTACK_COLUMNS": ATTACK_COLUMNS[1:],
        "JOINED_COLUMNS": JOINED_COLUMNS,
    }
    assert CERTIFY_COLUMNS[0] == ATTACK_COLUMNS[0] == "test_index"
    owners: dict[str, list[str]] = {}
    for name, cols in groups.items():
        assert len(set(cols)) == len(cols), name
        for c in cols:
            owners.setdefault(c, []).append(name)
    names = set(INSTANCE_SCHEMA.names) - {"test_index"}
    assert set(owners) == names, (
        f"schema columns in no group: {sorted(names - set(owners))}; group columns not in "
        f"the schema: {sorted(set(owners) - names)} (a new column goes in one group too)"
    )
    assert {c: o for c, o in owners.items() if len(o) > 1} == {}


def test_groups_are_subsets_in_schema_order():
    order = INSTANCE_SCHEMA.names
    assert MODEL_KEYS == order[: len(MODEL_KEYS)] and MODEL_KEYS[-1] == "test_error"
    for group in (GUARANTEE_COLUMNS, MEAN_COLUMNS, UPPER_COLUMNS):
        idx = [order.index(c) for c in group]
        assert idx == sorted(idx)
    assert set(GUARANTEE_COLUMNS) <= set(CERTIFY_COLUMNS)
    assert set(UPPER_COLUMNS) <= set(ATTACK_COLUMNS)
    assert set(MEAN_COLUMNS) - set(GUARANTEE_COLUMNS) == {"ratio_global_local"}


def test_each_norm_has_its_guarantee_and_upper_bound_columns():
    for name in NORMS:
        assert {f"guarantee_{name}", f"guarantee_{name}_box"} <= set(GUARANTEE_COLUMNS)
        assert upper_bound_column(name) in ATTACK_COLUMNS
        assert f"upper_bound_{name}_refined" in ATTACK_COLUMNS
    assert upper_bound_column("l2") == "upper_bound"
    with pytest.raises(ValueError, match="'l3'"):
        upper_bound_column("l3")


def test_summary_averages_every_guarantee_and_upper_bound():
    assert SUMMARY_COLUMNS[: len(MODEL_KEYS)] == MODEL_KEYS
    means = {c.removeprefix("mean_") for c in SUMMARY_COLUMNS if c.startswith("mean_")}
    assert means == {*MEAN_COLUMNS, "upper_bound", *UPPER_COLUMNS}


def test_norm_names_map_to_the_supported_p():
    assert NORMS == {"l1": 1.0, "l2": 2.0, "linf": math.inf}
    assert P_VALUES == (1.0, 2.0, math.inf)
    assert [norm_p(n) for n in NORMS] == list(P_VALUES)
    assert check_p(2) == 2.0 and isinstance(check_p(1), float)
    for bad in (0.5, 3, -math.inf):
        with pytest.raises(ValueError, match="only the 1-, 2- and inf-norms"):
            check_p(bad)
