"""Gold: each model's SQL over silver, gated, then published in one overwrite (docs/architecture.md, "Gold")."""

from __future__ import annotations

from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.delta import DeltaEngine
from spark_jobs.errors import PipelineError
from spark_jobs.lake import Lake
from spark_jobs.layers.common import gate, lag_seconds, one_row, share, write_quarantine
from spark_jobs.layers.summary import GoldSummary
from spark_jobs.quality.expectations import QUARANTINE
from spark_jobs.quality.gates import gold_checks
from spark_jobs.quality.user_expectations import check_columns, violations
from spark_jobs.registry import GoldModel


def gold_refresh(spark: SparkSession, engine: DeltaEngine, model: GoldModel, lake: Lake,
                 batch_id: str) -> GoldSummary:
    """Run the model's SQL over silver, gate the result, then overwrite the gold table: write-audit-publish,
    a failed gate leaves gold at its previous version."""
    newest = None
    for source in model.sources:
        silver = engine.read(spark, lake.silver(source))
        if silver is None:
            raise PipelineError(model.name, "gold", f"source silver table {source!r} does not exist yet")
        silver.createOrReplaceTempView(source)
        source_newest = one_row(silver.agg(F.max("_source_ts_ms").alias("ts")))["ts"]
        newest = source_newest if newest is None or (source_newest or 0) > newest else newest
    result = spark.sql(model.sql).localCheckpoint()
    rows = result.count()
    summary = GoldSummary(table=model.name, batch_id=batch_id, sources=list(model.sources), rows=rows,
                          lag_s=lag_seconds(newest))
    check_columns(result, model.expectations, "the model's columns")
    published, quarantine = _quarantine_by_expectations(model, result, batch_id)
    frames = {"model": result}
    if model.references:
        frames["references"] = _references(spark, engine, lake, model, result)
    figures: dict[str, Any] = {"lag_s": summary.lag_s}
    if quarantine is not None:
        # the rows a `quarantine` expectation refused are kept aside before the gate, as silver's are
        summary.quarantined = write_quarantine(engine, lake, model.name, quarantine, "gold", batch_id)
        figures["quarantined"] = sum(summary.quarantined.values())
        figures["quarantined_share"] = summary.quarantined_share = share(figures["quarantined"], rows)
    gate(frames, figures, model.name, "gold", gold_checks(model), lake, summary, model.quality.actions)
    summary.version = engine.overwrite(published, lake.gold(model.name))
    return summary


def _quarantine_by_expectations(model: GoldModel, result: DataFrame, batch_id: str) -> tuple[DataFrame, DataFrame | None]:
    """The model's rows to publish, and those a `quarantine` expectation refused as quarantine rows (the row
    as JSON, the expectation as reason, numbered within this refresh)."""
    if not any(u.action == QUARANTINE for u in model.expectations):
        return result, None
    numbered = result.withColumn(ROW_ID, F.monotonically_increasing_id()).localCheckpoint()
    failing = violations(numbered, model.expectations, ROW_ID)
    assert failing is not None
    failing = failing.localCheckpoint()
    published = numbered.join(failing, ROW_ID, "left_anti").drop(ROW_ID)
    refused = numbered.join(failing, ROW_ID).select(
        F.lit(f"gold/{model.name}/{batch_id}").alias("_source_file"), F.col(ROW_ID).alias("_line"),
        F.to_json(F.struct(*[F.col(c) for c in result.columns])).alias("_raw"), "reason")
    return published.localCheckpoint(), refused


ROW_ID = "_cdc_row_id"


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
