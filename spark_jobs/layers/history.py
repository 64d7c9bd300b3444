"""History (SCD type 2): every version of each row in `silver/<table>_history` (docs/architecture.md,
"History")."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_jobs.debezium import types
from spark_jobs.delta import DeltaEngine, MergeSpec
from spark_jobs.lake import Lake
from spark_jobs.layers.common import counted_checkpoint
from spark_jobs.layers.silver_plan import silver_rows
from spark_jobs.registry import TableConfig

TRUNCATE_LOG_MERGE = MergeSpec(keys=("_seq",), insert_when="true")


def apply_history(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, events: DataFrame | None,
                  fields: list[types.ImageField], recompute_all: bool) -> int:
    """Every version of each row in `silver/<table>_history`: one row per applied event (a delete is a
    row with `_op = 'd'` that ends the version before it), `_valid_to` = the sequence of the key's next
    event or of the first truncate after it (for deletes: the next event only), `_is_current` for the
    live version. Late events slot into their place: the chains of the batch's keys (all keys after a
    new truncate) are recomputed.

    Returns the number of new history rows."""
    path = lake.history(table.name)
    existing = engine.read(spark, path)
    keys = list(table.keys)
    new, added = None, 0
    if events is not None:
        # one row per (key, position); an event already in history keeps its first-applied version
        first = Window.partitionBy(*keys, "_seq").orderBy(F.col("_source_file").desc(), F.col("_line").desc())
        deduped = events.withColumn("_n", F.row_number().over(first)).where("_n = 1")
        new = silver_rows(deduped, fields, engine.schema(path))
        if existing is not None:
            new = new.join(existing.select(*keys, "_seq"), [*keys, "_seq"], "left_anti")
        new, added = counted_checkpoint(new)  # counted by the job that makes them
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
