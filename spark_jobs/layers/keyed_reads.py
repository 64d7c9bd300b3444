"""Silver's tables read by key on the driver, for a small batch of either plan (a table's own, layers/silver_plan.py,
or the silver pass's, silver_pass.plan_table): its keys' state before the merge and the merged rows the gate audits
after it. A key-filtered read of the table's files (DeltaEngine.read_where) costs no Spark job, where Spark's joins with
the tables' scans cost one per exchange. The rules they apply are SQL text (layers/changes.py), evaluated over Arrow
(sql_text.holds)."""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from spark_jobs.delta import DeltaEngine
from spark_jobs.lake import Lake
from spark_jobs.layers import changes
from spark_jobs.registry import TableConfig
from spark_jobs.sql_text import holds

# key types whose equality Arrow's joins on the driver and Spark's agree on (floats' NaN and -0.0 they may not)
_KEY_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.StringType, T.BinaryType, T.BooleanType,
              T.DateType, T.TimestampType, T.TimestampNTZType, T.DecimalType)


def keys_join_on_driver(row: T.StructType, keys: tuple[str, ...]) -> bool:
    """Do Arrow's joins on the driver match the keys (columns of `row`) as Spark's would?"""
    return all(isinstance(row[k].dataType, _KEY_TYPES) for k in keys)


def by_key(small: bool, row: T.StructType, keys: tuple[str, ...]) -> bool:
    """Are a batch's state and merged rows read here (a `small` batch, keys whose joins here match Spark's), not by
    Spark's joins with the tables' scans?"""
    return small and keys_join_on_driver(row, keys)


def among(keys: pa.Table, or_equal: tuple[str, str] | None = None) -> Callable[[pa.Schema], pc.Expression]:
    """`DeltaEngine.read_where`'s filter: rows whose every key column holds one of `keys`' values in it (a superset of the
    rows of `keys`, which a join then takes), or whose column `or_equal[0]` is `or_equal[1]`. Values are cast to the
    table's types (Spark's keys may be narrower)."""
    def where(schema: pa.Schema) -> pc.Expression:
        matched = reduce(lambda a, b: a & b, [
            # unsafe: a value the table's type cannot hold (its column narrower than the batch's) is in none of its rows
            pc.field(k).isin(pc.unique(keys.column(k)).cast(schema.field(k).type, safe=False)) for k in keys.column_names])
        if or_equal is None:
            return matched
        column, value = or_equal
        return matched | (pc.field(column) == pa.scalar(value, schema.field(column).type))
    return where


def key_state(engine: DeltaEngine, lake: Lake, table: TableConfig, wanted: pa.Table, seq_type: pa.DataType,
              new_truncate: str | None = None) -> pa.Table:
    """silver_plan.current_state of the keys `wanted` (their key columns, each key once) on the driver, for a small
    batch of either plan: its keys' silver and ledger entries read by key (where Spark's joins with their scans cost a
    job per exchange), the newest of the two (live first at one position, as max(struct(_seq, _live)) orders) and
    `_ledger_behind`. Entries older than `new_truncate` are left out, as there."""
    keys = list(table.keys)
    entries = []
    for path, live in ((lake.silver(table.name), True), (lake.tombstones(table.name), False)):
        current = engine.read_where(path, [*keys, "_seq"], among(wanted))
        if current is not None and current.num_rows:
            current = current.select([*keys, "_seq"]).cast(pa.schema([*wanted.schema, pa.field("_seq", seq_type)]))
            if new_truncate:
                current = current.filter(holds(current, changes.kept_by_truncate(new_truncate)))
            entries.append(current.append_column("_live", pa.array([live] * current.num_rows, pa.bool_())).join(
                wanted, keys, join_type="left semi"))
    if not entries:
        return pa.table({**{k: pa.array([], wanted.schema.field(k).type) for k in keys}, "_seq": pa.array([], seq_type),
                         "_live": pa.array([], pa.bool_()), "_ledger_behind": pa.array([], pa.bool_())})
    newest = pa.concat_tables(entries).sort_by([("_seq", "descending"), ("_live", "descending")]).group_by(
        keys, use_threads=False).aggregate([("_seq", "first"), ("_live", "first"), ("_seq", "count")])
    return pa.table({**{k: newest.column(k) for k in keys}, "_seq": newest.column("_seq_first"),
                     "_live": newest.column("_live_first"),
                     "_ledger_behind": pc.and_(pc.greater(newest.column("_seq_count"), 1), newest.column("_live_first"))})


def merged_audit(engine: DeltaEngine, silver_path: str, touched: pa.Table, received: pa.Table, batch_id: str
                 ) -> tuple[pa.Table, pa.Table]:
    """silver_plan.merged_audit for a small batch, whichever plan made it, read back from the merged silver table on
    the driver (a key-filtered read, where Spark's joins with the table's scan cost a job per exchange): its rows of the
    batch's keys (`touched`: their key columns) and those this batch wrote (key, `_seq`), and each delete received
    (`received`: key columns and `_seq`) with `_live_seq`, its key's live position now."""
    keys = touched.column_names
    seq_type = received.schema.field("_seq").type
    silver = engine.read_where(silver_path, [*keys, "_seq", "_batch_id"], among(
        pa.concat_tables([touched, received.select(keys)]), ("_batch_id", batch_id)))
    if silver is None:
        rows = touched.slice(0, 0).append_column("_seq", pa.array([], seq_type))
        live_seq = pa.array([None] * received.num_rows, seq_type)
        return rows, pa.table({"_seq": received.column("_seq"), "_live_seq": live_seq})
    silver = silver.select([*keys, "_seq", "_batch_id"]).cast(pa.schema(
        [*touched.schema, pa.field("_seq", seq_type), pa.field("_batch_id", pa.string())]))
    marked = silver.join(touched.append_column("_touched", pa.array([True] * touched.num_rows, pa.bool_())), keys,
                         join_type="left outer")
    marked = marked.append_column("_audited_batch", pa.array([batch_id] * marked.num_rows, pa.string()))
    rows = marked.filter(holds(marked, changes.AUDITED_ROWS)).select([*keys, "_seq"])
    live = silver.select([*keys, "_seq"]).rename_columns([*keys, "_live_seq"])
    deletes = received.join(live, keys, join_type="left outer")
    return rows, deletes.select(["_seq", "_live_seq"])
