"""delta.reads.read_arrow's filter (what the silver pass reads of a big silver table: the rows of the batch's keys, not the
table): exactly the rows a full read then filtered would give, over many files, with the value sets of another type
than the table's columns."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from spark_jobs.delta.reads import read_arrow
from spark_jobs.layers.keyed_reads import among
from spark_jobs.storage import delta_storage_options
from tests.support import s3_environment


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


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_partitioned_tables_partition_columns_are_read_with_their_values_from_its_log(where, tmp_path, request,
                                                                                      monkeypatch):
    """A partition column is in no data file: read whole or filtered by it (silver partitioned by a key column), each
    row has its file's value from the table's log, odd characters and nulls included, as DataFusion reads the table;
    on a local lake and on S3 (a file's URI there is matched to its log entry by another path form)."""
    from deltalake import DeltaTable, QueryBuilder

    if where == "s3":
        for name, value in s3_environment(request.getfixturevalue("s3_endpoint")).items():
            monkeypatch.setenv(name, value)
        path = "s3://lake/cdc/silver/items"
    else:
        path = str(tmp_path / "silver")
    options = delta_storage_options(path, os.environ)
    regions = ["r 1", "a/b", None, "it's%2F"]
    for part in range(2):
        ids = list(range(part * 40, part * 40 + 40))
        write_deltalake(path, pa.table({
            "tenant": pa.array([i % 3 for i in ids], pa.int64()), "region": pa.array([regions[i % 4] for i in ids]),
            "id": pa.array(ids, pa.int64()), "_seq": [f"{i:08d}" for i in ids]}), mode="append",
            partition_by=["tenant", "region"], storage_options=options)
    table = DeltaTable(path, storage_options=options)
    expected = pa.table(QueryBuilder().register("t", table).execute("SELECT tenant, region, id, _seq FROM t").read_all())
    rows = sorted(expected.to_pylist(), key=lambda r: r["id"])
    assert len(rows) == 80 and {r["region"] for r in rows} == set(regions)
    whole = read_arrow(path)
    assert whole is not None and sorted(whole.to_pylist(), key=lambda r: r["id"]) == rows
    keys = pa.table({"tenant": pa.array([1, 2, 0], pa.int32()), "region": ["a/b", "r 1", "it's%2F"]})
    got = read_arrow(path, ["tenant", "region", "_seq"], where=among(keys))
    assert got is not None and sorted(got.to_pylist(), key=lambda r: r["_seq"]) == [
        {"tenant": r["tenant"], "region": r["region"], "_seq": r["_seq"]} for r in rows
        if r["tenant"] in (0, 1, 2) and r["region"] in ("a/b", "r 1", "it's%2F")]
    assert got.num_rows == 60  # the null region matches no key
