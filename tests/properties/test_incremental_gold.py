"""Property: a gold model kept incrementally (layers/gold_plan.py, layers/gold_state.py) equals its SQL run over all of
silver after every run, whatever the source's history and its arrival.

The histories and their delivery are the source model's (tests/support.py, as test_properties.py draws them):
inserts, updates (of a model's group key too), deletes, primary-key changes, late and re-delivered events, truncates;
each run goes through silver's own apply step. After each run every model refreshes from silver's change feed (the
first run and a truncate's are the ones to watch), and their gold is compared with the model's SQL over silver, row
for row. The models kept as a state cover every aggregate kept (COUNT, SUM, AVG, MIN, MAX; of integers, decimals and
doubles), a WHERE, an expression group with NULL groups, and groups that empty out; the two joins (the table with
itself: a LEFT join keyed by the primary key, an INNER join grouped by a value, with HAVING) are computed again for
the keys each run's changes reach. Gold's gate is stubbed as silver's is there (Great Expectations would add minutes)."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.delta import MergeSpec
from spark_jobs.delta.delta_rs import DeltaRsEngine
from spark_jobs.lake import Lake
from spark_jobs.layers import gold
from spark_jobs.layers.gold_plan import GroupsPlan, IncrementalPlan
from spark_jobs.layers.silver import apply_changes
from spark_jobs.registry import GoldModel
from tests.support import (
    COMMON,
    HISTORIES_PER_EXAMPLE,
    TABLE,
    bronze_batch,
    bundles,
    gold_gate_stubbed,
    silver_gate,
    truncate_histories,
)

EXAMPLES = {"ci": (3, 6), "long": (100, 200)}[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
# bundles of HISTORIES_PER_EXAMPLE histories for the test of several commits per refresh: 13 bundles, 520 histories
WINDOW_BUNDLES = {"ci": 13, "long": 250}[os.environ.get("HYPOTHESIS_PROFILE", "ci")]

BY_VALUE = """SELECT v AS value, COUNT(*) AS items, SUM(id) AS id_sum, MIN(id) AS low, MAX(id) AS high,
       ROUND(AVG(tenant), 3) AS mean_tenant, AVG(CAST(id AS DECIMAL(6, 2))) AS mean_id,
       SUM(CAST(tenant AS DECIMAL(8, 1))) AS tenant_total, MAX(v) AS top, SUM(id * 0.5D) AS halves
FROM items WHERE id <> 3 GROUP BY v"""
# NULL groups (an even id), and a count of a column that is NULL in some rows
BY_LETTER = """SELECT CASE WHEN id % 2 = 0 THEN NULL ELSE SUBSTRING(v, 1, 1) END AS letter, COUNT(*) AS items,
       COUNT(CASE WHEN tenant % 3 = 0 THEN tenant END) AS thirds, MIN(CONCAT(v, id)) AS first_tag
FROM items GROUP BY 1"""
# joins (of the one table the histories write, twice), computed again for the keys a change reaches: through the
# other occurrence's join condition (an item's namesakes), a LEFT join's unmatched rows, and an INNER join
NAMESAKES = """SELECT a.tenant, a.id, MAX(a.v) AS v, COUNT(b.id) AS namesakes, MIN(b.id) AS first_namesake
FROM items a LEFT JOIN items b ON b.v = a.v AND NOT (b.id = a.id AND b.tenant = a.tenant)
GROUP BY a.tenant, a.id"""
LATER_IN_TENANT = """SELECT a.v AS value, COUNT(*) AS pairs, SUM(b.id - a.id) AS gaps, MAX(b.v) AS last_value
FROM items a JOIN items b ON b.tenant = a.tenant AND b.id > a.id WHERE a.id <> 2
GROUP BY a.v HAVING COUNT(*) > 1"""
MODELS = [GoldModel(name=name, sql=sql, keys=keys, sources=("items",), path=Path(f"{name}.sql"), row_count=(0, None))
          for name, sql, keys in [("by_value", BY_VALUE, ("value",)), ("by_letter", BY_LETTER, ("letter",)),
                                  ("namesakes", NAMESAKES, ("tenant", "id")),
                                  ("later_in_tenant", LATER_IN_TENANT, ("value",))]]
KEPT = {"by_value": IncrementalPlan, "by_letter": IncrementalPlan, "namesakes": GroupsPlan,
        "later_in_tenant": GroupsPlan}


def same(got: list, expected: list) -> bool:
    """Rows equal; a double to its rounding (its sum's order differs between the two ways: neither is exact)."""
    if len(got) != len(expected):
        return False
    for a, b in zip(got, expected, strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9):
                    return False
            elif x != y:
                return False
    return True


def check(spark, runs):
    with tempfile.TemporaryDirectory(prefix="prop-gold-") as folder:  # hundreds of examples: each lake deleted
        return _check(spark, runs, DeltaRsEngine(), Lake(folder))


def _check(spark, runs, engine, lake):
    truncated_at = None
    refreshes = []
    for run, files in enumerate(runs):
        _, truncated_at = apply_changes(spark, engine, TABLE, lake, bronze_batch(spark, files, run), truncated_at,
                                        f"run-{run}", silver_gate)
        schema = engine.schema(lake.silver(TABLE.name))
        if schema is None or "v" not in schema.fieldNames():  # a first batch of deletes only: no column to group by
            continue
        for model in MODELS:
            assert isinstance(gold.incremental_plan(model), KEPT[model.name])
            with gold_gate_stubbed():
                summary = gold.gold_refresh(spark, engine, model, lake, f"run-{run}")
            refreshes.append(summary.refresh or summary.gate)
            silver = engine.read(spark, lake.silver(TABLE.name))
            silver.createOrReplaceTempView("items")
            expected = sorted((tuple(r) for r in spark.sql(model.sql).collect()), key=repr)
            got = sorted((tuple(r) for r in engine.read(spark, lake.gold(model.name)).collect()), key=repr)
            assert same(got, expected), f"{model.name} after run {run} ({summary.refresh}): {got} != {expected}"
            typed = [(f.name, f.dataType) for f in engine.read(spark, lake.gold(model.name)).schema]
            assert typed == [(f.name, f.dataType) for f in spark.sql(model.sql).schema]
    spark.catalog.clearCache()
    return refreshes


@settings(max_examples=EXAMPLES[0], **COMMON)
@given(bundles())
def test_incremental_gold_equals_its_sql_over_silver_after_every_run(spark, delivery):
    runs, _ = delivery
    refreshes = check(spark, runs)
    # after its first refresh, a model moves with silver's changes (none of these runs rewrites silver)
    assert all(r == "incremental" or r.startswith("skipped") for r in refreshes[len(MODELS):]), refreshes


@settings(max_examples=EXAMPLES[1], **COMMON)
@given(truncate_histories())
def test_incremental_gold_equals_its_sql_over_silver_through_truncates(spark, delivery):
    runs, _ = delivery
    check(spark, runs)


# silver's rows as the merges below write them, and the merge: a change event per key, newest applied
SILVER_ROWS = "tenant INT, id INT, v STRING, n BIGINT, _op STRING, _source_ts_ms BIGINT"
APPLY = MergeSpec(keys=("tenant", "id"), delete_when="s._op = 'd'", update_when="s._op <> 'd'", insert_when="s._op <> 'd'")
STATE_KEPT = [m for m in MODELS if KEPT[m.name] is IncrementalPlan]  # the route that keeps a per-group state
# the one of them with every aggregate that route keeps: COUNT, SUM, AVG, MIN and MAX, of numbers and of text
EVERY_AGGREGATE = [m for m in STATE_KEPT if m.name == "by_value"]


@settings(max_examples=WINDOW_BUNDLES, **COMMON)
@given(bundles(), st.data())
def test_a_state_moved_by_several_silver_commits_between_refreshes_equals_its_sql(spark, delivery, data):
    """Silver's commits between two refreshes, several of them: a value one commit adds and a later one takes away
    (an update moving a row out of its group, then its delete; an extreme replaced and restored) must leave every
    aggregate the per-group route keeps (COUNT, SUM, AVG, MIN, MAX) as the model's SQL over silver has it. Silver is
    written here straight from the source model's states (its own rules are test_properties.py's): each commit
    applies the next stretch of the log, and the models refresh after a drawn subset of the commits."""
    _, logs = delivery
    assert len(logs) == HISTORIES_PER_EXAMPLE
    log = sorted((e for history in logs for e in history), key=lambda e: (e.position, e.tenant))
    # a few commits, refreshed after the first, the last and at most one between: each window several commits wide
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(log) - 1)), min_size=2, max_size=6))))
    commits = [log[a:b] for a, b in zip([0, *cuts], [*cuts, len(log)], strict=True) if a < b]
    refresh_after = {0, len(commits) - 1} | set(data.draw(st.lists(st.integers(0, len(commits) - 1), max_size=1)))
    with tempfile.TemporaryDirectory(prefix="prop-gold-windows-") as folder:
        engine, lake = DeltaRsEngine(), Lake(folder)
        state: dict[tuple[int, int], tuple[str | None, int | None]] = {}
        refreshes = []
        for number, commit in enumerate(commits):
            before = dict(state)
            for e in commit:
                if e.op == "d":
                    state.pop((e.tenant, e.key), None)
                else:
                    state[(e.tenant, e.key)] = e.image
            changed = [(*key, *(state.get(key) or (None, None)), "d" if key not in state else "u", number)
                       for key in sorted(set(before) | set(state)) if before.get(key) != state.get(key)]
            if changed:
                engine.merge(spark.createDataFrame(changed, SILVER_ROWS), lake.silver(TABLE.name), APPLY)
            if number in refresh_after and engine.version(lake.silver(TABLE.name)) is not None:
                refreshes += [_refreshed_equal(spark, engine, lake, model, number) for model in EVERY_AGGREGATE]
        spark.catalog.clearCache()
    # after its first refresh, each model moves with silver's commits
    assert all(r == "incremental" or r.startswith("skipped") for r in refreshes[len(EVERY_AGGREGATE):]), refreshes


def _refreshed_equal(spark, engine, lake, model, number) -> str:
    """The model refreshed (its gate stubbed), its gold equal to its SQL over silver: how it refreshed."""
    with gold_gate_stubbed():
        summary = gold.gold_refresh(spark, engine, model, lake, f"commit-{number}")
    engine.read(spark, lake.silver(TABLE.name)).createOrReplaceTempView("items")
    expected = sorted((tuple(r) for r in spark.sql(model.sql).collect()), key=repr)
    got = sorted((tuple(r) for r in engine.read(spark, lake.gold(model.name)).collect()), key=repr)
    assert same(got, expected), f"{model.name} after commit {number} ({summary.refresh}): {got} != {expected}"
    return summary.refresh or summary.gate


def test_a_model_the_planner_refuses_is_rewritten_and_says_why(spark, tmp_path):
    engine, lake = DeltaRsEngine(), Lake(str(tmp_path / "lake"))
    engine.overwrite(spark.createDataFrame([(1, "a", 0), (2, "a", 0)], "id INT, v STRING, _source_ts_ms BIGINT"),
                     lake.silver("items"))
    model = replace(MODELS[0], sql="SELECT v AS value, COUNT(*) AS items FROM items GROUP BY v ORDER BY 2 LIMIT 1")
    with gold_gate_stubbed():
        assert gold.gold_refresh(spark, engine, model, lake, "b").refresh == "full (it has LIMIT)"
        engine.append(spark.createDataFrame([(3, "b", 0)], "id INT, v STRING, _source_ts_ms BIGINT"), lake.silver("items"))
        assert gold.gold_refresh(spark, engine, model, lake, "b").refresh == "full (it has LIMIT)"
    assert [tuple(r) for r in engine.read(spark, lake.gold("by_value")).collect()] == [("b", 1)]


def test_an_aggregate_no_state_keeps_is_computed_again_for_the_touched_groups(spark, tmp_path):
    """COUNT(DISTINCT) has no running state; grouped by a column, its groups are computed again from silver."""
    engine, lake = DeltaRsEngine(), Lake(str(tmp_path / "lake"))
    schema = "id INT, v STRING, _source_ts_ms BIGINT"
    engine.overwrite(spark.createDataFrame([(1, "a", 0), (2, "a", 0), (3, "c", 0)], schema), lake.silver("items"))
    model = replace(MODELS[0], sql="SELECT v AS value, COUNT(DISTINCT id % 2) AS parities FROM items GROUP BY v")
    with gold_gate_stubbed():
        gold.gold_refresh(spark, engine, model, lake, "b")
        engine.append(spark.createDataFrame([(5, "a", 0), (4, "b", 0)], schema), lake.silver("items"))
        summary = gold.gold_refresh(spark, engine, model, lake, "b")
    assert (summary.refresh, summary.changes, summary.groups_changed) == ("incremental", 2, 2)
    assert sorted(tuple(r) for r in engine.read(spark, lake.gold("by_value")).collect()) == [
        ("a", 2), ("b", 1), ("c", 1)]


def test_a_join_keyed_by_null_nan_and_signed_zero_groups_them_as_spark_does(spark, tmp_path):
    """Keys a join computes again are matched on the driver: NULL with NULL, NaN with NaN, -0.0 with 0.0, as Spark
    groups them; a group emptied (the last NaN) is deleted, the others replaced, never both."""
    engine, lake = DeltaRsEngine(), Lake(str(tmp_path / "lake"))
    schema = "id INT, v STRING, w DOUBLE, _source_ts_ms BIGINT"
    nan = float("nan")
    engine.overwrite(spark.createDataFrame([(1, "a", None, 0), (2, "a", nan, 0), (3, "b", 0.0, 0), (4, "b", -0.0, 0),
                                            (5, "c", 1.5, 0)], schema), lake.silver("items"))
    model = replace(MODELS[0], name="by_weight", keys=("weight",),
                    sql="SELECT a.w AS weight, COUNT(b.id) AS namesakes FROM items a LEFT JOIN items b "
                        "ON b.v = a.v AND b.id <> a.id GROUP BY a.w")
    apply = MergeSpec(keys=("id",), delete_when="s.v IS NULL", update_when="s.v IS NOT NULL",
                      insert_when="s.v IS NOT NULL")

    def refresh():
        with gold_gate_stubbed():
            summary = gold.gold_refresh(spark, engine, model, lake, "b")
        engine.read(spark, lake.silver("items")).createOrReplaceTempView("items")
        expected = sorted((tuple(r) for r in spark.sql(model.sql).collect()), key=repr)
        got = sorted((tuple(r) for r in engine.read(spark, lake.gold("by_weight")).collect()), key=repr)
        assert repr(got) == repr(expected), (got, expected)
        return summary.refresh, summary.groups_changed

    assert refresh() == ("full (first refresh)", None)
    engine.merge(spark.createDataFrame([(6, "a", None, 1), (7, "b", -0.0, 1)], schema), lake.silver("items"), apply)
    assert refresh() == ("incremental", 3)  # NULL (actor 1's namesake), NaN (2's), 0.0 (3, 4 and 7 as one)
    engine.merge(spark.createDataFrame([(2, None, None, 2)], schema), lake.silver("items"), apply)  # the last NaN
    assert refresh() == ("incremental", 2)  # NaN gone, NULL (row 1's and 6's namesake) replaced
    assert not any(r["weight"] != r["weight"] for r in engine.read(spark, lake.gold("by_weight")).collect() if
                   r["weight"] is not None)
