"""Gold: each model's SQL over silver, gated, then published in one overwrite (docs/architecture.md, "Gold")."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.delta import DeltaEngine
from spark_jobs.errors import PipelineError
from spark_jobs.lake import Lake
from spark_jobs.layers.common import gate, lag_seconds, one_row
from spark_jobs.layers.summary import GoldSummary
from spark_jobs.quality.gates import gold_checks
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
    frames = {"model": result}
    if model.references:
        frames["references"] = _references(spark, engine, lake, model, result)
    figures = {"lag_s": summary.lag_s} if model.freshness_s is not None else {}
    gate(frames, figures, model.name, "gold", gold_checks(model), lake, summary)
    summary.version = engine.overwrite(result, lake.gold(model.name))
    return summary


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
