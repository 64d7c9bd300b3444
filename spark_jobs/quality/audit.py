"""A batch's audit: how many rows each check on rows applies to and fails, counted from the flags its record
declares (quality/expectations.py) in one Spark aggregation over the layer's audited rows, and the batch's
figures. The gate validates this one row (quality/gates.py): no audited row leaves the executors."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.quality.expectations import Expectation


@dataclass(frozen=True)
class Tally:
    """A check over rows: the rows it applies to (its flag is not null) and those failing it."""

    applies: int
    failed: int


@dataclass
class Figures:
    """The batch's figures the checks on figures read (quality/expectations.py, `figure`); None: not measured."""

    quarantined: int = 0
    quarantined_share: float = 0.0
    deletes_received: int | None = None
    deletes_unaccounted: int | None = None  # received - (removed + absent + stale + superseded + before a truncate)
    rows: int | None = None
    lag_s: float | None = None


@dataclass
class Audit:
    """What a gate validates: the checks' tallies by name, and the figures."""

    figures: Figures
    tallies: dict[str, Tally] = field(default_factory=dict)

    def with_tallies(self, tallies: dict[str, Tally]) -> Audit:
        return Audit(self.figures, {**self.tallies, **tallies})


def _keyed(df: DataFrame, keys: tuple[str, ...], reads_key_rows: bool) -> DataFrame:
    """`_key` (null when a key column is) and, when read, `_key_rows`, on a frame that has the key columns."""
    if not keys or not set(keys) <= set(df.columns):
        return df
    present = reduce(lambda a, b: a & b, [F.col(k).isNotNull() for k in keys])
    df = df.withColumn("_key", F.when(present, F.struct(*keys)))
    if reads_key_rows:
        df = df.withColumn("_key_rows", F.when(F.col("_key").isNotNull(), F.count(F.lit(1)).over(Window.partitionBy("_key"))))
    return df


def tally(frames: dict[str, DataFrame], checks: list[Expectation], keys: tuple[str, ...] = ()) -> dict[str, Tally]:
    """Each check's tally over its rows (`frames` by the name the records give them), in one Spark action: each
    frame's flags are evaluated in place, the frames' flag columns stacked and counted in one aggregate (one Spark
    job when the frames are one partition each; a shuffle the frames' own plans need adds its stage)."""
    found = _tallies(frames, checks, keys, None, {})
    return found[""].tallies if "" in found else {e.name: Tally(0, 0) for e in checks if e.rows in frames}


def tally_by(frames: dict[str, DataFrame], checks: list[Expectation], by: str,
             measures: dict[str, Column] | None = None) -> dict[str, Tallied]:
    """`tally` of each value of the column `by` (every frame has it), in the same one aggregate: many tables'
    batches audited at once. `measures`: counts the caller takes from the same aggregate (aggregate columns over
    the frames' own columns), so that they cost no Spark job of their own. A value with no rows is absent (its
    tallies are all zero)."""
    return _tallies(frames, checks, (), by, measures or {})


@dataclass(frozen=True)
class Tallied:
    """One group's tallies, and the measures counted with them."""

    tallies: dict[str, Tally]
    measures: dict[str, int]


def _tallies(frames: dict[str, DataFrame], checks: list[Expectation], keys: tuple[str, ...],
             by: str | None, measures: dict[str, Column]) -> dict[str, Tallied]:
    counted = [e for e in checks if e.rows in frames]
    if not counted and not measures:
        return {}
    group = [by] if by else []
    parts = []
    for name, df in frames.items():
        own = [(n, e) for n, e in enumerate(counted) if e.rows == name]
        if own or measures:
            df = _keyed(df, keys, any("_key_rows" in (e.flag or "") for _, e in own))
            kept = [c for c in df.columns if c not in group] if measures else []
            parts.append(df.select(*group, *kept, *[F.expr(e.flag or "").cast("boolean").alias(f"_c{n}") for n, e in own]))
    stacked = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    rows = stacked.groupBy(*group).agg(*[agg for n in range(len(counted)) for agg in (
        F.count(f"_c{n}").alias(f"a{n}"), F.count(F.when(~F.col(f"_c{n}"), 1)).alias(f"f{n}"))],
        *[m.alias(f"m_{name}") for name, m in measures.items()]).collect()
    return {(row[by] if by else ""): Tallied({e.name: Tally(row[f"a{n}"], row[f"f{n}"]) for n, e in enumerate(counted)},
                                             {name: int(row[f"m_{name}"] or 0) for name in measures})
            for row in rows}
