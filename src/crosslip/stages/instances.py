"""The instances stage: certification and attack joined into the per-instance results."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..certified_accuracy import exact_points
from ..io.files import read_json
from ..norms import NORMS
from ..results_schema import INSTANCE_SCHEMA, model_keys
from .parquet import write_parquet


def instances_stage(
    certify: Path | str,
    attack: Path | str,
    metrics: Path | str,
    model_id: str,
    out: Path | str,
) -> pd.DataFrame:
    """Join certification and attack results with the model's identifiers (INSTANCE_SCHEMA)."""
    met = read_json(metrics)
    df = pd.read_parquet(certify).merge(
        pd.read_parquet(attack), on="test_index", how="outer", validate="one_to_one"
    )
    df["correct"] = df["pred"] == df["label"]
    ratio = df["guarantee_global"] / df["guarantee_local"]
    df["ratio_global_local"] = ratio.where(df["guarantee_local"] > 0)
    for norm in NORMS:
        df[f"exact_{norm}"] = exact_points(df, norm)
    for k, v in model_keys(met, model_id).items():
        df[k] = v
    df = df.sort_values("test_index")[INSTANCE_SCHEMA.names]
    write_parquet(df, out, INSTANCE_SCHEMA)
    return df
