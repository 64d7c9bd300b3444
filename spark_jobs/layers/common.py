"""What every layer step shares: the quarantine table, the gate call, the batch's figures."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from functools import reduce
from typing import Any, TypeVar

from pyspark.sql import Column, DataFrame, Observation, Row
from pyspark.sql import functions as F

from spark_jobs.delta import DeltaEngine, MergeSpec, driver_rows
from spark_jobs.errors import GateFailed
from spark_jobs.lake import Lake
from spark_jobs.landing import LandingFile
from spark_jobs.layers.summary import Counts, LayerSummary
from spark_jobs.logs import logger
from spark_jobs.quality.audit import Audit
from spark_jobs.quality.findings import GateResult
from spark_jobs.quality.gates import Check, run_gate
from spark_jobs.sql_text import literal

log = logger(__name__)

QUARANTINE_MERGE = MergeSpec(keys=("layer", "_source_file", "_line"), insert_when="true")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# what a step quarantines, as rows: their columns, and as DDL
_QUARANTINED_TYPES = {"_source_file": "STRING", "_line": "BIGINT", "_raw": "STRING", "reason": "STRING"}
QUARANTINED_COLUMNS = tuple(_QUARANTINED_TYPES)
QUARANTINED = ", ".join(f"{name} {kind}" for name, kind in _QUARANTINED_TYPES.items())
QUARANTINE_SCHEMA = f"{QUARANTINED}, layer STRING, _batch_id STRING, _ingested_at TIMESTAMP"


def whole_file_rows(files: dict[LandingFile, str]) -> list[tuple[str, int, str, str]]:
    """The quarantine rows of landing files quarantined whole (unreadable, or set aside unread): line 0, no raw text."""
    return [(f.path, 0, "", reason) for f, reason in files.items()]


def write_quarantine(engine: DeltaEngine, lake: Lake, table: str, rows: DataFrame | list[tuple[str, int, str, str]],
                     layer: str, batch_id: str, counts: Counts | None = None, small: bool = False) -> Counts:
    """Quarantine rows keep the raw record and a reason; keyed by (layer, file, line) so a re-run adds
    nothing twice. Returns the counts by reason (`counts`, when the caller has them already). `small`: the rows
    are a small batch's (DeltaEngine). `rows` made on the driver are (_source_file, _line, _raw, reason)."""
    if isinstance(rows, list):
        counts = counts if counts is not None else dict(Counter(row[3] for row in rows))
        if rows:
            at = now()
            engine.merge(driver_rows([(*row, layer, batch_id, at) for row in rows], QUARANTINE_SCHEMA),
                         lake.quarantine(table), QUARANTINE_MERGE, small=True)
        return counts
    counts = reasons(rows) if counts is None else counts
    if counts:
        rows = rows.select(
            *QUARANTINED_COLUMNS, F.lit(layer).alias("layer"),
            F.lit(batch_id).alias("_batch_id"), F.lit(now()).cast("timestamp").alias("_ingested_at"))
        engine.merge(rows, lake.quarantine(table), QUARANTINE_MERGE, small=small)
    return counts


# Batches up to this size are planned in one partition (checkpoint): bronze rows into silver, landing bytes into
# bronze (a gzip file's lines taking about ten times its size)
ONE_TASK_ROWS = 10_000
ONE_TASK_BYTES = 8 << 20
# A silver pass (layers/silver_pass.py) plans its tables' new rows in one partition, and their newest rows on the
# driver, up to these. Up to twice one task's bounds a pass of one measured no slower than the table's own plan over
# its partitions, and costs a fifth of its Spark jobs: 10,500 events into 100,000 rows 4.7 s (8 jobs) against 6.4 s
# (46), 21,000 events 7.9 s against 7.5 s; at 42,000 events the pass's one core lost, 11.5 s against 9.9 s
PASS_ROWS = 2 * ONE_TASK_ROWS
PASS_BYTES = 2 * ONE_TASK_BYTES


def landing_bytes(files: Iterable[LandingFile]) -> int:
    """About how many bytes of lines the landing files hold."""
    return sum(f.size * (10 if f.path.endswith(".gz") else 1) for f in files)


def small_landing(files: Iterable[LandingFile]) -> bool:
    """Do the landing files hold at most ONE_TASK_BYTES of lines (a small bronze batch, planned in one partition)?"""
    return landing_bytes(files) <= ONE_TASK_BYTES


T = TypeVar("T")
R = TypeVar("R")


def in_passes(items: Iterable[T], fits: Callable[[list[T]], bool]) -> list[list[T]]:
    """`items` in order, in passes as large as `fits` allows (an item that fits with no other is a pass alone)."""
    passes: list[list[T]] = []
    for item in items:
        if passes and fits([*passes[-1], item]):
            passes[-1].append(item)
        else:
            passes.append([item])
    return passes


def read_shared(layer: str, alone: str, passes: Iterable[list[T]], read: Callable[[list[T]], dict[str, R]],
                done: Callable[[list[T], dict[str, R]], str]) -> dict[str, R]:
    """Each pass read together (`read`; a single table is a pass of one: the pass costs fewer Spark jobs than a table's
    own step), the results by table, each pass's line saying what it `done`. A pass that fails is reported and leaves
    its tables to their own steps (which then do as `alone` says)."""
    reads: dict[str, R] = {}
    for together in (p for p in passes if p):
        started = time.monotonic()
        try:
            got = read(together)
        except Exception as exc:  # not swallowed: each table's own step runs next, and fails on its own if it must
            log.warning(f"{layer}: a shared pass over {len(together)} tables failed, each {alone}: "
                        f"{type(exc).__name__}: {next((line for line in str(exc).splitlines() if line.strip()), '')}")
            continue
        reads |= got
        log.info(f"{layer}: {done(together, got)} in one pass in {time.monotonic() - started:.3f} s")
    return reads


def checkpoint(df: DataFrame, together: bool) -> DataFrame:
    """`df` materialised; with `together` (a small batch) in one partition, which the planner then knows: every
    later aggregate, window and join over it runs in place, where Spark would otherwise shuffle first, and under
    adaptive execution each shuffle is a Spark job of its own. For a small batch those jobs cost more than a
    second core gains. Marked on the checkpoint, not before it: adaptive execution plans an aggregate, window or
    join as a whole, and the checkpoint of such a plan does not know its partitions."""
    if not together:
        return df.localCheckpoint()
    # lazily: the plan is cut here all the same, and the rows are made (and kept) by the first Spark job that reads
    # them, in its own stage, not by a job of their own. (A plan with an exchange would still run its shuffle now:
    # a small batch's plans have none.) That first reader reads every row (an aggregate, a collect, a count): a
    # `limit` first would leave the rest to be made later, from inputs that may be gone (a pass's staged files)
    return df.localCheckpoint(eager=False).coalesce(1)


def observed_checkpoint(df: DataFrame, *measures: Column) -> tuple[DataFrame, dict[str, Any]]:
    """`df` materialised, and `measures` (named aggregates over its rows) taken by the same Spark job as observed
    metrics, where an aggregate after it would run its own (two, with an exchange, under adaptive execution). Eager
    only: a lazy checkpoint's reader reports zero for what the plan under it observed (measured)."""
    observed = Observation(f"measures-{uuid.uuid4().hex}")  # one per materialisation: tables run in threads at once
    materialised = df.observe(observed, *measures).localCheckpoint()
    return materialised, observed.get


def counted_checkpoint(df: DataFrame) -> tuple[DataFrame, int]:
    """`df` materialised, and how many rows it holds (`observed_checkpoint`)."""
    materialised, measured = observed_checkpoint(df, F.count(F.lit(1)).alias("rows"))
    return materialised, int(measured["rows"])


def join_side(df: DataFrame, together: bool) -> DataFrame:
    """The side of a join from a small batch's one-partition frames (`together`): broadcast, one Spark job, where
    Spark would shuffle both sides to its shuffle partitions first, a job each. Otherwise as Spark chooses."""
    return F.broadcast(df) if together else df


def one_row(df: DataFrame) -> Row:
    """The single row of a global aggregate (which always has exactly one)."""
    row = df.first()
    assert row is not None
    return row


def single_rows(*aggregates: DataFrame) -> list[Row]:
    """The single rows of global aggregates (each has exactly one), in one Spark job: each as a struct of its own in
    their union, collected together, where a `one_row` each was a Spark job each (and its shared inputs' lazy
    checkpoints made again in each)."""
    tagged = [df.select(F.struct(*df.columns).alias(f"_cdc_row{n}")) for n, df in enumerate(aggregates)]
    rows = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged).collect()
    assert len(rows) == len(aggregates)
    return [next(row[f"_cdc_row{n}"] for row in rows if row[f"_cdc_row{n}"] is not None) for n in range(len(aggregates))]


def lookup(values: dict[str, str] | dict[str, int], key: str) -> Column:
    """`values[key]` (`key`: SQL text) as a literal map: no join, no Spark job (a few hundred entries). Written as
    SQL text, one py4j round trip whatever its size; not kept (sql_text.sql): its entries are one batch's."""
    entries = ", ".join(f"{literal(k)}, {literal(v) if isinstance(v, str) else f'{int(v)}L'}" for k, v in values.items())
    return F.expr(f"map({entries})[{key}]")


def reasons(rows: DataFrame) -> Counts:
    """Quarantine counts by reason, with the variable tail (column names, op values) kept."""
    return {r["reason"]: r["n"] for r in _by_reason(rows).collect()}


def reason_counts(rows: DataFrame) -> DataFrame:
    """`reasons` as a one-row aggregate (`reasons`: a map of reason to rows), for a caller that collects it with its
    other aggregates (single_rows)."""
    return _by_reason(rows).agg(F.map_from_entries(F.collect_list(F.struct("reason", "n"))).alias("reasons"))


def _by_reason(rows: DataFrame) -> DataFrame:
    return rows.groupBy("reason").agg(F.count(F.lit(1)).alias("n"))


def lag_seconds(max_ts_ms: Any) -> float | None:
    """Seconds between the newest source change (ts_ms) and now."""
    return None if max_ts_ms is None else round(now().timestamp() - max_ts_ms / 1000, 3)


def share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


# (audit, frames of a user's expectations, table, layer, checks, lake, summary) -> result; raises GateFailed on failure
Gate = Callable[[Audit, dict[str, DataFrame], str, str, list[Check], Lake, LayerSummary], Any]


def gate(audit: Audit, frames: dict[str, DataFrame], name: str, layer: str, checks: list[Check], lake: Lake,
         summary: LayerSummary, actions: tuple[str, ...] = ()) -> GateResult:
    """Run a gate over the batch's audit (and the frames a user's expectations read); the summary records the
    findings (and, when the gate fails, goes with the exception so the failed run's report still has it)."""
    return settle(run_gate(audit, frames, name, layer, checks, lake, run_name=summary.batch_id, raise_on_failure=False,
                           actions=actions), summary)


def settle(result: GateResult, summary: LayerSummary) -> GateResult:
    """A gate's verdict recorded in the summary, which goes with the GateFailed raised when it failed."""
    summary.record_gate(result)
    if not result.success:
        raise GateFailed(result, summary)
    return result
