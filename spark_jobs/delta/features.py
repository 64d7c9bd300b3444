"""Which Delta tables a plain read of their Parquet files gets right (no pyspark: the sensor and `status`
read small state tables through this).

The project's light readers take a snapshot's active Parquet files as the table's rows (delta-rs'
pyarrow-dataset readers abort the interpreter at exit here; docs/architecture.md). That holds unless a
reader feature changes what a file means: deletion vectors mark rows of a file deleted, column mapping
renames its columns. Such tables are read with a reader that honours the feature instead."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

if TYPE_CHECKING:
    import pyarrow as pa

# reader features under which the snapshot's Parquet files hold exactly the table's rows
PLAIN_PARQUET_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck"})


def unplain_features(table: DeltaTable) -> list[str]:
    """The table's reader features that a plain Parquet read, or a delta-rs rewrite, would get wrong."""
    protocol = table.protocol()
    features = set(protocol.reader_features or []) - PLAIN_PARQUET_FEATURES
    if protocol.min_reader_version == 2 or table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
        features.add("columnMapping")  # reader version 2 is column mapping, from before features were named
    return sorted(features)


def query(table: DeltaTable, sql: str) -> dict[str, list[Any]]:
    """`sql` over the table (named `t`) through delta-rs' DataFusion provider, which applies deletion vectors;
    for the small state tables of a lake written by delta-spark."""
    return query_batches(table, sql).read_all().to_pydict()


def query_batches(table: DeltaTable, sql: str) -> pa.RecordBatchReader:
    """`query`'s result as a stream of Arrow batches, for a reader that keeps a few of a big table's rows."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    return pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute(sql))
