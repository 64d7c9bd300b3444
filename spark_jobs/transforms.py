"""Pure transforms, DataFrame -> DataFrame. They never create sessions, read paths or write.

Bronze: `split_lines` -> `parse_envelope` -> `classify` (bronze rows, tombstone lines, quarantine).
Silver: `order_key` -> `latest_per_key` -> `typed_rows` -> `effective_changes` against the current state.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

OPS = ("c", "u", "d", "r", "t")
SNAPSHOT_MARKERS = ("true", "first", "last", "first_in_data_collection", "last_in_data_collection")

# Parsed with string leaves: Spark keeps nested objects as their JSON text, so every table shares one
# bronze schema and the images are typed later, in silver, from the schema or the data.
_RECORD_SCHEMA = "schema STRING, payload STRING, before STRING, after STRING, source STRING, op STRING, ts_ms BIGINT"
_PAYLOAD_SCHEMA = "before STRING, after STRING, source STRING, op STRING, ts_ms BIGINT"


def split_lines(files: DataFrame) -> DataFrame:
    """(_source_file, content) -> one row per line with its 1-based line number.

    The newline that ends the file does not make an extra empty line; blank lines inside a file do
    (they are quarantined, never dropped)."""
    lines = files.select("_source_file", F.posexplode(F.split("content", "\n")).alias("_pos", "_raw"))
    last = F.max("_pos").over(Window.partitionBy("_source_file"))
    return (
        lines.withColumn("_last", last)
        .where(~((F.col("_pos") == F.col("_last")) & (F.col("_raw") == "")))
        .select("_source_file", (F.col("_pos") + 1).cast("long").alias("_line"),
                F.regexp_replace("_raw", "\r$", "").alias("_raw"))
    )


# Debezium's ExtractNewRecordState puts source fields at the top level as `__<field>` (or
# `__source_<field>` when added as `source.<field>`); these are the ones ordering and lineage read.
FLAT_SOURCE_FIELDS = ("connector", "name", "db", "schema", "table", "lsn", "txId", "snapshot", "file", "pos", "row",
                      "gtid", "server_id", "commit_lsn", "change_lsn", "event_serial_no", "sequence", "ts_ms")


def parse_envelope(lines: DataFrame, fmt: str = "auto") -> DataFrame:
    """Parse a Debezium JSON record, with or without the schema envelope, keeping the raw line.

    Flattened records (ExtractNewRecordState, `format: json-flat`, or with `auto` any record carrying
    `__op` or `__deleted`) are mapped onto the same columns: the record is the row image, `__op` (or
    `__deleted`, delete.handling.mode=rewrite) the op, and the `__` fields the source block.

    Adds op, ts_ms, source, before, after (JSON text), _schema (the envelope's schema, or null) and
    _json_ok (false when the line is not valid JSON)."""
    rec = F.from_json("_raw", _RECORD_SCHEMA)
    payload = F.from_json(rec["payload"], _PAYLOAD_SCHEMA)
    enveloped = rec["payload"].isNotNull() & rec["op"].isNull()
    body = F.when(enveloped, rec["payload"]).otherwise(F.col("_raw"))
    flat_fields = F.from_json(body, "map<string,string>")

    def meta(name: str) -> Column:
        return flat_fields[f"__{name}"]

    has_marker = meta("op").isNotNull() | meta("deleted").isNotNull()
    # Debezium's own envelope never has `__op`/`__deleted` at its top level
    flat = F.lit(fmt == "json-flat") if fmt != "auto" else has_marker
    deleted = F.lower(meta("deleted"))
    flat_op = F.coalesce(meta("op"), F.when(deleted == "true", "d").when(deleted == "false", "u"))
    flat_source = F.to_json(F.struct(*[F.coalesce(meta(f"source_{name}"), meta(name) if name != "ts_ms" else F.lit(None))
                                       .alias(name) for name in FLAT_SOURCE_FIELDS]))

    def pick(name: str) -> Column:
        return F.when(enveloped, payload[name]).otherwise(rec[name])

    return lines.select(
        "*",
        F.expr("try_parse_json(_raw)").isNotNull().alias("_json_ok"),
        F.when(flat, flat_op).otherwise(pick("op")).alias("op"),
        F.when(flat, F.coalesce(meta("ts_ms"), meta("source_ts_ms")).cast("long")).otherwise(pick("ts_ms")).alias("ts_ms"),
        F.when(flat, flat_source).otherwise(pick("source")).alias("source"),
        F.when(flat, F.when(flat_op == "d", body)).otherwise(pick("before")).alias("before"),
        F.when(flat, F.when(flat_op != "d", body)).otherwise(pick("after")).alias("after"),
        F.when(enveloped, rec["schema"]).alias("_schema"),
    )


ENVELOPE_FIELDS = ("before", "after", "source", "op", "ts_ms", "transaction")


def parquet_image_type(schema: StructType) -> StructType:
    """The row image's columns in a Parquet landing file: the `after` struct of a Debezium envelope, or a
    flattened record's own columns (without the `__` metadata ones)."""
    names = set(schema.fieldNames())
    if "after" in names and isinstance(schema["after"].dataType, StructType):
        return schema["after"].dataType
    return StructType([f for f in schema.fields if not f.name.startswith("__") and not
                       ("op" in names and f.name in ENVELOPE_FIELDS)])


def key_image() -> Column:
    """The image the key comes from: `before` for deletes, `after` for c/u/r (DESIGN 4.2)."""
    return F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after"))


def missing_keys(keys: tuple[str, ...]) -> Column:
    """Comma-separated key columns that are null or absent in the key image ('' when all present)."""
    parts = [F.when(F.get_json_object(key_image(), f"$.{k}").isNull(), F.lit(k)) for k in keys]
    return F.concat_ws(",", *parts)


def missing_keys_typed(keys: tuple[str, ...]) -> Column:
    """Like `missing_keys`, on typed key columns (a key that did not parse to its type is missing)."""
    return F.concat_ws(",", *[F.when(F.col(k).isNull(), F.lit(k)) for k in keys])


def classify(parsed: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Adds `_kind` (event | tombstone | quarantine) and `reason` for quarantined lines."""
    trimmed = F.trim(F.col("_raw"))
    missing = missing_keys(keys)
    reason = (
        F.when(trimmed == "", "empty_line")
        .when(~F.col("_json_ok"), "malformed_json")
        .when(F.col("op").isNull(), "not_debezium: no op field")
        .when(~F.col("op").isin(*OPS), F.concat(F.lit("unknown_op: "), F.col("op")))
        .when((F.col("op") != "t") & (missing != ""), F.concat(F.lit("missing_key: "), missing))
    )
    # a Kafka tombstone is `null`, or with the JSON converter's schemas.enable=true, an empty envelope
    tombstone = (trimmed == "null") | trimmed.rlike(r'^\{\s*"schema"\s*:\s*null\s*,\s*"payload"\s*:\s*null\s*\}$')
    kind = F.when(tombstone, "tombstone").when(reason.isNotNull(), "quarantine").otherwise("event")
    return parsed.withColumn("_kind", kind).withColumn("reason", F.when(kind == "quarantine", reason))


# ---- silver ---------------------------------------------------------------------------------------


def _src(field: str) -> Column:
    return F.get_json_object(F.col("source"), f"$.{field}")


def _pad(col: Column, width: int = 20) -> Column:
    return F.lpad(col, width, "0")


def _snapshot_rank() -> Column:
    """0 for snapshot events, 1 for streaming ones: snapshot rows rank first at a shared position."""
    is_snapshot = (F.col("op") == "r") | F.lower(F.coalesce(_src("snapshot"), F.lit("false"))).isin(*SNAPSHOT_MARKERS)
    return F.when(is_snapshot, "0").otherwise("1")


def connector_sequence() -> Column:
    """A sortable string from the connector's log position; null when the connector has none we know.

    PostgreSQL: lsn, snapshot rank. MySQL: binlog file number, pos, snapshot rank, row.
    SQL Server: commit_lsn, change_lsn, event_serial_no. Never ts_ms: it ties and it is a wall clock.
    Without `source.connector` (flattened records) the connector is told by the fields present."""
    connector = F.coalesce(_src("connector"), F.when(_src("lsn").isNotNull(), "postgresql")
                           .when(_src("file").isNotNull() & _src("pos").isNotNull(), "mysql")
                           .when(_src("commit_lsn").isNotNull(), "sqlserver"))
    pg = F.concat_ws("|", _pad(_src("lsn")), _snapshot_rank())
    binlog_no = F.regexp_extract(_src("file"), r"(\d+)$", 1)
    row = _pad(F.coalesce(_src("row"), F.lit("0")), 10)
    mysql = F.concat_ws("|", _pad(binlog_no, 10), _pad(_src("pos")), _snapshot_rank(), row)
    sqlserver = F.concat_ws("|", _src("commit_lsn"), _src("change_lsn"), _pad(_src("event_serial_no")))
    return (
        F.when((connector == "postgresql") & _src("lsn").isNotNull(), pg)
        .when((connector == "mysql") & _src("file").isNotNull() & _src("pos").isNotNull(), mysql)
        .when((connector == "sqlserver") & _src("commit_lsn").isNotNull() & _src("change_lsn").isNotNull(), sqlserver)
    )


def configured_sequence(columns: tuple[str, ...]) -> Column:
    """`sequence_by` from tables.yaml: fields of the row image, or `source.<field>`; numbers are
    zero-padded so they sort as strings. Null when any part is missing."""
    parts = []
    for name in columns:
        raw = _src(name.split(".", 1)[1]) if name.startswith("source.") else F.get_json_object(key_image(), f"$.{name}")
        parts.append(F.when(raw.rlike(r"^\d+$"), _pad(raw)).otherwise(raw))
    any_missing = reduce(lambda a, b: a | b, [p.isNull() for p in parts])
    return F.when(~any_missing, F.concat_ws("|", *parts))


def order_key(events: DataFrame, sequence_by: tuple[str, ...] | None) -> DataFrame:
    """Adds `_seq`, the event's position in the source log (DESIGN 4.1)."""
    seq = configured_sequence(sequence_by) if sequence_by else connector_sequence()
    return events.withColumn("_seq", seq)


def latest_per_key(events: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Keep the newest event per key: highest `_seq`, ties broken by landing file and line.

    Adds `_tie` (true when another event with different content shares the winner's sequence) and
    `_events` (how many events the key had in the batch)."""
    by_key = Window.partitionBy(*keys)
    newest = Window.partitionBy(*keys).orderBy(F.col("_seq").desc(), F.col("_source_file").desc(), F.col("_line").desc())
    at_top = Window.partitionBy(*keys, "_seq")
    content = F.concat_ws("\u0001", F.col("op"), F.coalesce(F.col("before"), F.lit("")), F.coalesce(F.col("after"), F.lit("")))
    ranked = (
        events.withColumn("_rank", F.row_number().over(newest))
        .withColumn("_variants", F.size(F.collect_set(content).over(at_top)))
        .withColumn("_events", F.count(F.lit(1)).over(by_key))
    )
    return ranked.where("_rank = 1").withColumn("_tie", F.col("_variants") > 1).drop("_rank", "_variants")


def effective_changes(latest: DataFrame, state: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Latest events newer than the key's current state; state = live silver rows and the tombstone
    ledger (key, _seq of the delete). Older events are stale: they never overwrite, and a late event
    older than a delete never brings the row back."""
    current = state.select(*keys, F.col("_seq").alias("_state_seq"))
    joined = latest.join(current, list(keys), "left")
    return joined.where(F.col("_state_seq").isNull() | (F.col("_seq") > F.col("_state_seq"))).drop("_state_seq")
