"""delta-spark engine, for Spark sessions with Delta's jars on the classpath (clusters, the
docker-compose Spark image). Same MergeSpec meaning as delta-rs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_jobs.delta import (
    CHANGE_FEED,
    MergeResult,
    MergeSpec,
    NewFiles,
    key_predicate,
    log_retention,
    records_changes,
    retention_hours,
    spark_frame,
)
from spark_jobs.delta.reads import current, new_files, open_table, read_arrow
from spark_jobs.sql_text import ident, literal

if TYPE_CHECKING:
    from spark_jobs.delta import Rows


class DeltaSparkEngine:
    name = "delta-spark"

    def __init__(self, spark: SparkSession):
        from delta.tables import DeltaTable  # the Python API; needs the JVM jars at call time

        self.spark, self._DeltaTable = spark, DeltaTable
        spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")

    def _exists(self, path: str) -> bool:
        return bool(self._DeltaTable.isDeltaTable(self.spark, path))

    # a table's version and commits from its log, as delta-rs reads it: DeltaTable.history is a Spark job per call,
    # and a small batch asks for versions dozens of times (W2 on delta-spark: tests/benchmarks/RESULTS.md)
    def version(self, path: str) -> int | None:
        table = open_table(path)
        return None if table is None else table.version()

    def schema(self, path: str) -> T.StructType | None:
        return self.spark.read.format("delta").load(path).schema if self._exists(path) else None

    def read(self, spark: SparkSession, path: str, version: int | None = None) -> DataFrame | None:
        if not self._exists(path):
            return None
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(path)

    def current(self, path: str) -> tuple[int, str] | None:
        return current(path)  # from the log, as delta-rs reads it: no Spark job

    def new_files(self, path: str, after: int) -> NewFiles | None:
        return new_files(path, after)

    def read_where(self, path: str, columns: list[str], where: Callable[[pa.Schema], pc.Expression]) -> pa.Table | None:
        return read_arrow(path, columns, where=where)  # the snapshot's files, read on the driver as delta-rs reads them

    def _frame(self, df: Rows) -> DataFrame:
        return spark_frame(self.spark, df) if isinstance(df, pa.Table) else df

    def append(self, df: Rows, path: str, partition_by: tuple[str, ...] = (), small: bool = False) -> int:
        df = self._frame(df)  # Spark writes on every executor, whatever the batch's size
        df.write.format("delta").mode("append").option("mergeSchema", "true").partitionBy(*partition_by).save(path)
        return self.version(path) or 0

    def overwrite(self, df: DataFrame, path: str, partition_by: tuple[str, ...] = ()) -> int:
        (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
         .partitionBy(*partition_by).save(path))
        return self.version(path) or 0

    def replace(self, df: Rows, path: str, predicate: str, partition_by: tuple[str, ...] = ()) -> int:
        (self._frame(df).write.format("delta").mode("overwrite").option("replaceWhere", predicate)
         .partitionBy(*partition_by).save(path))
        return self.version(path) or 0

    def merge(self, df: Rows, path: str, spec: MergeSpec, partition_by: tuple[str, ...] = (),
              small: bool = False) -> MergeResult:
        df = self._frame(df)
        if not self._exists(path) and spec.insert_when:
            # an initial load: into no table, a merge inserts the rows its insert clause takes, and nothing else
            df.alias("s").where(spec.insert_when).drop(*[spec.marker] if spec.marker else []).write.format("delta") \
                .partitionBy(*partition_by).save(path)
            written = self.history(path, 1)[0]
            inserted = int((written.get("operationMetrics") or {}).get("numOutputRows", 0))
            return MergeResult(version=written["version"], inserted=inserted, updated=0, deleted=0)
        if not self._exists(path):
            df.limit(0).write.format("delta").partitionBy(*partition_by).save(path)
        predicate = key_predicate(spec.keys, ident, "<=>" if spec.null_safe else None)
        merger = self._DeltaTable.forPath(self.spark, path).alias("t").merge(df.alias("s"), predicate)
        # with a marker, each written column is named: Delta's update-all and insert-all would write the marker too
        written = {ident(c): f"s.{ident(c)}" for c in df.columns if c != spec.marker}
        if spec.delete_when:
            merger = merger.whenMatchedDelete(condition=spec.delete_when)
        if spec.update_when:
            merger = merger.whenMatchedUpdate(condition=spec.update_when, set=written) if spec.marker \
                else merger.whenMatchedUpdateAll(condition=spec.update_when)
        if spec.insert_when:
            merger = merger.whenNotMatchedInsert(condition=spec.insert_when, values=written) if spec.marker \
                else merger.whenNotMatchedInsertAll(condition=spec.insert_when)
        # the merge's own counts (a merge that changes nothing makes no commit, so history would show the last one)
        counts = merger.execute().first()
        assert counts is not None  # one row, always
        return MergeResult(version=self.version(path) or 0, inserted=int(counts["num_inserted_rows"]),
                           updated=int(counts["num_updated_rows"]), deleted=int(counts["num_deleted_rows"]))

    def delete(self, path: str, predicate: str) -> int:
        before = self.version(path)
        self._DeltaTable.forPath(self.spark, path).delete(predicate)
        last = self.history(path, 1)[0]
        if last["version"] == before:  # nothing matched: no commit
            return 0
        return int((last.get("operationMetrics") or {}).get("numDeletedRows", 0))

    def literal(self, value: str) -> str:
        """Spark SQL's: a quote or backslash inside a string is escaped with a backslash (`'a''b'` would be
        two adjacent literals, read as `ab`)."""
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        table = open_table(path)
        return [] if table is None else table.history(limit)

    def restore(self, path: str, version: int) -> int:
        self._DeltaTable.forPath(self.spark, path).restoreToVersion(version)
        return self.version(path) or 0

    def changes(self, spark: SparkSession, path: str, after: int, upto: int) -> DataFrame | None:
        if not (self._records_changes(path, after) and self._records_changes(path, upto)):
            return None
        return (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", after + 1)
                .option("endingVersion", upto).load(path).drop("_commit_version", "_commit_timestamp"))

    def _records_changes(self, path: str, version: int) -> bool:
        # the table's settings at that version, from its log (delta-rs reads a log as well as Delta does)
        table = open_table(path, version)
        return table is not None and records_changes(table.metadata().configuration)

    def changes_recorded(self, path: str) -> bool:
        return self._records_changes(path, self.version(path) or 0)

    def record_changes(self, path: str) -> None:
        if not self.changes_recorded(path):
            self.spark.sql(f"ALTER TABLE delta.{ident(path)} SET TBLPROPERTIES ({literal(CHANGE_FEED)} = 'true')")

    def compact(self, path: str, target_bytes: int, zorder_by: tuple[str, ...] = ()) -> None:
        self.spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(target_bytes))
        optimize = self._DeltaTable.forPath(self.spark, path).optimize()
        if zorder_by:
            optimize.executeZOrderBy(*zorder_by)
        else:
            optimize.executeCompaction()

    def checkpoint(self, path: str, retain_s: int) -> None:
        wanted = log_retention(retain_s)
        if wanted:
            self.spark.sql(f"ALTER TABLE delta.{ident(path)} SET TBLPROPERTIES ('delta.logRetentionDuration' = "
                           f"{literal(wanted)})")
        # Delta's Python API has no checkpoint call; its Scala DeltaLog does (and drops expired log files with it)
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, path).checkpoint()

    def vacuum(self, path: str, retain_s: int) -> None:
        # Delta refuses a retention under 7 days unless its check is off: the window is the project's setting,
        # never under an hour (registry.MIN_RETAIN_VERSIONS_S)
        self.spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        # VACUUM lists a table's folders in this many tasks: Spark's default, 10,000, took 30-44 s for a
        # six-file table on two cores; a few tasks per core lists as fast on a cluster
        tasks = max(8, 4 * self.spark.sparkContext.defaultParallelism)
        self.spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", str(tasks))
        self._DeltaTable.forPath(self.spark, path).vacuum(float(retention_hours(retain_s)))
