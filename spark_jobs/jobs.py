"""Layer jobs: read -> transform -> gate -> write, one table (or gold model) at a time.

Each returns a summary dict (counts, versions, gate verdict) that the CLI prints and publishes."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs import schemas, transforms
from spark_jobs.config import FAIL, QUARANTINE, GoldModel, TableConfig, row_checks
from spark_jobs.delta import DeltaEngine, MergeSpec
from spark_jobs.gates import Check, GateFailed, GateResult, bronze_checks, gold_checks, run_gate, silver_checks
from spark_jobs.landing import LandingFile, LandingWindow, landing_read_problem, list_topic, split_exact, stage
from spark_jobs.state import Lake, ensure_dir, ingest_log, ingested_files

# Silver: apply the newest event per key when it is newer than the row (DESIGN 4.2).
SILVER_MERGE = MergeSpec(keys=(), delete_when="s._op = 'd' AND s._seq > t._seq",
                         update_when="s._op <> 'd' AND s._seq > t._seq", insert_when="s._op <> 'd'")
# Tombstone ledger: the mirror image. A delete records (key, seq); a newer insert or update clears it.
LEDGER_MERGE = MergeSpec(keys=(), delete_when="s._op <> 'd' AND s._seq > t._seq",
                         update_when="s._op = 'd' AND s._seq > t._seq", insert_when="s._op = 'd'")
QUARANTINE_MERGE = MergeSpec(keys=("layer", "_source_file", "_line"), insert_when="true")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def write_quarantine(engine: DeltaEngine, lake: Lake, table: str, rows: DataFrame, layer: str,
                     batch_id: str) -> dict[str, int]:
    """Quarantine rows keep the raw record and a reason; keyed by (layer, file, line) so a re-run adds
    nothing twice. Returns the counts by reason."""
    reasons = _reasons(rows)
    if reasons:
        rows = rows.select(
            "_source_file", "_line", "_raw", "reason", F.lit(layer).alias("layer"),
            F.lit(batch_id).alias("_batch_id"), F.lit(_now()).cast("timestamp").alias("_ingested_at"))
        engine.merge(rows, lake.quarantine(table), QUARANTINE_MERGE)
    return reasons


def _one(df: DataFrame) -> Row:
    """The single row of a global aggregate (which always has exactly one)."""
    row = df.first()
    assert row is not None
    return row


def _reasons(rows: DataFrame) -> dict[str, int]:
    """Quarantine counts by reason, with the variable tail (column names, op values) kept."""
    return {r["reason"]: r["n"] for r in rows.groupBy("reason").agg(F.count(F.lit(1)).alias("n")).collect()}


# ---- bronze ----------------------------------------------------------------------------------------


def _staged_to_landing(spark: SparkSession, staged: dict[str, LandingFile], read: DataFrame) -> DataFrame:
    """Spark names each file by its staged URI: `_source_file`, the landing path it stands for, replaces it."""
    mapping = spark.createDataFrame([(Path(path).name, f.path) for path, f in staged.items()],
                                    "_staged STRING, _source_file STRING")
    named = read.withColumn("_staged", F.element_at(F.split(F.col("_uri"), "/"), -1)).drop("_uri")
    return named.join(F.broadcast(mapping), "_staged").drop("_staged")


def _parquet_rows(path: str) -> int | None:
    """Records in a Parquet landing file from its footer; None when it is not a readable Parquet file."""
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, ValueError):
        return None


def max_line_bytes() -> int:
    """CDC_MAX_LINE_BYTES (default 16 MiB): a longer line is quarantined as line_too_large, never parsed."""
    return int(os.environ.get("CDC_MAX_LINE_BYTES", str(16 * 2**20)))


def read_landing(spark: SparkSession, staged: dict[str, LandingFile], files: list[LandingFile],
                 fmt: str = "auto") -> tuple[DataFrame, dict[LandingFile, str]]:
    """Landing files as lines: (_source_file, _line, _raw, _line_problem, _typed_schema), checkpointed.
    JSON files (plain or gzip) give one row per text line; Parquet files one row per record, as its JSON
    text, with `_typed_schema` holding the record's column types. `staged` maps Spark-safe paths to the
    landing files (landing.stage).

    Files that cannot be read are returned apart with the reason, to be quarantined whole while the rest
    of the batch goes on: not of the table's format (unsupported_file), or unreadable_file (cannot be
    opened, not valid gzip or Parquet, cut short). Lines of a file holding bytes that are not UTF-8 are
    read again byte for byte: Spark's line split would replace those bytes."""
    wanted = {"auto": ("json", "parquet"), "json": ("json",), "json-flat": ("json",), "parquet": ("parquet",)}[fmt]
    by_kind: dict[str, dict[str, LandingFile]] = {"json": {}, "parquet": {}}
    for path, f in staged.items():
        if f.kind in wanted:
            by_kind[f.kind][path] = f
    parquet_rows = {path: _parquet_rows(path) for path, f in by_kind["parquet"].items() if f.size}
    unreadable = {f: f"unsupported_file: {_name(f)}" for f in files if f.kind not in wanted}
    unreadable |= {f: f"unreadable_file: {_name(f)}: {f.problem}" for f in files if f.problem and f.kind in wanted}
    unreadable |= {by_kind["parquet"][path]: f"unreadable_file: {_name(by_kind['parquet'][path])}: not a valid Parquet file"
                   for path, rows in parquet_rows.items() if rows is None}
    parts = []
    if by_kind["json"]:
        # a file Spark cannot read (bad gzip, cut short) yields no row instead of failing the batch; such
        # files are found below and quarantined whole (wholetext: a file is one row or none, never part)
        raw = spark.read.option("ignoreCorruptFiles", "true").text(list(by_kind["json"]), wholetext=True).select(
            F.col("_metadata.file_path").alias("_uri"), F.col("value").alias("content"))
        lines = transforms.split_lines(_staged_to_landing(spark, by_kind["json"], raw), max_line_bytes()).localCheckpoint()
        lines, broken = _exact_lines(spark, lines, by_kind["json"])
        unreadable |= broken
        parts.append(lines.withColumn("_typed_schema", F.lit(None).cast("string")))
    readable_parquet = {path: f for path, f in by_kind["parquet"].items() if parquet_rows.get(path)}
    if readable_parquet:
        # as with JSON, a file that breaks while being read is not fatal: it gives fewer rows than its
        # footer counts, and is then quarantined whole
        records = spark.read.option("mergeSchema", "true").option("ignoreCorruptFiles", "true").parquet(*readable_parquet)
        typed = schemas.envelope_from_spark(transforms.parquet_image_type(records.schema))
        record = F.struct(*[F.col(f"`{c}`") for c in records.columns])
        rows = records.select(F.col("_metadata.file_path").alias("_uri"), (F.col("_metadata.row_index") + 1).alias("_line"),
                              F.to_json(record, schemas.JSON_OPTIONS).alias("_raw"))
        rows = _staged_to_landing(spark, readable_parquet, rows).localCheckpoint()
        read = {r["_source_file"]: r["n"] for r in rows.groupBy("_source_file").agg(F.count(F.lit(1)).alias("n")).collect()}
        short = {f: (read.get(f.path, 0), parquet_rows[path]) for path, f in readable_parquet.items()
                 if read.get(f.path, 0) != parquet_rows[path]}
        unreadable |= {f: f"unreadable_file: {_name(f)}: corrupt, {got} of {expected} records readable"
                       for f, (got, expected) in short.items()}
        parts.append(rows.where(~F.col("_source_file").isin([f.path for f in short])).select(
            "_source_file", "_line", "_raw", F.lit(None).cast("string").alias("_line_problem"),
            F.lit(typed).alias("_typed_schema")))
    if not parts:
        return spark.createDataFrame(
            [], "_source_file STRING, _line BIGINT, _raw STRING, _line_problem STRING, _typed_schema STRING"), unreadable
    return reduce(DataFrame.unionByName, parts), unreadable


def _name(f: LandingFile) -> str:
    return f.path.rsplit("/", 1)[-1]


def _exact_lines(spark: SparkSession, lines: DataFrame,
                 staged: dict[str, LandingFile]) -> tuple[DataFrame, dict[LandingFile, str]]:
    """Files that gave Spark no text although they hold bytes are unreadable (the reason comes from
    opening them here); files holding bytes that are not UTF-8 are split again here, byte for byte."""
    health = {r["_source_file"]: r["utf8"] for r in
              lines.groupBy("_source_file").agg(F.min("_file_utf8_ok").alias("utf8")).collect()}
    broken, invalid = {}, {}
    for path, f in staged.items():
        if f.path not in health and f.size:
            broken[f] = f"unreadable_file: {_name(f)}: {landing_read_problem(path)}"
        elif health.get(f.path) is False:
            invalid[path] = f
    lines = lines.drop("_file_utf8_ok")
    if not invalid:
        return lines, broken
    exact = [(f.path, *line) for path, f in invalid.items() for line in split_exact(path, max_line_bytes())]
    redone = spark.createDataFrame(exact, "_source_file STRING, _line BIGINT, _raw STRING, _line_problem STRING")
    kept = lines.where(~F.col("_source_file").isin([f.path for f in invalid.values()]))
    return kept.unionByName(redone).localCheckpoint(), broken


def _lag_s(max_ts_ms: Any) -> float | None:
    """Seconds between the newest source change (ts_ms) and now."""
    return None if max_ts_ms is None else round(_now().timestamp() - max_ts_ms / 1000, 3)


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


# (audit frames, batch figures, table, layer, checks, lake, summary) -> result; raises GateFailed on failure
Gate = Callable[[dict[str, DataFrame], dict[str, Any], str, str, list[Check], Lake, dict[str, Any]], Any]


def _gate(frames: dict[str, DataFrame], figures: dict[str, Any], name: str, layer: str, checks: list[Check], lake: Lake,
          summary: dict[str, Any]) -> GateResult:
    """Run a gate over the audit frames and the batch's figures; the summary carries the findings (and,
    when the gate fails, goes with the exception so the failed run's report still has it)."""
    result = run_gate(frames, name, layer, checks, lake.root, raise_on_failure=False, figures=figures)
    summary.update(gate=result.verdict(), warnings=result.warnings(), checks=result.as_dict(), docs=result.docs)
    if not result.success:
        raise GateFailed(result, summary)
    return result


@dataclass(frozen=True)
class Selection:
    """Which landing files a bronze run takes: those in the landing-time window, only the `files` named
    (the sensor's exact list) when given; files already in bronze are left alone unless `reprocess`,
    which reads them again and replaces their rows."""

    window: LandingWindow = LandingWindow()
    files: frozenset[str] | None = None
    reprocess: bool = False


def _select(landing: str, lake: Lake, table: TableConfig, selection: Selection, recovered: set[str]) -> list[LandingFile]:
    listed = list_topic(landing, table.topic)
    if selection.files is not None:
        gone = sorted(selection.files - {f.path for f in listed})
        if gone:
            raise FileNotFoundError(f"table={table.name} layer=bronze: {len(gone)} landing file(s) handed to this run "
                                    f"are no longer in {landing}: {', '.join(gone[:5])}")
        listed = [f for f in listed if f.path in selection.files]
    done = set() if selection.reprocess else ingested_files(lake, table.name) | recovered
    return [f for f in listed if f in selection.window and f.path not in done]


def bronze_ingest(spark: SparkSession, engine: DeltaEngine, table: TableConfig, landing: str, lake: Lake,
                  batch_id: str, selection: Selection = Selection()) -> dict[str, Any]:
    recovered = _recover_unlogged_files(spark, engine, lake, table.name, batch_id)
    files = _select(landing, lake, table, selection, recovered)
    summary: dict[str, Any] = {"table": table.name, "layer": "bronze", "batch_id": batch_id, "files": len(files),
                               "recovered_files": len(recovered)}
    if selection.reprocess:
        summary["mode"] = "reprocess"
    if not files:
        return {**summary, "gate": "skipped (no new files)", "lines": 0, "events": 0, "tombstones": 0, "quarantined": {}}
    # staged in the lake, which a cluster's executors see as the driver does (a shared volume); what a
    # killed run staged goes first (one writer per table: no live run of this table has a folder here)
    staging_root = ensure_dir(lake.staging_files)
    for left in staging_root.glob(f"{table.name}-*"):
        shutil.rmtree(left, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"{table.name}-", dir=staging_root) as staging:
        return _ingest(spark, engine, table, stage(landing, files, Path(staging)), lake, batch_id, files,
                       selection.reprocess, summary)


def _ingest(spark: SparkSession, engine: DeltaEngine, table: TableConfig, staged: dict[str, LandingFile], lake: Lake,
            batch_id: str, files: list[LandingFile], reprocess: bool, summary: dict[str, Any]) -> dict[str, Any]:
    """Bronze for `files`, read from their `staged` copies or links (landing.stage)."""
    again = _in_bronze(engine, lake, table.name, files) if reprocess else []
    lines, unreadable = read_landing(spark, staged, files, table.format)
    parsed = transforms.parse_envelope(lines, table.format)
    parsed = parsed.withColumn("_schema", F.coalesce("_typed_schema", "_schema")).drop("_typed_schema")
    to_quarantine = frozenset(n for n in row_checks("bronze") if table.quality.action(n) == QUARANTINE)
    classified = transforms.classify(parsed, table.keys, to_quarantine).localCheckpoint()

    quarantine = classified.where("_kind = 'quarantine'").select("_source_file", "_line", "_raw", "reason")
    if unreadable:
        quarantine = quarantine.unionByName(spark.createDataFrame(
            [(f.path, 0, "", reason) for f, reason in unreadable.items()],
            "_source_file STRING, _line BIGINT, _raw STRING, reason STRING"))
    if again and engine.version(lake.quarantine(table.name)) is not None:
        # what the files' earlier reading quarantined is replaced by what this reading finds
        engine.delete(lake.quarantine(table.name), f"layer = 'bronze' AND {_files_predicate(again)}")
    quarantined = write_quarantine(engine, lake, table.name, quarantine, "bronze", batch_id)

    per_file = {r["_source_file"]: (r["lines"], r["events"], r["tombstones"], r["quarantined"])
                for r in classified.groupBy("_source_file").agg(
                    F.count(F.lit(1)).alias("lines"),
                    F.sum(F.when(F.col("_kind") == "event", 1).otherwise(0)).alias("events"),
                    F.sum(F.when(F.col("_kind") == "tombstone", 1).otherwise(0)).alias("tombstones"),
                    F.sum(F.when(F.col("_kind") == "quarantine", 1).otherwise(0)).alias("quarantined")).collect()}
    lines_in, events_in, tombstones = (sum(stats[i] for stats in per_file.values()) for i in range(3))
    events = classified.where("_kind = 'event'")
    # tombstone lines that open a file follow a record of an earlier batch: look in bronze for those only
    opening = [r["_source_file"] for r in classified.where("_kind = 'tombstone' AND _line = 1").select("_source_file")
               .distinct().collect()]
    earlier = _preceding_rows(spark, engine, lake, table.name, opening) if opening else None
    matched = transforms.match_tombstones(classified, earlier).localCheckpoint()
    matched_n = matched.where("_follows_delete").count() if tombstones else 0
    newest = _one(events.agg(F.max("ts_ms").alias("ts")))["ts"]
    quarantined_n = sum(quarantined.values())
    summary.update(lines=lines_in, events=events_in, tombstones=tombstones, tombstones_matched=matched_n,
                   tombstones_unmatched=tombstones - matched_n, quarantined=quarantined,
                   quarantined_share=_share(quarantined_n, lines_in + len(unreadable)),
                   empty_files=sum(1 for f in files if f.size == 0), lag_s=_lag_s(newest))
    expectation_counts = _reasons(events.where("_expectation IS NOT NULL").withColumn("reason", F.col("_expectation")))
    if expectation_counts:
        summary["flagged"] = expectation_counts  # events kept in the batch that fail a warn/fail expectation

    change_events = classified.where(f"_kind <> 'tombstone' AND _json_ok AND op IN {transforms.OPS}")
    audit = change_events.select("op", F.lit(None).cast("boolean").alias("_follows_delete"), "_deleted_flag_agrees",
                          *[F.get_json_object(transforms.key_image(), f"$.{k}").alias(k) for k in table.keys])
    flags = audit.unionByName(matched.select("_follows_delete"), allowMissingColumns=True)
    _gate({"events": flags}, {"quarantined_share": summary["quarantined_share"]},
          table.name, "bronze", bronze_checks(table), lake, summary)

    summary["tombstones_matched_late"] = _track_pending_tombstones(spark, engine, lake, table.name, classified, matched)
    version_before = engine.version(lake.bronze(table.name))
    bronze_version = 0 if version_before is None else version_before + 1
    rows = events.select(
        "_source_file", "_line", "_raw", "op", "ts_ms", "source", "before", "after", "_schema",
        F.lit(batch_id).alias("_batch_id"), F.lit(bronze_version).cast("long").alias("_bronze_version"),
        F.lit(_now()).cast("timestamp").alias("_ingested_at"))
    committed = None
    if again:  # their rows, read again, replace the earlier ones in one commit: bronze never holds a line twice
        # every file read is in the predicate: files landed since the last run are read too, and a replace
        # refuses rows its predicate does not cover
        committed = engine.replace(rows, lake.bronze(table.name), _files_predicate([f.path for f in files]))
    elif events_in:
        committed = engine.append(rows, lake.bronze(table.name))
    if committed is not None and committed != bronze_version:
        raise RuntimeError(f"table={table.name} layer=bronze: another writer committed version {committed - 1} "
                           "during this run; runs of one table must be serialized")
    for f in unreadable:
        per_file[f.path] = (0, 0, 0, 1)
    _log_files(spark, engine, lake, table.name, {f.path: (f.size, f.modified_ms, *per_file.get(f.path, (0, 0, 0, 0)))
                                                 for f in files}, batch_id, committed)
    return {**summary, "version": committed if committed is not None else version_before}


PENDING_TOMBSTONES = MergeSpec(keys=("_source_file", "_line"), insert_when="true")


def _track_pending_tombstones(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, classified: DataFrame,
                              matched: DataFrame) -> int:
    """Tombstones whose previous record is in no batch yet wait in the lake; each batch settles those whose
    previous record it brings. Returns how many of them follow a delete (matched late)."""
    path = lake.pending_tombstones(table)
    settled_late = 0
    if engine.version(path) is not None:
        pending = engine.read(spark, path)
        assert pending is not None
        settled = transforms.resolve_pending_tombstones(pending, classified).localCheckpoint()
        settled_late = settled.where("_follows_delete").count()
        if settled.limit(1).count():
            engine.merge(settled.select("_source_file", "_line"), path,
                         MergeSpec(keys=("_source_file", "_line"), delete_when="true"))
    waiting = matched.where("_previous_unseen AND _part <> _source_file").select("_source_file", "_line", "_part", "_offset")
    if waiting.limit(1).count():
        engine.merge(waiting, path, PENDING_TOMBSTONES)
    return settled_late


def _preceding_rows(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, opening: list[str]) -> DataFrame | None:
    """Bronze rows of the files that precede `opening` in their Kafka partition (the sink names files by
    topic, partition and first offset): a tombstone opening a file follows the previous file's last record.
    Read from the bronze versions holding those files (by the ingest log), never all of bronze."""
    log = ingest_log(lake, table, ["file", "bronze_version"])
    taken: dict[str, list[tuple[int, str, int]]] = {}
    for path, version in zip(log["file"], log["bronze_version"], strict=True):
        position = transforms.landing_offset(path)
        if position is not None and version is not None:
            taken.setdefault(position[0], []).append((position[1], path, version))
    wanted: dict[str, int] = {}
    for path in opening:
        position = transforms.landing_offset(path)
        earlier = [f for f in taken.get(position[0], []) if f[0] < position[1]] if position else []
        if earlier:
            _, previous, version = max(earlier)
            wanted[previous] = version
    bronze = engine.read(spark, lake.bronze(table)) if wanted else None
    if bronze is None:
        return None
    return bronze.where(F.col("_bronze_version").isin(sorted(set(wanted.values()))) & F.col("_source_file").isin(sorted(wanted)))


def _in_bronze(engine: DeltaEngine, lake: Lake, table: str, files: list[LandingFile]) -> list[str]:
    """Those of `files` bronze has taken before (by the ingest log)."""
    if engine.version(lake.bronze(table)) is None:
        return []
    done = ingested_files(lake, table)
    return [f.path for f in files if f.path in done]


def _files_predicate(paths: list[str]) -> str:
    quoted = ", ".join("'" + p.replace("'", "''") + "'" for p in sorted(paths))
    return f"_source_file IN ({quoted})"


INGEST_LOG_SCHEMA = ("table STRING, file STRING, size BIGINT, modified_ms BIGINT, lines BIGINT, events BIGINT, "
                     "tombstones BIGINT, quarantined BIGINT, _batch_id STRING, bronze_version BIGINT, ingested_at TIMESTAMP")


def _log_files(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str,
               files: dict[str, tuple[Any, ...]], batch_id: str, bronze_version: int | None) -> None:
    """Record files as ingested: (size, modified_ms, lines, events, tombstones, quarantined) per path;
    `bronze_version` is the bronze commit that holds their rows (None when they had no events)."""
    now = _now()
    rows = [(table, path, *stats, batch_id, bronze_version, now) for path, stats in sorted(files.items())]
    engine.append(spark.createDataFrame(rows, INGEST_LOG_SCHEMA), lake.ingest_log(table))


def _recover_unlogged_files(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, batch_id: str) -> set[str]:
    """Bronze commits its rows before the ingest log. If a run died between the two, bronze's rows newer
    than the last logged commit name the files it already holds: log them now, never append them twice."""
    current = engine.version(lake.bronze(table))
    if current is None:
        return set()
    log = engine.read(spark, lake.ingest_log(table))
    newest = None if log is None else _one(log.agg(F.max("bronze_version").alias("v")))["v"]
    logged = -1 if newest is None else newest  # version 0 is a real commit, not "none"
    if current <= logged:
        return set()
    bronze = engine.read(spark, lake.bronze(table))
    assert bronze is not None
    held = bronze.where(F.col("_bronze_version") > logged).groupBy("_source_file", "_bronze_version").agg(
        F.count(F.lit(1)).alias("events")).collect()
    for version in sorted({r["_bronze_version"] for r in held}):
        # sizes, line and tombstone counts of those files were lost with the run: left null
        files = {r["_source_file"]: (None, None, None, r["events"], None, None) for r in held if r["_bronze_version"] == version}
        _log_files(spark, engine, lake, table, files, batch_id, version)
    return {r["_source_file"] for r in held}


# ---- silver ----------------------------------------------------------------------------------------

PROGRESS_SCHEMA = ("layer STRING, bronze_version BIGINT, truncated_at STRING, _batch_id STRING, updated_at TIMESTAMP, "
                   "silver_version BIGINT")
NO_SEQUENCE = "missing_sequence: no log position for this connector; set sequence_by"


@dataclass(frozen=True)
class SilverProgress:
    bronze_version: int = -1  # the bronze version silver has applied; -1 when none
    truncated_at: str | None = None  # the position of the latest truncate applied
    # silver's version when progress was last recorded: later commits are an interrupted run's (None: not known)
    silver_version: int | None = None


def silver_progress(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str) -> SilverProgress:
    progress = engine.read(spark, lake.progress(table))
    row = None if progress is None else progress.where("layer = 'silver'").first()
    if row is None:
        return SilverProgress()
    return SilverProgress(int(row["bronze_version"]), row["truncated_at"], row.asDict().get("silver_version"))


# operation metrics as delta-rs and delta-spark name them
_METRICS = {"inserted": ("num_target_rows_inserted", "numTargetRowsInserted"),
            "updated": ("num_target_rows_updated", "numTargetRowsUpdated"),
            "deleted": ("num_target_rows_deleted", "numTargetRowsDeleted", "num_deleted_rows", "numDeletedRows")}


def interrupted_work(engine: DeltaEngine, path: str, since_version: int | None) -> dict[str, int]:
    """What silver commits after `since_version` (the last recorded progress) applied: a run killed before
    recording its progress. Its retry finds those events already applied and would report nothing of them."""
    current = engine.version(path)
    if since_version is None or current is None or current <= since_version:
        return {}
    totals = {"recovered_commits": 0, "inserted": 0, "updated": 0, "deleted": 0}
    for commit in engine.history(path, current - since_version):
        if int(commit["version"]) <= since_version or commit.get("operation") not in ("MERGE", "DELETE"):
            continue
        metrics = commit.get("operationMetrics") or {}
        totals["recovered_commits"] += 1
        for figure, names in _METRICS.items():
            totals[figure] += sum(int(metrics.get(name) or 0) for name in names)
    return totals


def _image_fields(spark: SparkSession, table: TableConfig, events: DataFrame, has_plain: bool) -> list[schemas.ImageField]:
    """Columns of the batch's row images: from the envelope schemas, else inferred from plain JSON (with
    the table's `columns:` overrides). `__` fields are flattened records' metadata, not columns."""
    envelope_schemas = [r["_schema"] for r in events.where("_schema IS NOT NULL").select("_schema").distinct().collect()]
    lists = [schemas.fields_from_envelope(s) for s in sorted(envelope_schemas)]
    if has_plain:
        plain = events.where("_schema IS NULL").select(transforms.key_image().alias("_image"))
        lists.insert(0, schemas.with_overrides(schemas.infer_fields(plain, "_image"), table.columns))
    return [f for f in schemas.merge_fields(lists) if not f.name.startswith("__")]


def _typed_changes(spark: SparkSession, table: TableConfig, changes: DataFrame, target: T.StructType | None,
                   has_plain: bool, unavailable: bool) -> tuple[DataFrame, list[schemas.ImageField]]:
    """Row events (with `_seq`) plus the typed image in `_row`, typed key columns and a quarantine `reason`.
    With `unavailable`, placeholders of unchanged TOASTed values are listed in `_unavailable` and typed as
    null (transforms.mark_unavailable), to be filled in by `_fill_unavailable`."""
    if unavailable:
        changes = transforms.mark_unavailable(changes, table.unavailable_value_placeholder)
    fields = _image_fields(spark, table, changes, has_plain)
    names = {f.name for f in fields}
    absent = [k for k in table.keys if k not in names]
    if absent:
        raise ValueError(f"table={table.name} layer=silver: key column(s) {', '.join(absent)} not in the "
                         f"change events' columns ({', '.join(sorted(names))})")
    typed = schemas.parse_image(changes, transforms.key_image(), fields, "_row")
    typed = schemas.align(typed, "_row", target)
    for k in table.keys:
        typed = typed.withColumn(k, F.col("_row")[k])
    missing = transforms.missing_keys_typed(table.keys)
    reason = (F.when(F.col("_seq").isNull(), NO_SEQUENCE)
              .when(F.col("_decode_problems") != "", F.concat(F.lit("incompatible_type: "), F.col("_decode_problems")))
              .when(F.col("_type_problems") != "", F.concat(F.lit("incompatible_type: "), F.col("_type_problems")))
              .when(missing != "", F.concat(F.lit("missing_key: "), missing)))
    return typed.withColumn("reason", reason), fields


def silver_merge(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, batch_id: str) -> dict[str, Any]:
    """Apply the bronze rows silver has not seen (gated inside), then record the progress."""
    summary: dict[str, Any] = {"table": table.name, "layer": "silver", "batch_id": batch_id}
    progress = silver_progress(spark, engine, lake, table.name)
    bronze_version = engine.version(lake.bronze(table.name))
    if bronze_version is None or bronze_version <= progress.bronze_version:
        return {**summary, "events": 0, "gate": "skipped (no new bronze rows)", "quarantined": {}}
    bronze = engine.read(spark, lake.bronze(table.name), version=bronze_version)
    assert bronze is not None
    recovered = interrupted_work(engine, lake.silver(table.name), progress.silver_version)
    try:
        stats, truncated_at = apply_changes(spark, engine, table, lake,
                                            bronze.where(F.col("_bronze_version") > progress.bronze_version),
                                            progress.truncated_at, batch_id)
    except GateFailed as failure:
        failure.summary = {**summary, "bronze_version": bronze_version, **(failure.summary or {})}
        # the failed batch's commits were undone: what silver holds now is what progress says
        _save_progress(spark, engine, lake, table.name, progress.bronze_version, progress.truncated_at, batch_id)
        raise
    for figure, value in recovered.items():  # what an interrupted run applied of these events counts here
        stats[figure] = stats.get(figure, 0) + value
    _save_progress(spark, engine, lake, table.name, bronze_version, truncated_at, batch_id)
    spark.catalog.clearCache()
    return {**summary, **stats, "bronze_version": bronze_version, "version": engine.version(lake.silver(table.name))}


def silver_rebuild(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake,
                   batch_id: str) -> dict[str, Any]:
    """Recompute silver (and its ledger, history, truncate log) from all of bronze, in a staging area of
    the lake; when the gate passes, publish each table in one commit. A failed or killed rebuild leaves
    silver as it was, or already rebuilt: the retry starts over from bronze and ends the same."""
    summary: dict[str, Any] = {"table": table.name, "layer": "silver", "batch_id": batch_id, "mode": "rebuild"}
    bronze_version = engine.version(lake.bronze(table.name))
    if bronze_version is None:
        raise ValueError(f"table={table.name} layer=silver: no bronze table to rebuild from")
    staged = lake.staged(table.name)
    shutil.rmtree(str(staged.staging), ignore_errors=True)  # what a killed rebuild left
    bronze = engine.read(spark, lake.bronze(table.name), version=bronze_version)
    assert bronze is not None
    try:
        stats, truncated_at = apply_changes(spark, engine, table, staged, bronze, None, batch_id)
    except GateFailed as failure:
        failure.summary = {**summary, "bronze_version": bronze_version, **(failure.summary or {})}
        raise
    for place, partition_by in ((Lake.silver, table.partition_by), (Lake.tombstones, ()),
                                (Lake.history, table.partition_by), (Lake.truncates, ())):
        path, rebuilt = place(lake, table.name), engine.read(spark, place(staged, table.name))
        if rebuilt is not None:
            engine.overwrite(rebuilt, path, partition_by)
        elif engine.version(path) is not None:
            engine.delete(path, "true")
    _save_progress(spark, engine, lake, table.name, bronze_version, truncated_at, batch_id)
    shutil.rmtree(str(staged.staging), ignore_errors=True)
    spark.catalog.clearCache()
    return {**summary, **stats, "bronze_version": bronze_version, "version": engine.version(lake.silver(table.name))}


def apply_changes(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, batch: DataFrame,
                  truncated_at: str | None, batch_id: str, gate: Gate | None = None) -> tuple[dict[str, Any], str | None]:
    """Apply a batch of bronze rows to silver, the tombstone ledger, history and quarantine (DESIGN 4),
    gated write-audit-publish: the batch is audited before any table is written (too much quarantined,
    or a `fail` expectation on its events: nothing but the quarantine is written), and the merged result
    after (keys, deletes): when that fails, every table is restored to its version before the batch.

    `truncated_at` is the position of the latest truncate already applied; returns the batch's counts
    (with the gate's verdict and findings) and the truncate position in force afterwards. `gate` runs the
    checks (default: Great Expectations, publishing Data Docs) and raises GateFailed when they fail."""
    gate = gate or _gate
    target_path, ledger_path = lake.silver(table.name), lake.tombstones(table.name)
    published = {path: engine.version(path) for path in
                 (target_path, ledger_path, lake.history(table.name), lake.truncates(table.name))}
    target_schema = engine.schema(target_path)
    checks = silver_checks(table)
    # one pass over the batch; every later step (and each count) starts from these rows, not the batch's plan
    ordered = transforms.order_key(batch, table.sequence_by).localCheckpoint()
    overview = _one(ordered.agg(
        F.count(F.when((F.col("op") == "t") & F.col("_seq").isNotNull(), 1)).alias("truncates"),
        F.max(F.when(F.col("op") == "t", F.col("_seq"))).alias("truncated_at"),
        F.count(F.when(F.col("op") != "t", 1)).alias("changes"),
        F.count(F.when((F.col("op") != "t") & F.col("_schema").isNull(), 1)).alias("plain"),
        F.max(F.get_json_object("source", "$.ts_ms").cast("long")).alias("newest_ts_ms"),
        F.count(F.lit(1)).alias("rows"),
        F.count(F.when(transforms.holds_placeholder(table.unavailable_value_placeholder), 1)).alias("unavailable")))

    # truncate (op=t): the table is empty as of its position; every older event is stale
    truncates = ordered.where("op = 't'").withColumn("reason", F.when(F.col("_seq").isNull(), NO_SEQUENCE))
    batch_truncate = overview["truncated_at"]
    new_truncate = batch_truncate if batch_truncate and batch_truncate > (truncated_at or "") else None
    truncated_at = new_truncate or truncated_at
    quarantine = truncates.where("reason IS NOT NULL").select("_source_file", "_line", "_raw", "reason")

    frames: dict[str, DataFrame] = {}
    typed = counts = latest_counts = latest = rows = deletes = state = None
    fields: list[schemas.ImageField] = []
    effective_count, delete_counts = 0, {"received": 0, "before_truncate": 0, "superseded": 0, "stale": 0, "absent": 0}
    if overview["changes"]:
        typed, fields = _typed_changes(spark, table, ordered.where("op <> 't'"), target_schema, overview["plain"] > 0,
                                       overview["unavailable"] > 0)
        if overview["unavailable"]:
            typed = _fill_unavailable(spark, engine, lake, table, typed.localCheckpoint())
        typed = typed.localCheckpoint()
        quarantine = quarantine.unionByName(typed.where("reason IS NOT NULL").select("_source_file", "_line", "_raw", "reason"))
        events = typed.where("reason IS NULL")
        # audit frames are materialised once: the gate computes each expectation with its own Spark job
        frames["events"] = _event_audit(typed, table.keys).localCheckpoint()
        after_truncate = F.col("_seq") > F.lit(truncated_at) if truncated_at else F.lit(True)
        position = F.struct(*table.keys, "_seq")
        counts = _one(events.agg(F.count(F.lit(1)).alias("events"), F.countDistinct(position).alias("positions"),
                                 F.countDistinct(F.when(after_truncate, position)).alias("positions_after_truncate")))
        latest = transforms.latest_per_key(events.where(after_truncate), table.keys).localCheckpoint()
        latest_counts = _one(latest.agg(F.count(F.lit(1)).alias("keys"), F.sum(F.col("_tie").cast("int")).alias("ties")))
        state = _current_state(spark, engine, lake, table, latest, new_truncate)
        state = state.localCheckpoint()
        rows = _silver_rows(transforms.effective_changes(latest, state.select(*table.keys, "_seq"), table.keys), fields,
                            target_schema).localCheckpoint()
        effective_count = rows.count()
        deletes = events.where("op = 'd'").select(*table.keys, "_seq").distinct().localCheckpoint()
        delete_counts = _classify_deletes(deletes, latest, state, table.keys, truncated_at)
    quarantined = write_quarantine(engine, lake, table.name, quarantine, "silver", batch_id)
    quarantined_n = sum(quarantined.values())
    events_in, positions, kept = ((counts["events"], counts["positions"], counts["positions_after_truncate"])
                                  if counts else (0, 0, 0))
    keys = latest_counts["keys"] if latest_counts else 0
    stats: dict[str, Any] = {
        "events": events_in + overview["truncates"] + quarantined_n,
        "duplicates_dropped": events_in - positions, "superseded_in_batch": kept - keys,
        "stale_ignored": (positions - kept) + (keys - effective_count),
        "ties": int(latest_counts["ties"] or 0) if latest_counts else 0, "truncates": overview["truncates"],
        "quarantined": quarantined, "quarantined_share": _share(quarantined_n, overview["rows"]),
        "lag_s": _lag_s(overview["newest_ts_ms"])}
    figures = {"quarantined_share": stats["quarantined_share"]}

    # audit before publishing: a batch the table refuses leaves every table as it was
    if stats["quarantined_share"] > table.quality.max_quarantined or _refused(table, typed, stats["ties"]):
        pre_publish = [c for c in checks if c.name not in ("deletes_reconcile", "deleted_keys_not_live")]
        gate(frames, figures, table.name, "silver", pre_publish, lake, stats)
    new_truncates = 0  # truncates history has not seen: they close versions of every key
    if table.history and overview["truncates"]:
        new_truncates = engine.merge(truncates.where("reason IS NULL").select("_seq", F.lit(batch_id).alias("_batch_id"))
                                     .distinct(), lake.truncates(table.name), TRUNCATE_LOG_MERGE).inserted
    deleted_by_truncate = 0
    if new_truncate:
        predicate = f"_seq < '{new_truncate}'"
        if target_schema is not None:
            deleted_by_truncate = engine.delete(target_path, predicate)
        if engine.version(ledger_path) is not None:
            engine.delete(ledger_path, predicate)
    result, versions = None, 0
    if rows is not None and effective_count:
        result = engine.merge(rows, target_path, replace(SILVER_MERGE, keys=table.keys), table.partition_by)
    if rows is not None and state is not None:
        ledger = rows.select(*table.keys, "_seq", "_op", F.coalesce(
            "_source_ts_ms", F.unix_millis(F.col("_ingested_at").cast("timestamp"))).alias("_deleted_at_ms"))
        # a ledger entry older than the key's live row (left by a run killed between the two merges) goes:
        # as a live event at the row's position, the ledger merge clears it like any newer upsert
        behind = state.where("_ledger_behind").select(*table.keys, "_seq", F.lit("u").alias("_op"),
                                                      F.lit(None).cast("long").alias("_deleted_at_ms"))
        ledger = ledger.unionByName(behind.join(rows.select(*table.keys), list(table.keys), "left_anti"))
        if effective_count or behind.limit(1).count():
            engine.merge(ledger, ledger_path, replace(LEDGER_MERGE, keys=table.keys))
    if table.history and typed is not None:
        versions = apply_history(spark, engine, table, lake, typed.where("reason IS NULL"), fields,
                                 recompute_all=new_truncates > 0)
    elif table.history and new_truncates:
        versions = apply_history(spark, engine, table, lake, None, [], recompute_all=True)
    expired = _expire_tombstones(engine, lake, table)
    removed = result.deleted if result else 0
    stats.update(inserted=result.inserted if result else 0, updated=result.updated if result else 0,
                 deleted=removed + deleted_by_truncate, tombstones_expired=expired,
                 deletes={**delete_counts, "removed": removed},
                 **({"history_rows": versions} if table.history else {}))

    # audit the published result; on failure, put every table back to its version before the batch
    accounted = removed + sum(v for k, v in delete_counts.items() if k != "received")
    figures.update(deletes_received=delete_counts["received"], deletes_accounted=accounted)
    if latest is not None and deletes is not None:
        rows_audit, deletes_audit = _merged_audit(spark, engine, target_path, latest, deletes, table.keys, batch_id)
        frames.update(events=frames["events"].unionByName(deletes_audit, allowMissingColumns=True).localCheckpoint(),
                      rows=rows_audit.localCheckpoint())
    try:
        gate(frames, figures, table.name, "silver", checks, lake, stats)
    except GateFailed:
        for path, before in published.items():
            if before is None and engine.version(path) is not None:
                engine.delete(path, "true")  # created by this batch: nothing to go back to but empty
            elif before is not None and engine.version(path) != before:
                engine.restore(path, before)
        raise
    return stats, truncated_at


def _fill_unavailable(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: TableConfig,
                      typed: DataFrame) -> DataFrame:
    """An unchanged TOASTed column (PostgreSQL, REPLICA IDENTITY DEFAULT) keeps the key's previous value:
    the value of the key's last earlier event in the batch that carried it, else of its live silver row.
    With neither, the value is unknown here: the event is quarantined (`unavailable_value`), never
    applied with a placeholder or a null in place of the value."""
    columns = sorted({r[0] for r in typed.select(F.explode("_unavailable")).distinct().collect()})
    keys = list(table.keys)
    earlier = Window.partitionBy(*keys).orderBy("_seq", "_source_file", "_line").rowsBetween(Window.unboundedPreceding, -1)
    silver = engine.read(spark, lake.silver(table.name))
    in_silver = [c for c in columns if silver is not None and c in silver.columns]
    if in_silver and silver is not None:
        typed = typed.join(silver.select(*keys, F.struct(*[F.struct(F.col(c).alias("v")).alias(c) for c in in_silver])
                                         .alias("_live")), keys, "left")
    unresolved = []
    for c in columns:
        missing = F.array_contains("_unavailable", c)
        previous = F.last(F.when(~missing, F.struct(F.col("_row")[c].alias("v"))), ignorenulls=True).over(earlier)
        live = F.col("_live")[c] if c in in_silver else F.lit(None)
        known = F.coalesce(previous, live)
        typed = typed.withColumn("_row", F.col("_row").withField(c, F.when(missing, known["v"]).otherwise(F.col("_row")[c])))
        unresolved.append(F.when(missing & known.isNull(), F.lit(c)))
    lost = F.concat_ws(", ", *unresolved)
    reason = F.coalesce("reason", F.when(lost != "", F.concat(
        F.lit("unavailable_value: "), lost, F.lit(" (an unchanged TOASTed value, and no earlier value of the key here)"))))
    return typed.withColumn("reason", reason).drop("_unavailable", *(["_live"] if in_silver else []))


def _refused(table: TableConfig, typed: DataFrame | None, ties: int) -> bool:
    """Does a `fail` row expectation fail on the batch's events (before anything is written)?"""
    q = table.quality
    if q.action("sequence_increasing") == FAIL and ties:
        return True
    return (q.action("sequence_present") == FAIL and typed is not None
            and typed.where(F.col("_seq").isNull()).limit(1).count() > 0)


def _event_audit(typed: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Per row event: `_seq_present`, and `_no_tie` (no other event of the key shares its position with
    different content; null where the event has no key or position)."""
    variants = F.size(F.collect_set(transforms.event_content()).over(Window.partitionBy(*keys, "_seq")))
    usable = F.col("_seq").isNotNull() & reduce(lambda a, b: a & b, [F.col(k).isNotNull() for k in keys])
    return typed.select(F.col("_seq").isNotNull().alias("_seq_present"),
                        F.when(usable, variants == 1).alias("_no_tie"))


def _classify_deletes(deletes: DataFrame, latest: DataFrame, state: DataFrame, keys: tuple[str, ...],
                      truncated_at: str | None) -> dict[str, int]:
    """Where each delete the batch received (one per key and position) goes: before the truncate in force,
    superseded by a later event of its key in the batch, stale (the key's state is newer), or applied to
    a key that is not live (`absent`: the ledger records it). Applied deletes of live keys are the rows
    the merge removes: the gate checks that the merge reports exactly that many."""
    before = F.col("_seq") <= F.lit(truncated_at) if truncated_at else F.lit(False)
    winners = latest.where("op = 'd'").select(*keys, F.col("_seq").alias("_winner_seq")).join(
        state.select(*keys, F.col("_seq").alias("_state_seq"), "_live"), list(keys), "left")
    outcome = deletes.join(winners, list(keys), "left").withColumn(
        "_winner", F.coalesce(F.col("_winner_seq") == F.col("_seq"), F.lit(False)))
    newer = F.col("_state_seq").isNull() | (F.col("_seq") > F.col("_state_seq"))
    counts = _one(outcome.agg(
        F.count(F.lit(1)).alias("received"), F.count(F.when(before, 1)).alias("before_truncate"),
        F.count(F.when(~before & ~F.col("_winner"), 1)).alias("superseded"),
        F.count(F.when(F.col("_winner") & ~newer, 1)).alias("stale"),
        F.count(F.when(F.col("_winner") & newer & ~F.coalesce("_live", F.lit(False)), 1)).alias("absent")))
    return counts.asDict()


def _merged_audit(spark: SparkSession, engine: DeltaEngine, target_path: str, latest: DataFrame, deletes: DataFrame,
                  keys: tuple[str, ...], batch_id: str) -> tuple[DataFrame, DataFrame]:
    """Read back from the merged silver table: the rows of the batch's keys and the rows this batch
    wrote (key checks, scaled to the batch rather than the table), and each delete of the batch with
    `_not_live_after`: its key is not live afterwards, unless at a later position."""
    silver = engine.read(spark, target_path)
    if silver is None:
        silver = latest.select(*keys, "_seq", F.lit(batch_id).alias("_batch_id")).limit(0)
    touched = latest.select(*keys).withColumn("_touched", F.lit(True))
    rows = (silver.join(touched, list(keys), "left").where(F.col("_touched") | (F.col("_batch_id") == batch_id))
            .select(*keys, "_seq"))
    live = silver.select(*keys, F.col("_seq").alias("_live_seq"))
    checked = deletes.join(live, list(keys), "left").select(
        (F.col("_live_seq").isNull() | (F.col("_live_seq") > F.col("_seq"))).alias("_not_live_after"))
    return rows, checked


def _expire_tombstones(engine: DeltaEngine, lake: Lake, table: TableConfig) -> int:
    """Drop ledger entries older than the table's tombstone retention (by the delete's source time).
    After that, a change older than the delete arriving even later can bring the row back: the
    retention is the lateness the table promises to absorb. Default: keep them forever."""
    if table.tombstone_retention_s is None or engine.version(lake.tombstones(table.name)) is None:
        return 0
    cutoff_ms = int(_now().timestamp() * 1000) - table.tombstone_retention_s * 1000
    return engine.delete(lake.tombstones(table.name), f"_deleted_at_ms < {cutoff_ms}")


# ---- history (SCD type 2) --------------------------------------------------------------------------

TRUNCATE_LOG_MERGE = MergeSpec(keys=("_seq",), insert_when="true")


def apply_history(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, events: DataFrame | None,
                  fields: list[schemas.ImageField], recompute_all: bool) -> int:
    """Every version of each row in `silver/<table>_history`: one row per applied event (a delete is a
    row with `_op = 'd'` that ends the version before it), `_valid_to` = the sequence of the key's next
    event or of the first truncate after it (for deletes: the next event only), `_is_current` for the
    live version. Late events slot into their place: the chains of the batch's keys (all keys after a
    new truncate) are recomputed.

    Returns the number of new history rows."""
    path = lake.history(table.name)
    existing = engine.read(spark, path)
    keys = list(table.keys)
    new = None
    if events is not None:
        # one row per (key, position); an event already in history keeps its first-applied version
        first = Window.partitionBy(*keys, "_seq").orderBy(F.col("_source_file").desc(), F.col("_line").desc())
        deduped = events.withColumn("_n", F.row_number().over(first)).where("_n = 1")
        new = _silver_rows(deduped, fields, engine.schema(path))
        if existing is not None:
            new = new.join(existing.select(*keys, "_seq"), [*keys, "_seq"], "left_anti")
        new = new.localCheckpoint()
    added = new.count() if new is not None else 0
    if not added and not recompute_all:
        return 0
    chains = None
    if existing is not None:
        old = existing.drop("_valid_to", "_is_current")
        if not recompute_all and new is not None:
            old = old.join(new.select(*keys).distinct(), keys, "left_semi")
        chains = old
    if new is not None and added:
        chains = new if chains is None else chains.unionByName(new, allowMissingColumns=True)
    if chains is None:
        return 0
    truncates = engine.read(spark, lake.truncates(table.name))
    cuts = sorted(r["_seq"] for r in truncates.select("_seq").collect()) if truncates is not None else []
    next_cut = F.lit(None).cast("string")
    for cut in reversed(cuts):  # the first truncate after the event's position
        next_cut = F.when(F.col("_seq") < cut, F.lit(cut)).otherwise(next_cut)
    following = F.lead("_seq").over(Window.partitionBy(*keys).orderBy("_seq"))
    # a delete is not a version: only the key's next event follows it, never a truncate
    valid_to = F.when(F.col("_op") == "d", following).otherwise(F.least(following, next_cut))
    versions = (chains.withColumn("_valid_to", valid_to)
                .withColumn("_is_current", F.col("_valid_to").isNull() & (F.col("_op") != "d")))
    engine.merge(versions, path, MergeSpec(keys=(*table.keys, "_seq"), update_when="true", insert_when="true"),
                 table.partition_by)
    return added


def _current_state(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: TableConfig, latest: DataFrame,
                   new_truncate: str | None) -> DataFrame:
    """(key, _seq, _live, _ledger_behind) of the batch's keys: the newest of the key's live silver row and
    its tombstone-ledger entry. The two are written by separate commits, so a run killed between them
    leaves a key in both; the newer one is the key's state, and `_ledger_behind` marks a ledger entry older
    than the live row, for the ledger merge to drop. Entries older than a new truncate are left out: it
    removes them before the merge."""
    keys = latest.select(*table.keys)
    parts = []
    for path, live in ((lake.silver(table.name), True), (lake.tombstones(table.name), False)):
        current = engine.read(spark, path)
        if current is not None:
            if new_truncate:
                current = current.where(F.col("_seq") >= F.lit(new_truncate))
            parts.append(current.select(*[F.col(k).cast(keys.schema[k].dataType).alias(k) for k in table.keys], "_seq",
                                        F.lit(live).alias("_live")).join(keys, list(table.keys), "left_semi"))
    if not parts:
        return spark.createDataFrame([], T.StructType([*keys.schema.fields, T.StructField("_seq", T.StringType()),
                                                       T.StructField("_live", T.BooleanType()),
                                                       T.StructField("_ledger_behind", T.BooleanType())]))
    entries = reduce(DataFrame.unionByName, parts)
    newest = F.max(F.struct("_seq", "_live"))
    return entries.groupBy(*table.keys).agg(newest["_seq"].alias("_seq"), newest["_live"].alias("_live"),
                                            (F.count(F.lit(1)) > 1).alias("_both")).select(
        *table.keys, "_seq", "_live", (F.col("_both") & F.col("_live")).alias("_ledger_behind"))


def _silver_rows(effective: DataFrame, fields: list[schemas.ImageField], target: T.StructType | None) -> DataFrame:
    """Source columns under their own names, then the pipeline's `_` columns; columns the table has but
    the batch lacks are null (DESIGN 3.5, 4.3)."""
    columns = [F.col("_row")[f.name].alias(f.name) for f in fields]
    present = {f.name for f in fields}
    meta = {"_op": F.col("op"), "_seq": F.col("_seq"),
            "_source_ts_ms": F.get_json_object("source", "$.ts_ms").cast("long"),
            "_ingested_at": F.col("_ingested_at"), "_batch_id": F.col("_batch_id")}
    if target is not None:
        columns += [F.lit(None).cast(f.dataType).alias(f.name) for f in target.fields
                    if f.name not in present and f.name not in meta]
    return effective.select(*columns, *[c.alias(n) for n, c in meta.items()])


def _save_progress(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, bronze_version: int,
                   truncated_at: str | None, batch_id: str) -> None:
    row = spark.createDataFrame([("silver", bronze_version, truncated_at, batch_id, _now(),
                                  engine.version(lake.silver(table)))], PROGRESS_SCHEMA)
    engine.merge(row, lake.progress(table), MergeSpec(("layer",), update_when="true", insert_when="true"))


# ---- gold ------------------------------------------------------------------------------------------


def gold_refresh(spark: SparkSession, engine: DeltaEngine, model: GoldModel, lake: Lake,
                 batch_id: str) -> dict[str, Any]:
    """Run the model's SQL over silver, gate the result, then overwrite the gold table: write-audit-publish,
    a failed gate leaves gold at its previous version."""
    newest = None
    for source in model.sources:
        silver = engine.read(spark, lake.silver(source))
        if silver is None:
            raise ValueError(f"table={model.name} layer=gold: source silver table {source!r} does not exist yet")
        silver.createOrReplaceTempView(source)
        source_newest = _one(silver.agg(F.max("_source_ts_ms").alias("ts")))["ts"]
        newest = source_newest if newest is None or (source_newest or 0) > newest else newest
    result = spark.sql(model.sql).localCheckpoint()
    rows = result.count()
    summary: dict[str, Any] = {"table": model.name, "layer": "gold", "batch_id": batch_id,
                               "sources": list(model.sources), "rows": rows, "lag_s": _lag_s(newest)}
    frames = {"model": result}
    if model.references:
        frames["references"] = _references(spark, engine, lake, model, result)
    figures = {"lag_s": summary["lag_s"]} if model.freshness_s is not None else {}
    _gate(frames, figures, model.name, "gold", gold_checks(model), lake, summary)
    return {**summary, "version": engine.overwrite(result, lake.gold(model.name))}


def _references(spark: SparkSession, engine: DeltaEngine, lake: Lake, model: GoldModel, result: DataFrame) -> DataFrame:
    """One row per reference and model row with all its columns set: `_found` when the silver table has
    a row with those values."""
    parts = []
    for ref in model.references:
        target = engine.read(spark, lake.silver(ref.table))
        values = result.select(*[F.col(c).alias(f"_v{i}") for i, c in enumerate(ref.columns)]).dropna()
        if target is None:
            parts.append(values.select(F.lit(ref.label()).alias("reference"), F.lit(False).alias("_found")))
            continue
        present = target.select(*[F.col(c).alias(f"_v{i}") for i, c in enumerate(ref.to)]).distinct() \
            .withColumn("_present", F.lit(True))
        parts.append(values.join(present, [f"_v{i}" for i in range(len(ref.columns))], "left").select(
            F.lit(ref.label()).alias("reference"), F.coalesce("_present", F.lit(False)).alias("_found")))
    return reduce(DataFrame.unionByName, parts)
