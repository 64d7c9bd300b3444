"""delta.reads.read_arrow's filter (what the silver pass reads of a big silver table: the rows of the batch's keys, not the
table): exactly the rows a full read then filtered would give, over many files, with the value sets of another type
than the table's columns."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake

from spark_jobs.delta.reads import read_arrow
from spark_jobs.layers.keyed_reads import among


def test_a_filtered_read_keeps_exactly_the_rows_of_the_keys_or_the_other_condition(tmp_path):
    path = str(tmp_path / "silver")
    for part in range(3):  # three commits, three files
        ids = list(range(part * 100, part * 100 + 100))
        write_deltalake(path, pa.table({
            "id": pa.array(ids, pa.int64()), "region": pa.array([f"r{i % 3}" for i in ids], pa.string_view()),
            "_seq": [f"{i:08d}" for i in ids], "_batch_id": pa.array([f"b{part}" for _ in ids], pa.string_view())}),
            mode="append")
    # strings as delta-rs writes them (views); the batch's keys as typed by Spark: int32 ids, plain strings, and
    # pairs of which only some are rows (id 7 is in r1, not r2)
    keys = pa.table({"id": pa.array([7, 7, 150, 299, 1000], pa.int32()), "region": ["r1", "r2", "r0", "r2", "r1"]})
    got = read_arrow(path, ["id", "region", "_seq", "_batch_id"], where=among(keys, ("_batch_id", "b1")))
    whole = read_arrow(path, ["id", "region", "_seq", "_batch_id"])
    assert whole is not None and whole.num_rows == 300
    expected = {(r["id"], r["region"]) for r in whole.to_pylist() if r["_batch_id"] == "b1" or (
        r["id"] in {7, 150, 299, 1000} and r["region"] in {"r1", "r2", "r0"})}
    assert got is not None and {(r["id"], r["region"]) for r in got.to_pylist()} == expected
    assert got.num_rows == len(expected) == 100 + 2  # b1's rows (150 among them), 7 (r1) and 299 (r2)
    assert read_arrow(path, ["id", "region"], where=among(keys.slice(0, 0))).num_rows == 0
