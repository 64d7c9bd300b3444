"""Layer jobs: read -> transform -> gate -> write, one table (or gold model) at a time.

Each returns a summary dict (counts, versions, gate verdict) that the CLI prints and publishes."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark.sql import DataFrame, SparkSession
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
QUARANTINE_COLUMNS = ("_source_file", "_line", "_raw", "reason", "layer", "_batch_id", "_ingested_at")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def write_quarantine(engine: DeltaEngine, lake: Lake, table: str, rows: DataFrame, layer: str, batch_id: str) -> int:
    """Quarantine rows keep the raw record and a reason; keyed by (layer, file, line) so a re-run adds
    nothing twice."""
    rows = rows.select(
        "_source_file", "_line", "_raw", "reason", F.lit(layer).alias("layer"),
        F.lit(batch_id).alias("_batch_id"), F.lit(_now()).cast("timestamp").alias("_ingested_at"))
    if rows.isEmpty():
        return 0
    engine.merge(rows, lake.quarantine(table), QUARANTINE_MERGE)
    return rows.count()


def _reasons(rows: DataFrame) -> dict[str, int]:
    """Quarantine counts by reason, with the variable tail (column names, op values) kept."""
    return {r["reason"]: r["n"] for r in rows.groupBy("reason").agg(F.count(F.lit(1)).alias("n")).collect()}


# ---- bronze ----------------------------------------------------------------------------------------


def read_landing(spark: SparkSession, landing: str, files: list[LandingFile]) -> tuple[DataFrame, list[LandingFile]]:
    """One row per JSON landing file (path relative to the landing root, whole text); the files that
    cannot be read as JSON lines are returned apart, to be quarantined whole."""
    readable = [f for f in files if f.kind == "json"]
    unreadable = [f for f in files if f.kind != "json"]
    if not readable:
        return spark.createDataFrame([], "_source_file STRING, content STRING"), unreadable
    relative = {f"{landing}/{f.path}": f.path for f in readable}
    raw = spark.read.text(list(relative), wholetext=True).select(
        F.col("_metadata.file_path").alias("_uri"), F.col("value").alias("content"))
    mapping = spark.createDataFrame([(k, v) for k, v in relative.items()], "_path STRING, _source_file STRING")
    # _metadata.file_path is a URI (file:/...); match it on the path's tail, which is unique per file
    joined = raw.join(mapping, F.col("_uri").endswith(F.col("_path")))
    return joined.select("_source_file", "content"), unreadable


def bronze_ingest(spark: SparkSession, engine: DeltaEngine, table: TableConfig, landing: str, lake: Lake,
                  batch_id: str) -> dict[str, Any]:
    files = pending_files(landing, lake, table.name, table.topic)
    summary: dict[str, Any] = {"table": table.name, "layer": "bronze", "batch_id": batch_id, "files": len(files)}
    if not files:
        return {**summary, "gate": "skipped (no new files)", "lines": 0, "events": 0, "tombstones": 0, "quarantined": {}}

    contents, unreadable = read_landing(spark, landing, files)
    lines = transforms.split_lines(contents)
    if unreadable:
        whole_files = spark.createDataFrame(
            [(f.path, 0, "", f"unsupported_file: {f.path.rsplit('/', 1)[-1]}") for f in unreadable],
            "_source_file STRING, _line BIGINT, _raw STRING, reason STRING")
    classified = transforms.classify(transforms.parse_envelope(lines), table.keys).cache()

    quarantine = classified.where("_kind = 'quarantine'").select("_source_file", "_line", "_raw", "reason")
    if unreadable:
        quarantine = quarantine.unionByName(whole_files)
    quarantined = _reasons(quarantine)
    write_quarantine(engine, lake, table.name, quarantine, "bronze", batch_id)

    events = classified.where("_kind = 'event'")
    gate_frame = events.select("op", *[F.get_json_object(transforms.key_image(), f"$.{k}").alias(k) for k in table.keys])
    gate = run_gate(gate_frame, table.name, "bronze", bronze_checks(table), lake.root)

    version_before = engine.version(lake.bronze(table.name))
    bronze_version = 0 if version_before is None else version_before + 1
    rows = events.select(
        "_source_file", "_line", "_raw", "op", "ts_ms", "source", "before", "after", "_schema",
        F.lit(batch_id).alias("_batch_id"), F.lit(bronze_version).cast("long").alias("_bronze_version"),
        F.lit(_now()).cast("timestamp").alias("_ingested_at"))
    counts = {r["_kind"]: r["n"] for r in classified.groupBy("_kind").agg(F.count(F.lit(1)).alias("n")).collect()}
    if counts.get("event", 0):
        written = engine.append(rows, lake.bronze(table.name))
        if written != bronze_version:
            raise RuntimeError(f"table={table.name} layer=bronze: another writer committed version {written - 1} "
                               "during this run; runs of one table must be serialized")
    _log_files(spark, engine, lake, table.name, files, classified, batch_id, bronze_version)
    classified.unpersist()
    return {**summary, "lines": sum(counts.values()), "events": counts.get("event", 0),
            "tombstones": counts.get("tombstone", 0), "quarantined": quarantined,
            "empty_files": sum(1 for f in files if f.size == 0), "version": engine.version(lake.bronze(table.name)),
            "gate": gate.verdict(), "docs": gate.docs}


def _log_files(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, files: list[LandingFile],
               classified: DataFrame, batch_id: str, bronze_version: int) -> None:
    per_file = {r["_source_file"]: r for r in classified.groupBy("_source_file").agg(
        F.count(F.lit(1)).alias("lines"),
        F.sum(F.when(F.col("_kind") == "event", 1).otherwise(0)).alias("events"),
        F.sum(F.when(F.col("_kind") == "tombstone", 1).otherwise(0)).alias("tombstones"),
        F.sum(F.when(F.col("_kind") == "quarantine", 1).otherwise(0)).alias("quarantined")).collect()}
    now = _now()
    rows = []
    for f in files:
        stats = per_file.get(f.path)
        whole = 1 if f.kind != "json" else 0
        rows.append((table, f.path, f.size, f.modified_ms, stats["lines"] if stats else 0, stats["events"] if stats else 0,
                     stats["tombstones"] if stats else 0, (stats["quarantined"] if stats else 0) + whole,
                     batch_id, bronze_version, now))
    log = spark.createDataFrame(rows, "table STRING, file STRING, size BIGINT, modified_ms BIGINT, lines BIGINT, "
                                      "events BIGINT, tombstones BIGINT, quarantined BIGINT, _batch_id STRING, "
                                      "bronze_version BIGINT, ingested_at TIMESTAMP")
    engine.append(log, lake.ingest_log(table))


# ---- silver ----------------------------------------------------------------------------------------

PROGRESS_SCHEMA = "layer STRING, bronze_version BIGINT, _batch_id STRING, updated_at TIMESTAMP"


def applied_bronze_version(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str) -> int:
    progress = engine.read(spark, lake.progress(table))
    if progress is None:
        return -1
    row = progress.where("layer = 'silver'").agg(F.max("bronze_version").alias("v")).first()
    return -1 if row is None or row["v"] is None else int(row["v"])


def _image_fields(spark: SparkSession, events: DataFrame) -> list[schemas.ImageField]:
    """Columns of the batch's row images: from the envelope schemas, else inferred from plain JSON."""
    envelope_schemas = [r["_schema"] for r in events.where("_schema IS NOT NULL").select("_schema").distinct().collect()]
    lists = [schemas.fields_from_envelope(s) for s in sorted(envelope_schemas)]
    plain = events.where("_schema IS NULL").select(transforms.key_image().alias("_image"))
    if not plain.isEmpty():
        lists.insert(0, schemas.infer_fields(plain, "_image"))
    return schemas.merge_fields(lists)


def silver_merge(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, batch_id: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"table": table.name, "layer": "silver", "batch_id": batch_id}
    applied = applied_bronze_version(spark, engine, lake, table.name)
    bronze_version = engine.version(lake.bronze(table.name))
    if bronze_version is None or bronze_version <= applied:
        return {**summary, "events": 0, "gate": "skipped (no new bronze rows)", "quarantined": {}}
    bronze = engine.read(spark, lake.bronze(table.name), version=bronze_version)
    assert bronze is not None
    batch = bronze.where(F.col("_bronze_version") > applied)

    fields = _image_fields(spark, batch)
    field_names = {f.name for f in fields}
    absent_keys = [k for k in table.keys if k not in field_names]
    if absent_keys:
        raise ValueError(f"table={table.name} layer=silver: key column(s) {', '.join(absent_keys)} not in the "
                         f"change events' columns ({', '.join(sorted(field_names))})")
    target_path = lake.silver(table.name)
    target_schema = engine.schema(target_path)
    typed = schemas.parse_image(transforms.order_key(batch, table.sequence_by), transforms.key_image(), fields, "_row")
    typed = schemas.align(typed, "_row", target_schema)
    for k in table.keys:
        typed = typed.withColumn(k, F.col("_row")[k])
    missing_typed_key = transforms.missing_keys_typed(table.keys)
    reason = (F.when(F.col("op") == "t", "unsupported_op: t (truncate)")
              .when(F.col("_seq").isNull(), "missing_sequence: no log position for this connector; set sequence_by")
              .when(F.col("_decode_problems") != "", F.concat(F.lit("incompatible_type: "), F.col("_decode_problems")))
              .when(F.col("_type_problems") != "", F.concat(F.lit("incompatible_type: "), F.col("_type_problems")))
              .when(missing_typed_key != "", F.concat(F.lit("missing_key: "), missing_typed_key)))
    typed = typed.withColumn("reason", reason).cache()
    quarantine = typed.where("reason IS NOT NULL")
    quarantined = _reasons(quarantine)
    write_quarantine(engine, lake, table.name, quarantine.select("_source_file", "_line", "_raw", "reason"),
                     "silver", batch_id)

    events = typed.where("reason IS NULL")
    latest = transforms.latest_per_key(events, table.keys).cache()
    state = _current_state(spark, engine, lake, table, latest)
    effective = transforms.effective_changes(latest, state, table.keys)
    rows = _silver_rows(effective, fields, target_schema)

    counts = events.agg(F.count(F.lit(1)).alias("events"),
                        F.countDistinct(*table.keys, "_seq").alias("distinct_positions")).first()
    latest_counts = latest.agg(F.count(F.lit(1)).alias("keys"), F.sum(F.col("_tie").cast("int")).alias("ties")).first()
    effective_count = rows.count()

    version_before = engine.version(target_path)
    result = None
    if effective_count:
        spec = MergeSpec(table.keys, SILVER_MERGE.delete_when, SILVER_MERGE.update_when, SILVER_MERGE.insert_when)
        result = engine.merge(rows, target_path, spec, table.partition_by)
        ledger = rows.select(*table.keys, "_seq", "_op")
        ledger_spec = MergeSpec(table.keys, LEDGER_MERGE.delete_when, LEDGER_MERGE.update_when, LEDGER_MERGE.insert_when)
        engine.merge(ledger, lake.tombstones(table.name), ledger_spec)

    silver = engine.read(spark, target_path)
    gate_result = None
    if silver is not None:
        try:
            gate_result = run_gate(silver, table.name, "silver", silver_checks(table), lake.root)
        except GateFailed:
            # write-audit-publish: a failed gate leaves the published table at its previous version
            if version_before is not None and result is not None:
                engine.restore(target_path, version_before)
            raise
    _save_progress(spark, engine, lake, table.name, bronze_version, batch_id)
    typed.unpersist()
    latest.unpersist()
    events_in = counts["events"]
    return {**summary, "events": events_in + sum(quarantined.values()), "bronze_version": bronze_version,
            "duplicates_dropped": events_in - counts["distinct_positions"],
            "superseded_in_batch": counts["distinct_positions"] - latest_counts["keys"],
            "stale_ignored": latest_counts["keys"] - effective_count, "ties": int(latest_counts["ties"] or 0),
            "inserted": result.inserted if result else 0, "updated": result.updated if result else 0,
            "deleted": result.deleted if result else 0, "quarantined": quarantined,
            "version": engine.version(target_path), "gate": gate_result.verdict() if gate_result else "skipped",
            "docs": gate_result.docs if gate_result else None}


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


def _save_progress(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, bronze_version: int, batch_id: str) -> None:
    row = spark.createDataFrame([("silver", bronze_version, batch_id, _now())], PROGRESS_SCHEMA)
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
