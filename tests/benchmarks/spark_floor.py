"""The Spark floor: the least a warm PySpark program does for the benchmark's step, in one long-lived session built
the way the pipeline service builds its own (spark_jobs/session.py). `apply`: read the change files with the lines'
schema, keep the newest event per key, hand the rows to Arrow, merge them into silver with delta-rs under the
pipeline's conditions; `load`: the same read and projection, silver written anew. No bronze, no gates, no ledger, no
quarantine, no typing: the project's figure over this one is the overhead the project itself adds on Spark, where
the DuckDB floor (floor.py) also counts what Spark itself costs. Both floors end in the same Arrow-to-Delta step
(floor.as_silver, floor.merge, floor.write_new), so they differ only in the engine that reads and dedupes."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.benchmarks import floor

# silver's Arrow types of the benchmark table's source columns, as Spark reads them from the JSON lines
SPARK_TYPES = {pa.int64(): "BIGINT", pa.int32(): "INT", pa.int16(): "SMALLINT", pa.string(): "STRING",
               pa.large_string(): "STRING", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}


class SparkFloor:
    """The session, made on first use and kept for the benchmark (the project's steps it is compared with run on the
    warm pipeline service); the first step it runs warms it and is not timed."""

    def __init__(self) -> None:
        self._spark: Any = None

    @property
    def spark(self) -> Any:
        if self._spark is None:
            from spark_jobs.session import build_session

            self._spark = build_session("bench-spark-floor")
        return self._spark

    def __enter__(self) -> SparkFloor:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None

    def timed(self, step: str, landing: Path, files: list[str], silver: Path, keys: tuple[str, ...],
              schema_of: Path | None, scratch: Path) -> float:
        """Seconds of `load` (silver written from `files`, in the schema of `schema_of`) or `apply` (merged into
        silver). On the session's first step, the same step runs once before, untimed, on `scratch` (silver's copy
        for `apply`), deleted after."""
        run = (lambda target: self.load(landing, files, target, schema_of, keys)) if step == "load" else (
            lambda target: self.apply(landing, files, target, keys))
        if self._spark is None:
            shutil.rmtree(scratch, ignore_errors=True)
            if step == "apply":
                shutil.copytree(silver, scratch)
            run(scratch)
            shutil.rmtree(scratch)
        started = time.perf_counter()
        run(silver)
        return time.perf_counter() - started

    def latest(self, landing: Path, files: list[str], schema: pa.Schema, keys: tuple[str, ...]) -> pa.Table:
        """The newest event per key in the files (source columns, `_op`, `_seq`, `_source_ts_ms`) as Arrow: the lines
        read with their schema (Kafka tombstones, `null`, read as nothing), the position as the pipeline orders a
        PostgreSQL event's (floor.sequence_sql), ties broken by the later file, as the DuckDB floor does."""
        from pyspark.sql import functions as F

        columns = [f for f in schema if not f.name.startswith("_")]
        image = ", ".join(f"`{f.name}`: {SPARK_TYPES[f.type]}" for f in columns)
        lines = (f"op STRING, before STRUCT<{image}>, after STRUCT<{image}>, "
                 "source STRUCT<lsn: BIGINT, snapshot: STRING, ts_ms: BIGINT>")
        markers = ", ".join(repr(m) for m in floor.SNAPSHOT_MARKERS)
        events = (self.spark.read.schema(lines).json([str(landing / f) for f in files])
                  .where("op IS NOT NULL")
                  .selectExpr("CASE WHEN op = 'd' THEN before ELSE after END AS img", "op AS _op",
                              "concat(lpad(CAST(source.lsn AS STRING), 20, '0'), '|', CASE WHEN op = 'r' OR "
                              f"lower(coalesce(source.snapshot, 'false')) IN ({markers}) THEN '0' ELSE '1' END) AS _seq",
                              "source.ts_ms AS _source_ts_ms", "_metadata.file_path AS _source_file")
                  .select(*(F.col("img")[f.name].alias(f.name) for f in columns), "_op", "_seq", "_source_ts_ms",
                          "_source_file"))
        rest = [c for c in events.columns if c not in (*keys, "_seq", "_source_file")]
        newest = events.groupBy(*keys).agg(F.max(F.struct("_seq", "_source_file", *rest)).alias("n"))
        return newest.select(*keys, *(F.col("n")[c].alias(c) for c in ("_seq", *rest))).toArrow()

    def load(self, landing: Path, files: list[str], silver: Path, schema_of: Path | None,
             keys: tuple[str, ...]) -> dict[str, int]:
        assert schema_of is not None
        schema = floor.silver_schema(str(schema_of))
        return floor.write_new(str(silver), floor.as_silver(self.latest(landing, files, schema, keys), schema, "floor"))

    def apply(self, landing: Path, files: list[str], silver: Path, keys: tuple[str, ...]) -> dict[str, int]:
        schema = floor.silver_schema(str(silver))
        return floor.merge(str(silver), floor.as_silver(self.latest(landing, files, schema, keys), schema, "floor"), keys)
