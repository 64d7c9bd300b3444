"""Property: whatever order, duplication or batching the change files arrive in, silver and its history
equal what a small reference model gets by applying the source's log in order.

Source histories: a snapshot sharing one LSN, inserts, updates, deletes (with and without a Kafka
tombstone line), re-inserts, primary-key changes, streaming events at the snapshot's LSN, ts_ms ties,
and (second test) truncates. A nullable integer column `n` is null in every event before a drawn point of the
log and an integer or null after it: its first batches may all be null, and silver must still type it as an integer
(bigint) and keep each value. They are cut into sink files, the files shuffled, some re-delivered under
new offsets, and spread over several runs. Each run goes through the bronze transforms and silver's
apply step with the history table on, planned by silver's pass (a pass of one table) or by the table's own plan, in
one task or partitioned (drawn per example). Every batch must also pass the silver gate's checks: deletes
received = removed + absent + stale + superseded + before a truncate, no deleted key live, keys unique.
They are evaluated here directly; Great Expectations' own run of them (tests/quality/test_quality.py) would
add minutes.

Every apply rule but truncate works per key, so independent histories on disjoint keys cannot affect
each other in one table: the first test runs a bundle of HISTORIES_PER_EXAMPLE histories per example
(each tenant's keys are its own) and checks each against its own model, which keeps Spark's fixed cost
per run from dominating. Truncate empties the whole table, so the second test runs one history per table.

The third test runs the same histories through silver's shared pass (silver.read_pass, each table's batch finished
on the driver): each example's tenants spread over three tables of different columns, planned together, the third
with its history on (held to the model's versions as the first test's are).

Profiles: `ci` (default: 6 bundles = 240 histories, 9 truncate histories, and 7 passes = 273 histories) and `long`
(9,960 histories, 300 truncate histories and 9,750 through the pass), each of the first two tests' a third per planner:
    HYPOTHESIS_PROFILE=long pytest tests/properties/test_properties.py   # about 3 hours on 2 cores
"""

from __future__ import annotations

import json
import os
import tempfile
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.delta.delta_rs import DeltaRsEngine
from spark_jobs.lake import Lake
from spark_jobs.layers import silver, silver_plan
from spark_jobs.layers.silver import apply_changes
from spark_jobs.registry import TableConfig
from tests.support import (
    COMMON,
    HISTORIES_PER_EXAMPLE,
    TABLE,
    bronze_batch,
    bundles,
    image,
    position,
    reference,
    silver_gate,
    truncate_histories,
)

PROFILES = {"ci": (6, 9, 7), "long": (249, 300, 250)}  # (bundles, truncate histories, passes), each planner a third
BUNDLES, TRUNCATE_HISTORIES, PASSES = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]


# how a test's batches are planned, each a third of its examples: silver's pass (a pass of one table, each batch
# landed in bronze first), or the table's own plan (as for a batch the pass does not take, or any with delta-spark),
# in one task or partitioned
PLANNERS = pytest.mark.parametrize("planner", ["pass", "own plan", "own plan, partitioned"],
                                   ids=["pass", "own-plan", "own-plan-partitioned"])


def check(spark, runs, logs, planner):
    """`own plan, partitioned`: every batch planned as a big one is (its partitions kept), not in one task."""
    partitioned = planner == "own plan, partitioned"
    with mock.patch.object(silver_plan, "ONE_TASK_ROWS", -1 if partitioned else silver_plan.ONE_TASK_ROWS):
        with tempfile.TemporaryDirectory(prefix="prop-lake-") as folder:  # hundreds of examples: each lake deleted
            _check_lake(spark, runs, logs, DeltaRsEngine(), Lake(folder), planner == "pass")


def _apply(spark, engine, lake, files, run, truncated_at, batch_id, through_pass):
    """One run's files applied to silver: through the pass (landed in bronze first), or given to apply_changes as
    bronze's rows. Returns the summary (None: the files held no event for bronze) and the truncate in force."""
    if not through_pass:
        return apply_changes(spark, engine, TABLE, lake, bronze_batch(spark, files, run), truncated_at, batch_id,
                             silver_gate)
    if not _land(spark, engine, lake, TABLE, files, run):
        return None, truncated_at
    summaries, planned = _silver_step(spark, engine, lake, batch_id, (TABLE,))
    # the pass plans every batch but truncates alone before silver's first commit (silver_pass._typing)
    assert planned == 1 or engine.version(lake.silver(TABLE.name)) is None, "a batch went to the table's own plan"
    return summaries[TABLE.name], None


def _check_lake(spark, runs, logs, engine, lake, through_pass):
    truncated_at = None
    for run, files in enumerate(runs):
        _, truncated_at = _apply(spark, engine, lake, files, run, truncated_at, f"run-{run}", through_pass)
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
        stats, _ = _apply(spark, engine, lake, runs[-1], len(runs), truncated_at, "again", through_pass)
        assert stats is None or (stats.inserted, stats.updated, stats.deleted, stats.history_rows or 0) == (0, 0, 0, 0)
        assert (engine.version(lake.silver(TABLE.name)), engine.version(lake.history(TABLE.name))) == versions
    spark.catalog.clearCache()


@PLANNERS
@settings(max_examples=max(1, BUNDLES // 3), **COMMON)
@given(bundles())
def test_silver_and_history_equal_the_model_for_every_tenant_whatever_the_arrival(spark, planner, delivery):
    runs, logs = delivery
    check(spark, runs, logs, planner)


@PLANNERS
@settings(max_examples=max(1, TRUNCATE_HISTORIES // 3), **COMMON)
@given(truncate_histories())
def test_truncates_empty_the_table_as_of_their_position_whatever_the_arrival(spark, planner, delivery):
    runs, logs = delivery
    check(spark, runs, logs, planner)


# the pass's tables: each its own tenants, and a column of its own in every image (none, text, an integer); the
# second's silver partitioned by its tenant, the third keeping history
PASS_TABLES = tuple(TableConfig(name=f"items{j}", topic=f"src.public.items{j}", keys=("tenant", "id"),
                                partition_by=("tenant",) if j == 1 else (), history=j == 2) for j in range(3))
OWN_COLUMNS = ({}, {"label": "x"}, {"weight": 7})


@st.composite
def pass_bundles(draw):
    """A bundle per pass table, together HISTORIES_PER_EXAMPLE histories' worth."""
    per = HISTORIES_PER_EXAMPLE // len(PASS_TABLES)
    return [draw(bundles(range(j * per, (j + 1) * per))) for j in range(len(PASS_TABLES))]


def _own_columns(files, columns: dict):
    """The sink files with `columns` in each event's images."""
    def line(text: str) -> str:
        if text == "null":
            return text
        event = json.loads(text)
        for side in ("before", "after"):
            if event[side] is not None:
                event[side] = {**event[side], **columns}
        return json.dumps(event)
    return [(offset, [line(t) for t in chunk]) for offset, chunk in files]


def _land(spark, engine, lake, table, files, run) -> bool:
    """The files' events appended to the table's bronze as its next version, as the bronze step commits them (files
    of no event, Kafka tombstones alone: no commit). Were any?"""
    version = engine.version(lake.bronze(table.name))
    rows = bronze_batch(spark, files, run, table, 0 if version is None else version + 1)
    if rows.isEmpty():
        return False
    engine.append(rows, lake.bronze(table.name))
    return True


def _silver_step(spark, engine, lake, batch_id, tables=PASS_TABLES):
    """Silver for `tables` as a run does it (run_plan): the pass read, each table's step to its merged audit, the
    audits answered together, each step to its end. Returns the summaries and how many the pass planned."""
    planned = silver.read_pass(spark, engine, list(tables), lake)
    asking, summaries = {}, {}
    for table in tables:
        work = silver.silver_merge(spark, engine, table, lake, batch_id, planned.get(table.name), silver_gate)
        try:
            asking[table.name] = (work, next(work))
        except StopIteration as done:  # its own plan: no question asked
            summaries[table.name] = done.value
    answers = silver.answer_merged({name: question for name, (_, question) in asking.items()}, batch_id) if asking else {}
    for name, (work, _) in asking.items():
        try:
            work.send(answers[name])
            raise AssertionError("a step asks once")
        except StopIteration as done:
            summaries[name] = done.value
    return summaries, len(asking)


def _history(spark, engine, lake, table) -> list:
    """The table's history rows as the model's versions."""
    history = engine.read(spark, lake.history(table.name))
    return [] if history is None else sorted(
        ((r["tenant"], r["id"]), position(r["_seq"]), r["_op"], image(r), position(r["_valid_to"]), r["_is_current"])
        for r in history.collect())


def _deleted_keys(log) -> set:
    """The keys whose last event in commit order is a delete: the tombstone ledger's."""
    last = {}
    for e in sorted(log, key=lambda e: e.position):
        last[(e.tenant, e.key)] = e.op
    return {key for key, op in last.items() if op == "d"}


@settings(max_examples=PASSES, **COMMON)
@given(pass_bundles())
def test_the_shared_pass_equals_the_model_for_every_tenant_of_every_table_whatever_the_arrival(spark, deliveries):
    engine = DeltaRsEngine()  # the pass lists a table's new files with delta-rs
    deliveries = [([_own_columns(files, columns) for files in runs], logs)
                  for (runs, logs), columns in zip(deliveries, OWN_COLUMNS, strict=True)]
    with tempfile.TemporaryDirectory(prefix="prop-pass-") as folder:
        lake = Lake(folder)
        landed = through_pass = 0
        for run in range(max(len(runs) for runs, _ in deliveries)):
            for table, (runs, _) in zip(PASS_TABLES, deliveries, strict=True):
                if run < len(runs):
                    landed += _land(spark, engine, lake, table, runs[run], run)
            through_pass += _silver_step(spark, engine, lake, f"run-{run}")[1]
        assert through_pass == landed, "a batch went to its table's own plan: this test holds the pass's"
        for table, (_, logs), columns in zip(PASS_TABLES, deliveries, OWN_COLUMNS, strict=True):
            rows = engine.read(spark, lake.silver(table.name))
            got = {} if rows is None else {(r["tenant"], r["id"]): (image(r), {c: r[c] for c in columns})
                                           for r in rows.collect()}
            expected = {key: (row, columns) for log in logs for key, row in reference(log)[0].items()}
            assert got == expected, table.name
            if table.history:
                assert _history(spark, engine, lake, table) == sorted(v for log in logs for v in reference(log)[1])
            ledger = engine.read(spark, lake.tombstones(table.name))
            got_deleted = set() if ledger is None else {(r["tenant"], r["id"]) for r in ledger.collect()}
            assert got_deleted == set().union(*map(_deleted_keys, logs)), table.name
        # every table's last run landed again: the pass applies nothing, and silver makes no commit
        versions = {t.name: engine.version(lake.silver(t.name)) for t in PASS_TABLES}
        for table, (runs, _) in zip(PASS_TABLES, deliveries, strict=True):
            if runs:
                _land(spark, engine, lake, table, runs[-1], len(runs))
        versions |= {"history": engine.version(lake.history(PASS_TABLES[2].name))}
        summaries, _ = _silver_step(spark, engine, lake, "again")
        assert {name: (s.inserted, s.updated, s.deleted, s.history_rows or 0) for name, s in summaries.items()
                if s.events} == {name: (0, 0, 0, 0) for name, s in summaries.items() if s.events}
        assert {t.name: engine.version(lake.silver(t.name)) for t in PASS_TABLES} | {
            "history": engine.version(lake.history(PASS_TABLES[2].name))} == versions
    spark.catalog.clearCache()
