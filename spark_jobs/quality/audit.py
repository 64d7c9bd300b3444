"""A batch's audit: how many rows each check on rows applies to and fails, counted from the flags its record
declares (quality/expectations.py) in one Spark aggregation over the layer's audited rows (or, for rows already on
the driver, over their Arrow: `tally_tables`), and the batch's figures. The gate validates this one row
(quality/gates.py): no audited row leaves the executors for it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame

from spark_jobs.delta import all_nullable
from spark_jobs.quality.expectations import Expectation
from spark_jobs.sql_text import ident, literal, sql


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
    present = " AND ".join(f"{ident(k)} IS NOT NULL" for k in keys)
    df = df.withColumn("_key", sql(f"CASE WHEN {present} THEN struct({', '.join(ident(k) for k in keys)}) END"))
    if reads_key_rows:
        df = df.withColumn("_key_rows", sql("CASE WHEN _key IS NOT NULL THEN count(1) OVER (PARTITION BY _key) END"))
    return df


def tally(frames: dict[str, DataFrame], checks: list[Expectation], keys: tuple[str, ...] = ()) -> dict[str, Tally]:
    """Each check's tally over its rows (`frames` by the name the records give them), in one Spark action: each
    frame's flags are evaluated in place, the frames' flag columns stacked and counted in one aggregate (one Spark
    job when the frames are one partition each; a shuffle the frames' own plans need adds its stage)."""
    grouped = _aggregate(frames, keys, checks, None, {})
    found = {} if grouped is None else grouped.read(grouped.frame.collect())
    if _BATCH_ROWS in found:
        return found[_BATCH_ROWS].tallies
    return {e.name: Tally(0, 0) for e in checks if e.rows in frames}  # no rows: every tally zero


def _flag(check: Expectation) -> str:
    """The check's flag as the boolean its tally counts (null: the check does not apply to the row)."""
    return f"CAST(({check.flag}) AS BOOLEAN)"


def _reads_key_rows(checks: list[Expectation]) -> bool:
    return any("_key_rows" in (e.flag or "") for e in checks)


def tally_tables(tables: dict[str, tuple[dict[str, pa.Table], tuple[str, ...]]],
                 checks: list[Expectation]) -> dict[str, dict[str, Tally]]:
    """`tally` of many small batches whose frames are already on the driver (Arrow; by name: each its frames and its
    key columns), counted there: each check's flag, its record's one SQL text, read over the rows by
    sql_text.evaluated, beside the `_key` and `_key_rows` columns `_keyed` gives a frame in Spark. Sending them back to
    Spark for the count was a Spark job per pass (about 0.2 s of a warm 1k batch, tests/benchmarks/RESULTS.md W2)."""
    tallied: dict[str, dict[str, Tally]] = {}
    for name, (frames, keys) in tables.items():
        tallied[name] = {}
        for frame, rows in frames.items():
            own = [e for e in checks if e.rows == frame]
            tallied[name] |= dict(zip((e.name for e in own), _driver_tallies(rows, keys, own), strict=True))
    return tallied


def _driver_tallies(rows: pa.Table, keys: tuple[str, ...], checks: list[Expectation]) -> list[Tally]:
    import pyarrow.compute as pc

    from spark_jobs.sql_text import evaluated

    if not checks:
        return []
    rows = _driver_keyed(rows, keys, _reads_key_rows(checks))
    flags = evaluated(rows, {f"_c{n}": _flag(e) for n, e in enumerate(checks)})
    tallies = []
    for flag in flags.columns:
        applies = len(flag) - flag.null_count
        tallies.append(Tally(applies, applies - int(pc.sum(pc.cast(flag, pa.int64())).as_py() or 0)))
    return tallies


def _driver_keyed(rows: pa.Table, keys: tuple[str, ...], counts: bool) -> pa.Table:
    """`_keyed` of rows on the driver: `_key`, null when a key column is, and `_key_rows` when `counts`: the rows with
    that key, a float key's NaNs one value and its zeros one (Spark normalises them in a window's partition)."""
    import pyarrow.compute as pc

    if not keys or not set(keys) <= set(rows.column_names):
        return rows
    present = reduce(pc.and_, [pc.is_valid(rows.column(k)) for k in keys])
    missing = pc.invert(present).combine_chunks()
    rows = rows.append_column("_key", pa.StructArray.from_arrays(
        [rows.column(k).combine_chunks() for k in keys], names=list(keys), mask=missing))
    if not counts:
        return rows
    grouping = pa.table({f"_k{n}": _normalised(rows.column(k)) for n, k in enumerate(keys)})
    names = grouping.column_names
    counted = grouping.group_by(names).aggregate([([], "count_all")])
    joined = grouping.append_column("_at", pa.array(range(rows.num_rows), pa.int64())).join(
        counted, names, join_type="left outer").sort_by("_at")
    return rows.append_column("_key_rows", pc.if_else(present, joined.column("count_all"), pa.scalar(None, pa.int64())))


def _normalised(column: pa.ChunkedArray) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    if not pa.types.is_floating(column.type):
        return column
    return pc.if_else(pc.is_nan(column), pa.scalar("NaN"), pc.cast(pc.add(column, 0.0), pa.string()))


def tally_by(frames: dict[str, DataFrame], checks: list[Expectation], by: str,
             measures: dict[str, Column] | None = None) -> dict[str, Tallied]:
    """`tally` of each value of the column `by` (every frame has it), in the same one aggregate: many tables'
    batches audited at once. `measures`: counts the caller takes from the same aggregate (aggregate columns over
    the frames' own columns), so that they cost no Spark job of their own. A value with no rows is absent (its
    tallies are all zero)."""
    grouped = grouped_tally(frames, checks, by, measures)
    return {} if grouped is None else grouped.read(grouped.frame.collect())


def grouped_tally(frames: dict[str, DataFrame], checks: list[Expectation], by: str,
                  measures: dict[str, Column] | None = None) -> GroupedTally | None:
    """`tally_by`'s aggregate, not collected: for a caller that collects it in the job that collects its rows (a
    union, as observe's metrics cannot be grouped by table). None: nothing to count."""
    return _aggregate(frames, (), checks, by, measures or {})


@dataclass(frozen=True)
class Tallied:
    """One group's tallies, and the measures counted with them."""

    tallies: dict[str, Tally]
    measures: dict[str, int]


@dataclass(frozen=True)
class GroupedTally:
    """A grouped tally's aggregate (`frame`: a row per group, its column `group` first, then `a<n>` and `f<n>` for
    each of `checks`, `m_<name>` for each measure) and how its collected rows read."""

    frame: DataFrame
    group: str
    checks: list[Expectation]
    measures: tuple[str, ...]

    def read(self, rows: Iterable[Any]) -> dict[str, Tallied]:  # Spark's rows, or dicts of their columns
        return {row[self.group]: Tallied({e.name: Tally(row[f"a{n}"], row[f"f{n}"]) for n, e in enumerate(self.checks)},
                                         {name: int(row[f"m_{name}"] or 0) for name in self.measures})
                for row in rows}


def collect_with(parts: dict[str, DataFrame], grouped: GroupedTally | None
                 ) -> tuple[dict[str, pa.Table], dict[str, Tallied]]:
    """Each of `parts` as Arrow (its own columns), and `grouped`'s tallies, in one Spark job: a union whose rows say
    their part (`_cdc_part`), split on the driver. A tally of its own was a Spark job more a batch; observe's metrics
    cannot be grouped by table."""
    import pyarrow.compute as pc

    tagged = [df.select(sql(f"{literal(name)} AS _cdc_part"), "*") for name, df in parts.items()]
    if grouped is not None:
        tagged.append(grouped.frame.select(sql(f"{literal(_COUNTS)} AS _cdc_part"), "*"))
    both = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged).toArrow()
    both = both.cast(all_nullable(both.schema))

    def part(name: str, columns: list[str]) -> pa.Table:
        return both.filter(pc.equal(both.column("_cdc_part"), name)).select(columns)

    found = {name: part(name, df.columns) for name, df in parts.items()}
    return found, {} if grouped is None else grouped.read(part(_COUNTS, grouped.frame.columns).to_pylist())


_COUNTS = "_cdc_counts"  # collect_with's part of the tally's rows


_BATCH, _BATCH_ROWS = "_cdc_batch", "rows"  # the one group of an ungrouped tally: its column and value


def _aggregate(frames: dict[str, DataFrame], keys: tuple[str, ...], checks: list[Expectation], by: str | None,
               measures: dict[str, Column]) -> GroupedTally | None:
    """Grouped by `by` (a column of the frames) when given, else all in one group."""
    counted = [e for e in checks if e.rows in frames]
    if not counted and not measures:
        return None
    group = by or _BATCH
    parts = []
    for name, df in frames.items():
        own = [(n, e) for n, e in enumerate(counted) if e.rows == name]
        if own or measures:
            df = _keyed(df, keys, _reads_key_rows([e for _, e in own]))
            kept = [sql(ident(c)) for c in df.columns if c != by] if measures else []
            parts.append(df.select(sql(ident(by)) if by else sql(f"{literal(_BATCH_ROWS)} AS {_BATCH}"), *kept,
                                   *[sql(f"{_flag(e)} AS _c{n}") for n, e in own]))
    stacked = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    frame = stacked.groupBy(group).agg(*[sql(text) for n in range(len(counted)) for text in (
        f"count(_c{n}) AS a{n}", f"count(CASE WHEN NOT _c{n} THEN 1 END) AS f{n}")],
        *[m.alias(f"m_{name}") for name, m in measures.items()])
    return GroupedTally(frame, group, counted, tuple(measures))
