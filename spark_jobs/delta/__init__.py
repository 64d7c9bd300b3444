"""All Delta I/O goes through `DeltaEngine` (docs/architecture.md, "Delta engines"): delta-rs (the embedded
default: Spark computes, delta-rs commits from the driver) or delta-spark (Spark writes, on every executor;
CDC_DELTA_ENGINE=delta-spark). Both give the same meaning to the same `MergeSpec`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

if TYPE_CHECKING:  # the package's pure modules (features) are read where pyspark is not imported
    from typing import TypeAlias

    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T

    # what the engines write: a Spark frame, or rows made on the driver as Arrow (driver_rows)
    Rows: TypeAlias = DataFrame | pa.Table


@dataclass(frozen=True)
class MergeSpec:
    """Merge `s` (source) into `t` (target) on equal keys; each clause applies when its SQL condition
    over `s` and `t` holds (None = never). Conditions use only `=`, `<>`, `>`, AND/OR on plain columns so
    that both engines read them alike."""

    keys: tuple[str, ...]
    delete_when: str | None = None
    update_when: str | None = None
    insert_when: str | None = None
    null_safe: bool = False  # keys equal when both are NULL (a gold model's group may be NULL; silver's keys never are)
    marker: str | None = None  # a source column the conditions read that is not written to the target


@dataclass(frozen=True)
class MergeResult:
    version: int
    inserted: int
    updated: int
    deleted: int


@dataclass(frozen=True)
class NewFiles:
    """A table's files added since a version: what a reader of only its new rows opens."""

    version: int
    files: tuple[str, ...]
    schema: str  # the table's schema, as JSON
    size: int  # the files' bytes
    rows: int | None  # the files' rows, from their statistics; None when a file has none


class DeltaEngine(Protocol):
    name: str

    def version(self, path: str) -> int | None: ...  # None when there is no table at `path`
    def schema(self, path: str) -> T.StructType | None: ...
    def read(self, spark: SparkSession, path: str, version: int | None = None) -> DataFrame | None: ...
    def current(self, path: str) -> tuple[int, str] | None: ...  # version and schema (JSON) from one read of the log
    # the files of the current version not there at version `after` (-1: none was), from the log (reads.new_files);
    # None when nothing is newer, or when a plain read of them would get their rows wrong
    def new_files(self, path: str, after: int) -> NewFiles | None: ...
    # the rows (of `columns`) passing `where` (made from the schema read), on the driver as Arrow: a few keys' rows
    # of a big table, memory holding the rows kept; None when there is no table
    def read_where(self, path: str, columns: list[str], where: Callable[[pa.Schema], pc.Expression]
                   ) -> pa.Table | None: ...
    # `small`: the rows of a small batch, which fit in the driver's memory; an engine committing from the driver
    # (delta-rs) takes them there as Arrow rather than through a Spark write (its job and commit protocol)
    def append(self, df: Rows, path: str, partition_by: tuple[str, ...] = (), small: bool = False) -> int: ...
    def overwrite(self, df: DataFrame, path: str, partition_by: tuple[str, ...] = ()) -> int: ...
    # rows matching `predicate` (SQL over plain columns) replaced by `df`, in one commit
    def replace(self, df: Rows, path: str, predicate: str, partition_by: tuple[str, ...] = ()) -> int: ...
    def merge(self, df: Rows, path: str, spec: MergeSpec, partition_by: tuple[str, ...] = (),
              small: bool = False) -> MergeResult: ...
    def delete(self, path: str, predicate: str) -> int: ...  # rows deleted
    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]: ...
    def restore(self, path: str, version: int) -> int: ...
    # the rows each commit after `after` up to `upto` changed (Delta's change data feed: the table's columns and
    # `_change_type`, one of insert, delete, update_preimage, update_postimage); None when the feed was not on
    def changes(self, spark: SparkSession, path: str, after: int, upto: int) -> DataFrame | None: ...
    def changes_recorded(self, path: str) -> bool: ...  # the change data feed is on (delta.enableChangeDataFeed)
    def record_changes(self, path: str) -> None: ...  # turn it on
    # `value` as a string literal in the SQL dialect of the engine's predicates
    def literal(self, value: str) -> str: ...
    # maintenance (spark_jobs/maintenance.py), Delta's own commands: OPTIMIZE (Z-ordered by `zorder_by` when
    # given) into files of about `target_bytes`; a checkpoint, and the log kept for at least `retain_s`;
    # VACUUM of the files no version younger than `retain_s` needs
    def compact(self, path: str, target_bytes: int, zorder_by: tuple[str, ...] = ()) -> None: ...
    def checkpoint(self, path: str, retain_s: int) -> None: ...
    def vacuum(self, path: str, retain_s: int) -> None: ...


@lru_cache(maxsize=32)
def _arrow_schema(ddl: str) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import DataType, StructType

    struct = DataType.fromDDL(ddl)
    assert isinstance(struct, StructType)
    return to_arrow_schema(struct, timezone="UTC")  # a Delta timestamp is an instant; Arrow's type names UTC


def driver_rows(rows: list[tuple[Any, ...]], ddl: str) -> pa.Table:
    """Rows made on the driver (the ingest log's lines, silver's progress) as Arrow, with the table's
    schema in Spark's DDL. delta-rs commits them with no Spark job; a Spark frame of Python rows cost a
    Parquet write job and a Python worker, 0.15-0.3 s a table here. delta-spark makes its frame of them."""
    import pyarrow as pa

    schema = _arrow_schema(ddl)
    return pa.Table.from_pylist([dict(zip(schema.names, row, strict=True)) for row in rows], schema=schema)


def spark_frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    """A Spark frame of Arrow rows on the driver, every row in it. pyspark sends a table's chunks as Arrow batches,
    and its reader stops at an empty batch other than the first: the rows of a filtered or joined table after one
    were silently lost (tests/unit/test_delta_engines.py). A table of one chunk has no empty batch."""
    return spark.createDataFrame(rows.combine_chunks())


def all_nullable(schema: pa.Schema) -> pa.Schema:
    """Spark marks columns NOT NULL from the plan (a literal, current_timestamp()); a Delta table created from
    that would reject later batches that legitimately hold nulls there."""
    import pyarrow as pa

    return pa.schema([f.with_nullable(True) for f in schema])


# Delta's default delta.logRetentionDuration: commits older than this go at a checkpoint, and with them time travel
LOG_RETENTION_S = 30 * 86400


def log_retention(retain_s: int) -> str | None:
    """The delta.logRetentionDuration a time-travel window longer than Delta's default needs (None: the default
    covers it)."""
    return None if retain_s <= LOG_RETENTION_S else f"interval {-(-retain_s // 86400)} days"


def retention_hours(retain_s: int) -> int:
    """VACUUM takes whole hours: rounded up, so it never keeps less than asked."""
    return -(-retain_s // 3600)


def table_files(table: DeltaTable) -> list[str]:
    """The paths of a delta-rs table's data files as they are named on disk or in the bucket: delta-rs gives them
    under its table's root URL-encoded (`odd%20name/part-…`), which neither Spark nor Arrow decodes; what lies under
    the root (a partition's folder) is already as named."""
    root = table.table_uri.removeprefix("file://").rstrip("/") + "/"
    return [unquote(root) + uri[len(root):] if uri.startswith(root) else uri for uri in table.file_uris()]


def delta_jars_present(spark: SparkSession) -> bool:
    jvm = getattr(spark.sparkContext, "_jvm", None)
    if jvm is None:
        return False
    try:
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, jvm.Thread.currentThread().getContextClassLoader())
        return True
    except Exception:  # py4j raises Py4JJavaError(ClassNotFoundException): the jars are absent
        return False


def key_predicate(keys: tuple[str, ...], ident: Callable[[str], str], null_safe: str | None = None) -> str:
    """`t.k = s.k AND ...`, each key quoted by the engine's `ident`; with `null_safe`, the engine's operator that also
    holds when both are NULL (each in parentheses: delta-rs's parser binds `IS NOT DISTINCT FROM` looser than AND)."""
    if null_safe:
        return " AND ".join(f"(t.{ident(k)} {null_safe} s.{ident(k)})" for k in keys)
    return " AND ".join(f"t.{ident(k)} = s.{ident(k)}" for k in keys)


def datafusion_ident(name: str) -> str:
    """`name` as a delta-rs (DataFusion SQL) identifier, whatever characters it holds: in double quotes, a double quote
    inside doubled."""
    return '"' + name.replace('"', '""') + '"'


CHANGE_FEED = "delta.enableChangeDataFeed"


def records_changes(configuration: dict[str, str]) -> bool:
    return configuration.get(CHANGE_FEED, "false").lower() == "true"


UPKEEP = {"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES"}  # maintenance's and settings': no row changes


def commits_between(engine: DeltaEngine, path: str, after: int, upto: int) -> list[dict[str, Any]] | None:
    """The table's commits after `after` up to `upto` from its log, None when it no longer holds them all. The log is
    read back from the table's current version, which a writer may have moved past `upto` since."""
    if upto <= after:
        return []
    newest = engine.version(path) or upto
    commits = [c for c in engine.history(path, newest - after) if after < c["version"] <= upto]
    return commits if len(commits) == upto - after else None


def upkeep_only(engine: DeltaEngine, path: str, after: int, upto: int) -> bool:
    """Every commit to the table after `after` up to `upto` changed no row: maintenance's (spark_jobs/maintenance.py
    compacts, vacuums, keeps its log) or a setting's (gold turns silver's change feed on)."""
    commits = commits_between(engine, path, after, upto)
    return commits is not None and all(c.get("operation") in UPKEEP for c in commits)
