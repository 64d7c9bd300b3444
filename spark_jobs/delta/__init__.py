"""All Delta I/O goes through `DeltaEngine` (docs/architecture.md, "Delta engines"): delta-rs (the embedded
default: Spark computes, delta-rs commits from the driver) or delta-spark (Spark writes, on every executor;
CDC_DELTA_ENGINE=delta-spark). Both give the same meaning to the same `MergeSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the package's pure modules (features) are read where pyspark is not imported
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T


@dataclass(frozen=True)
class MergeSpec:
    """Merge `s` (source) into `t` (target) on equal keys; each clause applies when its SQL condition
    over `s` and `t` holds (None = never). Conditions use only `=`, `<>`, `>`, AND/OR on plain columns so
    that both engines read them alike."""

    keys: tuple[str, ...]
    delete_when: str | None = None
    update_when: str | None = None
    insert_when: str | None = None


@dataclass(frozen=True)
class MergeResult:
    version: int
    inserted: int
    updated: int
    deleted: int


class DeltaEngine(Protocol):
    name: str

    def version(self, path: str) -> int | None: ...  # None when there is no table at `path`
    def schema(self, path: str) -> T.StructType | None: ...
    def read(self, spark: SparkSession, path: str, version: int | None = None) -> DataFrame | None: ...
    def append(self, df: DataFrame, path: str, partition_by: tuple[str, ...] = ()) -> int: ...
    def overwrite(self, df: DataFrame, path: str, partition_by: tuple[str, ...] = ()) -> int: ...
    # rows matching `predicate` (SQL over plain columns) replaced by `df`, in one commit
    def replace(self, df: DataFrame, path: str, predicate: str, partition_by: tuple[str, ...] = ()) -> int: ...
    def merge(self, df: DataFrame, path: str, spec: MergeSpec, partition_by: tuple[str, ...] = ()) -> MergeResult: ...
    def delete(self, path: str, predicate: str) -> int: ...  # rows deleted
    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]: ...
    def restore(self, path: str, version: int) -> int: ...
    # `value` as a string literal in the SQL dialect of the engine's predicates
    def literal(self, value: str) -> str: ...


def delta_jars_present(spark: SparkSession) -> bool:
    if is_remote_session(spark):  # no JVM to ask: the server's session is set up for Delta or not
        return "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")
    jvm = getattr(spark.sparkContext, "_jvm", None)
    if jvm is None:
        return False
    try:
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, jvm.Thread.currentThread().getContextClassLoader())
        return True
    except Exception:  # py4j raises Py4JJavaError(ClassNotFoundException): the jars are absent
        return False


def is_remote_session(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def make_engine(spark: SparkSession, choice: str | None = None) -> DeltaEngine:
    from spark_jobs.settings import settings

    choice = choice or settings().delta_engine
    if choice == "delta-rs":
        from spark_jobs.delta.delta_rs import DeltaRsEngine

        return DeltaRsEngine()
    if choice == "delta-spark":
        from spark_jobs.delta.delta_spark import DeltaSparkEngine
        from spark_jobs.errors import ConfigError

        if is_remote_session(spark):  # delta-spark's Python API over Spark Connect needs Delta Connect server-side
            raise ConfigError("CDC_DELTA_ENGINE=delta-spark does not run attached to a Spark Connect server "
                              "(CDC_SPARK_REMOTE): use a Spark session of its own, or delta-rs")
        return DeltaSparkEngine(spark)
    raise ValueError(f"CDC_DELTA_ENGINE must be delta-rs or delta-spark, got {choice!r}")


def key_predicate(keys: tuple[str, ...], quote: str) -> str:
    return " AND ".join(f"t.{quote}{k}{quote} = s.{quote}{k}{quote}" for k in keys)
