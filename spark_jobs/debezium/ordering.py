"""A change event's position in its source log, `_seq`: a string that sorts as the log does, from the
connector's rules (debezium/connectors.py) or the table's `sequence_by` (docs/architecture.md,
"Ordering")."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.debezium import connectors
from spark_jobs.debezium.envelope import key_image, transaction_id


def _src(field: str) -> Column:
    return F.get_json_object(F.col("source"), f"$.{field}")


def _pad(col: Column, width: int = 20) -> Column:
    return F.lpad(col, width, "0")


_SOURCE_POSITION = ", ".join(f"{name} STRING" for name in connectors.SOURCE_FIELDS)


def connector_sequence(events: DataFrame) -> DataFrame:
    """Adds `_seq`, a sortable string from the connector's log position (spark_jobs.connectors); null
    when the connector has none we know. Without `source.connector` (flattened records) the connector is
    told by the fields present."""
    return events.withColumn("_src", source_position()).withColumn("_seq", sequence(None)).drop("_src")


def with_transaction_key(events: DataFrame) -> DataFrame:
    """Adds `_transaction_id`: the part of the event's transaction id that every record of its transaction shares,
    by its connector's rule (connectors.transaction_key_sql); null outside a transaction (a snapshot read)."""
    return (events.withColumn("_src", source_position()).withColumn("_txid", transaction_id())
            .withColumn("_transaction_id", F.expr(connectors.transaction_key_sql("_txid"))).drop("_src", "_txid"))


def source_position() -> Column:
    """The source block's position fields, which `sequence` reads from the column `_src`."""
    return F.from_json("source", _SOURCE_POSITION)


def sequence(sequence_by: tuple[str, ...] | None) -> Column:
    """An event's `_seq`: by `sequence_by`, else by its connector's rules (reading `_src`, `source_position`)."""
    return configured_sequence(sequence_by) if sequence_by else F.expr(connectors.sequence_sql())


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
    """Adds `_seq`, the event's position in the source log (docs/architecture.md, "Ordering")."""
    if sequence_by:
        return events.withColumn("_seq", configured_sequence(sequence_by))
    return connector_sequence(events)
