"""A Delta `add` action's statistics for a Parquet file another writer made (Spark's executors), read from
the file's footer: Delta's JSON of numRecords, and per top-level column its nullCount and, where a bound is
exact in Delta's stats format, minValues and maxValues.

Written by hand because delta-rs computes these only for files it writes itself (or for a whole folder it
converts into a new table), and a file committed without them leaves every later merge unable to skip it.
A bound is left out rather than risked: a wrong one would make a reader skip a file that holds rows it
wants. Only integers, dates and strings get bounds: floats (NaN orders differently), timestamps (Delta keeps
milliseconds, a file microseconds), decimals and nested columns do not. Pure: pyarrow only."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# Delta keeps string bounds short; a prefix is a valid lower bound, a longer maximum is left out
STRING_PREFIX = 32


def _leaves(dtype: pa.DataType) -> int:
    """Parquet columns (leaves) a field of this type occupies."""
    if pa.types.is_struct(dtype):
        return sum(_leaves(dtype.field(i).type) for i in range(dtype.num_fields)) or 1
    if pa.types.is_map(dtype):
        return _leaves(dtype.key_type) + _leaves(dtype.item_type)
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return _leaves(dtype.value_type)
    return 1


def _bound(dtype: pa.DataType, value: Any, lower: bool) -> Any:
    """`value` in Delta's stats JSON, or None where no exact bound can be written."""
    if pa.types.is_integer(dtype) and isinstance(value, int):
        return value
    if pa.types.is_date32(dtype) and isinstance(value, dt.date):
        return value.isoformat()
    if (pa.types.is_string(dtype) or pa.types.is_large_string(dtype)) and isinstance(value, str):
        if len(value) <= STRING_PREFIX:
            return value
        return value[:STRING_PREFIX] if lower else None
    return None


def _column(meta: pq.FileMetaData, leaf: int, dtype: pa.DataType) -> tuple[int | None, Any, Any]:
    """(nulls, min, max) of one top-level column over the row groups; None where a row group lacks it."""
    nulls: int | None = 0
    low: Any = None
    high: Any = None
    bounded = True
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(leaf).statistics
        if stats is None or not stats.has_null_count:
            return None, None, None
        nulls = (nulls or 0) + stats.null_count
        if meta.row_group(g).num_rows == stats.null_count:
            continue  # only nulls: no bound to take
        if not stats.has_min_max:
            bounded = False
            continue
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    if not bounded or low is None:
        return nulls, None, None
    return nulls, _bound(dtype, low, lower=True), _bound(dtype, high, lower=False)


def delta_stats(meta: pq.FileMetaData) -> str:
    """The `stats` JSON of an add action for the file whose footer is `meta`."""
    schema = meta.schema.to_arrow_schema()
    stats: dict[str, Any] = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    leaf = 0
    for f in schema:
        width = _leaves(f.type)
        if width == 1 and not pa.types.is_nested(f.type):
            nulls, low, high = _column(meta, leaf, f.type)
            if nulls is not None:
                stats["nullCount"][f.name] = nulls
            if low is not None:
                stats["minValues"][f.name] = low
            if high is not None:
                stats["maxValues"][f.name] = high
        leaf += width
    return json.dumps(stats, separators=(",", ":"))
