"""An add action's statistics read from a footer (spark_jobs/delta/file_stats.py): exact where Delta's format
can hold a bound exactly, absent where it cannot, so no reader skips a file holding rows it wants."""

import datetime as dt
import json

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.delta.file_stats import STRING_PREFIX, delta_stats


def stats_of(table: pa.Table, tmp_path, **write) -> dict:
    pq.write_table(table, tmp_path / "f.parquet", **write)
    return json.loads(delta_stats(pq.read_metadata(tmp_path / "f.parquet")))


def test_bounds_span_every_row_group_and_nulls_are_counted(tmp_path):
    long = "x" * (STRING_PREFIX + 5)
    table = pa.table({
        "k": pa.array([5, None, -3, 40], pa.int64()),
        "name": pa.array(["b", long, None, "a"]),
        "day": pa.array([dt.date(2024, 3, 1), dt.date(2023, 1, 2), None, None]),
        "none": pa.array([None] * 4, pa.int32()),
    })
    stats = stats_of(table, tmp_path, row_group_size=2)  # two row groups: bounds over both
    assert stats == {
        "numRecords": 4,
        # a string longer than Delta keeps: its prefix still bounds from below; no upper bound is written
        "minValues": {"k": -3, "name": "a", "day": "2023-01-02"},
        "maxValues": {"k": 40, "day": "2024-03-01"},
        "nullCount": {"k": 1, "name": 1, "day": 2, "none": 4},
    }


def test_short_strings_keep_both_bounds_and_a_long_minimum_its_prefix(tmp_path):
    long = "m" * (STRING_PREFIX + 1)
    stats = stats_of(pa.table({"s": [long, "z"]}), tmp_path)
    assert (stats["minValues"], stats["maxValues"]) == ({"s": "m" * STRING_PREFIX}, {"s": "z"})


def test_types_whose_bounds_delta_cannot_hold_exactly_get_none(tmp_path):
    table = pa.table({
        "f": pa.array([1.5, float("nan")]),
        "at": pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, 1), dt.datetime(2024, 1, 2)], pa.timestamp("us", tz="UTC")),
        "n": pa.array([{"a": 1}, {"a": 2}]),
        "after": pa.array([7, 9], pa.int16()),  # a column after a nested one still finds its own footer column
    })
    stats = stats_of(table, tmp_path)
    assert (stats["minValues"], stats["maxValues"]) == ({"after": 7}, {"after": 9})
    assert stats["nullCount"] == {"f": 0, "at": 0, "after": 0}


def test_a_file_without_statistics_gives_only_its_row_count(tmp_path):
    stats = stats_of(pa.table({"k": [1, 2, 3]}), tmp_path, write_statistics=False)
    assert stats == {"numRecords": 3, "minValues": {}, "maxValues": {}, "nullCount": {}}
