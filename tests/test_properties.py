"""Property: whatever order, duplication or batching the change files arrive in, silver equals the
source table's state after applying its log in order (the reference model below).

Source histories: a snapshot sharing one LSN, inserts, updates, deletes (with and without a Kafka
tombstone line), re-inserts, primary-key changes, truncates, streaming events at the snapshot's LSN,
ts_ms ties. They are cut into sink files, the files shuffled, some re-delivered under new offsets,
and spread over several runs. Each run goes through the bronze transforms and silver's apply step
(the gates are covered elsewhere; they would only add minutes).

Profiles: `ci` (default, 25 examples) and `long` (500): HYPOTHESIS_PROFILE=long pytest tests/test_properties.py
"""

from __future__ import annotations

import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from spark_jobs import transforms
from spark_jobs.config import TableConfig
from spark_jobs.delta.delta_rs import DeltaRsEngine
from spark_jobs.jobs import apply_changes
from spark_jobs.state import Lake

settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TABLE = TableConfig(name="items", topic="src.public.items", keys=("id",))
KEYS = st.integers(1, 6)
VALUES = st.text(alphabet="abcxyz", min_size=1, max_size=3)
SNAPSHOT_LSN = 5_000


@st.composite
def histories(draw):
    """A source table's change log in commit order, and the table's final state (the reference model)."""
    state: dict[int, str] = {}
    log: list[dict] = []
    clock = draw(st.integers(0, 3))

    def emit(op, key=None, value=None, lsn=SNAPSHOT_LSN, snapshot="false", tombstone=False):
        nonlocal clock
        clock += draw(st.integers(0, 1))  # ts_ms ties on purpose: the order must not come from it
        before = {"id": key, "v": None} if op == "d" else None
        after = {"id": key, "v": value} if op in "cur" else None
        source = {"connector": "postgresql", "lsn": lsn, "snapshot": snapshot, "ts_ms": clock, "txId": lsn // 10}
        log.append({"before": before, "after": after, "source": source, "op": op, "ts_ms": clock})
        if tombstone:
            log.append(None)

    snapshot = sorted(draw(st.sets(KEYS, max_size=4)))
    for i, key in enumerate(snapshot):
        state[key] = draw(VALUES)
        emit("r", key, state[key], snapshot="last" if i == len(snapshot) - 1 else "true")
    # streaming may start at the snapshot's own LSN: snapshot events still come first
    lsn = SNAPSHOT_LSN if draw(st.booleans()) else SNAPSHOT_LSN + 1
    steps = st.sampled_from(["upsert", "upsert", "upsert", "delete", "delete", "rekey", "truncate"])
    for step in draw(st.lists(steps, min_size=2, max_size=14)):
        if step == "upsert":
            key = draw(KEYS)
            op = "u" if key in state else "c"
            state[key] = draw(VALUES)
            emit(op, key, state[key], lsn)
        elif step == "delete" and state:
            key = draw(st.sampled_from(sorted(state)))
            del state[key]
            emit("d", key, lsn=lsn, tombstone=draw(st.booleans()))
        elif step == "rekey" and state and len(state) < 6:
            old = draw(st.sampled_from(sorted(state)))
            new = draw(st.sampled_from([k for k in range(1, 7) if k not in state]))
            state[new] = state.pop(old)
            emit("d", old, lsn=lsn, tombstone=True)
            lsn += 1
            emit("c", new, state[new], lsn)
        elif step == "truncate":
            state.clear()
            emit("t", lsn=lsn)
        lsn += draw(st.integers(1, 3))
    return log, state


@st.composite
def deliveries(draw):
    """The log cut into sink files, some re-delivered under new offsets, shuffled into runs."""
    log, final = draw(histories())
    lines = ["null" if record is None else json.dumps(record) for record in log]
    files, offset = [], 0
    while offset < len(lines):
        size = draw(st.integers(1, 3))
        files.append((offset, lines[offset:offset + size]))
        offset += size
    redelivered = [(offset + 1000 * (i + 1), chunk) for i, (offset, chunk) in enumerate(files) if draw(st.booleans())]
    arrivals = draw(st.permutations(files + redelivered))
    runs = draw(st.sampled_from([1, 2, 3, 3, 4]))
    cut = sorted(draw(st.lists(st.integers(0, len(arrivals)), min_size=runs - 1, max_size=runs - 1)))
    bounds = [0, *cut, len(arrivals)]
    return [arrivals[a:b] for a, b in zip(bounds, bounds[1:], strict=False)], final


def bronze_batch(spark, files, run: int):
    """What bronze holds for these files: the same transforms the bronze job runs."""
    rows = [(f"topics/{TABLE.topic}/partition=0/{TABLE.topic}+0+{offset:010d}.json", i + 1, line)
            for offset, chunk in files for i, line in enumerate(chunk)]
    lines = spark.createDataFrame(rows, "_source_file STRING, _line BIGINT, _raw STRING")
    classified = transforms.classify(transforms.parse_envelope(lines), TABLE.keys)
    return classified.where("_kind = 'event'").select(
        "_source_file", "_line", "_raw", "op", "ts_ms", "source", "before", "after", "_schema",
        F.lit(f"run-{run}").alias("_batch_id"), F.lit(run).cast("long").alias("_bronze_version"),
        F.current_timestamp().alias("_ingested_at"))


@given(deliveries())
def test_silver_equals_the_source_state_whatever_the_arrival(spark, delivery):
    runs, final = delivery
    engine, lake = DeltaRsEngine(), Lake(tempfile.mkdtemp(prefix="prop-lake-"))
    truncated_at = None
    for run, files in enumerate(runs):
        batch = bronze_batch(spark, files, run)
        _, truncated_at = apply_changes(spark, engine, TABLE, lake, batch, truncated_at, f"run-{run}")
    silver = engine.read(spark, lake.silver(TABLE.name))
    got = {} if silver is None else {r["id"]: r["v"] for r in silver.collect()}
    assert got == final
    if runs and silver is not None:  # the last run applied again changes nothing
        version = engine.version(lake.silver(TABLE.name))
        stats, _ = apply_changes(spark, engine, TABLE, lake, bronze_batch(spark, runs[-1], len(runs)), truncated_at, "again")
        assert (stats["inserted"], stats["updated"], stats["deleted"]) == (0, 0, 0)
        assert engine.version(lake.silver(TABLE.name)) == version
    spark.catalog.clearCache()
