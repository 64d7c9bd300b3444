"""One contract suite for both Delta engines (docs/architecture.md, "Delta engines"): the same calls give the same
rows, versions and metrics. delta-spark runs on the test session's pinned jars (`make jars`); none is skipped."""

import datetime as dt
import os
from dataclasses import replace
from decimal import Decimal

import pytest

from spark_jobs.delta import MergeSpec, driver_rows
from spark_jobs.layers.silver import LEDGER_MERGE, SILVER_MERGE

SCHEMA = "k INT, v STRING, _seq STRING, _op STRING"


@pytest.fixture(params=["delta-rs", "delta-spark"])
def any_engine(request, spark):
    if request.param == "delta-rs":
        from spark_jobs.delta.delta_rs import DeltaRsEngine

        return DeltaRsEngine()
    from spark_jobs.delta.delta_spark import DeltaSparkEngine

    return DeltaSparkEngine(spark)


def rows(engine, spark, path, order="k"):
    df = engine.read(spark, path)
    return None if df is None else [tuple(r) for r in df.orderBy(order).collect()]


def test_absent_table_has_no_version_schema_or_rows(any_engine, spark, tmp_path):
    path = str(tmp_path / "none")
    assert (any_engine.version(path), any_engine.schema(path), any_engine.read(spark, path)) == (None, None, None)
    assert any_engine.history(path) == []


def test_append_then_read_types_and_versions(any_engine, spark, tmp_path):
    path = str(tmp_path / "t")
    df = spark.createDataFrame([(1, Decimal("1.50"), dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5, 6))],
                               "k INT, d DECIMAL(6,2), day DATE, at TIMESTAMP")
    assert any_engine.append(df, path) == 0
    assert any_engine.append(df, path) == 1
    assert rows(any_engine, spark, path) == [(1, Decimal("1.50"), dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5, 6))] * 2
    assert [f.simpleString() for f in any_engine.schema(path).fields] == ["k:int", "d:decimal(6,2)", "day:date", "at:timestamp"]
    assert [h["version"] for h in any_engine.history(path)] == [1, 0]


def test_rows_made_on_the_driver_append_and_merge_as_a_spark_frame_of_them_would(any_engine, spark, tmp_path):
    ddl = "k INT, v STRING, _seq STRING, _op STRING, at TIMESTAMP"
    at = dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    first, later = [(1, "a", "1", "c", at), (2, None, "1", "c", None)], [(1, "b", "2", "u", at), (3, "c", "2", "c", at)]
    by_arrow, by_spark = str(tmp_path / "arrow"), str(tmp_path / "spark")
    assert any_engine.append(driver_rows(first, ddl), by_arrow) == any_engine.append(spark.createDataFrame(first, ddl), by_spark)
    spec = replace(SILVER_MERGE, keys=("k",))
    merged = any_engine.merge(driver_rows(later, ddl), by_arrow, spec)
    assert merged == any_engine.merge(spark.createDataFrame(later, ddl), by_spark, spec)
    assert (merged.inserted, merged.updated) == (1, 1)
    assert any_engine.schema(by_arrow) == any_engine.schema(by_spark)
    naive = at.replace(tzinfo=None)  # the session's time zone is UTC
    assert rows(any_engine, spark, by_arrow) == rows(any_engine, spark, by_spark) == [
        (1, "b", "2", "u", naive), (2, None, "1", "c", None), (3, "c", "2", "c", naive)]


def test_arrow_rows_in_chunks_some_empty_all_commit(any_engine, spark, tmp_path):
    """Rows on the driver as a filter or a join leaves them, in chunks some of which are empty: every row is
    committed (pyspark's frame of such a table stopped at its first empty chunk after the first)."""
    import pyarrow as pa

    ddl = "k INT, v STRING, _seq STRING, _op STRING"
    one, none = driver_rows([(1, "a", "1", "c")], ddl), driver_rows([], ddl)
    chunked = pa.concat_tables([one, none, driver_rows([(2, "b", "1", "c")], ddl), none, none,
                                driver_rows([(3, "c", "1", "c")], ddl)])
    path = str(tmp_path / "t")
    any_engine.append(chunked, path)
    any_engine.merge(pa.concat_tables([none, none, driver_rows([(4, "d", "2", "c")], ddl)]), path,
                     replace(SILVER_MERGE, keys=("k",)))
    assert rows(any_engine, spark, path) == [(1, "a", "1", "c"), (2, "b", "1", "c"), (3, "c", "1", "c"), (4, "d", "2", "c")]


def test_a_small_batchs_rows_commit_as_the_same_rows_written_by_spark_would(any_engine, spark, tmp_path):
    """`small` (a batch that fits in the driver's memory) changes how the rows travel, never what is committed: the
    same rows, schema, versions and merge counts, a column Spark marked NOT NULL (a literal) still taking nulls
    later. delta-rs collects them and writes from the driver, where a Spark write leaves its files in a folder of
    its own (`cdc-`)."""
    from pyspark.sql import functions as F

    at = dt.datetime(2024, 1, 2, 3, 4, 5, 6)
    first = spark.createDataFrame([(1, "a", "1", at), (2, None, "1", None)], "k INT, v STRING, _seq STRING, at TIMESTAMP")
    first = first.withColumn("_op", F.lit("c"))  # NOT NULL in Spark's schema
    later = spark.createDataFrame([(1, "b", "2", "u", at), (3, "c", "2", None, at)],
                                  "k INT, v STRING, _seq STRING, _op STRING, at TIMESTAMP")
    spec, ledger = replace(SILVER_MERGE, keys=("k",)), replace(LEDGER_MERGE, keys=("k",))
    outcome = {}
    for small in (True, False):
        path, deletes = str(tmp_path / f"small-{small}"), str(tmp_path / f"ledger-{small}")
        appended = any_engine.append(first, path, small=small)
        merged = any_engine.merge(later.where("_op IS NOT NULL"), path, spec, small=small)
        nulls = any_engine.append(later.where("_op IS NULL"), path, small=small)
        any_engine.merge(first.withColumn("_op", F.lit("d")), deletes, ledger, small=small)  # made by its first batch
        cleared = any_engine.merge(later.where("_op IS NOT NULL"), deletes, ledger, small=small)
        outcome[small] = (appended, merged, nulls, cleared, any_engine.schema(path), rows(any_engine, spark, path),
                          rows(any_engine, spark, deletes))
    assert outcome[True] == outcome[False]
    assert outcome[True][5] == [(1, "b", "2", at, "u"), (2, None, "1", None, "c"), (3, "c", "2", at, None)]
    assert outcome[True][6] == [(2, None, "1", None, "d")]  # the newer upsert of key 1 cleared its ledger entry
    if any_engine.name == "delta-rs":
        staged = {small: {a["path"].startswith("cdc-") for table in ("small", "ledger")
                          for a in committed_files(str(tmp_path / f"{table}-{small}"))} for small in (True, False)}
        assert staged[True] == {False} and True in staged[False]  # the merge's own rows delta-rs writes either way


def test_empty_table_reads_as_empty_frame_with_schema(any_engine, spark, tmp_path):
    path = str(tmp_path / "t")
    any_engine.overwrite(spark.createDataFrame([], SCHEMA), path)
    df = any_engine.read(spark, path)
    assert (df.count(), df.columns) == (0, ["k", "v", "_seq", "_op"])


def test_partitioned_tables_read_back_partition_columns(any_engine, spark, tmp_path):
    path = str(tmp_path / "t")
    df = spark.createDataFrame([(1, "a b/c"), (2, None), (3, "x")], "k INT, region STRING")
    any_engine.append(df, path, partition_by=("region",))
    assert rows(any_engine, spark, path) == [(1, "a b/c"), (2, None), (3, "x")]


def test_silver_merge_spec_applies_only_newer_events(any_engine, spark, tmp_path):
    path = str(tmp_path / "t")
    spec = replace(SILVER_MERGE, keys=("k",))
    first = spark.createDataFrame([(1, "a", "05", "c"), (2, "b", "05", "c"), (3, "c", "05", "c"), (9, None, "05", "d")], SCHEMA)
    result = any_engine.merge(first, path, spec)
    assert (result.inserted, result.updated, result.deleted) == (3, 0, 0)
    second = spark.createDataFrame([
        (1, "a2", "06", "u"),   # newer update: applies
        (2, "b0", "04", "u"),   # older update: ignored
        (3, None, "07", "d"),   # newer delete: applies
        (4, "d", "01", "c"),    # new key: inserted
        (5, None, "09", "d"),   # delete of an absent key: nothing
    ], SCHEMA)
    result = any_engine.merge(second, path, spec)
    assert (result.inserted, result.updated, result.deleted) == (1, 1, 1)
    assert rows(any_engine, spark, path) == [(1, "a2", "06", "u"), (2, "b", "05", "c"), (4, "d", "01", "c")]
    # the same batch again changes nothing
    result = any_engine.merge(second, path, spec)
    assert (result.inserted, result.updated, result.deleted) == (0, 0, 0)


def test_ledger_merge_spec_records_deletes_and_clears_them_on_newer_writes(any_engine, spark, tmp_path):
    path = str(tmp_path / "ledger")
    spec = replace(LEDGER_MERGE, keys=("k",))
    schema = "k INT, _seq STRING, _op STRING"
    any_engine.merge(spark.createDataFrame([(1, "05", "d"), (2, "05", "d"), (3, "05", "u")], schema), path, spec)
    any_engine.merge(spark.createDataFrame([(1, "07", "c"), (2, "08", "d"), (4, "01", "d")], schema), path, spec)
    assert rows(any_engine, spark, path) == [(2, "08", "d"), (4, "01", "d")]


def test_a_null_safe_merge_on_two_keys_matches_null_with_null_and_leaves_its_marker_out(any_engine, spark, tmp_path):
    """Gold's merges of touched groups: keys may be NULL (a group's), and a marker says which rows delete."""
    path = str(tmp_path / "t")
    spec = MergeSpec(keys=("a", "b"), delete_when="s.gone = 1", update_when="s.gone = 0", insert_when="s.gone = 0",
                     null_safe=True, marker="gone")
    schema = "a INT, b STRING, n INT, gone INT"
    any_engine.merge(spark.createDataFrame([(1, None, 1, 0), (None, None, 2, 0), (2, "x", 3, 0)], schema), path, spec)
    any_engine.merge(spark.createDataFrame([(1, None, 10, 0), (None, None, 0, 1), (None, "y", 4, 0)], schema), path, spec)
    assert rows(any_engine, spark, path, ["a", "b"]) == [(None, "y", 4), (1, None, 10), (2, "x", 3)]
    arrow_path = str(tmp_path / "from_arrow")  # rows made on the driver, into no table: the marker is left out too
    any_engine.merge(spark.createDataFrame([(1, None, 1, 0), (3, "z", 5, 1)], schema).toArrow(), arrow_path, spec)
    assert rows(any_engine, spark, arrow_path, ["a", "b"]) == [(1, None, 1)]


def test_the_change_feed_gives_the_rows_each_commit_changed_once_it_is_on(any_engine, spark, tmp_path):
    """What incremental gold reads of silver (layers/gold_state.py): a merge's inserts, updates (before and after) and
    deletes, a delete's and an append's rows, for the commits between two versions; nothing before the feed was on."""
    path = str(tmp_path / "t")
    any_engine.append(spark.createDataFrame([(1, "a", "01", "c"), (2, "b", "01", "c")], SCHEMA), path)
    assert not any_engine.changes_recorded(path)
    any_engine.record_changes(path)
    on = any_engine.version(path)
    assert any_engine.changes_recorded(path) and any_engine.changes(spark, path, 0, on) is None
    spec = replace(SILVER_MERGE, keys=("k",))
    any_engine.merge(spark.createDataFrame([(1, "a2", "02", "u"), (2, None, "02", "d"), (3, "c", "02", "c")], SCHEMA),
                     path, spec)
    any_engine.delete(path, "k = 3")
    any_engine.append(spark.createDataFrame([(4, "d", "03", "c")], SCHEMA), path)
    changes = any_engine.changes(spark, path, on, any_engine.version(path))
    assert sorted(tuple(r) for r in changes.select("k", "v", "_change_type").collect()) == [
        (1, "a", "update_preimage"), (1, "a2", "update_postimage"), (2, "b", "delete"), (3, "c", "delete"),
        (3, "c", "insert"), (4, "d", "insert")]
    merged = any_engine.changes(spark, path, on, on + 1)  # one commit's
    assert sorted(tuple(r) for r in merged.select("k", "_change_type").collect()) == [
        (1, "update_postimage"), (1, "update_preimage"), (2, "delete"), (3, "insert")]


# column names a source may send that both engines take without column mapping (delta-spark refuses ' ,;{}()=')
ODD_NAMES = ["a`b", 'q"r', "c:d", "e.f", "hy-phen", "$env:HOME", "Up"]


def test_any_column_name_a_source_sends_merges_and_keys_on_both_engines(any_engine, spark, tmp_path):
    """Names quoted for each engine's SQL (delta-rs's update-all and insert-all took them unquoted: a backtick
    failed every merge), on keys too, and on a table path that holds what Spark would substitute into."""
    path = str(tmp_path / "odd $HOME `t`")  # delta-rs names its files URL-encoded
    columns = ", ".join(f"`{n.replace('`', '``')}` STRING" for n in ODD_NAMES)
    spec = MergeSpec(keys=("a`b", "c:d"), delete_when="s._op = 'd'", update_when="s._op <> 'd'", insert_when="s._op <> 'd'")
    first = spark.createDataFrame([("1", "x", "1", *["v1"] * 4, "c"), ("2", "y", "2", *["v2"] * 4, "c")],
                                  f"{columns}, _op STRING")
    any_engine.merge(first, path, spec)
    second = spark.createDataFrame([("1", "x", "1", *["w1"] * 4, "u"), ("2", "y", "2", *[None] * 4, "d"),
                                    ("3", "z", "3", *["v3"] * 4, "c")], f"{columns}, _op STRING")
    result = any_engine.merge(second, path, spec)
    assert (result.inserted, result.updated, result.deleted) == (1, 1, 1)
    assert any_engine.schema(path).fieldNames() == [*ODD_NAMES, "_op"]
    assert rows(any_engine, spark, path, "`a``b`") == [("1", "x", "1", *["w1"] * 4, "u"), ("3", "z", "3", *["v3"] * 4, "c")]
    any_engine.record_changes(path)
    assert any_engine.changes_recorded(path)


def test_merge_adds_new_source_columns(any_engine, spark, tmp_path):
    path = str(tmp_path / "t")
    spec = MergeSpec(("k",), update_when="true", insert_when="true")
    any_engine.merge(spark.createDataFrame([(1, "a")], "k INT, v STRING"), path, spec)
    any_engine.merge(spark.createDataFrame([(2, "b", 7)], "k INT, v STRING, extra INT"), path, spec)
    assert rows(any_engine, spark, path) == [(1, "a", None), (2, "b", 7)]


def test_overwrite_replaces_rows_and_schema_and_restore_goes_back(any_engine, spark, tmp_path):
    path = str(tmp_path / "t")
    any_engine.overwrite(spark.createDataFrame([(1, "a", "1", "c")], SCHEMA), path)
    any_engine.overwrite(spark.createDataFrame([(5, 1.5)], "k INT, score DOUBLE"), path)
    assert rows(any_engine, spark, path) == [(5, 1.5)]
    assert any_engine.restore(path, 0) == 2
    assert rows(any_engine, spark, path) == [(1, "a", "1", "c")]
    assert any_engine.read(spark, path, version=1).collect()[0]["score"] == 1.5


def test_delete_removes_matching_rows_and_counts_them(any_engine, spark, tmp_path):
    path = str(tmp_path / "t")
    any_engine.append(spark.createDataFrame([(1, "a", "02", "c"), (2, "b", "05", "c"), (3, "c", "03", "u")], SCHEMA), path)
    assert any_engine.delete(path, "_seq < '04'") == 2
    assert rows(any_engine, spark, path) == [(2, "b", "05", "c")]


def test_replace_swaps_the_matching_rows_in_one_commit(any_engine, spark, tmp_path):
    path = str(tmp_path / "t")
    any_engine.append(spark.createDataFrame([(1, "a", "f1", "c"), (2, "b", "f1", "c"), (3, "c", "f'2", "u")], SCHEMA), path)
    assert any_engine.replace(spark.createDataFrame([(1, "A", "f1", "c")], SCHEMA), path, "_seq IN ('f1')") == 1
    assert rows(any_engine, spark, path) == [(1, "A", "f1", "c"), (3, "c", "f'2", "u")]
    quoted = any_engine.literal("f'2")
    assert any_engine.replace(spark.createDataFrame([], SCHEMA), path, f"_seq IN ({quoted})") == 2
    assert rows(any_engine, spark, path) == [(1, "A", "f1", "c")]
    # nothing to remove, nothing to add: the table is unchanged; an engine may skip the commit (delta-spark does)
    assert any_engine.replace(spark.createDataFrame([], SCHEMA), path, "_seq IN ('none')") in (2, 3)
    assert rows(any_engine, spark, path) == [(1, "A", "f1", "c")]


def dv_table(spark, path):
    """A table as delta-spark leaves it: deletion vectors on (the session's default), rows 1 and 3 deleted by
    marking them in a deletion vector, not by rewriting the file."""
    from deltalake import DeltaTable

    from spark_jobs.delta.delta_spark import DeltaSparkEngine

    writer = DeltaSparkEngine(spark)
    writer.append(spark.createDataFrame([(k, f"v{k}", "01", "c") for k in range(1, 5)], SCHEMA).coalesce(1), path)
    writer.delete(path, "k IN (1, 3)")
    assert "deletionVectors" in DeltaTable(path).protocol().reader_features
    assert [h["operationMetrics"].get("numDeletionVectorsAdded") for h in writer.history(path, 1)] == ["1"]
    return DeltaTable(path).version()


def test_a_table_with_deletion_vectors_reads_its_rows_and_delta_rs_never_writes_it(any_engine, spark, tmp_path):
    from spark_jobs.delta.reads import row_count
    from spark_jobs.errors import UnsupportedTable

    path = str(tmp_path / "t")
    version = dv_table(spark, path)
    assert rows(any_engine, spark, path) == [(2, "v2", "01", "c"), (4, "v4", "01", "c")]
    assert row_count(path) == 2  # `status` and the sensor's light reads honour the deletion vector too
    more = spark.createDataFrame([(5, "v5", "02", "c")], SCHEMA)
    if any_engine.name == "delta-rs":
        # a delta-rs rewrite would drop the deletion vector and bring rows 1 and 3 back: refused, nothing written
        for write in (lambda: any_engine.append(more, path), lambda: any_engine.delete(path, "k = 2"),
                      lambda: any_engine.merge(more, path, replace(SILVER_MERGE, keys=("k",)))):
            with pytest.raises(UnsupportedTable, match=f"Delta table at {path} uses deletionVectors"):
                write()
        assert any_engine.version(path) == version
    else:
        assert any_engine.merge(more, path, replace(SILVER_MERGE, keys=("k",))).inserted == 1
        assert any_engine.delete(path, "k = 2") == 1
        assert rows(any_engine, spark, path) == [(4, "v4", "01", "c"), (5, "v5", "02", "c")]


def test_new_files_lists_what_each_append_added_and_none_once_rows_may_be_marked_deleted(any_engine, spark, tmp_path):
    """What the silver pass reads of bronze (DeltaEngine.new_files, from the log): the files added since a version, with
    their rows. delta-spark's tables have deletion vectors on: after a write over a predicate or a delete, which may
    mark rows of a new file deleted, a plain read of the files would be wrong, so none is listed; an append since
    lists again. The driver's key-filtered read honours the deletion vectors."""
    from spark_jobs.layers.keyed_reads import among

    path = str(tmp_path / "t")
    batch = lambda *ks: spark.createDataFrame([(k, f"v{k}", "01", "c") for k in ks], SCHEMA).coalesce(1)  # noqa: E731
    any_engine.append(batch(1, 2), path)
    any_engine.append(batch(3, 4, 5), path)
    first, second = any_engine.new_files(path, -1), any_engine.new_files(path, 0)
    assert (first.version, len(first.files), first.rows) == (1, 2, 5)
    assert (second.version, second.rows, set(second.files) < set(first.files)) == (1, 3, True)
    assert any_engine.new_files(path, 1) is None  # nothing newer
    any_engine.delete(path, "k = 4")
    marks = any_engine.name == "delta-spark"
    assert (any_engine.new_files(path, 1) is None) is marks
    any_engine.append(batch(6), path)
    assert any_engine.new_files(path, 2).rows == 1
    assert (any_engine.new_files(path, 0) is None) is marks  # the delete is in the range
    any_engine.replace(spark.createDataFrame([(6, "v6'", "02", "u")], SCHEMA), path, "k = 6")
    assert (any_engine.new_files(path, 3) is None) is marks
    keyed = any_engine.read_where(path, ["k", "v"], among(driver_rows([(4,), (5,)], "k INT")))
    assert keyed.to_pylist() == [{"k": 5, "v": "v5"}]


def test_maintenance_compacts_by_key_checkpoints_and_vacuum_keeps_the_window(any_engine, spark, tmp_path):
    """Delta's own OPTIMIZE (Z-ordered), checkpoint and VACUUM through either engine: the rows stay, the files
    become one in key order, and VACUUM with a 7-day window removes nothing a version of today needs."""
    from deltalake import DeltaTable

    path = str(tmp_path / "t")
    for batch in range(6):
        any_engine.append(spark.createDataFrame([(k, f"v{k}", "01", "c") for k in (5 - batch, 11 - batch)], SCHEMA)
                          .coalesce(1), path)
    before = rows(any_engine, spark, path)
    assert len(DeltaTable(path).file_uris()) == 6
    any_engine.compact(path, 128 * 2**20, ("k",))
    any_engine.checkpoint(path, 40 * 86400)
    any_engine.vacuum(path, 7 * 86400)
    table = DeltaTable(path)
    assert rows(any_engine, spark, path) == before and len(table.file_uris()) == 1
    if any_engine.name == "delta-rs":  # its Z-order of one column sorts; Delta's clusters ranges across files
        assert [r[0] for r in any_engine.read(spark, path).collect()] == sorted(r[0] for r in before)
    assert table.metadata().configuration.get("delta.logRetentionDuration") == "interval 40 days"
    assert any(name.endswith(".checkpoint.parquet") for name in os.listdir(f"{path}/_delta_log"))
    for version in range(6):  # every version of the window still reads its rows
        assert len(any_engine.read(spark, path, version).collect()) == 2 * (version + 1)


@pytest.mark.parametrize("value", ["f'2", "it''s", "back\\slash", "a\\'b", "plain"])
def test_each_engine_quotes_a_literal_so_its_sql_reads_the_same_value(spark, tmp_path, value):
    """Predicates name landing paths, which may hold quotes: Spark SQL escapes with a backslash (a doubled
    quote would be two literals, concatenated), DataFusion (delta-rs) doubles the quote."""
    from spark_jobs.delta.delta_rs import DeltaRsEngine
    from spark_jobs.delta.delta_spark import DeltaSparkEngine

    assert spark.sql(f"SELECT {DeltaSparkEngine(spark).literal(value)} AS v").first()["v"] == value
    rs, path = DeltaRsEngine(), str(tmp_path / "t")
    rs.append(spark.createDataFrame([(value,), ("other",)], "v STRING"), path)
    assert rs.delete(path, f"v = {rs.literal(value)}") == 1
    assert [r["v"] for r in rs.read(spark, path).collect()] == ["other"]


@pytest.mark.parametrize("source_mb", ["256", "0"], ids=["in-memory", "streamed"])
def test_delta_rs_writes_through_scratch_parquet_held_or_streamed_and_leaves_nothing(engine, spark, tmp_path,
                                                                                       monkeypatch, source_mb):
    # CDC_MERGE_SOURCE_MB=0 streams every merge source; several Spark partitions make several scratch files
    monkeypatch.setenv("CDC_MERGE_SOURCE_MB", source_mb)
    monkeypatch.setenv("CDC_SPILL_DIR", str(tmp_path / "spill"))
    (tmp_path / "spill").mkdir()
    path, spec = str(tmp_path / "t"), replace(SILVER_MERGE, keys=("k",))
    first = spark.createDataFrame([(k, f"v{k}", "05", "c") for k in range(1, 7)], SCHEMA).repartition(3)
    # the first merge creates the table (version 0: a load, not a merge), the append is version 1
    assert (engine.merge(first, path, spec).inserted, engine.append(first.limit(0), path)) == (6, 1)
    second = spark.createDataFrame([(2, "w2", "06", "u"), (3, None, "07", "d"), (7, "v7", "01", "c"), (4, "old", "04", "u")],
                                   SCHEMA).repartition(3)
    result = engine.merge(second, path, spec)
    assert (result.inserted, result.updated, result.deleted) == (1, 1, 1)
    assert rows(engine, spark, path) == [(1, "v1", "05", "c"), (2, "w2", "06", "u"), (4, "v4", "05", "c"),
                                         (5, "v5", "05", "c"), (6, "v6", "05", "c"), (7, "v7", "01", "c")]
    assert list((tmp_path / "spill").iterdir()) == []  # every scratch folder removed


def test_scratch_left_by_a_killed_run_is_removed_and_a_live_runs_is_kept(spark, tmp_path, monkeypatch):
    import subprocess

    from spark_jobs.delta.delta_rs import DeltaRsEngine

    monkeypatch.setenv("CDC_SPILL_DIR", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()  # a process that has exited: its pid names a killed run's scratch
    (tmp_path / f"cdc-spill-{dead.pid}-abc").mkdir()
    (tmp_path / f"cdc-spill-{dead.pid}-abc" / "part-0.parquet").write_bytes(b"rows")
    (tmp_path / f"cdc-spill-{os.getpid()}-def").mkdir()  # this live process's
    (tmp_path / "other").mkdir()
    DeltaRsEngine()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"cdc-spill-{os.getpid()}-def", "other"]


def committed_files(path):
    import pyarrow as pa
    from deltalake import DeltaTable

    return pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()


def table_files(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and "_delta_log" not in p.parts)


@pytest.fixture
def no_driver_rows(monkeypatch):
    """Fails a test whose rows would pass through the driver (the scratch Parquet read back into delta-rs)."""
    from spark_jobs.delta.delta_rs import DeltaRsEngine

    monkeypatch.setattr(DeltaRsEngine, "_rows", lambda *_: pytest.fail("the rows passed through the driver"))


def test_delta_rs_commits_the_files_spark_wrote_in_the_tables_folder_with_their_bounds(engine, spark, tmp_path,
                                                                                        no_driver_rows):

    path = tmp_path / "t"
    first = spark.createDataFrame([(k, f"v{k}", "01", "c") for k in range(1, 7)], SCHEMA).repartition(2, "k")
    assert engine.append(first, str(path)) == 0
    assert engine.append(first.where("k > 4"), str(path)) == 1
    assert rows(engine, spark, str(path)) == [(k, f"v{k}", "01", "c") for k in (1, 2, 3, 4, 5, 5, 6, 6)]
    added = committed_files(str(path))
    # each write's files in a folder of its own, nothing else left there (no _SUCCESS, no checksums)
    assert table_files(path) == sorted(a["path"] for a in added)
    assert len({a["path"].split("/")[0] for a in added}) == 2 and all(a["path"].startswith("cdc-") for a in added)
    # with each file's bounds and counts, as delta-rs' own writes have them: merges can skip the files
    by_file = [(a["num_records"], a["min.k"], a["max.k"], a["null_count.v"]) for a in added]
    assert sorted(by_file) == sorted(
        (len(ks), min(ks), max(ks), 0) for ks in _spark_files_keys(spark, path, added))
    assert sum(n for n, *_ in by_file) == 8


def _spark_files_keys(spark, path, added):
    for a in added:
        yield [r["k"] for r in spark.read.parquet(str(path / a["path"])).collect()]


def test_a_merge_into_no_table_loads_it_with_the_rows_its_insert_clause_takes(any_engine, spark, tmp_path,
                                                                                no_driver_rows, monkeypatch):
    path = str(tmp_path / "t")
    events = spark.createDataFrame([(1, "a", "01", "c"), (2, None, "02", "d"), (3, "c", "03", "u")], SCHEMA)
    result = any_engine.merge(events, path, replace(SILVER_MERGE, keys=("k",)))
    assert (result.version, result.inserted, result.updated, result.deleted) == (0, 2, 0, 0)
    assert rows(any_engine, spark, path) == [(1, "a", "01", "c"), (3, "c", "03", "u")]
    assert "MERGE" not in [h["operation"] for h in any_engine.history(path)]  # written, not merged
    # later merges into it take the usual path (a merge's source goes through the driver), and meet the loaded rows
    monkeypatch.undo()
    later = any_engine.merge(spark.createDataFrame([(1, "b", "04", "u")], SCHEMA), path,
                             replace(SILVER_MERGE, keys=("k",)))
    assert (later.inserted, later.updated) == (0, 1)


def test_an_append_with_new_columns_evolves_the_schema_in_one_commit_and_leaves_no_staged_files(engine, spark,
                                                                                               tmp_path):
    from pyspark.sql import functions as F

    path = tmp_path / "t"
    first = spark.createDataFrame([(1, "a", "01", "c")], SCHEMA)
    engine.append(first, str(path))
    assert engine.append(first.withColumn("extra", F.lit(7)), str(path)) == 1
    assert rows(engine, spark, str(path), "extra") == [(1, "a", "01", "c", None), (1, "a", "01", "c", 7)]
    assert table_files(path) == sorted(a["path"] for a in committed_files(str(path)))


def test_delta_rs_vacuum_removes_the_staged_folders_it_empties(engine, spark, tmp_path):
    path = tmp_path / "t"
    for k in range(3):
        engine.append(spark.createDataFrame([(k, "a", "01", "c")], SCHEMA), str(path))
    engine.compact(str(path), 128 * 2**20)
    engine.vacuum(str(path), 0)  # no window: every file no longer in the table goes
    assert table_files(path) == [a["path"] for a in committed_files(str(path))]
    assert sorted(p.name for p in path.iterdir() if p.name != "_delta_log") == [
        p.split("/")[0] for p in table_files(path)]


def test_a_write_that_fails_leaves_no_files_in_the_table(engine, spark, tmp_path):
    from pyspark.sql import functions as F

    path = tmp_path / "t"
    engine.append(spark.createDataFrame([(1, "a", "01", "c")], SCHEMA), str(path))
    broken = spark.createDataFrame([(0, "b", "02", "c")], SCHEMA).withColumn(
        "k", F.udf(lambda k: 1 // k, "int")("k"))
    with pytest.raises(Exception, match="ZeroDivisionError"):
        engine.append(broken, str(path))
    assert table_files(path) == [a["path"] for a in committed_files(str(path))]
    assert [p.name for p in path.iterdir() if p.name.startswith("cdc-")] == [committed_files(str(path))[0]["path"].split("/")[0]]
