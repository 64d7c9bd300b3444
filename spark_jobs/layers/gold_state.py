"""A gold model's per-group state (layers/gold_plan.py): built from all of silver, or moved by silver's changes since
the last refresh, and the model's rows computed from it (docs/architecture.md, "Incremental gold").

State columns: `_g<i>` each group's values, `_rows` its rows, and per aggregate `j`: `_a<j>_n` its non-null values,
`_a<j>_s` their sum (SUM, AVG: in the type Spark sums them in), `_a<j>_v` the extreme (MIN, MAX). A change adds
(+1: an insert or an update's new row) or takes away (-1: a delete or an update's old row); over several commits, each
MIN and MAX value's changes are netted first (`_netted`). MIN and MAX cannot take a value away without the group's other
rows: when the taken value was the extreme and no added one replaces it, the group's state is recomputed from
silver."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.delta import spark_frame
from spark_jobs.layers.gold_plan import IncrementalPlan, group_columns

SIGN = "_sign"
GONE = "_gone"  # 1 on a group no row is left in: its gold row and state row are deleted
ADDED, _TAKEN = ("insert", "update_postimage"), ("delete", "update_preimage")  # the change feed's row kinds


@dataclass(frozen=True)
class Moved:
    """A refresh's new state rows for the groups its changes touched (`GONE` = 1: none left)."""

    state: pa.Table
    changes: int  # the change feed's rows the model's WHERE kept
    groups: int  # groups they touched
    recomputed: int  # of those, groups whose MIN or MAX lost its value and were read again from silver
    newest_change_ms: int | None  # the newest source time of a row they added


def signed_changes(changes: DataFrame) -> DataFrame:
    """The change feed's rows with `SIGN`: +1 for a row a commit added, -1 for one it took away."""
    kind = F.col("_change_type")
    return changes.withColumn(SIGN, F.when(kind.isin(*ADDED), 1).when(kind.isin(*_TAKEN), -1)).drop("_change_type")


def build(silver: DataFrame, plan: IncrementalPlan) -> DataFrame:
    """The state of every group, from all of silver's rows."""
    return _finished(_aggregated(_projected(silver.withColumn(SIGN, F.lit(1)), plan), plan), plan)


def move(state: DataFrame, changes: DataFrame, silver: DataFrame, plan: IncrementalPlan) -> Moved:
    """The state of each group `changes` (signed: `signed_changes`) touch, from its stored `state` and the changes;
    a group whose MIN or MAX lost its value is read again from `silver` (the version the changes lead to)."""
    groups = group_columns(len(plan.groups))
    delta = _aggregated(_netted(_projected(changes, plan), plan), plan).alias("d")
    joined = delta.join(state.alias("o"), same_keys(groups, delta, state), "left")
    rows = F.coalesce(F.col("o._rows"), F.lit(0)) + F.col("d._rows")
    columns: list[Column] = [F.col(f"d.{g}").alias(g) for g in groups] + [rows.alias("_rows")]
    unknown: list[Column] = []
    for j, agg in enumerate(plan.aggregates):
        if agg.kind in ("count", "sum", "avg"):
            count = F.coalesce(F.col(f"o._a{j}_n"), F.lit(0)) + F.col(f"d._a{j}_n")
            columns.append(count.alias(f"_a{j}_n"))
        if agg.kind in ("sum", "avg"):
            total = F.coalesce(F.col(f"o._a{j}_s"), F.lit(0)) + F.coalesce(F.col(f"d._a{j}_s"), F.lit(0))
            # none left: no sum (a float's sum would otherwise keep its rounding residue for the next value)
            columns.append(F.when(count > 0, total.cast(state.schema[f"_a{j}_s"].dataType)).alias(f"_a{j}_s"))
        if agg.kind in ("min", "max"):
            old, added, taken = F.col(f"o._a{j}_v"), F.col(f"d._a{j}_add"), F.col(f"d._a{j}_taken")
            beyond = (taken > old) if agg.kind == "min" else (taken < old)
            replaces = (added <= old) if agg.kind == "min" else (added >= old)
            kept = F.least(old, added) if agg.kind == "min" else F.greatest(old, added)
            # the extreme stays when no value at or past it was taken; a taken extreme gives way to an added value past it
            value = F.when(taken.isNull() | beyond, kept).when(added.isNotNull() & replaces, added)
            columns.append(value.alias(f"_a{j}_v"))
            unknown.append(~F.coalesce(taken.isNull() | beyond, F.lit(False))
                           & ~F.coalesce(added.isNotNull() & replaces, F.lit(False)))
    recompute = (reduce(Column.__or__, unknown) & (rows > 0)) if unknown else F.lit(False)
    # the touched groups are few (at most the changes): on the driver, as Arrow, which the merges take without a job
    moved = joined.select(*columns, (rows <= 0).cast("int").alias(GONE), recompute.alias("_recompute"),
                          "d._changes", "d._newest").toArrow()
    lost = moved["_recompute"]
    recomputed = pc.sum(pc.cast(lost, "int64")).as_py() or 0
    figures = (moved.num_rows, pc.sum(moved["_changes"]).as_py() or 0, pc.max(moved["_newest"]).as_py())
    state_rows = moved.drop_columns(["_recompute", "_changes", "_newest"])
    if recomputed:
        spark = silver.sparkSession
        built, lost_groups = build(silver, plan), spark_frame(spark, state_rows.filter(lost).select(groups))
        again = built.join(lost_groups, same_keys(groups, built, lost_groups), "left_semi")
        again_rows = again.withColumn(GONE, F.lit(0)).select(*state_rows.schema.names).toArrow()
        state_rows = pa.concat_tables([state_rows.filter(pc.invert(lost)), again_rows.cast(state_rows.schema)])
    return Moved(state=state_rows, changes=figures[1], groups=figures[0], recomputed=recomputed,
                 newest_change_ms=figures[2])


def model_rows(state: DataFrame, plan: IncrementalPlan, schema: T.StructType, silver: DataFrame) -> DataFrame:
    """The model's rows from the state, typed as the model's SQL over `silver` types them (`schema`); `GONE` kept
    when present."""
    arguments = _projected(silver.withColumn(SIGN, F.lit(1)), plan).schema  # Spark's analysis: no job
    with_averages = state
    for j, agg in enumerate(plan.aggregates):
        if agg.kind == "avg":
            with_averages = with_averages.withColumn(f"_a{j}_avg", _average(j, arguments[f"_x{j}"].dataType))
    outputs = [F.expr(sql).cast(schema[name].dataType).alias(name) for name, sql in plan.outputs]
    return with_averages.select(*outputs, *([GONE] if GONE in state.columns else []))


def _average(j: int, argument: T.DataType) -> Column:
    """AVG as Spark's Average computes it from its sum and count: a decimal's sum divided by the count as
    DECIMAL(20, 0), in the result type DECIMAL(p + 4, s + 4) of the argument's DECIMAL(p, s); any other sum is a
    double, divided by the count."""
    total, count = F.col(f"_a{j}_s"), F.col(f"_a{j}_n")
    if isinstance(argument, T.DecimalType):
        typed = T.DecimalType(min(argument.precision + 4, 38), min(argument.scale + 4, 38))
        return F.when(count > 0, (total / count.cast(T.DecimalType(20, 0))).cast(typed))
    return F.when(count > 0, total.cast("double") / count.cast("double"))


def _projected(rows: DataFrame, plan: IncrementalPlan) -> DataFrame:
    """Each row the model's WHERE keeps as its groups' values (`_g<i>`), its aggregates' arguments (`_x<j>`) and sign."""
    kept = rows.where(plan.where) if plan.where else rows
    newest = F.when(F.col(SIGN) > 0, F.col("_source_ts_ms")) if "_source_ts_ms" in rows.columns else F.lit(None)
    return kept.select(*[F.expr(g).alias(name) for name, g in zip(group_columns(len(plan.groups)), plan.groups, strict=True)],
                       *[F.expr(a.argument).alias(f"_x{j}") for j, a in enumerate(plan.aggregates) if a.argument],
                       SIGN, newest.cast("long").alias("_newest"))


def _netted(projected: DataFrame, plan: IncrementalPlan) -> DataFrame:
    """The changes of several commits, each MIN and MAX argument's value netted within its group (`_n<j>`: how many
    rows of that value the commits added, less those they took away). A value one commit added and a later one took
    away (an update moving a row out of its group, then a delete) is neither added nor taken: counted as added it
    stayed the group's extreme, though no row of the group holds it."""
    netted = projected
    for j, agg in enumerate(plan.aggregates):
        if agg.kind in ("min", "max"):
            value = Window.partitionBy(*group_columns(len(plan.groups)), f"_x{j}")
            netted = netted.withColumn(f"_n{j}", F.sum(SIGN).over(value))
    return netted


def _aggregated(projected: DataFrame, plan: IncrementalPlan) -> DataFrame:
    """Per group, the signed sums of the projected rows: what they add to (or take from) each state column; MIN and
    MAX as the extreme added (`_a<j>_add`) and taken (`_a<j>_taken`), of the values whose count grew or fell when the
    rows are changes (`_netted`)."""
    sign = F.col(SIGN)
    columns = [F.sum(sign).alias("_rows"), F.count(F.lit(1)).alias("_changes"), F.max("_newest").alias("_newest")]
    for j, agg in enumerate(plan.aggregates):
        x = F.col(f"_x{j}")
        if agg.kind in ("count", "sum", "avg"):
            columns.append(F.sum(F.when(x.isNull(), 0).otherwise(sign)).cast("long").alias(f"_a{j}_n"))
        if agg.kind in ("sum", "avg"):
            kind = _sum_type(projected.schema[f"_x{j}"].dataType, agg.kind)
            typed = x.cast(kind)
            columns.append(F.sum(F.when(sign > 0, typed).otherwise(-typed)).cast(kind).alias(f"_a{j}_s"))
        if agg.kind in ("min", "max"):
            extreme = F.min if agg.kind == "min" else F.max
            net = F.col(f"_n{j}") if f"_n{j}" in projected.columns else sign
            columns += [extreme(F.when((sign > 0) & (net > 0), x)).alias(f"_a{j}_add"),
                        extreme(F.when((sign < 0) & (net < 0), x)).alias(f"_a{j}_taken")]
    return projected.groupBy(*group_columns(len(plan.groups))).agg(*columns)


def _finished(aggregated: DataFrame, plan: IncrementalPlan) -> DataFrame:
    """Built state: the sums in their types (a decimal's SUM widens by 10 digits, as Spark's own SUM does once), the
    added extreme the extreme."""
    columns = [F.col(g) for g in group_columns(len(plan.groups))] + [F.col("_rows")]
    for j, agg in enumerate(plan.aggregates):
        if agg.kind in ("count", "sum", "avg"):
            columns.append(F.col(f"_a{j}_n"))
        if agg.kind in ("sum", "avg"):
            columns.append(F.when(F.col(f"_a{j}_n") > 0, F.col(f"_a{j}_s")).alias(f"_a{j}_s"))
        if agg.kind in ("min", "max"):
            columns.append(F.col(f"_a{j}_add").alias(f"_a{j}_v"))
    return aggregated.select(*columns)


def _sum_type(argument: T.DataType, kind: str) -> T.DataType:
    """The type Spark sums an argument in: a decimal's sum has 10 more digits (at most 38); SUM of an integer is a
    bigint; anything else (AVG of an integer too) a double."""
    if isinstance(argument, T.DecimalType):
        return T.DecimalType(min(argument.precision + 10, 38), argument.scale)
    if kind == "sum" and isinstance(argument, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return T.LongType()
    return T.DoubleType()


def same_keys(keys: list[str] | tuple[str, ...], left: DataFrame, right: DataFrame) -> Column:
    """Rows of two frames with equal keys, NULL equal to NULL (a group's value may be NULL)."""
    return reduce(Column.__and__, [left[k].eqNullSafe(right[k]) for k in keys])
