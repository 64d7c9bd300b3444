"""delta-rs engine: Spark computes, delta-rs commits.

Reads never go through delta-rs' pyarrow-dataset readers (they abort the interpreter at exit about half
the time here; docs/architecture.md, "Measured facts that shaped the choices"): Spark reads the snapshot's
Parquet file list directly. That is only right for tables whose reader features change no file's meaning:
a table with deletion vectors (written by delta-spark or another tool) or column mapping is read with
Delta's own Spark reader instead, and never written (delta-rs 1.6 rewrites a file without applying its
deletion vector, which brings deleted rows back).

Appends, overwrites and a merge into a table that does not exist yet (an initial load) never pass rows
through the driver: Spark's executors write the Parquet files into a folder of the table's own
(`cdc-<uuid>/`), and delta-rs commits them as they are, with statistics read from their footers
(delta/file_stats.py). A partitioned table's files would need their partition folders at the table's root
for Spark's reader to find the partition values, so its writes take the path below instead.

A merge (and a partitioned table's write, or a replace) hands delta-rs the rows as Arrow: Spark writes
them to a scratch Parquet folder (CDC_SPILL_DIR, default the system's temp folder) and delta-rs reads it
back a row group at a time, so memory stays bounded whatever the batch's size. A merge source up to
CDC_MERGE_SOURCE_MB (default 256) is held in memory, which lets delta-rs prune the target's files by the
source's key range; a larger one is streamed."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions
from pyarrow import fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_jobs.delta import (
    CHANGE_FEED,
    MergeResult,
    MergeSpec,
    NewFiles,
    all_nullable,
    datafusion_ident,
    key_predicate,
    log_retention,
    records_changes,
    retention_hours,
    spark_frame,
    table_files,
)
from spark_jobs.delta.features import unplain_features
from spark_jobs.delta.file_stats import delta_stats
from spark_jobs.delta.reads import current, new_files, open_table, read_arrow
from spark_jobs.errors import UnsupportedTable
from spark_jobs.settings import settings
from spark_jobs.storage import arrow_path, arrow_s3, delta_storage_options, is_s3

if TYPE_CHECKING:
    from spark_jobs.delta import Rows

SPILL_PREFIX = "cdc-spill-"
STAGED_PREFIX = "cdc-"  # a folder of the table's files one write committed: not hidden, so VACUUM sees them


def _remove_dead_runs_scratch() -> None:
    """Scratch folders of runs that were killed (their process is gone) hold copies of a batch's rows:
    remove them. A folder is named after the process that made it, so a live run's is left alone."""
    for folder in Path(settings().spill_dir or tempfile.gettempdir()).glob(f"{SPILL_PREFIX}*-*"):
        pid = folder.name[len(SPILL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _on_driver(df: Rows) -> pa.Table:
    """A small batch's frame collected as Arrow, for delta-rs to write from the driver. A Spark write of it (a job,
    the commit protocol's folders, each made with a forked `chmod` where Hadoop has no native library, then the files
    listed and read back) cost about 120 ms more a write than collecting it (tests/benchmarks/RESULTS.md, issue 32)."""
    if isinstance(df, pa.Table):
        return df
    collected = df.toArrow()
    return collected.cast(all_nullable(collected.schema))


@dataclass
class _Staged:
    """Parquet files Spark wrote into one folder (a table's, before they are committed; or scratch)."""

    fs: pafs.FileSystem
    root: str  # the folder, as `fs` names it
    files: list[str] = field(default_factory=list)
    actions: list[AddAction] = field(default_factory=list)
    schema: pa.Schema | None = None
    rows: int = 0

    def reader(self) -> pa.RecordBatchReader:
        assert self.schema is not None
        schema = self.schema

        def batches() -> Iterator[pa.RecordBatch]:
            for f in self.files:
                with self.fs.open_input_file(f) as handle:
                    for batch in pq.ParquetFile(handle).iter_batches(batch_size=65_536):
                        yield batch.cast(schema)

        return pa.RecordBatchReader.from_batches(schema, batches())

    def remove(self) -> None:
        if self.fs.get_file_info(self.root).type != pafs.FileType.NotFound:
            self.fs.delete_dir(self.root)


class DeltaRsEngine:
    name = "delta-rs"

    def __init__(self, storage_options: dict[str, str] | None = None):
        self.storage_options = storage_options  # None: a table's own (spark_jobs/storage.py: local, or S3 from AWS_*)
        _remove_dead_runs_scratch()

    def _options(self, path: str) -> dict[str, str] | None:
        return self.storage_options if self.storage_options is not None else delta_storage_options(path)

    def _table(self, path: str, version: int | None = None) -> DeltaTable | None:
        return open_table(path, version, options=self._options(path))

    def version(self, path: str) -> int | None:
        table = self._table(path)
        return None if table is None else table.version()

    def schema(self, path: str) -> T.StructType | None:
        table = self._table(path)
        if table is None:
            return None
        return T.StructType.fromJson(json.loads(table.schema().to_json()))

    def current(self, path: str) -> tuple[int, str] | None:
        return current(path, self._options(path))

    def new_files(self, path: str, after: int) -> NewFiles | None:
        return new_files(path, after, self._options(path))

    def read_where(self, path: str, columns: list[str], where: Callable[[pa.Schema], pc.Expression]) -> pa.Table | None:
        return read_arrow(path, columns, where=where, options=self._options(path))

    def read(self, spark: SparkSession, path: str, version: int | None = None) -> DataFrame | None:
        table = self._table(path, version)
        if table is None:
            return None
        unplain = unplain_features(table)
        if unplain:
            return self._read_with_delta_spark(spark, path, version, unplain)
        schema = T.StructType.fromJson(json.loads(table.schema().to_json()))
        files = table_files(table)
        if not files:
            return spark.createDataFrame([], schema)
        # basePath lets Spark take partition values from the hive-style folders delta-rs writes
        return spark.read.schema(schema).option("basePath", path).parquet(*files)

    @staticmethod
    def _read_with_delta_spark(spark: SparkSession, path: str, version: int | None, features: list[str]) -> DataFrame:
        from spark_jobs.delta import delta_jars_present

        if not delta_jars_present(spark):
            raise UnsupportedTable(path, features, "a plain Parquet read would get wrong and Delta's Spark reader is not "
                                   "on this session", "put the pinned jars on it (`make jars`, spark_jobs/jvm.py)")
        reader = spark.read.format("delta")
        return (reader if version is None else reader.option("versionAsOf", version)).load(path)

    def _writable(self, path: str) -> DeltaTable | None:
        """The table as it is now (None: there is none), which the write then goes through (one read of its log)."""
        table = self._table(path)
        unplain = [] if table is None else unplain_features(table)
        if unplain:
            raise UnsupportedTable(path, unplain, "delta-rs does not honour when it rewrites files (nothing was "
                                   "written)", "write it with CDC_DELTA_ENGINE=delta-spark")
        return table

    @contextmanager
    def _rows(self, df: Rows) -> Iterator[tuple[pa.RecordBatchReader, int]]:
        """The rows as a stream of Arrow batches, and their size in bytes (a DataFrame's on disk: see above)."""
        if isinstance(df, pa.Table):  # made on the driver: already in memory
            yield df.to_reader(), df.nbytes
            return
        folder = Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=settings().spill_dir or None))
        try:
            df.write.mode("overwrite").parquet(str(folder))
            files = sorted(folder.glob("part-*.parquet"))
            schema = pq.read_schema(files[0]) if files else df.limit(0).toArrow().schema
            scratch = _Staged(pafs.LocalFileSystem(), str(folder), [str(f) for f in files], schema=all_nullable(schema))
            yield scratch.reader(), sum(f.stat().st_size for f in files)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def append(self, df: Rows, path: str, partition_by: tuple[str, ...] = (), small: bool = False) -> int:
        table = self._writable(path)
        if small:
            df = _on_driver(df)
        if isinstance(df, DataFrame) and not partition_by:
            return self._commit(self._stage(df, path), path, "append")[0]
        with self._rows(df) as (rows, _):
            return self._write(table, path, rows, mode="append", partition_by=list(partition_by) or None,
                               schema_mode="merge")

    def overwrite(self, df: DataFrame, path: str, partition_by: tuple[str, ...] = ()) -> int:
        table = self._writable(path)
        if not partition_by:
            return self._commit(self._stage(df, path), path, "overwrite")[0]
        with self._rows(df) as (rows, _):
            return self._write(table, path, rows, mode="overwrite", partition_by=list(partition_by) or None,
                               schema_mode="overwrite")

    def _write(self, table: DeltaTable | None, path: str, rows: pa.RecordBatchReader | pa.Table, **how: Any) -> int:
        """write_deltalake into the table `_writable` loaded (None: there is none yet); its new version. Written through
        the loaded table, brought up to date first (its new commits only: the rows may have taken a Spark job to
        stage), whose state the commit then advances: by path, delta-rs would read the whole log twice more."""
        if table is None:
            write_deltalake(path, rows, storage_options=self._options(path), **how)
            return self._must(path).version()
        table.update_incremental()
        write_deltalake(table, rows, **how)
        return table.version()

    def _stage(self, df: DataFrame, path: str) -> _Staged:
        """Spark's executors write `df` into a new folder of the table's; its files as add actions (not yet
        committed: a reader sees none of them). What is not a data file (Spark's _SUCCESS marker, the local
        filesystem's checksums) is removed: VACUUM never removes a hidden file."""
        folder = f"{STAGED_PREFIX}{uuid.uuid4().hex}"
        uri = f"{path.rstrip('/')}/{folder}"
        staged = _Staged(arrow_s3() if is_s3(path) else pafs.LocalFileSystem(), arrow_path(uri))
        try:
            df.write.mode("errorifexists").parquet(uri)
            found = staged.fs.get_file_info(pafs.FileSelector(staged.root, recursive=True))
            data = sorted((f for f in found if f.is_file and f.base_name.startswith("part-")
                           and f.base_name.endswith(".parquet")), key=lambda f: f.path)
            for f in found:
                if f.is_file and f not in data:
                    staged.fs.delete_file(f.path)
            for f in data:
                meta = pq.read_metadata(f.path, filesystem=staged.fs)
                staged.schema = staged.schema or meta.schema.to_arrow_schema()
                mtime = f.mtime.timestamp() if f.mtime else 0.0
                staged.files.append(f.path)
                staged.rows += meta.num_rows
                staged.actions.append(AddAction(f"{folder}/{f.path[len(staged.root) + 1:]}", f.size, {},
                                                int(mtime * 1000), True, delta_stats(meta)))
        except BaseException:  # a failed write leaves no files behind
            staged.remove()
            raise
        staged.schema = all_nullable(staged.schema or df.limit(0).toArrow().schema)  # no file for no rows
        return staged

    def _commit(self, staged: _Staged, path: str, mode: str) -> tuple[int, int]:
        """Commit staged files (the table is created by the first): the new version, and the rows added."""
        table, schema = self._table(path), staged.schema
        assert schema is not None
        if table is None:
            create_table_with_add_actions(path, DeltaSchema.from_arrow(schema), staged.actions, mode="error",
                                          storage_options=self._options(path))
        elif mode == "append" and set(schema.names) - {f.name for f in table.schema().fields}:
            # new columns: a commit of files cannot change the schema, so delta-rs writes the rows itself, with
            # its schema merge, in one commit (rare: a source's schema changed)
            try:
                write_deltalake(path, staged.reader(), mode="append", schema_mode="merge",
                                storage_options=self._options(path))
            finally:
                staged.remove()
        else:
            table.create_write_transaction(list[AddAction | RemoveAction](staged.actions), mode=mode, schema=schema)
        return self._must(path).version(), staged.rows

    def replace(self, df: Rows, path: str, predicate: str, partition_by: tuple[str, ...] = ()) -> int:
        table = self._writable(path)
        with self._rows(df) as (rows, _):
            return self._write(table, path, rows, mode="overwrite", predicate=predicate,
                               partition_by=list(partition_by) or None)

    def merge(self, df: Rows, path: str, spec: MergeSpec, partition_by: tuple[str, ...] = (),
              small: bool = False) -> MergeResult:
        table = self._writable(path)
        if isinstance(df, DataFrame) and not partition_by and spec.insert_when and table is None:
            # an initial load: into no table, a merge inserts the rows its insert clause takes (Spark applies it: it
            # is SQL), and nothing else, in one commit
            inserts = df.alias("s").where(spec.insert_when).drop(*[spec.marker] if spec.marker else [])
            if small:
                created = _on_driver(inserts)
                return MergeResult(version=self.append(created, path), inserted=created.num_rows, updated=0, deleted=0)
            version, rows = self._commit(self._stage(inserts, path), path, "append")
            return MergeResult(version=version, inserted=rows, updated=0, deleted=0)
        if small:
            df = _on_driver(df)
        with self._rows(df) as (rows, size):
            return self._merge(table, rows, size, path, spec, partition_by)

    def _merge(self, table: DeltaTable | None, rows: pa.RecordBatchReader, size: int, path: str, spec: MergeSpec,
               partition_by: tuple[str, ...]) -> MergeResult:
        """The merge through the table `_writable` loaded (None: there is none yet), brought up to date first and
        advanced by the commit, as `_write` does."""
        if table is None:  # first batch: create the table with the source's schema (its marker left out), then merge
            schema = rows.schema if spec.marker is None else rows.schema.remove(rows.schema.get_field_index(spec.marker))
            write_deltalake(path, schema.empty_table(), partition_by=list(partition_by) or None,
                            storage_options=self._options(path))
            table = self._must(path)
        else:
            table.update_incremental()
        # in memory, delta-rs prunes the target's files by the source's key range; streamed, it cannot
        in_memory = size <= settings().merge_source_mb * 2**20
        source: Any = rows.read_all() if in_memory else rows
        predicate = key_predicate(spec.keys, datafusion_ident, "IS NOT DISTINCT FROM" if spec.null_safe else None)
        merger = table.merge(source, predicate=predicate, source_alias="s", target_alias="t",
                             merge_schema=spec.marker is None, streamed_exec=not in_memory)
        # each written column named and quoted: delta-rs' update-all and insert-all parse the names unquoted (a backtick
        # in a source column's name failed every merge) and would write the marker too
        written = {datafusion_ident(c): f"s.{datafusion_ident(c)}" for c in source.schema.names if c != spec.marker}
        if spec.delete_when:
            merger = merger.when_matched_delete(predicate=spec.delete_when)
        if spec.update_when:
            merger = merger.when_matched_update(written, predicate=spec.update_when)
        if spec.insert_when:
            merger = merger.when_not_matched_insert(written, predicate=spec.insert_when)
        metrics = merger.execute()
        return MergeResult(version=table.version(), inserted=metrics.get("num_target_rows_inserted", 0),
                           updated=metrics.get("num_target_rows_updated", 0),
                           deleted=metrics.get("num_target_rows_deleted", 0))

    def delete(self, path: str, predicate: str) -> int:
        return int(self._must(path, self._writable(path)).delete(predicate).get("num_deleted_rows", 0))

    def literal(self, value: str) -> str:
        """DataFusion's SQL: a quote inside a string is doubled."""
        return "'" + value.replace("'", "''") + "'"

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        table = self._table(path)
        return [] if table is None else table.history(limit)

    def restore(self, path: str, version: int) -> int:
        table = self._must(path, self._writable(path))
        table.restore(version)
        return table.version()

    def changes(self, spark: SparkSession, path: str, after: int, upto: int) -> DataFrame | None:
        """delta-rs reads the feed on the driver (its DataFusion reader), as Arrow: the changes of a few batches are
        small, and a Spark read of the feed needs Delta's jars, which the embedded default does without."""
        since, until = self._table(path, after), self._table(path, upto)
        if since is None or until is None or not records_changes(since.metadata().configuration) \
                or not records_changes(until.metadata().configuration):
            return None
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = T.StructType.fromJson(json.loads(until.schema().to_json())).add("_change_type", T.StringType())
        # its reader gives text as Arrow's string views, which Spark does not take: typed as the table's Spark schema
        typed = to_arrow_schema(schema, timezone="UTC")
        rows = pa.table(until.load_cdf(starting_version=after + 1, ending_version=upto).read_all())
        return spark_frame(spark, rows.select(typed.names).cast(typed))

    def changes_recorded(self, path: str) -> bool:
        return records_changes(self._must(path).metadata().configuration)

    def record_changes(self, path: str) -> None:
        table = self._must(path, self._writable(path))
        if not records_changes(table.metadata().configuration):
            table.alter.set_table_properties({CHANGE_FEED: "true"})

    def compact(self, path: str, target_bytes: int, zorder_by: tuple[str, ...] = ()) -> None:
        optimize = self._must(path, self._writable(path)).optimize
        if zorder_by:
            optimize.z_order(list(zorder_by), target_size=target_bytes)
        else:
            optimize.compact(target_size=target_bytes)

    def checkpoint(self, path: str, retain_s: int) -> None:
        table = self._must(path, self._writable(path))
        wanted = log_retention(retain_s)
        if wanted and table.metadata().configuration.get("delta.logRetentionDuration") != wanted:
            table.alter.set_table_properties({"delta.logRetentionDuration": wanted})
        table.create_checkpoint()
        table.cleanup_metadata()  # log files older than the log retention and than the checkpoint

    def vacuum(self, path: str, retain_s: int) -> None:
        # delta-rs refuses a retention under the table's deletedFileRetentionDuration (7 days) unless told:
        # the window is the project's setting, never under an hour (registry.MIN_RETAIN_VERSIONS_S)
        table = self._must(path, self._writable(path))  # its VACUUM does not know deletion vectors' files
        table.vacuum(retention_hours=retention_hours(retain_s), dry_run=False, enforce_retention_duration=False)
        if not is_s3(path):  # VACUUM removes files, not folders: the staged folders it emptied go too (S3 has none)
            for folder in Path(path).glob(f"{STAGED_PREFIX}*"):
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()

    def _must(self, path: str, loaded: DeltaTable | None = None) -> DeltaTable:
        """The table (`loaded`, else loaded now); FileNotFoundError when there is none."""
        table = loaded if loaded is not None else self._table(path)
        if table is None:
            raise FileNotFoundError(f"no Delta table at {path}")
        return table
