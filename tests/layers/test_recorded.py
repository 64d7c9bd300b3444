"""Recorded connector output (tests/fixtures/debezium: PostgreSQL without the schema envelope, MySQL with
it) through the CLI, compared with the source tables' final state, with each Delta engine."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from spark_jobs.lake import Lake
from tests.support import FIXTURES, RECORDED_FINAL, land, mongo_event, planner_run, run, silver_rows, summary_line


def land_newest_first(capsys, root: Path, files, landing: Path, lake: Path, table: str, runs=run) -> None:
    """Copies `files` (under `root`) to the landing newest first, with one run of the table after each (`runs`)."""
    for f in sorted(files, reverse=True):
        target = landing / f.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, target)
        code, out, err = runs(capsys, FIXTURES / "tables.yaml", landing, lake, "--tables", table)
        assert (code, err) == (0, ""), out


@pytest.mark.parametrize("source, table", [("postgres", "pg_customers"), ("mysql", "mysql_customers")])
def test_recorded_connector_output_landing_in_reverse_order_over_several_runs(spark, engine, tmp_path, capsys, source, table):
    """PostgreSQL events without the schema envelope and MySQL events with it: snapshot, inserts, updates,
    deletes with tombstones, a primary-key change, a re-insert, ts_ms going backwards, a binlog rotation."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    land_newest_first(capsys, FIXTURES / source, (FIXTURES / source).rglob("*.json"), landing, lake, table)
    assert silver_rows(spark, engine, lake, table, ("id",)) == RECORDED_FINAL[table]
    # and the same files applied in one run, in landing order, give the same table
    one_run = tmp_path / "lake_one_run"
    code, _, _ = run(capsys, FIXTURES / "tables.yaml", landing, one_run, "--tables", table)
    assert code == 0
    assert silver_rows(spark, engine, one_run, table, ("id",)) == RECORDED_FINAL[table]


@pytest.mark.parametrize("source, table", [("postgres", "pg_customers"), ("mysql", "mysql_customers")])
def test_recorded_connector_output_written_with_delta_spark_gives_the_same_tables(spark, tmp_path, capsys, monkeypatch,
                                                                                  source, table):
    """The same recorded output through the delta-spark engine (deletion vectors on): silver and the ledger
    of deletes as delta-rs leaves them, planned by the silver pass as with delta-rs. One run of all files (late events
    across runs meet the same merge conditions, which the engine contract suite checks on both engines)."""
    from spark_jobs.delta.delta_spark import DeltaSparkEngine

    monkeypatch.setenv("CDC_DELTA_ENGINE", "delta-spark")
    shutil.copytree(FIXTURES / source, tmp_path / "landing")
    code, out, err = run(capsys, FIXTURES / "tables.yaml", tmp_path / "landing", tmp_path / "lake", "--tables", table)
    assert (code, err) == (0, "")
    assert "engine=delta-spark " in out
    assert "1 of 1 tables' new bronze rows planned in one pass" in out and "plans its own" not in out, out
    engine = DeltaSparkEngine(spark)
    assert silver_rows(spark, engine, tmp_path / "lake", table, ("id",)) == RECORDED_FINAL[table]
    assert summary_line(out, "silver", table)["gate"] == "passed"


MONGO = FIXTURES / "mongodb"
OIDS = [f"65a1f0c2e4b0a1b2c3d4e5f{n}" for n in range(1, 5)]
# the collections' final state after tests/fixtures/debezium/mongodb (silver_rows leaves the key `_id` out of the
# values): extended JSON typed ($oid text, $numberLong BIGINT, $date TIMESTAMP from milliseconds or ISO text,
# $numberDecimal DECIMAL), deletes keyed from the key files
MONGO_FINAL = {
    "mongo_customers": {
        (OIDS[0],): {"name": "Sally", "visits": 4, "joined": dt.datetime(2023, 11, 14, 22, 13, 20, 123000),
                     "score": 4.5, "balance": None},
        (OIDS[1],): {"name": "Georgina", "visits": 1, "joined": dt.datetime(2024, 11, 21, 8, 30, 0, 500000),
                     "score": None, "balance": Decimal("-0.25")},
        (OIDS[3],): {"name": "Anne Marie", "visits": 2, "joined": dt.datetime(2024, 11, 20, 10, 0),
                     "score": None, "balance": None},
    },
    # ExtractNewDocumentState's plain JSON: the ObjectId as text, dates as milliseconds; its delete has no _id
    "mongo_products": {
        ("65a1f0c2e4b0a1b2c3d4e601",): {"name": "hammer", "qty": 4,
                                         "added": 1690000000000},
    },
}


@pytest.mark.parametrize("table, own_plan", [("mongo_customers", False), ("mongo_products", True)],
                         ids=["mongo_customers-pass", "mongo_products-own-plan"])
def test_mongodb_change_events_landing_in_reverse_order_over_several_runs(spark, engine, tmp_path, capsys, monkeypatch,
                                                                          table, own_plan):
    """MongoDB's connector (documents as extended JSON text; deletes with no document, keyed by the S3 sink's key
    files) and ExtractNewDocumentState's flat records: snapshot, insert, full-document update, delete with its
    tombstone, a re-insert of a deleted _id; newest file first, one run per file, ordered by the oplog position. One
    collection through the silver pass, the other through its own plan (the documents' fields found alike)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    topic = "mongo1.inventory." + table.split("_", 1)[1]
    runs = planner_run(monkeypatch, own_plan)
    # a key file (`.keys.json`) sorts after its value file: newest first, it lands before its values
    land_newest_first(capsys, MONGO, (MONGO / "topics" / topic).rglob("*.json"), landing, lake, table, runs)
    assert silver_rows(spark, engine, lake, table, ("_id",)) == MONGO_FINAL[table]
    one_run = tmp_path / "lake_one_run"
    code, out, _ = runs(capsys, FIXTURES / "tables.yaml", landing, one_run, "--tables", table)
    assert code == 0 and summary_line(out, "bronze", table)["quarantined_share"] == "0.0"
    assert own_plan or ("1 of 1 tables' new bronze rows planned in one pass" in out and "plans its own" not in out), out
    assert silver_rows(spark, engine, one_run, table, ("_id",)) == MONGO_FINAL[table]


def test_a_mongodb_field_of_mixed_types_keeps_each_value_as_its_extended_json_in_every_batch(spark, engine, tmp_path,
                                                                                            capsys):
    """A field holding a date, a number and a string is text: each value as its extended JSON (compact), a string as
    itself. A later batch whose values of it are all dates keeps them so, never a timestamp's display form."""
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  things:\n    topic: mongo1.inventory.things\n    keys: [_id]\n")
    landing, lake, oid = tmp_path / "landing", tmp_path / "lake", "65a1f0c2e4b0a1b2c3d4e5{:02x}".format
    land(landing, "mongo1.inventory.things", [
        mongo_event("c", 1, {"_id": {"$oid": oid(1)}, "when": {"$date": 1746034410610}}),
        mongo_event("c", 2, {"_id": {"$oid": oid(2)}, "when": 42}),
        mongo_event("c", 3, {"_id": {"$oid": oid(3)}, "when": "soon"}),
        mongo_event("c", 4, {"_id": {"$oid": oid(4)}, "when": {"$date": "2025-04-30T17:33:30.61Z"}})])
    assert run(capsys, config, landing, lake)[:3:2] == (0, "")
    land(landing, "mongo1.inventory.things", offset=4, lines=[
        mongo_event("c", 5, {"_id": {"$oid": oid(5)}, "when": {"$date": {"$numberLong": "1746034410610"}}}),
        mongo_event("c", 6, {"_id": {"$oid": oid(6)}, "when": {"$date": 1746034410610}})])
    code, out, err = run(capsys, config, landing, lake)
    assert (code, err, summary_line(out, "silver", "things")["inserted"]) == (0, "", "2"), out
    assert silver_rows(spark, engine, lake, "things", ("_id",)) == {
        (oid(1),): {"when": '{"$date":1746034410610}'}, (oid(2),): {"when": "42"}, (oid(3),): {"when": "soon"},
        (oid(4),): {"when": '{"$date":"2025-04-30T17:33:30.61Z"}'},
        (oid(5),): {"when": '{"$date":{"$numberLong":"1746034410610"}}'}, (oid(6),): {"when": '{"$date":1746034410610}'}}


def test_a_landing_file_waits_for_its_key_file_and_without_record_keys_a_mongodb_delete_is_quarantined(
        spark, engine, tmp_path, capsys):
    """The sink commits the values, then the keys: a value file listed alone is left for a later run, not read
    without its keys. Without `record_keys`, a MongoDB delete has no key to apply: quarantined, counted."""
    folder = "topics/mongo1.inventory.customers/partition=0"
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    (landing / folder).mkdir(parents=True)
    for name in ("+0+0000000000.json", "+0+0000000003.json"):
        shutil.copy(MONGO / folder / f"mongo1.inventory.customers{name}", landing / folder)
    code, out, err = run(capsys, FIXTURES / "tables.yaml", landing, lake, "--tables", "mongo_customers")
    assert (code, err) == (0, "")
    assert summary_line(out, "bronze", "mongo_customers")["waiting_for_keys"] == "2"
    assert summary_line(out, "bronze", "mongo_customers")["files"] == "0"
    shutil.copy(MONGO / folder / "mongo1.inventory.customers+0+0000000000.keys.json", landing / folder)
    code, out, _ = run(capsys, FIXTURES / "tables.yaml", landing, lake, "--tables", "mongo_customers")
    assert code == 0
    bronze = summary_line(out, "bronze", "mongo_customers")
    assert (bronze["files"], bronze["events"], bronze["waiting_for_keys"]) == ("1", "3", "1")
    assert sorted(silver_rows(spark, engine, lake, "mongo_customers", ("_id",))) == [(OIDS[0],), (OIDS[1],), (OIDS[2],)]
    waiting = f"{folder}/mongo1.inventory.customers+0+0000000003.json"  # its keys never land: set aside by hand
    code, out, _ = run(capsys, FIXTURES / "tables.yaml", landing, lake, "--tables", "mongo_customers", "--mode", "skip",
                       "--layers", "bronze", "--files", json.dumps([waiting]))
    assert (code, summary_line(out, "bronze", "mongo_customers")["files"]) == (0, "1")
    code, out, _ = run(capsys, FIXTURES / "tables.yaml", landing, lake, "--tables", "mongo_customers")
    assert (code, summary_line(out, "bronze", "mongo_customers")["files"]) == (0, "0")
    assert "waiting_for_keys" not in summary_line(out, "bronze", "mongo_customers")

    registry = tmp_path / "tables.yaml"
    registry.write_text("tables:\n  mongo_customers:\n    topic: mongo1.inventory.customers\n    keys: [_id]\n")
    code, out, _ = run(capsys, registry, landing, tmp_path / "lake_without_keys", "--tables", "mongo_customers")
    assert code == 0
    quarantine = engine.read(spark, Lake(str(tmp_path / "lake_without_keys")).quarantine("mongo_customers"))
    assert [(r["_line"], r["reason"]) for r in quarantine.where("_source_file LIKE '%0000000003.json'").collect()] == [
        (3, "delete_has_key: _id")]
