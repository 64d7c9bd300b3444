"""Integration: the CLI (same code path as the DAG tasks) on tmp dirs, run twice to prove idempotency,
with silver compared row for row against the source table's final state."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spark_jobs import cli
from spark_jobs.config import load_registry
from spark_jobs.generate import PROFILES, Options, generate
from spark_jobs.state import Lake, row_count

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "debezium"
DEMO_CONFIG = str(ROOT / "include" / "tables.yaml")


def run(capsys, config, landing, lake, *extra):
    code = cli.main(["run", "--config", str(config), "--landing", str(landing), "--lake", str(lake), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def summary_line(out: str, layer: str, table: str) -> dict[str, str]:
    for line in out.splitlines():
        parts = line.split()
        if parts[:2] == [layer, table]:
            return dict(p.split("=", 1) for p in parts[2:] if "=" in p)
    raise AssertionError(f"no {layer} {table} line in:\n{out}")


def silver_rows(spark, engine, lake, table, keys):
    df = engine.read(spark, Lake(str(lake)).silver(table))
    return {tuple(r[k] for k in keys): {c: r[c] for c in df.columns if not c.startswith("_")} for r in df.collect()}


def expected_rows(topic, final_rows):
    """The source's final state as silver shows it: logical types with the envelope, JSON types without."""
    profile = PROFILES[topic]
    if profile.envelope:
        return final_rows
    return {k: {c.name: c.encode(row[c.name]) for c in profile.columns} for k, row in final_rows.items()}


def test_demo_tables_equal_the_source_state_and_a_rerun_changes_nothing(spark, engine, tmp_path, capsys):
    registry = load_registry(DEMO_CONFIG)
    tables = ["customers", "products", "actor", "film_actor"]
    generated = generate(registry.select(tables), tmp_path / "landing",
                         Options(rows=40, changes=120, records_per_file=40, seed=11))
    args = ("--tables", ",".join(tables), "--models", "customers_by_state,products_by_weight")
    code, out, err = run(capsys, DEMO_CONFIG, tmp_path / "landing", tmp_path / "lake", *args)
    assert (code, err) == (0, "")
    lake = Lake(str(tmp_path / "lake"))
    for g in generated:
        keys = registry.tables[g.table].keys
        assert silver_rows(spark, engine, tmp_path / "lake", g.table, keys) == expected_rows(g.topic, g.final_rows)
        bronze = summary_line(out, "bronze", g.table)
        assert (int(bronze["events"]), int(bronze["tombstones"]), bronze["gate"]) == (g.events, g.tombstones, "passed")
        assert row_count(lake.bronze(g.table)) == g.events
        assert summary_line(out, "silver", g.table)["gate"] == "passed"
    by_state = engine.read(spark, lake.gold("customers_by_state"))
    customers = next(g for g in generated if g.table == "customers").final_rows.values()
    assert {r["state"]: r["customers"] for r in by_state.collect()} == {
        s: sum(1 for c in customers if c["state"] == s) for s in {c["state"] for c in customers}}

    versions = {t: engine.version(lake.silver(t)) for t in tables}
    code, out, err = run(capsys, DEMO_CONFIG, tmp_path / "landing", tmp_path / "lake", *args)
    assert (code, err) == (0, "")
    for t in tables:
        assert (summary_line(out, "bronze", t)["files"], summary_line(out, "bronze", t)["recovered_files"]) == ("0", "0")
        assert summary_line(out, "silver", t)["events"] == "0"
        assert engine.version(lake.silver(t)) == versions[t]
        assert row_count(lake.bronze(t)) == next(g.events for g in generated if g.table == t)


@pytest.mark.parametrize("source, table", [("postgres", "pg_customers"), ("mysql", "mysql_customers")])
def test_recorded_connector_output_landing_in_reverse_order_over_several_runs(spark, engine, tmp_path, capsys, source, table):
    """PostgreSQL events without the schema envelope and MySQL events with it: snapshot, inserts, updates,
    deletes with tombstones, a primary-key change, a re-insert, ts_ms going backwards, a binlog rotation."""
    files = sorted((FIXTURES / source).rglob("*.json"), reverse=True)
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    for f in files:  # newest file first, one run per file
        target = landing / f.relative_to(FIXTURES / source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, target)
        code, out, err = run(capsys, FIXTURES / "tables.yaml", landing, lake, "--tables", table)
        assert (code, err) == (0, "")
    expected = {
        "pg_customers": {
            (1001,): {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "st@thomas.name"},
            (1004,): {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "anne@kretchmar.org"},
            (1005,): {"id": 1005, "first_name": "Jane", "last_name": "Roe-Doe", "email": "jane@roe-doe.org"},
            (1103,): {"id": 1103, "first_name": "Edward", "last_name": "Walker", "email": "ed@walker.com"},
        },
        "mysql_customers": {
            (1001,): {"id": 1001, "first_name": "Sally", "last_name": "Thomas-Walker", "email": "sally@thomas.name"},
            (1002,): {"id": 1002, "first_name": "George", "last_name": "Bailey", "email": "george@bailey.name"},
            (1003,): {"id": 1003, "first_name": "Edward", "last_name": "Walker", "email": "ed@walker.com"},
            (1004,): {"id": 1004, "first_name": "Anne Marie", "last_name": "Kretchmar", "email": "anne.marie@kretchmar.org"},
        },
    }[table]
    assert silver_rows(spark, engine, lake, table, ("id",)) == expected
    # and the same files applied in one run, in landing order, give the same table
    one_run = tmp_path / "lake_one_run"
    code, _, _ = run(capsys, FIXTURES / "tables.yaml", landing, one_run, "--tables", table)
    assert code == 0
    assert silver_rows(spark, engine, one_run, table, ("id",)) == expected


def test_bad_input_is_counted_quarantined_and_never_fatal(spark, engine, tmp_path, capsys):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders:\n    topic: shop.public.orders\n    keys: [id]\n")
    landing = tmp_path / "landing 100%"  # Spark percent-encodes such paths; no file may get lost
    folder = landing / "topics" / "shop.public.orders" / "partition=0"
    folder.mkdir(parents=True)
    src = '"source":{"connector":"postgresql","lsn":%d,"snapshot":"false","ts_ms":1}'
    (folder / "shop.public.orders+0+0000000000.json").write_text("\n".join([
        '{"before":null,"after":{"id":1,"qty":2},%s,"op":"c"}' % (src % 10),
        '{"before":null,"after":{"id":2,"qty":5},%s,"op":"c"}' % (src % 11),
        '{"before":{"id":2},"after":null,%s,"op":"d"}' % (src % 12),
        "null",
        '{"before":null,"after":null,%s,"op":"d"}' % (src % 13),   # keyless delete
        '{"before":null,"after":{"id":3, "qty":',                    # malformed JSON
        '{"id":9,"qty":1}',                                          # not a Debezium event
        '{"before":null,"after":{"id":4},%s,"op":"m"}' % (src % 14),  # unknown op
    ]) + "\n")
    (folder / "shop.public.orders+0+0000000008.json").write_text("")
    (folder / "shop.public.orders+0+0000000009.txt").write_text("hello")
    code, out, err = run(capsys, config, landing, tmp_path / "lake", "--tables", "orders")
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "orders")
    assert (bronze["files"], bronze["lines"], bronze["events"], bronze["tombstones"], bronze["empty_files"]) == (
        "3", "8", "3", "1", "1")
    quarantine = engine.read(spark, Lake(str(tmp_path / "lake")).quarantine("orders"))
    assert sorted((r["_source_file"].rsplit("+", 1)[1], r["_line"], r["reason"]) for r in quarantine.collect()) == [
        ("0000000000.json", 5, "missing_key: id"),
        ("0000000000.json", 6, "malformed_json"),
        ("0000000000.json", 7, "not_debezium: no op field"),
        ("0000000000.json", 8, "unknown_op: m"),
        ("0000000009.txt", 0, "unsupported_file: shop.public.orders+0+0000000009.txt"),
    ]
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(1,): {"id": 1, "qty": 2}}
    # a second run takes nothing twice: no new files, quarantine unchanged
    code, out, _ = run(capsys, config, landing, tmp_path / "lake", "--tables", "orders")
    assert (code, summary_line(out, "bronze", "orders")["files"]) == (0, "0")
    assert engine.read(spark, Lake(str(tmp_path / "lake")).quarantine("orders")).count() == 5


def test_config_errors_exit_2_with_one_line(tmp_path, capsys):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders:\n    topic: t\n    keys: [id]\n    colour: red\n")
    code, out, err = run(capsys, config, tmp_path, tmp_path / "lake")
    assert (code, err) == (2, "config error: table 'orders': unknown field(s) colour\n")


def test_a_run_killed_after_the_bronze_commit_does_not_ingest_twice(spark, engine, tmp_path, capsys):
    """Bronze commits its rows, then the ingest log. A run killed between the two must not make the
    next run append the same files again: bronze's own rows tell which files it already holds."""
    registry = load_registry(DEMO_CONFIG)
    generated = generate(registry.select(["actor"]), tmp_path / "landing", Options(rows=20, changes=30, seed=3, compress=True))[0]
    lake = Lake(str(tmp_path / "lake"))
    code, _, _ = run(capsys, DEMO_CONFIG, tmp_path / "landing", tmp_path / "lake", "--tables", "actor", "--layers", "bronze")
    assert code == 0
    shutil.rmtree(lake.ingest_log("actor"))  # the log commit never happened
    code, out, err = run(capsys, DEMO_CONFIG, tmp_path / "landing", tmp_path / "lake", "--tables", "actor",
                         "--layers", "bronze,silver")
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "actor")
    assert (bronze["files"], bronze["recovered_files"]) == ("0", str(len(generated.files)))
    assert row_count(lake.bronze("actor")) == generated.events
    assert silver_rows(spark, engine, tmp_path / "lake", "actor", ("actor_id",)) == expected_rows(generated.topic,
                                                                                                   generated.final_rows)


def test_truncate_empties_the_table_as_of_its_position_and_later_events_apply(spark, engine, tmp_path, capsys):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders:\n    topic: shop.public.orders\n    keys: [id]\n")
    folder = tmp_path / "landing" / "topics" / "shop.public.orders" / "partition=0"
    folder.mkdir(parents=True)

    def event(op, lsn, row=None):
        source = {"connector": "postgresql", "lsn": lsn, "snapshot": "false", "ts_ms": 1}
        return json.dumps({"before": None, "after": row, "source": source, "op": op})

    def land(offset, *lines):
        (folder / f"shop.public.orders+0+{offset:010d}.json").write_text("\n".join(lines) + "\n")
        code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake", "--tables", "orders")
        assert (code, err) == (0, "")
        return out

    land(0, event("c", 10, {"id": 1, "qty": 1}), event("c", 11, {"id": 2, "qty": 1}))
    # one batch: a truncate at 20 between older and newer events
    out = land(2, event("u", 15, {"id": 1, "qty": 2}), event("t", 20), event("c", 21, {"id": 3, "qty": 1}),
               event("u", 19, {"id": 2, "qty": 9}))
    silver = summary_line(out, "silver", "orders")
    assert (silver["truncates"], silver["deleted"], silver["inserted"], silver["stale_ignored"]) == ("1", "2", "1", "2")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(3,): {"id": 3, "qty": 1}}
    # a late event from before the truncate never comes back; a newer one applies
    out = land(6, event("u", 12, {"id": 1, "qty": 5}), event("c", 22, {"id": 4, "qty": 1}))
    silver = summary_line(out, "silver", "orders")
    assert (silver["stale_ignored"], silver["inserted"]) == ("1", "1")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {
        (3,): {"id": 3, "qty": 1}, (4,): {"id": 4, "qty": 1}}
