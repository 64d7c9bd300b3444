"""Gold: each model's SQL over silver, gated, then published in one overwrite (docs/architecture.md, "Gold")."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import fields
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.delta import DeltaEngine
from spark_jobs.errors import PipelineError
from spark_jobs.lake import Lake
from spark_jobs.layers import transactions
from spark_jobs.layers.common import gate, lag_seconds, one_row, share, write_quarantine
from spark_jobs.layers.summary import GoldSummary
from spark_jobs.lineage import model_lineage
from spark_jobs.quality.audit import Audit, Figures, tally
from spark_jobs.quality.expectations import QUARANTINE, flagged
from spark_jobs.quality.gates import gold_checks
from spark_jobs.quality.user_expectations import check_columns, violations
from spark_jobs.registry import GoldModel


def gold_refresh(spark: SparkSession, engine: DeltaEngine, model: GoldModel, lake: Lake,
                 batch_id: str, landing: str | None = None) -> GoldSummary:
    """Run the model's SQL over silver, gate the result, then overwrite the gold table: write-audit-publish,
    a failed gate leaves gold at its previous version. When nothing it reads has changed since the version
    it published (the same silver versions, model definition and gold version), it is not refreshed,
    unless its result or verdict depends on the clock (see `depends_on_the_clock`).

    Sources whose connector publishes its transactions (`model.at_watermark`) are read as of one transaction
    watermark (layers/transactions.py), after taking the transaction topic's new files from `landing`."""
    ingested = transactions.ingest(spark, engine, lake, landing, model.transactions, batch_id) \
        if model.transactions and landing is not None else None
    inputs = refresh_inputs(engine, lake, model)
    gold_version = engine.version(lake.gold(model.name))
    recorded = _published_inputs(lake, model) or {}
    if not depends_on_the_clock(model) and gold_version is not None and recorded.get("gold_version") == gold_version \
            and all(recorded.get(k) == v for k, v in inputs.items()):
        return GoldSummary(table=model.name, batch_id=batch_id, sources=list(model.sources), version=gold_version,
                           gate="skipped (sources unchanged)",
                           transaction_watermark=recorded.get("transaction_watermark"))
    consistent = {t.name: t for t in model.at_watermark}
    mark, visible, logs = None, None, {}
    if model.transactions:
        versions = inputs["transaction_versions"]
        logs = transactions.source_logs(spark, engine, lake, list(model.at_watermark), versions)
        mark, visible = transactions.watermark(spark, engine, lake, model.transactions,
                                               versions["transactions"][model.transactions], list(model.at_watermark), logs)
    newest = None
    for source in model.sources:
        if source in consistent:
            silver = transactions.as_of(consistent[source], logs[source], visible)
        else:
            silver = engine.read(spark, lake.silver(source), version=inputs["silver_versions"][source])
        if silver is None:
            raise PipelineError(model.name, "gold", f"source silver table {source!r} does not exist yet")
        silver.createOrReplaceTempView(source)
        source_newest = one_row(silver.agg(F.max("_source_ts_ms").alias("ts")))["ts"]
        newest = source_newest if newest is None or (source_newest or 0) > newest else newest
    result = spark.sql(model.sql).localCheckpoint()
    rows = result.count()
    traced = model_lineage(model.sql)
    summary = GoldSummary(table=model.name, batch_id=batch_id, sources=list(model.sources), rows=rows,
                          lag_s=lag_seconds(newest), newest_change_ms=newest,
                          lineage={c: traced.get(c, []) for c in result.columns})
    if ingested is not None:
        summary.transaction_files, summary.transactions_ended = ingested.files, ingested.ends
        summary.transactions_quarantined = sum(ingested.quarantined.values()) or None
    if mark is not None:
        summary.transaction_watermark, summary.transactions_waiting = mark.transaction or "none", mark.waiting
        summary.waiting_for, summary.transaction_ids_unmatched = mark.blocked_by, mark.ids_unmatched
    check_columns(result, model.expectations, "the model's columns")
    published, quarantine = _quarantine_by_expectations(model, result, batch_id)
    audited = {"rows": result}
    if model.references:
        audited["references"] = _references(spark, engine, lake, model, result, inputs["silver_versions"])
    figures = Figures(rows=rows, lag_s=summary.lag_s)
    if quarantine is not None:
        # the rows a `quarantine` expectation refused are kept aside before the gate, as silver's are
        summary.quarantined = write_quarantine(engine, lake, model.name, quarantine, "gold", batch_id)
        figures.quarantined = sum(summary.quarantined.values())
        figures.quarantined_share = summary.quarantined_share = share(figures.quarantined, rows)
    gate(Audit(figures, tally(audited, flagged("gold"), model.keys)), {"model": result}, model.name, "gold",
         gold_checks(model), lake, summary, model.quality.actions)
    summary.version = engine.overwrite(published, lake.gold(model.name))
    # written after the publish: a run dying between the two refreshes again, which is harmless
    # with the watermark it was published at: the newest transaction shown, and its END's offset in the topic
    lake.files.write(lake.gold_inputs(model.name), json.dumps(
        {**inputs, "gold_version": summary.version, "transaction_watermark": summary.transaction_watermark,
         "transaction_position": mark.position if mark is not None else None}, sort_keys=True))
    return summary


# Spark SQL functions whose value changes from one run to the next on the same data (some also without
# parentheses): a model calling one is refreshed every run. A mention in a comment only costs a refresh.
_CLOCK_OR_CHANCE = re.compile(r"\b(current_date|current_timestamp|localtimestamp|now|curdate|unix_timestamp|"
                              r"rand|randn|random|uuid|shuffle)\b", re.IGNORECASE)


def depends_on_the_clock(model: GoldModel) -> bool:
    """The model's rows or its gate's verdict may differ on unchanged silver: its SQL reads the clock (or
    draws at random), or its freshness is checked."""
    return model.freshness_s is not None or bool(_CLOCK_OR_CHANCE.search(model.sql))


def refresh_inputs(engine: DeltaEngine, lake: Lake, model: GoldModel) -> dict[str, Any]:
    """What a refresh reads: the model's definition (as a digest) and the version of every silver table its
    SQL or references read, taken before reading them (the refresh reads exactly these versions)."""
    definition = {f.name: getattr(model, f.name) for f in fields(model) if f.name not in ("path", "maintenance")}
    digest = hashlib.sha256(json.dumps(definition, sort_keys=True, default=repr).encode()).hexdigest()
    tables = sorted({*model.sources, *(ref.table for ref in model.references)})
    inputs: dict[str, Any] = {"model": digest, "silver_versions": {t: engine.version(lake.silver(t)) for t in tables}}
    if model.transactions:  # what the watermark and the sources read at it come from
        names = sorted(t.name for t in model.at_watermark)
        inputs["transaction_versions"] = {
            "transactions": {model.transactions: engine.version(lake.transactions(model.transactions))},
            "history": {t: engine.version(lake.history(t)) for t in names},
            "truncates": {t: engine.version(lake.truncates(t)) for t in names}}
    return inputs


def _published_inputs(lake: Lake, model: GoldModel) -> dict[str, Any] | None:
    text = lake.files.read(lake.gold_inputs(model.name))
    return None if text is None else dict(json.loads(text))


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


def _references(spark: SparkSession, engine: DeltaEngine, lake: Lake, model: GoldModel, result: DataFrame,
                versions: dict[str, int | None]) -> DataFrame:
    """One row per reference and model row with all its columns set: `_found` when the silver table has
    a row with those values."""
    parts = []
    for ref in model.references:
        target = engine.read(spark, lake.silver(ref.table), version=versions[ref.table])
        values = result.select(*[F.col(c).alias(f"_v{i}") for i, c in enumerate(ref.columns)]).dropna()
        if target is None:
            parts.append(values.select(F.lit(ref.label()).alias("reference"), F.lit(False).alias("_found")))
            continue
        present = target.select(*[F.col(c).alias(f"_v{i}") for i, c in enumerate(ref.to)]).distinct() \
            .withColumn("_present", F.lit(True))
        parts.append(values.join(present, [f"_v{i}" for i in range(len(ref.columns))], "left").select(
            F.lit(ref.label()).alias("reference"), F.coalesce("_present", F.lit(False)).alias("_found")))
    return reduce(DataFrame.unionByName, parts)
