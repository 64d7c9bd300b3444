"""Layer jobs: read -> transform -> gate -> write, one table (or gold model) at a time.

Each returns a summary dict (counts, versions, gate verdict) that the CLI prints and publishes."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import replace
from functools import reduce
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs import schemas, transforms
from spark_jobs.config import GoldModel, TableConfig
from spark_jobs.delta import DeltaEngine, MergeSpec
from spark_jobs.gates import GateFailed, bronze_checks, gold_checks, run_gate, silver_checks
from spark_jobs.landing import LandingFile
from spark_jobs.state import Lake, pending_files

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


def _landing_paths(spark: SparkSession, landing: str, files: list[LandingFile], read: DataFrame,
                   with_rows: set[str]) -> DataFrame:
    """Spark names files by URI (file:/..., percent-encoded): map each back to its landing path exactly,
    adding `_source_file`. Refuses to go on if a file known to hold rows (`with_rows`) cannot be matched."""
    relative = {os.path.abspath(f"{landing}/{f.path}"): f for f in files}
    uris = {unquote(urlparse(r["_uri"]).path): r["_uri"] for r in read.select("_uri").distinct().collect()}
    lost = [f.path for local, f in relative.items() if local not in uris and f.path in with_rows]
    if lost:
        raise RuntimeError(f"landing files read by Spark under other names, refusing to lose them: {', '.join(lost)}")
    mapping = spark.createDataFrame([(uris[local], f.path) for local, f in relative.items() if local in uris],
                                    "_uri STRING, _source_file STRING")
    return read.join(mapping, "_uri").drop("_uri")


def _parquet_rows(landing: str, f: LandingFile) -> int | None:
    """Records in a Parquet landing file from its footer; None when it is not a readable Parquet file."""
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(f"{landing}/{f.path}").num_rows)
    except (OSError, ValueError):
        return None


def read_landing(spark: SparkSession, landing: str, files: list[LandingFile],
                 fmt: str = "auto") -> tuple[DataFrame, dict[LandingFile, str]]:
    """Landing files as lines: (_source_file, _line, _raw, _typed_schema). JSON files (plain or gzip) give
    one row per text line; Parquet files one row per record, as its JSON text, with `_typed_schema` holding
    the record's column types. Files that cannot be read are returned apart with the reason, to be
    quarantined whole: not of the table's format (unsupported_file) or not a valid Parquet file
    (unreadable_file)."""
    wanted = {"auto": ("json", "parquet"), "json": ("json",), "json-flat": ("json",), "parquet": ("parquet",)}[fmt]
    json_files = [f for f in files if f.kind == "json" and "json" in wanted]
    parquet_rows = {f: _parquet_rows(landing, f) for f in files if f.kind == "parquet" and "parquet" in wanted and f.size}
    parquet_files = [f for f, rows in parquet_rows.items() if rows is not None]
    readable = {f.path for f in json_files + parquet_files}
    unreadable = {f: "unreadable_file" if f.kind in wanted else "unsupported_file" for f in files
                  if f.path not in readable and not (f.kind == "parquet" and f.size == 0)}
    parts = []
    if json_files:
        raw = spark.read.text([os.path.abspath(f"{landing}/{f.path}") for f in json_files], wholetext=True).select(
            F.col("_metadata.file_path").alias("_uri"), F.col("value").alias("content"))
        lines = transforms.split_lines(_landing_paths(spark, landing, json_files, raw, {f.path for f in json_files if f.size}))
        parts.append(lines.withColumn("_typed_schema", F.lit(None).cast("string")))
    if parquet_files:
        records = spark.read.option("mergeSchema", "true").parquet(
            *[os.path.abspath(f"{landing}/{f.path}") for f in parquet_files])
        typed = schemas.envelope_from_spark(transforms.parquet_image_type(records.schema))
        record = F.struct(*[F.col(f"`{c}`") for c in records.columns])
        rows = records.select(F.col("_metadata.file_path").alias("_uri"), (F.col("_metadata.row_index") + 1).alias("_line"),
                              F.to_json(record, schemas.JSON_OPTIONS).alias("_raw"))
        with_rows = {f.path for f in parquet_files if parquet_rows[f]}
        parts.append(_landing_paths(spark, landing, parquet_files, rows, with_rows).select(
            "_source_file", "_line", "_raw", F.lit(typed).alias("_typed_schema")))
    if not parts:
        return spark.createDataFrame([], "_source_file STRING, _line BIGINT, _raw STRING, _typed_schema STRING"), unreadable
    return reduce(DataFrame.unionByName, parts), unreadable


def bronze_ingest(spark: SparkSession, engine: DeltaEngine, table: TableConfig, landing: str, lake: Lake,
                  batch_id: str) -> dict[str, Any]:
    recovered = _recover_unlogged_files(spark, engine, lake, table.name, batch_id)
    files = [f for f in pending_files(landing, lake, table.name, table.topic) if f.path not in recovered]
    summary: dict[str, Any] = {"table": table.name, "layer": "bronze", "batch_id": batch_id, "files": len(files),
                               "recovered_files": len(recovered)}
    if not files:
        return {**summary, "gate": "skipped (no new files)", "lines": 0, "events": 0, "tombstones": 0, "quarantined": {}}

    lines, unreadable = read_landing(spark, landing, files, table.format)
    parsed = transforms.parse_envelope(lines, table.format)
    parsed = parsed.withColumn("_schema", F.coalesce("_typed_schema", "_schema")).drop("_typed_schema")
    classified = transforms.classify(parsed, table.keys).cache()

    quarantine = classified.where("_kind = 'quarantine'").select("_source_file", "_line", "_raw", "reason")
    if unreadable:
        quarantine = quarantine.unionByName(spark.createDataFrame(
            [(f.path, 0, "", f"{reason}: {f.path.rsplit('/', 1)[-1]}") for f, reason in unreadable.items()],
            "_source_file STRING, _line BIGINT, _raw STRING, reason STRING"))
    quarantined = write_quarantine(engine, lake, table.name, quarantine, "bronze", batch_id)

    events = classified.where("_kind = 'event'")
    gate_frame = events.select("op", *[F.get_json_object(transforms.key_image(), f"$.{k}").alias(k) for k in table.keys])
    gate = run_gate(gate_frame, table.name, "bronze", bronze_checks(table), lake.root)

    version_before = engine.version(lake.bronze(table.name))
    bronze_version = 0 if version_before is None else version_before + 1
    rows = events.select(
        "_source_file", "_line", "_raw", "op", "ts_ms", "source", "before", "after", "_schema",
        F.lit(batch_id).alias("_batch_id"), F.lit(bronze_version).cast("long").alias("_bronze_version"),
        F.lit(_now()).cast("timestamp").alias("_ingested_at"))
    per_file = {r["_source_file"]: (r["lines"], r["events"], r["tombstones"], r["quarantined"])
                for r in classified.groupBy("_source_file").agg(
                    F.count(F.lit(1)).alias("lines"),
                    F.sum(F.when(F.col("_kind") == "event", 1).otherwise(0)).alias("events"),
                    F.sum(F.when(F.col("_kind") == "tombstone", 1).otherwise(0)).alias("tombstones"),
                    F.sum(F.when(F.col("_kind") == "quarantine", 1).otherwise(0)).alias("quarantined")).collect()}
    lines_in, events_in, tombstones = (sum(stats[i] for stats in per_file.values()) for i in range(3))
    committed = None
    if events_in:
        committed = engine.append(rows, lake.bronze(table.name))
        if committed != bronze_version:
            raise RuntimeError(f"table={table.name} layer=bronze: another writer committed version {committed - 1} "
                               "during this run; runs of one table must be serialized")
    for f in unreadable:
        per_file[f.path] = (0, 0, 0, 1)
    _log_files(spark, engine, lake, table.name, {f.path: (f.size, f.modified_ms, *per_file.get(f.path, (0, 0, 0, 0)))
                                                 for f in files}, batch_id, committed)
    classified.unpersist()
    return {**summary, "lines": lines_in, "events": events_in, "tombstones": tombstones, "quarantined": quarantined,
            "empty_files": sum(1 for f in files if f.size == 0),
            "version": committed if committed is not None else version_before,
            "gate": gate.verdict(), "docs": gate.docs}


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

PROGRESS_SCHEMA = "layer STRING, bronze_version BIGINT, truncated_at STRING, _batch_id STRING, updated_at TIMESTAMP"
NO_SEQUENCE = "missing_sequence: no log position for this connector; set sequence_by"


def silver_progress(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str) -> tuple[int, str | None]:
    """(bronze version silver has applied, -1 if none; sequence of the latest truncate applied, if any)."""
    progress = engine.read(spark, lake.progress(table))
    row = None if progress is None else progress.where("layer = 'silver'").first()
    return (-1, None) if row is None else (int(row["bronze_version"]), row["truncated_at"])


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
                   has_plain: bool) -> tuple[DataFrame, list[schemas.ImageField]]:
    """Row events (with `_seq`) plus the typed image in `_row`, typed key columns and a quarantine `reason`."""
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
    """Apply the bronze rows silver has not seen, gate silver, then record the progress."""
    summary: dict[str, Any] = {"table": table.name, "layer": "silver", "batch_id": batch_id}
    applied, truncated_at = silver_progress(spark, engine, lake, table.name)
    bronze_version = engine.version(lake.bronze(table.name))
    if bronze_version is None or bronze_version <= applied:
        return {**summary, "events": 0, "gate": "skipped (no new bronze rows)", "quarantined": {}}
    bronze = engine.read(spark, lake.bronze(table.name), version=bronze_version)
    assert bronze is not None
    target_path = lake.silver(table.name)
    published = {path: engine.version(path) for path in (target_path, lake.history(table.name))}
    stats, truncated_at = apply_changes(spark, engine, table, lake, bronze.where(F.col("_bronze_version") > applied),
                                        truncated_at, batch_id)
    gate_result = None
    silver = engine.read(spark, target_path)
    if silver is not None:
        silver = silver.cache()  # the suite computes each metric in its own Spark job
        try:
            gate_result = run_gate(silver, table.name, "silver", silver_checks(table), lake.root)
        except GateFailed:
            # write-audit-publish: a failed gate leaves the published tables at their previous version
            for path, before in published.items():
                if before is not None and engine.version(path) != before:
                    engine.restore(path, before)
            raise
    _save_progress(spark, engine, lake, table.name, bronze_version, truncated_at, batch_id)
    spark.catalog.clearCache()
    return {**summary, **stats, "bronze_version": bronze_version, "version": engine.version(target_path),
            "gate": gate_result.verdict() if gate_result else "skipped",
            "docs": gate_result.docs if gate_result else None}


def apply_changes(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, batch: DataFrame,
                  truncated_at: str | None, batch_id: str) -> tuple[dict[str, Any], str | None]:
    """Apply a batch of bronze rows to silver, the tombstone ledger and quarantine (DESIGN 4).

    `truncated_at` is the position of the latest truncate already applied; returns the batch's counts
    and the truncate position in force afterwards."""
    target_path, ledger_path = lake.silver(table.name), lake.tombstones(table.name)
    target_schema = engine.schema(target_path)
    # one pass over the batch; every later step (and each count) starts from these rows, not the batch's plan
    ordered = transforms.order_key(batch, table.sequence_by).localCheckpoint()
    overview = _one(ordered.agg(
        F.count(F.when((F.col("op") == "t") & F.col("_seq").isNotNull(), 1)).alias("truncates"),
        F.max(F.when(F.col("op") == "t", F.col("_seq"))).alias("truncated_at"),
        F.count(F.when(F.col("op") != "t", 1)).alias("changes"),
        F.count(F.when((F.col("op") != "t") & F.col("_schema").isNull(), 1)).alias("plain")))

    # truncate (op=t): the table is empty as of its position; every older event is stale
    truncates = ordered.where("op = 't'").withColumn("reason", F.when(F.col("_seq").isNull(), NO_SEQUENCE))
    batch_truncate = overview["truncated_at"]
    new_truncate = batch_truncate if batch_truncate and batch_truncate > (truncated_at or "") else None
    truncated_at = new_truncate or truncated_at
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
    quarantine = truncates.where("reason IS NOT NULL").select("_source_file", "_line", "_raw", "reason")

    result, counts, latest_counts, effective_count, versions = None, None, None, 0, 0
    if overview["changes"]:
        typed, fields = _typed_changes(spark, table, ordered.where("op <> 't'"), target_schema, overview["plain"] > 0)
        typed = typed.localCheckpoint()
        quarantine = quarantine.unionByName(typed.where("reason IS NOT NULL").select("_source_file", "_line", "_raw", "reason"))
        events = typed.where("reason IS NULL")
        after_truncate = F.col("_seq") > F.lit(truncated_at) if truncated_at else F.lit(True)
        position = F.struct(*table.keys, "_seq")
        counts = _one(events.agg(F.count(F.lit(1)).alias("events"), F.countDistinct(position).alias("positions"),
                                 F.countDistinct(F.when(after_truncate, position)).alias("positions_after_truncate")))
        latest = transforms.latest_per_key(events.where(after_truncate), table.keys).localCheckpoint()
        latest_counts = _one(latest.agg(F.count(F.lit(1)).alias("keys"), F.sum(F.col("_tie").cast("int")).alias("ties")))
        state = _current_state(spark, engine, lake, table, latest)
        rows = _silver_rows(transforms.effective_changes(latest, state, table.keys), fields, target_schema).localCheckpoint()
        effective_count = rows.count()
        if effective_count:
            result = engine.merge(rows, target_path, replace(SILVER_MERGE, keys=table.keys), table.partition_by)
            ledger = rows.select(*table.keys, "_seq", "_op", F.coalesce(
                "_source_ts_ms", F.unix_millis(F.col("_ingested_at").cast("timestamp"))).alias("_deleted_at_ms"))
            engine.merge(ledger, ledger_path, replace(LEDGER_MERGE, keys=table.keys))
        if table.history:
            versions = apply_history(spark, engine, table, lake, events, fields, recompute_all=new_truncates > 0)
    elif new_truncates:
        versions = apply_history(spark, engine, table, lake, None, [], recompute_all=True)
    quarantined = write_quarantine(engine, lake, table.name, quarantine, "silver", batch_id)
    expired = _expire_tombstones(engine, lake, table)

    events_in, positions, kept = ((counts["events"], counts["positions"], counts["positions_after_truncate"])
                                  if counts else (0, 0, 0))
    keys = latest_counts["keys"] if latest_counts else 0
    return {"events": events_in + overview["truncates"] + sum(quarantined.values()),
            "duplicates_dropped": events_in - positions, "superseded_in_batch": kept - keys,
            "stale_ignored": (positions - kept) + (keys - effective_count),
            "ties": int(latest_counts["ties"] or 0) if latest_counts else 0, "truncates": overview["truncates"],
            "inserted": result.inserted if result else 0, "updated": result.updated if result else 0,
            "deleted": (result.deleted if result else 0) + deleted_by_truncate,
            "tombstones_expired": expired, **({"history_rows": versions} if table.history else {}),
            "quarantined": quarantined}, truncated_at


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


def _current_state(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: TableConfig, latest: DataFrame) -> DataFrame:
    """(key, _seq) of the batch's keys in silver and in the tombstone ledger; the two never share a key."""
    keys = latest.select(*table.keys)
    parts = []
    for path in (lake.silver(table.name), lake.tombstones(table.name)):
        current = engine.read(spark, path)
        if current is not None:
            parts.append(current.select(*[F.col(k).cast(keys.schema[k].dataType).alias(k) for k in table.keys], "_seq")
                         .join(keys, list(table.keys), "left_semi"))
    if not parts:
        return spark.createDataFrame([], T.StructType([*keys.schema.fields, T.StructField("_seq", T.StringType())]))
    state = parts[0]
    for part in parts[1:]:
        state = state.unionByName(part)
    return state


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
    row = spark.createDataFrame([("silver", bronze_version, truncated_at, batch_id, _now())], PROGRESS_SCHEMA)
    engine.merge(row, lake.progress(table), MergeSpec(("layer",), update_when="true", insert_when="true"))


# ---- gold ------------------------------------------------------------------------------------------


def gold_refresh(spark: SparkSession, engine: DeltaEngine, model: GoldModel, lake: Lake,
                 batch_id: str) -> dict[str, Any]:
    """Run the model's SQL over silver, gate the result, then overwrite the gold table (write-audit-publish)."""
    for source in model.sources:
        silver = engine.read(spark, lake.silver(source))
        if silver is None:
            raise ValueError(f"table={model.name} layer=gold: source silver table {source!r} does not exist yet")
        silver.createOrReplaceTempView(source)
    result = spark.sql(model.sql).cache()
    gate = run_gate(result, model.name, "gold", gold_checks(model), lake.root)
    version = engine.overwrite(result, lake.gold(model.name))
    rows = result.count()
    result.unpersist()
    return {"table": model.name, "layer": "gold", "batch_id": batch_id, "sources": list(model.sources),
            "rows": rows, "version": version, "gate": gate.verdict(), "docs": gate.docs}
