"""The stages' Parquet files, without torch: atomic writes cast to a schema, and the empty
frame of a model that diverged. The instances job takes these from here rather than from
:mod:`.common` (which needs torch), so it does not pay torch's start-up."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..io.files import atomic_path
from ..results_schema import INSTANCE_SCHEMA


def write_parquet(df: pd.DataFrame, path: Path | str, schema: pa.Schema | None = None) -> None:
    """Write ``df`` to Parquet atomically (optionally cast to ``schema``)."""
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def empty_frame(columns: list[str]) -> pd.DataFrame:
    """No rows, the columns typed as in INSTANCE_SCHEMA (for a model that diverged)."""
    return pd.DataFrame(
        {c: pd.Series(dtype=INSTANCE_SCHEMA.field(c).type.to_pandas_dtype()) for c in columns}
    )
