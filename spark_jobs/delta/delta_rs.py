"""delta-rs engine: Spark computes, delta-rs commits.

Reads never go through delta-rs' pyarrow-dataset readers (they abort the interpreter at exit about half
the time here, DESIGN 2): Spark reads the snapshot's Parquet file list directly."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_jobs.delta import MergeResult, MergeSpec, key_predicate


class DeltaRsEngine:
    name = "delta-rs"

    def __init__(self, storage_options: dict[str, str] | None = None):
        self.storage_options = storage_options

    def _table(self, path: str, version: int | None = None) -> DeltaTable | None:
        try:
            return DeltaTable(path, version=version, storage_options=self.storage_options)
        except TableNotFoundError:
            return None

    def version(self, path: str) -> int | None:
        table = self._table(path)
        return None if table is None else table.version()

    def schema(self, path: str) -> T.StructType | None:
        table = self._table(path)
        if table is None:
            return None
        return T.StructType.fromJson(json.loads(table.schema().to_json()))

    def read(self, spark: SparkSession, path: str, version: int | None = None) -> DataFrame | None:
        table = self._table(path, version)
        if table is None:
            return None
        schema = T.StructType.fromJson(json.loads(table.schema().to_json()))
        files = table.file_uris()
        if not files:
            return spark.createDataFrame([], schema)
        # basePath lets Spark take partition values from the hive-style folders delta-rs writes
        return spark.read.schema(schema).option("basePath", path).parquet(*files)

    @staticmethod
    def _arrow(df: DataFrame) -> pa.Table:
        # Spark marks columns NOT NULL from the plan (a literal, current_timestamp()); a Delta table created
        # from that would reject later batches that legitimately hold nulls there
        data = df.toArrow()
        return data.cast(pa.schema([f.with_nullable(True) for f in data.schema]))

    def append(self, df: DataFrame, path: str, partition_by: tuple[str, ...] = ()) -> int:
        data = self._arrow(df)
        write_deltalake(path, data, mode="append", partition_by=list(partition_by) or None,
                        schema_mode="merge", storage_options=self.storage_options)
        return self._must(path).version()

    def overwrite(self, df: DataFrame, path: str, partition_by: tuple[str, ...] = ()) -> int:
        write_deltalake(path, self._arrow(df), mode="overwrite", partition_by=list(partition_by) or None,
                        schema_mode="overwrite", storage_options=self.storage_options)
        return self._must(path).version()

    def replace(self, df: DataFrame, path: str, predicate: str, partition_by: tuple[str, ...] = ()) -> int:
        write_deltalake(path, self._arrow(df), mode="overwrite", predicate=predicate,
                        partition_by=list(partition_by) or None, storage_options=self.storage_options)
        return self._must(path).version()

    def merge(self, df: DataFrame, path: str, spec: MergeSpec, partition_by: tuple[str, ...] = ()) -> MergeResult:
        data = self._arrow(df)
        table = self._table(path)
        if table is None:  # first batch: create the table with the source's schema, then merge as usual
            write_deltalake(path, data.slice(0, 0), partition_by=list(partition_by) or None,
                            storage_options=self.storage_options)
            table = self._must(path)
        merger = table.merge(data, predicate=key_predicate(spec.keys, '"'), source_alias="s", target_alias="t",
                             merge_schema=True)
        if spec.delete_when:
            merger = merger.when_matched_delete(predicate=spec.delete_when)
        if spec.update_when:
            merger = merger.when_matched_update_all(predicate=spec.update_when)
        if spec.insert_when:
            merger = merger.when_not_matched_insert_all(predicate=spec.insert_when)
        metrics = merger.execute()
        return MergeResult(version=self._must(path).version(), inserted=metrics.get("num_target_rows_inserted", 0),
                           updated=metrics.get("num_target_rows_updated", 0),
                           deleted=metrics.get("num_target_rows_deleted", 0))

    def delete(self, path: str, predicate: str) -> int:
        return int(self._must(path).delete(predicate).get("num_deleted_rows", 0))

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        table = self._table(path)
        return [] if table is None else table.history(limit)

    def restore(self, path: str, version: int) -> int:
        table = self._must(path)
        table.restore(version)
        return self._must(path).version()

    def _must(self, path: str) -> DeltaTable:
        table = self._table(path)
        if table is None:
            raise FileNotFoundError(f"no Delta table at {path}")
        return table
