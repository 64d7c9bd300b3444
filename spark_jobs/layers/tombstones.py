"""Bronze's Kafka tombstone lines: how many follow a delete, the bronze rows a tombstone opening a file follows,
and the tombstones whose previous record has not landed yet, kept in the lake until a batch brings it."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.debezium import envelope
from spark_jobs.delta import DeltaEngine, MergeSpec
from spark_jobs.lake import Lake
from spark_jobs.layers.common import observed_checkpoint, one_row
from spark_jobs.sql_text import sql
from spark_jobs.state import ingest_log


@dataclass(frozen=True)
class TombstoneCounts:
    matched: int  # tombstone lines following a delete
    waiting: int  # tombstone lines whose previous record is in an earlier file not landed yet


def counting() -> dict[str, Column]:
    """TombstoneCounts' fields as aggregates over matched tombstone lines (envelope.match_tombstones' columns); null
    elsewhere, so they may be counted among other rows."""
    return {"matched": sql("count(CASE WHEN _follows_delete THEN 1 END)"),
            "waiting": sql("count(CASE WHEN _previous_unseen AND _part <> _source_file THEN 1 END)")}


def tombstone_counts(matched: DataFrame) -> TombstoneCounts:
    row = one_row(matched.agg(*[c.alias(name) for name, c in counting().items()]))
    return TombstoneCounts(row["matched"], row["waiting"])


PENDING_TOMBSTONES = MergeSpec(keys=("_source_file", "_line"), insert_when="true")


def track_pending_tombstones(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, classified: DataFrame,
                              matched: DataFrame | None, any_waiting: bool) -> int:
    """Tombstones whose previous record is in no batch yet wait in the lake (`any_waiting`: the batch has
    some); each batch settles those whose previous record it brings. Returns how many of them follow a
    delete (matched late)."""
    path = lake.pending_tombstones(table)
    settled_late = 0
    if engine.version(path) is not None:
        pending = engine.read(spark, path)
        assert pending is not None
        settled, counts = observed_checkpoint(envelope.resolve_pending_tombstones(pending, classified),
                                              F.count(F.lit(1)).alias("settled"),
                                              F.count(F.when(F.col("_follows_delete"), 1)).alias("late"))
        settled_late = counts["late"]
        if counts["settled"]:
            engine.merge(settled.select("_source_file", "_line"), path,
                         MergeSpec(keys=("_source_file", "_line"), delete_when="true"))
    if any_waiting and matched is not None:
        waiting = matched.where("_previous_unseen AND _part <> _source_file")
        engine.merge(waiting.select("_source_file", "_line", "_part", "_offset"), path, PENDING_TOMBSTONES)
    return settled_late


def preceding_rows(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, opening: list[str]) -> DataFrame | None:
    """Bronze rows of the files that precede `opening` in their Kafka partition (the sink names files by
    topic, partition and first offset): a tombstone opening a file follows the previous file's last record.
    Read from the bronze versions holding those files (by the ingest log), never all of bronze."""
    log = ingest_log(lake, table, ["file", "bronze_version"])
    taken: dict[str, list[tuple[int, str, int]]] = {}
    for path, version in zip(log["file"], log["bronze_version"], strict=True):
        position = envelope.landing_offset(path)
        if position is not None and version is not None:
            taken.setdefault(position[0], []).append((position[1], path, version))
    wanted: dict[str, int] = {}
    for path in opening:
        position = envelope.landing_offset(path)
        earlier = [f for f in taken.get(position[0], []) if f[0] < position[1]] if position else []
        if earlier:
            _, previous, version = max(earlier)
            wanted[previous] = version
    bronze = engine.read(spark, lake.bronze(table)) if wanted else None
    if bronze is None:
        return None
    return bronze.where(F.col("_bronze_version").isin(sorted(set(wanted.values()))) & F.col("_source_file").isin(sorted(wanted)))
