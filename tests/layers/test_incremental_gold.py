"""Incremental gold: the demo's customers_by_state moved by silver's change feed through inserts, an
update of the group key, the deletion of a group's extreme (MIN read again), a NULL group, a group emptied, a
truncate, a rewrite of silver (rebuilt whole, with the reason in the summary) and maintenance's compaction. Gold
equals the model's SQL over silver after every refresh, its types too; the refreshes are exactly the ones expected.
Gold's gate is stubbed (the demo runs it); the properties are tests/properties/test_incremental_gold.py's. What an
engine does for it (the change feed, null-safe merges, overwrite, compaction) is each engine's contract, proven on both
in tests/unit/test_delta_engines.py."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from unittest import mock

import pytest

from spark_jobs.delta import MergeSpec, commits_between
from spark_jobs.delta.engines import make_engine
from spark_jobs.lake import Lake
from spark_jobs.layers import gold
from spark_jobs.maintenance import maintain_delta
from spark_jobs.registry import Maintenance, TableConfig, parse_gold_model
from tests.support import gold_gate_stubbed

MODEL = Path(__file__).resolve().parents[2] / "include" / "gold" / "customers_by_state.sql"
SILVER = "id INT, state STRING, fico INT, registration_date DATE, _op STRING, _source_ts_ms BIGINT"
APPLY = MergeSpec(keys=("id",), delete_when="s._op = 'd'", update_when="s._op <> 'd'", insert_when="s._op <> 'd'")


def test_customers_by_state_moves_with_silvers_changes(spark, engine, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    model = parse_gold_model(MODEL, {"customers": TableConfig(name="customers", topic="t", keys=("id",))})
    day = dt.date(2020, 1, 1)

    def apply(*rows):
        engine.merge(spark.createDataFrame(list(rows), SILVER), lake.silver("customers"), APPLY)

    def refresh():
        with gold_gate_stubbed():
            summary = gold.gold_refresh(spark, engine, model, lake, "b")
        silver = engine.read(spark, lake.silver("customers"))
        silver.createOrReplaceTempView("customers")
        expected = spark.sql(model.sql)
        published = engine.read(spark, lake.gold(model.name))
        assert sorted(map(tuple, published.collect()), key=repr) == sorted(map(tuple, expected.collect()), key=repr)
        assert [(f.name, f.dataType) for f in published.schema] == [(f.name, f.dataType) for f in expected.schema]
        return summary.refresh, summary.changes, summary.groups_changed

    apply((1, "CA", 700, day, "c", 1), (2, "CA", 650, day.replace(day=2), "c", 1), (3, "NY", 801, day, "c", 1),
          (4, None, 555, day, "c", 1))
    assert refresh() == ("full (first refresh)", None, None)
    # an insert, the group key of one row updated, CA's earliest registration deleted (its MIN read again)
    apply((5, "TX", 720, day.replace(day=9), "c", 2), (3, "CA", 801, day.replace(day=5), "u", 2),
          (1, "CA", 700, day, "d", 2))
    assert refresh() == ("incremental", 4, 3)  # +TX, -NY +CA (an update: two rows), -CA; groups CA, NY, TX
    apply((4, None, 600, day, "u", 3), (6, None, None, None, "c", 3))  # the NULL group, a NULL fico
    assert refresh() == ("incremental", 3, 1)
    engine.delete(lake.silver("customers"), "true")  # a truncate
    assert refresh() == ("incremental", 5, 3)  # every row taken away: CA, TX and the NULL group emptied
    apply((7, "WA", 640, day, "c", 4))
    assert refresh() == ("incremental", 1, 1)
    engine.overwrite(engine.read(spark, lake.silver("customers")), lake.silver("customers"))  # a rewrite (a rebuild)
    refreshed = refresh()
    assert refreshed[0].startswith("full (silver customers was rewritten (WRITE") and refreshed[1:] == (None, None)
    apply((8, "WA", 700, day, "c", 5))
    assert refresh() == ("incremental", 1, 1)
    # maintenance compacts gold and its state (new versions, the same rows): the next refresh still moves the state
    upkeep = replace(Maintenance(), min_small_files=1)
    assert maintain_delta(engine, "gold", lake.gold(model.name), upkeep, model.keys).compacted
    assert maintain_delta(engine, "gold_state", lake.gold_state(model.name), upkeep, ("_g0",)).compacted
    apply((8, "OR", 700, day, "u", 6))
    assert refresh() == ("incremental", 2, 2)


def test_a_refresh_does_not_wait_for_its_sources_writer_once_the_feed_is_on(spark, tmp_path, monkeypatch):
    """Turning the feed on commits to silver, under its writer lock; once it is on, a refresh takes no silver lock,
    so a model's refresh never queues behind its source's next batch."""
    from spark_jobs.errors import TableBusy
    from spark_jobs.state import writer_lock

    engine, lake = make_engine(spark, "delta-rs"), Lake(str(tmp_path / "lake"))
    model = parse_gold_model(MODEL, {"customers": TableConfig(name="customers", topic="t", keys=("id",))})
    engine.merge(spark.createDataFrame([(1, "CA", 700, dt.date(2020, 1, 1), "c", 1)], SILVER), lake.silver("customers"),
                 APPLY)
    monkeypatch.setenv("CDC_LOCK_TIMEOUT", "0")
    with gold_gate_stubbed():
        with writer_lock(lake, "customers", "a silver batch"):  # the feed is off: turning it on needs the lock
            with pytest.raises(TableBusy):
                gold.gold_refresh(spark, engine, model, lake, "b")
        assert gold.gold_refresh(spark, engine, model, lake, "b").refresh == "full (first refresh)"
        engine.merge(spark.createDataFrame([(2, "NY", 640, dt.date(2020, 1, 2), "c", 2)], SILVER),
                     lake.silver("customers"), APPLY)
        with writer_lock(lake, "customers", "a silver batch"):
            assert gold.gold_refresh(spark, engine, model, lake, "b").refresh == "incremental"


def test_silvers_commits_since_the_last_refresh_are_read_even_when_a_later_batch_committed(spark, tmp_path):
    """A refresh reads silver's commits up to the version it took; the source's next batch may have committed since
    (a refresh holds no silver lock): those commits are still all found, so the refresh stays incremental."""
    engine, lake = make_engine(spark, "delta-rs"), Lake(str(tmp_path / "lake"))
    for i in range(6):  # versions 0..5
        apply_rows = spark.createDataFrame([(i, "CA", 700, dt.date(2020, 1, 1), "c", i)], SILVER)
        engine.merge(apply_rows, lake.silver("customers"), APPLY)
    commits = commits_between(engine, lake.silver("customers"), 1, 3)
    assert commits is not None and sorted(c["version"] for c in commits) == [2, 3]
    assert gold._not_replayable(engine, lake.silver("customers"), "customers", 1, 3) is None


def test_more_changes_than_the_setting_allows_rebuild_the_state_from_silver(spark, tmp_path, monkeypatch):
    """A backfill's worth of changes is cheaper as one scan: past CDC_GOLD_MAX_CHANGES, the model is rebuilt whole."""
    engine, lake = make_engine(spark, "delta-rs"), Lake(str(tmp_path / "lake"))
    model = parse_gold_model(MODEL, {"customers": TableConfig(name="customers", topic="t", keys=("id",))})
    day = dt.date(2020, 1, 1)
    engine.merge(spark.createDataFrame([(1, "CA", 700, day, "c", 1)], SILVER), lake.silver("customers"), APPLY)
    monkeypatch.setenv("CDC_GOLD_MAX_CHANGES", "2")
    with gold_gate_stubbed():
        gold.gold_refresh(spark, engine, model, lake, "b")
        engine.merge(spark.createDataFrame([(2, "NY", 640, day, "c", 2), (3, "NY", 650, day, "c", 2)], SILVER),
                     lake.silver("customers"), APPLY)
        assert gold.gold_refresh(spark, engine, model, lake, "b").refresh == "incremental"  # 2 changes: allowed
        engine.merge(spark.createDataFrame([(4, "TX", 600, day, "c", 3), (1, "TX", 700, day, "u", 3)], SILVER),
                     lake.silver("customers"), APPLY)
        assert gold.gold_refresh(spark, engine, model, lake, "b").refresh == (
            "full (3 changes to silver customers since the last refresh, more than CDC_GOLD_MAX_CHANGES)")


JOINED_MODEL = MODEL.parent / "films_per_actor.sql"
JOINED_SILVER = {
    "actor": ("actor_id INT, first_name STRING, last_name STRING, _op STRING, _source_ts_ms BIGINT", ("actor_id",)),
    "film_actor": ("actor_id INT, film_id INT, _op STRING, _source_ts_ms BIGINT", ("actor_id", "film_id")),
    "film": ("film_id INT, rental_rate DECIMAL(4,2), _op STRING, _source_ts_ms BIGINT", ("film_id",)),
}


def test_films_per_actor_computes_the_touched_actors_again(spark, tmp_path):
    """The demo's join model: a change to any of its three tables computes again only the actors whose rows it
    joined into, before or after it (a film's change reaches its actors through film_actor, as it was and as it
    is); an actor no longer there is deleted from gold. On delta-rs: what an engine adds (its change feed, its
    NULL-safe merge) is tested on both engines above and in tests/unit/test_delta_engines.py."""
    engine, lake = make_engine(spark, "delta-rs"), Lake(str(tmp_path / "lake"))
    tables = {name: TableConfig(name=name, topic=name, keys=keys) for name, (_, keys) in JOINED_SILVER.items()}
    model = parse_gold_model(JOINED_MODEL, tables)
    rate = Decimal

    def apply(table, *rows):
        schema, keys = JOINED_SILVER[table]
        spec = replace(APPLY, keys=keys)
        engine.merge(spark.createDataFrame(list(rows), schema), lake.silver(table), spec)

    def refresh():
        with gold_gate_stubbed():
            summary = gold.gold_refresh(spark, engine, model, lake, "b")
        for table in JOINED_SILVER:
            engine.read(spark, lake.silver(table)).createOrReplaceTempView(table)
        expected = spark.sql(model.sql)
        published = engine.read(spark, lake.gold(model.name))
        assert sorted(map(tuple, published.collect()), key=repr) == sorted(map(tuple, expected.collect()), key=repr)
        assert [(f.name, f.dataType) for f in published.schema] == [(f.name, f.dataType) for f in expected.schema]
        return summary.refresh, summary.changes, summary.groups_changed

    apply("actor", (1, "PENELOPE", "GUINESS", "c", 1), (2, "NICK", "WAHLBERG", "c", 1), (3, "ED", "CHASE", "c", 1))
    apply("film_actor", (1, 10, "c", 1), (1, 11, "c", 1), (2, 10, "c", 1))
    apply("film", (10, rate("2.99"), "c", 1), (11, rate("4.99"), "c", 1), (12, rate("0.99"), "c", 1))
    assert refresh() == ("full (first refresh)", None, None)
    apply("film", (10, rate("3.99"), "u", 2))  # film 10's actors, 1 and 2, through film_actor
    assert refresh() == ("incremental", 2, 2)
    apply("film_actor", (3, 12, "c", 3), (1, 10, "d", 3))  # actor 3 gains a film, actor 1 loses one
    assert refresh() == ("incremental", 2, 2)
    apply("actor", (2, "NICK", "WAHLBERG", "d", 4), (4, "JENNIFER", "DAVIS", "c", 4))  # 2 leaves gold, 4 enters
    assert refresh() == ("incremental", 2, 2)
    apply("film", (11, None, "d", 5))  # actor 1 keeps the row of a film that is gone (the LEFT JOIN's NULLs)
    assert refresh() == ("incremental", 1, 1)
    apply("film_actor", (5, 12, "c", 6))  # an actor silver does not have: reached, and nothing to publish
    apply("film", (12, rate("1.99"), "u", 6))  # reaches 3 and 5: film_actor as it was and as it is
    assert refresh() == ("incremental", 3, 2)
    engine.delete(lake.silver("film_actor"), "true")  # a truncate: every actor that had a film, 2 and 5 too
    assert refresh() == ("incremental", 4, 4)


def test_a_refresh_reads_its_own_sources_while_another_job_registers_views_of_the_same_names(spark, tmp_path):
    """The pipeline service runs jobs side by side in one Spark session, whose temporary views they share: another
    model's refresh registering `customers` (its own lake's, here) while this one has Spark analyze its SQL must
    wait, or this model would publish the other's rows."""
    import threading

    engine = make_engine(spark, "delta-rs")
    model = parse_gold_model(MODEL, {"customers": TableConfig(name="customers", topic="t", keys=("id",))})
    ours, theirs = Lake(str(tmp_path / "ours")), Lake(str(tmp_path / "theirs"))
    day = dt.date(2020, 1, 1)
    engine.merge(spark.createDataFrame([(1, "CA", 700, day, "c", 1)], SILVER), ours.silver("customers"), APPLY)
    engine.merge(spark.createDataFrame([(1, "NY", 600, day, "c", 1)], SILVER), theirs.silver("customers"), APPLY)
    other = engine.read(spark, theirs.silver("customers"))
    real_sql, registering = spark.sql, []

    def sql_while_another_registers(text):
        if not registering:
            registering.append(threading.Thread(target=gold.analyzed, args=(spark, {"customers": other}, "SELECT 1")))
            registering[0].start()
            registering[0].join(timeout=2)  # it waits for this analysis to end: the lock is held
        return real_sql(text)

    with gold_gate_stubbed(), mock.patch.object(spark, "sql", sql_while_another_registers):
        gold.gold_refresh(spark, engine, replace(model, sql=model.sql + " LIMIT 100"), ours, "b")  # rewritten whole
    registering[0].join()
    assert [r["state"] for r in engine.read(spark, ours.gold(model.name)).collect()] == ["CA"]


def test_a_join_whose_references_alone_changed_publishes_nothing_new(spark, tmp_path):
    """Only a table its references read changed: no key is touched, nothing is written, whatever the model's column
    types (a timestamp's Arrow type needs its zone)."""
    from spark_jobs.registry import GoldModel, Reference

    engine, lake = make_engine(spark, "delta-rs"), Lake(str(tmp_path / "lake"))
    spec = replace(APPLY, keys=("actor_id",))
    engine.merge(spark.createDataFrame([(1, "PENELOPE", dt.datetime(2020, 1, 1), "c", 1)],
                                       "actor_id INT, first_name STRING, last_update TIMESTAMP, _op STRING, "
                                       "_source_ts_ms BIGINT"), lake.silver("actor"), spec)
    engine.merge(spark.createDataFrame([(1, 10, "c", 1)], "actor_id INT, film_id INT, _op STRING, _source_ts_ms BIGINT"),
                 lake.silver("film_actor"), replace(APPLY, keys=("actor_id", "film_id")))
    listed = "actor_id INT, _op STRING, _source_ts_ms BIGINT"
    engine.merge(spark.createDataFrame([(1, "c", 1)], listed), lake.silver("listed"), spec)
    model = GoldModel(name="films", keys=("actor_id",), sources=("actor", "film_actor"), path=Path("films.sql"),
                      sql="SELECT a.actor_id, MAX(a.last_update) AS last_update, COUNT(fa.film_id) AS films "
                          "FROM actor a LEFT JOIN film_actor fa ON fa.actor_id = a.actor_id GROUP BY a.actor_id",
                      references=(Reference(columns=("actor_id",), table="listed", to=("actor_id",)),))
    with gold_gate_stubbed():
        first = gold.gold_refresh(spark, engine, model, lake, "b")
        engine.merge(spark.createDataFrame([(2, "c", 2)], listed), lake.silver("listed"), spec)
        summary = gold.gold_refresh(spark, engine, model, lake, "b")
    assert (summary.refresh, summary.changes, summary.groups_changed, summary.version) == (
        "incremental", 0, 0, first.version)
    assert [tuple(r) for r in engine.read(spark, lake.gold("films")).collect()] == [(1, dt.datetime(2020, 1, 1), 1)]
