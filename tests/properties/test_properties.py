"""Property: whatever order, duplication or batching the change files arrive in, silver and its history
equal what a small reference model gets by applying the source's log in order.

Source histories: a snapshot sharing one LSN, inserts, updates, deletes (with and without a Kafka
tombstone line), re-inserts, primary-key changes, streaming events at the snapshot's LSN, ts_ms ties,
and (second test) truncates. A nullable integer column `n` is null in every event before a drawn point of the
log and an integer or null after it: its first batches may all be null, and silver must still type it as an integer
(bigint) and keep each value. They are cut into sink files, the files shuffled, some re-delivered under
new offsets, and spread over several runs. Each run goes through the bronze transforms and silver's
apply step with the history table on. Every batch must also pass the silver gate's checks: deletes
received = removed + absent + stale + superseded + before a truncate, no deleted key live, keys unique.
They are evaluated here directly; Great Expectations' own run of them (tests/quality/test_quality.py) would
add minutes.

Every apply rule but truncate works per key, so independent histories on disjoint keys cannot affect
each other in one table: the first test runs a bundle of HISTORIES_PER_EXAMPLE histories per example
(each tenant's keys are its own) and checks each against its own model, which keeps Spark's fixed cost
per run from dominating. Truncate empties the whole table, so the second test runs one history per table.

Profiles: `ci` (default: 6 bundles = 240 histories, and 10 truncate histories) and `long` (10,000
histories and 300 truncate histories):
    HYPOTHESIS_PROFILE=long pytest tests/properties/test_properties.py   # about 1.5 hours on 2 cores
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from spark_jobs.debezium import envelope
from spark_jobs.delta.delta_rs import DeltaRsEngine
from spark_jobs.lake import Lake
from spark_jobs.layers import silver_plan
from spark_jobs.layers.silver import apply_changes
from spark_jobs.registry import TableConfig

HISTORIES_PER_EXAMPLE = 40  # more makes Hypothesis overrun its buffer and draw shorter histories
PROFILES = {"ci": (6, 10), "long": (250, 300)}  # (bundles, truncate histories)
BUNDLES, TRUNCATE_HISTORIES = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
          "derandomize": False}

TABLE = TableConfig(name="items", topic="src.public.items", keys=("tenant", "id"), history=True)
KEYS = st.integers(1, 6)
VALUES = st.text(alphabet="abcxyz", min_size=1, max_size=3)
SNAPSHOT_LSN = 5_000


@dataclass
class Event:
    tenant: int
    op: str
    key: int | None
    value: str | None
    lsn: int
    snapshot: bool
    clock: int
    tombstone: bool = False
    number: int | None = None  # the nullable integer column `n`

    @property
    def image(self) -> tuple[str | None, int | None]:
        """The row's (v, n) as the model keeps it: none for a delete."""
        return (None, None) if self.op == "d" else (self.value, self.number)

    @property
    def position(self) -> tuple[int, int]:
        """(lsn, 0 for snapshot events, 1 for streaming ones): the order the model applies."""
        return self.lsn, 0 if self.snapshot else 1

    def line(self) -> str:
        before = {"tenant": self.tenant, "id": self.key, "v": None, "n": None} if self.op == "d" else None
        after = {"tenant": self.tenant, "id": self.key, "v": self.value, "n": self.number} if self.op in "cur" else None
        source = {"connector": "postgresql", "lsn": self.lsn, "snapshot": "true" if self.snapshot else "false",
                  "ts_ms": self.clock, "txId": self.lsn // 10}
        return json.dumps({"before": before, "after": after, "source": source, "op": self.op, "ts_ms": self.clock})


@st.composite
def histories(draw, tenant: int, truncates: bool):
    """One source table's change log (for one tenant's keys) in commit order."""
    live: set[int] = set()
    log: list[Event] = []
    clock = draw(st.integers(0, 3))

    def emit(op, key=None, lsn=SNAPSHOT_LSN, snapshot=False, tombstone=False):
        nonlocal clock
        clock += draw(st.integers(0, 1))  # ts_ms ties on purpose: the order must not come from it
        value = draw(VALUES) if op in "cur" else None
        log.append(Event(tenant, op, key, value, lsn, snapshot, clock, tombstone))

    for key in sorted(draw(st.sets(KEYS, max_size=4))):
        live.add(key)
        emit("r", key, snapshot=True)
    # streaming may start at the snapshot's own LSN: snapshot events still come first
    lsn = SNAPSHOT_LSN if draw(st.booleans()) else SNAPSHOT_LSN + 1
    kinds = ["upsert", "upsert", "upsert", "delete", "delete", "rekey"] + (["truncate"] if truncates else [])
    for step in draw(st.lists(st.sampled_from(kinds), min_size=2, max_size=14)):
        if step == "upsert":
            key = draw(KEYS)
            emit("u" if key in live else "c", key, lsn)
            live.add(key)
        elif step == "delete" and live:
            key = draw(st.sampled_from(sorted(live)))
            live.discard(key)
            emit("d", key, lsn, tombstone=draw(st.booleans()))
        elif step == "rekey" and live and len(live) < 6:
            old = draw(st.sampled_from(sorted(live)))
            new = draw(st.sampled_from([k for k in range(1, 7) if k not in live]))
            live.discard(old)
            live.add(new)
            emit("d", old, lsn, tombstone=True)
            lsn += 1
            emit("c", new, lsn)
        elif step == "truncate":
            live.clear()
            emit("t", lsn=lsn)
        lsn += draw(st.integers(1, 3))
    return log


def reference(log: list[Event]) -> tuple[dict, list]:
    """The model: apply the log in order. Silver = the live rows; history = one row per row event, valid
    until the key's next event or (for versions) the next truncate, current when open and not a delete."""
    ordered = sorted(log, key=lambda e: e.position)  # commit order; the sort is stable for equal positions
    state: dict[tuple[int, int], tuple[str | None, int | None]] = {}
    history: list[list] = []
    open_rows: dict[tuple[int, int], list] = {}
    for e in ordered:
        if e.op == "t":
            state.clear()
            for row in open_rows.values():  # closes open versions; a delete stays open for the key's next event
                if row[2] != "d" and row[4] is None:
                    row[4] = e.position
            continue
        key = (e.tenant, e.key)
        if key in open_rows and open_rows[key][4] is None:
            open_rows[key][4] = e.position
        row = [key, e.position, e.op, e.image, None]
        history.append(row)
        open_rows[key] = row
        if e.op == "d":
            state.pop(key, None)
        else:
            state[key] = e.image
    return state, sorted((*r, r[4] is None and r[2] != "d") for r in history)


def deliver(draw, log: list[Event]):
    """The log cut into sink files, some re-delivered under new offsets, shuffled into runs."""
    lines = []
    for e in log:
        lines.append(e.line())
        if e.tombstone:
            lines.append("null")
    files, offset = [], 0
    while offset < len(lines):
        size = draw(st.integers(1, 3 * max(1, len(lines) // 12)))
        files.append((offset, lines[offset:offset + size]))
        offset += size
    redelivered = [(offset + 100_000 * (i + 1), chunk) for i, (offset, chunk) in enumerate(files) if draw(st.booleans())]
    arrivals = draw(st.permutations(files + redelivered))
    runs = draw(st.sampled_from([1, 2, 3, 3, 4]))
    cut = sorted(draw(st.lists(st.integers(0, len(arrivals)), min_size=runs - 1, max_size=runs - 1)))
    bounds = [0, *cut, len(arrivals)]
    return [arrivals[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@st.composite
def bundles(draw):
    """Independent tenants' logs interleaved into one topic partition (each keeps its own order)."""
    logs = [draw(histories(tenant, truncates=False)) for tenant in range(HISTORIES_PER_EXAMPLE)]
    merged, cursors = [], [0] * len(logs)
    while any(c < len(log) for c, log in zip(cursors, logs, strict=True)):
        tenant = draw(st.sampled_from([t for t, log in enumerate(logs) if cursors[t] < len(log)]))
        merged.append(logs[tenant][cursors[tenant]])
        cursors[tenant] += 1
    numbered(draw, merged)
    return deliver(draw, merged), logs


def numbered(draw, log: list[Event]) -> None:
    """`n` for the rows of the log from a drawn point on (an integer or null each): null in every event before it."""
    start = draw(st.integers(0, len(log)))
    for e in log[start:]:
        if e.op in "cur":
            e.number = draw(st.one_of(st.none(), st.integers(-(2**40), 2**40)))


@st.composite
def truncate_histories(draw):
    log = draw(histories(0, truncates=True))
    numbered(draw, log)
    return deliver(draw, log), [log]


def bronze_batch(spark, files, run: int):
    """What bronze holds for these files: the same transforms the bronze job runs."""
    rows = [(f"topics/{TABLE.topic}/partition=0/{TABLE.topic}+0+{offset:010d}.json", i + 1, line)
            for offset, chunk in files for i, line in enumerate(chunk)]
    lines = spark.createDataFrame(rows, "_source_file STRING, _line BIGINT, _raw STRING")
    classified = envelope.classify(envelope.parse_envelope(lines), TABLE.keys)
    return classified.where("_kind = 'event'").select(
        "_source_file", "_line", "_raw", "op", "ts_ms", "source", "before", "after", "_schema",
        F.lit(f"run-{run}").alias("_batch_id"), F.lit(run).cast("long").alias("_bronze_version"),
        F.current_timestamp().alias("_ingested_at"))


def position(seq: str | None) -> tuple[int, int] | None:
    """The pipeline's `_seq` for PostgreSQL ('<lsn, padded>|<snapshot rank>') as the model's position."""
    if seq is None:
        return None
    lsn, rank = seq.split("|")
    return int(lsn), int(rank)


def silver_gate(audit, frames, table, layer, checks, lake, summary):
    """The silver gate's fail checks on every batch, without Great Expectations."""
    assert audit.figures.quarantined_share == 0 and audit.figures.deletes_unaccounted in (0, None)  # None: before
    if "key_unique" in audit.tallies:
        assert (audit.tallies["deleted_keys_not_live"].failed, audit.tallies["key_unique"].failed,
                audit.tallies["key_not_null"].failed) == (0, 0, 0)
    summary.gate = "passed"


def image(row) -> tuple[str | None, int | None]:
    """A silver or history row's (v, n): `n` is not a column before its first value."""
    return row["v"], row.asDict().get("n")


def check(spark, runs, logs, partitioned=False):
    """`partitioned`: every batch planned as a big one is (its partitions kept), not in one task."""
    with mock.patch.object(silver_plan, "ONE_TASK_ROWS", -1 if partitioned else silver_plan.ONE_TASK_ROWS):
        _check(spark, runs, logs)


def _check(spark, runs, logs):
    with tempfile.TemporaryDirectory(prefix="prop-lake-") as folder:  # hundreds of examples: each lake deleted
        _check_lake(spark, runs, logs, DeltaRsEngine(), Lake(folder))


def _check_lake(spark, runs, logs, engine, lake):
    truncated_at = None
    for run, files in enumerate(runs):
        _, truncated_at = apply_changes(spark, engine, TABLE, lake, bronze_batch(spark, files, run), truncated_at,
                                        f"run-{run}", silver_gate)
    silver = engine.read(spark, lake.silver(TABLE.name))
    history = engine.read(spark, lake.history(TABLE.name))
    for table in (silver, history):  # `n` is an integer column once a value came, whatever came first
        assert table is None or "n" not in table.columns or table.schema["n"].dataType.simpleString() == "bigint"
    got_silver = {} if silver is None else {(r["tenant"], r["id"]): image(r) for r in silver.collect()}
    got_history = [] if history is None else sorted(
        ((r["tenant"], r["id"]), position(r["_seq"]), r["_op"], image(r), position(r["_valid_to"]), r["_is_current"])
        for r in history.collect())
    expected_silver: dict = {}
    expected_history: list = []
    for log in logs:  # each tenant against its own model
        state, versions = reference(log)
        expected_silver.update(state)
        expected_history += versions
    assert got_silver == expected_silver
    expected_history.sort()
    assert got_history == expected_history, (
        f"history: unexpected {sorted(set(got_history) - set(expected_history))}, "
        f"missing {sorted(set(expected_history) - set(got_history))}")
    if runs and silver is not None:  # the last run applied again changes nothing
        versions = (engine.version(lake.silver(TABLE.name)), engine.version(lake.history(TABLE.name)))
        stats, _ = apply_changes(spark, engine, TABLE, lake, bronze_batch(spark, runs[-1], len(runs)), truncated_at, "again",
                                 silver_gate)
        assert (stats.inserted, stats.updated, stats.deleted, stats.history_rows) == (0, 0, 0, 0)
        assert (engine.version(lake.silver(TABLE.name)), engine.version(lake.history(TABLE.name))) == versions
    spark.catalog.clearCache()


@settings(max_examples=BUNDLES, **COMMON)
@given(bundles(), st.booleans())
def test_silver_and_history_equal_the_model_for_every_tenant_whatever_the_arrival(spark, delivery, partitioned):
    runs, logs = delivery
    check(spark, runs, logs, partitioned)


@settings(max_examples=TRUNCATE_HISTORIES, **COMMON)
@given(truncate_histories(), st.booleans())
def test_truncates_empty_the_table_as_of_their_position_whatever_the_arrival(spark, delivery, partitioned):
    runs, logs = delivery
    check(spark, runs, logs, partitioned)
