"""Source transactions (docs/architecture.md, "Transaction-consistent gold"): a connector's transaction topic taken
into `_state/transactions/<topic>` (`ingest`), and silver tables read as of one transaction watermark (`watermark`,
`as_of`): every transaction up to it in commit order is applied in every input, none after it is visible, so a gold
model over them never shows part of a source transaction.

No library does this: Debezium publishes the boundaries (its transaction topic, and a `transaction` block on each
change event) and leaves their use to the consumer; Delta versions of separate tables never line up with them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_jobs.debezium import connectors, envelope
from spark_jobs.delta import DeltaEngine, MergeSpec
from spark_jobs.errors import ConfigError, PipelineError
from spark_jobs.lake import Lake
from spark_jobs.landing import list_topic, spark_paths
from spark_jobs.layers.bronze import log_files
from spark_jobs.layers.common import QUARANTINED, QUARANTINED_COLUMNS, one_row, small_landing, whole_file_rows, write_quarantine
from spark_jobs.layers.landing_reader import read_landing
from spark_jobs.layers.summary import Counts
from spark_jobs.registry import TableConfig
from spark_jobs.state import advance_marks, ingested_files, read_marks, transactions_name, writer_lock

_EVENT = ("status STRING, id STRING, event_count BIGINT, "
          "data_collections ARRAY<STRUCT<data_collection: STRING, event_count: BIGINT>>, ts_ms BIGINT")
_ENDS = MergeSpec(keys=("id",), insert_when="true")  # a redelivered END keeps the place it was first taken at
NOT_AN_EVENT = "transaction_metadata: not a BEGIN or END event of a Debezium transaction topic"
BAD_END = "transaction_metadata: an END event without its id, event_count or data_collections, or whose counts differ"


@dataclass(frozen=True)
class Ingested:
    files: int = 0
    ends: int = 0  # END events new to the table
    quarantined: Counts = field(default_factory=dict)


def ingest(spark: SparkSession, engine: DeltaEngine, lake: Lake, landing: str, topic: str, batch_id: str) -> Ingested:
    """The transaction topic's new landing files: each END event one row of `_state/transactions/<topic>`, placed by its
    Kafka offset (the topic's order is the commit order); BEGIN events carry nothing an END does not, and are
    dropped; anything else is quarantined under `quarantine/transactions.<topic>` with its reason. Under the topic's
    own writer lock: every gold model over its tables may call this."""
    name = transactions_name(topic)
    with writer_lock(lake, name, batch_id):
        marks = read_marks(lake, name)
        listed = list_topic(landing, topic, marks=marks)
        # the sink's names give each file's topic+partition (envelope.landing_offset)
        partitions = {named[0].rsplit("+", 1)[1] for path in [*marks.values(), *(f.path for f in listed)]
                      if (named := envelope.landing_offset(path))}
        if len(partitions) > 1:
            raise PipelineError(name, "gold", f"the transaction topic {topic} has partitions {', '.join(sorted(partitions))}: "
                                "its order is the commit order only in one partition (create it with one)")
        done = ingested_files(lake, name)
        new = [f for f in listed if f.path not in done]
        if not new:
            advance_marks(lake, name, marks, listed, done)
            return Ingested()
        staging = f"{lake.staging_files}/{name}-{batch_id}"
        try:
            lines, unreadable = read_landing(spark, spark_paths(landing, new, staging), new, "json", small_landing(new))
            unnamed = [f for f in new if envelope.landing_offset(f.path) is None and f not in unreadable]
            unreadable |= {f: f"unsupported_file: {f.path.rsplit('/', 1)[-1]}: not named by the S3 sink "
                              "(<topic>+<partition>+<offset>), so its transactions' commit order is unknown" for f in unnamed}
            events = _events(lines.where(~F.col("_source_file").isin([f.path for f in unreadable]))).localCheckpoint()
            ends = events.where("reason IS NULL AND status = 'END'")
            first = Window.partitionBy("id").orderBy("_position")
            ends = ends.withColumn("_n", F.row_number().over(first)).where("_n = 1").select(
                "id", "_position", "event_count", "data_collections", "ts_ms", "_source_file", "_line",
                F.lit(batch_id).alias("_batch_id"))
            added = engine.merge(ends, lake.transactions(topic), _ENDS).inserted
            refused = events.where("reason IS NOT NULL").select(*QUARANTINED_COLUMNS)
            if unreadable:
                refused = refused.unionByName(spark.createDataFrame(whole_file_rows(unreadable), QUARANTINED))
            quarantined = write_quarantine(engine, lake, name, refused, "gold", batch_id)
            per_file = {r["_source_file"]: (r["lines"], r["ends"], r["refused"]) for r in events.groupBy("_source_file").agg(
                F.count(F.lit(1)).alias("lines"), F.count(F.when(F.expr("reason IS NULL AND status = 'END'"), 1)).alias("ends"),
                F.count("reason").alias("refused")).collect()}
        finally:
            lake.files.delete_tree(staging)
        logged = {}
        for f in new:  # (size, modified_ms, lines, events, tombstones, quarantined), as bronze logs its files
            lines_n, ends_n, refused_n = per_file.get(f.path, (0, 0, 0))
            logged[f.path] = (f.size, f.modified_ms, lines_n, ends_n, 0, 1 if f in unreadable else refused_n)
        log_files(engine, lake, name, logged, batch_id, engine.version(lake.transactions(topic)))
        advance_marks(lake, name, marks, listed, done | {f.path for f in new})
        return Ingested(files=len(new), ends=added, quarantined=quarantined)


def _events(lines: DataFrame) -> DataFrame:
    """Transaction-topic lines (with or without the schema envelope) parsed, each with its Kafka offset
    (`_position`) and a quarantine `reason` when it is not a BEGIN or a consistent END event."""
    enveloped = F.get_json_object("_raw", "$.schema").isNotNull() & F.get_json_object("_raw", "$.payload").isNotNull()
    body = F.when(enveloped, F.get_json_object("_raw", "$.payload")).otherwise(F.col("_raw"))
    parsed = lines.withColumn("_event", F.from_json(body, _EVENT)).select(
        "_source_file", "_line", "_raw", "_line_problem", "_event.*",
        envelope.kafka_offset().alias("_position"))
    counted = F.aggregate("data_collections", F.lit(0).cast("long"), lambda total, c: total + c["event_count"])
    end_ok = (F.col("id").isNotNull() & F.col("event_count").isNotNull() & F.col("data_collections").isNotNull()
              & (counted == F.col("event_count"))
              & F.forall("data_collections", lambda c: c["data_collection"].isNotNull() & c["event_count"].isNotNull()))
    reason = (F.when(F.col("_line_problem").isNotNull(), F.col("_line_problem"))
              .when(F.expr("try_parse_json(_raw) IS NULL") | F.col("status").isNull() | ~F.col("status").isin("BEGIN", "END"),
                    NOT_AN_EVENT)
              .when((F.col("status") == "BEGIN") & F.col("id").isNull(), NOT_AN_EVENT)
              .when((F.col("status") == "END") & ~F.coalesce(end_ok, F.lit(False)), BAD_END))
    return parsed.withColumn("reason", reason)


@dataclass(frozen=True)
class Watermark:
    """Where a gold model reads its transactional inputs: every transaction up to `position` (its END's offset in the
    transaction topic) is applied in each of them; none after it is shown."""

    transaction: str | None = None  # the newest visible transaction's id; None: none yet (snapshot rows only)
    position: int | None = None
    waiting: int = 0  # transactions ended after it, not shown yet
    blocked_by: str | None = None  # the first of them, and what its inputs lack of it: `<id>(<table>:<applied>/<counted>,...)`
    # when that one counts no event of its tables, though they hold events, at or after its commit, whose transaction
    # no END names: the ids do not match (a connector whose ids the rules do not know). `<END id>(END),<event's>(event)`
    ids_unmatched: str | None = None


@dataclass(frozen=True)
class SourceLog:
    """What a source read at the watermark is read from: its history and truncate log (None: not written yet)."""

    history: DataFrame | None
    truncates: DataFrame | None


def source_logs(spark: SparkSession, engine: DeltaEngine, lake: Lake, tables: list[TableConfig],
                versions: dict[str, dict[str, int | None]]) -> dict[str, SourceLog]:
    """Each table's history and truncate log at the versions in `versions` (per table, `history` and `truncates`),
    read once for the watermark and the rows at it; refused when rows were written before `transactions:`."""
    check_transaction_ids(engine, tables, lake)
    return {t.name: SourceLog(engine.read(spark, lake.history(t.name), version=versions["history"][t.name]),
                              engine.read(spark, lake.truncates(t.name), version=versions["truncates"][t.name]))
            for t in tables}


def watermark(spark: SparkSession, engine: DeltaEngine, lake: Lake, topic: str, version: int | None,
              tables: list[TableConfig], logs: dict[str, SourceLog]) -> tuple[Watermark, DataFrame | None]:
    """The newest place in commit order up to which every transaction is complete in `tables` (the events each
    END counts for a table are all in its history, or its truncate log: `logs`), and the ids of the transactions
    up to it. `version`: the transaction log's version to read."""
    ends = engine.read(spark, lake.transactions(topic), version=version)
    if ends is None:
        return Watermark(), None
    owner: dict[str, str] = {}
    for t in tables:
        for name in t.data_collections():
            if owner.setdefault(name, t.name) != t.name:
                raise ConfigError(f"tables {owner[name]!r} and {t.name!r} may both be {name!r} in {topic}'s END events: "
                                  "set 'data_collection' on them")
    names = F.create_map(*[F.lit(x) for pair in owner.items() for x in pair])
    expected = ends.select("id", "_position", F.explode("data_collections").alias("_c")).select(
        "id", "_position", names[F.col("_c.data_collection")].alias("_table"), F.col("_c.event_count").alias("_expected")
    ).where("_table IS NOT NULL")
    # an END names its events by the keys its id may share with them (debezium/connectors.py), silver keeps each
    # event's key
    end_keys = ends.select("id", "_position", F.explode(F.expr(connectors.transaction_keys_sql("id"))).alias("_key"))
    logged = [frame.where("_transaction_id IS NOT NULL").select(F.col("_transaction_id").alias("_key"),
                                                                F.lit(t.name).alias("_table"))
              for t in tables for frame in (logs[t.name].history, logs[t.name].truncates) if frame is not None]
    applied = reduce(DataFrame.unionByName, logged, spark.createDataFrame([], "_key STRING, _table STRING")).groupBy(
        "_key", "_table").agg(F.count(F.lit(1)).alias("_applied"))
    counted = expected.join(end_keys.drop("_position"), "id").join(applied, ["_key", "_table"], "left").groupBy(
        "id", "_position", "_table", "_expected").agg(F.sum(F.coalesce("_applied", F.lit(0))).alias("_applied"))
    lacking = counted.where(F.col("_applied") < F.col("_expected"))
    first = one_row(lacking.agg(F.min("_position").alias("p")))["p"]
    blocked_by = ids_unmatched = None
    if first is not None:
        parts = lacking.where(F.col("_position") == first).orderBy("_table").collect()
        # one word, for the CLI line: `801:3330(order_lines:1/2)`, events applied / counted by its END
        blocked_by = f"{_word(parts[0]['id'])}(" + ",".join(
            f"{r['_table']}:{r['_applied'] or 0}/{r['_expected']}" for r in parts) + ")"
        if not any(r["_applied"] for r in parts):
            ids_unmatched = _unmatched(ends, first, end_keys, [logs[r["_table"]].history for r in parts])
    shown = F.lit(True) if first is None else F.col("_position") < F.lit(first)
    figures = one_row(ends.agg(F.max_by("id", F.when(shown, F.col("_position"))).alias("id"),
                               F.max(F.when(shown, F.col("_position"))).alias("position"),
                               F.count(F.when(~shown, 1)).alias("waiting")))
    newest = _word(figures["id"]) if figures["position"] is not None else None
    mark = Watermark(transaction=newest, position=figures["position"], waiting=figures["waiting"], blocked_by=blocked_by,
                     ids_unmatched=ids_unmatched)
    return mark, end_keys.where(shown).select(F.col("_key").alias("id"))


def _unmatched(ends: DataFrame, position: int, end_keys: DataFrame, histories: list[DataFrame | None]) -> str | None:
    """The END at `position` counts none of its events: when its tables hold an event committed at or after it
    (source ts_ms) whose transaction no END names, `<END id>(END),<the first such event's transaction>(event)`; else
    None (its events may only be late)."""
    end = one_row(ends.where(F.col("_position") == position).select("id", "ts_ms"))
    for history in (h for h in histories if h is not None):
        orphan = (history.where(F.col("_transaction_id").isNotNull() & (F.col("_source_ts_ms") >= F.lit(end["ts_ms"])))
                  .select(F.col("_transaction_id").alias("_key"), "_seq").join(end_keys, "_key", "left_anti")
                  .orderBy("_seq").limit(1).collect())
        if orphan:
            return f"{_word(end['id'])}(END),{_word(orphan[0]['_key'])}(event)"
    return None


def check_transaction_ids(engine: DeltaEngine, tables: list[TableConfig], lake: Lake) -> None:
    """Tables given `transactions:` after silver was written hold events without their transaction id, which the
    watermark would never count: they are rebuilt first (from bronze, which keeps each event's line)."""
    stale = [t.name for t in tables if t.transactions and any(
        (schema := engine.schema(path)) is not None and "_transaction_id" not in schema.fieldNames()
        for path in (lake.silver(t.name), lake.history(t.name), lake.truncates(t.name)))]
    if stale:
        raise ConfigError(f"table(s) {', '.join(stale)}: 'transactions' was set after their silver was written, whose "
                          "rows lack their transaction; rebuild them first: run --mode rebuild --tables "
                          f"{','.join(stale)} --layers silver")


def _word(source_id: str) -> str:
    """A transaction id as one word of the CLI's summary line: the source's own text, or JSON-quoted when it holds
    spaces or control characters (a line of its own could pass for another summary)."""
    return source_id if source_id.isprintable() and " " not in source_id else json.dumps(source_id)


def as_of(table: TableConfig, log: SourceLog, visible: DataFrame | None) -> DataFrame | None:
    """The table's rows as they stood at the watermark, from its history: per key, the newest version whose
    transaction is visible (snapshot reads always are), unless that is a delete or a visible truncate came after
    it. Silver's columns, in silver's order."""
    history = log.history
    if history is None:
        return None
    shown = _visible(history, visible)
    if log.truncates is not None:
        cut = one_row(_visible(log.truncates, visible).agg(F.max("_seq").alias("cut")))["cut"]
        if cut is not None:
            shown = shown.where(F.col("_seq") > F.lit(cut))
    newest = Window.partitionBy(*table.keys).orderBy(F.col("_seq").desc())
    columns = [c for c in history.columns if c not in ("_valid_to", "_is_current")]
    return shown.withColumn("_n", F.row_number().over(newest)).where("_n = 1 AND _op <> 'd'").select(*columns)


def _visible(rows: DataFrame, visible: DataFrame | None) -> DataFrame:
    """Rows outside any transaction (snapshot reads), and those of the visible transactions."""
    outside: Column = F.col("_transaction_id").isNull()
    if visible is None:
        return rows.where(outside)
    shown = visible.select(F.col("id").alias("_transaction_id"), F.lit(True).alias("_shown"))
    return rows.join(shown, "_transaction_id", "left").where(outside | F.col("_shown")).drop("_shown")
