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

import os
import tempfile
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.delta.delta_rs import DeltaRsEngine
from spark_jobs.lake import Lake
from spark_jobs.layers import silver_plan
from spark_jobs.layers.silver import apply_changes
from tests.support import COMMON, TABLE, bronze_batch, bundles, image, position, reference, silver_gate, truncate_histories

PROFILES = {"ci": (6, 10), "long": (250, 300)}  # (bundles, truncate histories)
BUNDLES, TRUNCATE_HISTORIES = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]


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
