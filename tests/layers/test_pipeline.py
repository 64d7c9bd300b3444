"""Integration: the CLI (same code path as the DAG tasks) on tmp dirs, run twice to prove idempotency,
with silver compared row for row against the source table's final state."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from spark_jobs.delta.reads import row_count
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.registry import load_registry
from tests.support import (
    DEMO_CONFIG,
    change_event,
    expected_rows,
    land,
    planner_run,
    published_summaries,
    run,
    silver_rows,
    summary_line,
)


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

    assert summary_line(out, "gold", "customers_by_state")["published"] == "True"  # what announces its asset
    first_run = re.search(r"^run (\S+):", out, re.MULTILINE).group(1)

    versions = {t: engine.version(lake.silver(t)) for t in tables}
    code, out, err = run(capsys, DEMO_CONFIG, tmp_path / "landing", tmp_path / "lake", *args)
    assert (code, err) == (0, "")
    assert "published" not in summary_line(out, "gold", "customers_by_state")  # nothing new: no asset event
    for t in tables:
        assert (summary_line(out, "bronze", t)["files"], summary_line(out, "bronze", t)["recovered_files"]) == ("0", "0")
        assert summary_line(out, "silver", t)["events"] == "0"
        assert engine.version(lake.silver(t)) == versions[t]
        assert row_count(lake.bronze(t)) == next(g.events for g in generated if g.table == t)
    # a retry of the run that published (its sources unchanged since) still says it did: its task announces it
    code, out, err = run(capsys, DEMO_CONFIG, tmp_path / "landing", tmp_path / "lake", "--layers", "gold", "--models",
                         "customers_by_state", "--run-id", first_run)
    assert (code, err) == (0, "")
    assert summary_line(out, "gold", "customers_by_state")["gate"].startswith("skipped")
    assert summary_line(out, "gold", "customers_by_state")["published"] == "True"


@pytest.mark.parametrize("own_plan", [False, True], ids=["pass", "own-plan"])
def test_a_redelivered_event_counts_as_a_duplicate_and_a_late_older_one_as_stale(spark, engine, tmp_path, capsys,
                                                                                 monkeypatch, own_plan):
    """One batch holding an exact redelivery of the event silver applied last for a key and an event older than
    another key's row: the first is `duplicates_dropped`, the second `stale_ignored`, in the run line, the batch's
    report and the event log alike; silver is as the source left it."""
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders:\n    topic: shop.public.orders\n    keys: [id]\n")
    landing, lake, runs = tmp_path / "landing", tmp_path / "lake", planner_run(monkeypatch, own_plan)
    applied = change_event("u", 12, before={"id": 2, "qty": 1}, after={"id": 2, "qty": 2})
    land(landing, "shop.public.orders", [change_event("c", 10, after={"id": 1, "qty": 1}),
                                         change_event("c", 11, after={"id": 2, "qty": 1}), applied])
    assert runs(capsys, config, landing, lake)[:3:2] == (0, "")
    land(landing, "shop.public.orders", [applied, change_event("u", 9, before={"id": 1, "qty": 0}, after={"id": 1, "qty": 0}),
                                         change_event("c", 13, after={"id": 3, "qty": 1})], offset=3)
    code, out, err = runs(capsys, config, landing, lake)
    assert (code, err) == (0, ""), out
    counted = ("events", "duplicates_dropped", "superseded_in_batch", "stale_ignored", "inserted", "updated")
    expected = {"events": 3, "duplicates_dropped": 1, "superseded_in_batch": 0, "stale_ignored": 1, "inserted": 1,
                "updated": 0}
    line = summary_line(out, "silver", "orders")
    assert {c: int(line[c]) for c in counted} == expected, line
    assert {c: published_summaries(lake, "orders", "silver")[-1][c] for c in counted} == expected
    logged = engine.read(spark, Lake(str(lake)).event_log).where("kind = 'step' AND layer = 'silver'")
    newest = logged.orderBy("published_at", ascending=False).first()
    assert {c: json.loads(newest["summary"])[c] for c in counted} == expected  # the summary it logged
    assert silver_rows(spark, engine, lake, "orders", ("id",)) == {
        (1,): {"id": 1, "qty": 1}, (2,): {"id": 2, "qty": 2}, (3,): {"id": 3, "qty": 1}}


def test_bad_input_is_counted_quarantined_and_never_fatal(spark, engine, tmp_path, capsys):
    config = tmp_path / "tables.yaml"
    # every kind of bad line in one small batch: allow any share quarantined (the default is 5%)
    config.write_text("quality: {max_quarantined: 100%}\ntables:\n  orders:\n    topic: shop.public.orders\n    keys: [id]\n")
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
    assert (bronze["tombstones_matched"], bronze["quarantined_share"], bronze["gate"]) == (
        "1", "0.555556", "passed-with-warnings")
    quarantine = engine.read(spark, Lake(str(tmp_path / "lake")).quarantine("orders"))
    assert sorted((r["_source_file"].rsplit("+", 1)[1], r["_line"], r["reason"]) for r in quarantine.collect()) == [
        ("0000000000.json", 5, "delete_has_key: id"),
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

    def event(op, lsn, row=None):
        return change_event(op, lsn, after=row)

    def land_and_run(offset, *lines):
        land(tmp_path / "landing", "shop.public.orders", list(lines), offset)
        code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake", "--tables", "orders")
        assert (code, err) == (0, "")
        return out

    land_and_run(0, event("c", 10, {"id": 1, "qty": 1}), event("c", 11, {"id": 2, "qty": 1}))
    # one batch: a truncate at 20 between older and newer events; a delete after it of a key live before it finds no
    # row (the truncate removed it): the ledger records it, and the gate expects no row removed for it
    out = land_and_run(2, event("u", 15, {"id": 1, "qty": 2}), event("t", 20), event("c", 21, {"id": 3, "qty": 1}),
                       event("u", 19, {"id": 2, "qty": 9}), change_event("d", 23, before={"id": 2}))
    silver = summary_line(out, "silver", "orders")
    assert (silver["truncates"], silver["deleted"], silver["inserted"], silver["stale_ignored"]) == ("1", "2", "1", "2")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(3,): {"id": 3, "qty": 1}}
    # a late event from before the truncate never comes back; a newer one applies
    out = land_and_run(6, event("u", 12, {"id": 1, "qty": 5}), event("c", 22, {"id": 4, "qty": 1}))
    silver = summary_line(out, "silver", "orders")
    assert (silver["stale_ignored"], silver["inserted"]) == ("1", "1")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {
        (3,): {"id": 3, "qty": 1}, (4,): {"id": 4, "qty": 1}}


def test_every_landing_format_reaches_silver_with_its_types(spark, engine, tmp_path, capsys):
    """Flattened JSON (ExtractNewRecordState, rewrite deletes) gzip-compressed in the time-based
    partitioner's folders; Parquet with the nested envelope; flattened Parquet. Each gives the source state."""
    from decimal import Decimal

    config = tmp_path / "tables.yaml"
    config.write_text("quality: {max_quarantined: 50%}\ntables:\n"  # whole files are quarantined below
                      "  flat_json: {topic: s.public.flat_json, keys: [id]}\n"
                      "  nested_parquet: {topic: s.public.nested_parquet, keys: [id], format: parquet}\n"
                      "  flat_parquet: {topic: s.inv.flat_parquet, keys: [id]}\n")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    land_flat_json(landing)
    day = land_nested_parquet(landing)
    land_flat_parquet(landing)

    code, out, err = run(capsys, config, landing, lake)
    assert (code, err) == (0, "")
    assert silver_rows(spark, engine, lake, "flat_json", ("id",)) == {(1,): {"id": 1, "v": "b"}}
    assert silver_rows(spark, engine, lake, "nested_parquet", ("id",)) == {
        (1,): {"id": 1, "price": Decimal("99999999.99"), "day": day}}
    assert engine.read(spark, Lake(str(lake)).silver("nested_parquet")).schema["price"].dataType.simpleString() == "decimal(10,2)"
    assert silver_rows(spark, engine, lake, "flat_parquet", ("id",)) == {(8,): {"id": 8, "name": "y"}}
    assert summary_line(out, "bronze", "flat_json")["tombstones"] == "1"
    # files that are not of the table's format, or cannot be read, are quarantined whole, with the reason
    quarantine = engine.read(spark, Lake(str(lake)).quarantine("nested_parquet")).collect()
    assert [(r["_source_file"].rsplit("/", 1)[1], r["reason"]) for r in quarantine] == [
        ("s.public.nested_parquet+0+0000000003.json", "unsupported_file: s.public.nested_parquet+0+0000000003.json")]
    quarantine = engine.read(spark, Lake(str(lake)).quarantine("flat_parquet")).collect()
    assert [r["reason"] for r in quarantine] == [
        "unreadable_file: s.inv.flat_parquet+1+0000000003.parquet: not a valid Parquet file"]


def land_flat_json(landing):
    """Flattened records, gzip, in the time-based partitioner's folders; the later file sorts first."""
    import gzip

    def flat(op, lsn, id, v, deleted="false"):
        return json.dumps({"id": id, "v": v, "__op": op, "__lsn": lsn, "__deleted": deleted, "__source_ts_ms": 1})

    hour = landing / "topics" / "s.public.flat_json" / "year=2026" / "month=11" / "day=22" / "hour=07"
    hour.mkdir(parents=True)
    (hour / "s.public.flat_json+0+0000000002.json.gz").write_bytes(gzip.compress("\n".join(
        [flat("u", 12, 1, "b"), flat("d", 13, 2, "x", "true"), "null"]).encode() + b"\n"))
    (hour / "s.public.flat_json+0+0000000000.json.gz").write_bytes(gzip.compress("\n".join(
        [flat("c", 10, 1, "a"), flat("c", 11, 2, "x")]).encode()))


def land_nested_parquet(landing):
    """The nested envelope as Parquet (typed decimal and date), and a JSON file where Parquet is expected."""
    import datetime as dt
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    row = pa.struct([("id", pa.int64()), ("price", pa.decimal128(10, 2)), ("day", pa.date32())])
    source = pa.struct([("connector", pa.string()), ("lsn", pa.int64()), ("snapshot", pa.string())])
    envelope = pa.schema([("before", row), ("after", row), ("source", source), ("op", pa.string()), ("ts_ms", pa.int64())])
    folder = landing / "topics" / "s.public.nested_parquet" / "partition=0"
    folder.mkdir(parents=True)
    day = dt.date(2026, 11, 22)
    pq.write_table(pa.Table.from_pylist([
        {"before": None, "after": {"id": 1, "price": Decimal("1.10"), "day": day}, "op": "r",
         "source": {"connector": "postgresql", "lsn": 5, "snapshot": "last"}},
        {"before": None, "after": {"id": 1, "price": Decimal("99999999.99"), "day": day}, "op": "u",
         "source": {"connector": "postgresql", "lsn": 6, "snapshot": "false"}},
        {"before": {"id": 2, "price": None, "day": None}, "after": None, "op": "d",
         "source": {"connector": "postgresql", "lsn": 7, "snapshot": "false"}},
    ], schema=envelope), folder / "s.public.nested_parquet+0+0000000000.snappy.parquet")
    (folder / "s.public.nested_parquet+0+0000000003.json").write_text("not parquet, and format is parquet\n")
    return day


def land_flat_parquet(landing):
    """Flattened MySQL records as Parquet, and a file cut short."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = landing / "topics" / "s.inv.flat_parquet" / "partition=1"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([
        {"id": 7, "name": "x", "__op": "c", "__deleted": "false", "__file": "bin.000001", "__pos": 4, "__row": 0},
        {"id": 8, "name": "y", "__op": "c", "__deleted": "false", "__file": "bin.000001", "__pos": 4, "__row": 1},
        {"id": 7, "name": "x", "__op": "d", "__deleted": "true", "__file": "bin.000002", "__pos": 1, "__row": 0},
    ]), folder / "s.inv.flat_parquet+1+0000000000.parquet")
    (folder / "s.inv.flat_parquet+1+0000000003.parquet").write_bytes(b"PAR1 truncated upload")


def _orders(tmp_path, capsys, options=""):
    """A one-table registry (`orders`, key id, plus `options`) and `land_and_run(offset, *lines)`, which writes a
    landing file and runs the pipeline on it; returns (land_and_run, lake)."""
    config = tmp_path / "tables.yaml"
    config.write_text(f"tables:\n  orders: {{topic: shop.public.orders, keys: [id]{options}}}\n")
    landing, lake = tmp_path / "landing", tmp_path / "lake"

    def land_and_run(offset, *lines):
        land(landing, "shop.public.orders", list(lines), offset)
        code, out, err = run(capsys, config, landing, lake)
        assert (code, err) == (0, "")
        return out

    return land_and_run, lake


def test_history_keeps_every_version_in_order_whatever_the_arrival(spark, engine, tmp_path, capsys):
    """SCD type 2 under late events, a primary-key change, a keyless delete and a truncate."""
    land_and_run, lake = _orders(tmp_path, capsys, ", history: true, quality: {max_quarantined: 50%}")

    land_and_run(0, change_event("c", 10, after={"id": 1, "v": "a"}), change_event("c", 11, after={"id": 2, "v": "x"}))
    # the key of row 1 changes from 1 to 3 in one transaction: a delete of the old key, a create of the new one
    land_and_run(2, change_event("u", 14, after={"id": 1, "v": "b"}), change_event("d", 15, before={"id": 2}), "null",
         change_event("d", 16, before={"id": 1}), "null", change_event("c", 16, after={"id": 3, "v": "b"}))
    assert silver_rows(spark, engine, lake, "orders", ("id",)) == {(3,): {"id": 3, "v": "b"}}
    out = land_and_run(8, change_event("u", 12, after={"id": 1, "v": "late"}),  # older than its delete: history only
               change_event("d", 13),  # keyless delete: quarantined with the missing key named, in the summary
               change_event("t", 20), change_event("c", 21, after={"id": 4, "v": "d"}))
    silver = summary_line(out, "silver", "orders")
    assert summary_line(out, "bronze", "orders")["quarantined"] == "delete_has_key:1"
    assert (silver["stale_ignored"], silver["truncates"], silver["inserted"], silver["history_rows"]) == ("1", "1", "1", "2")
    assert silver_rows(spark, engine, lake, "orders", ("id",)) == {(4,): {"id": 4, "v": "d"}}
    quarantine = engine.read(spark, Lake(str(lake)).quarantine("orders")).collect()
    assert [(r["layer"], r["reason"]) for r in quarantine] == [("bronze", "delete_has_key: id")]

    def lsn(seq):
        return None if seq is None else int(seq.split("|")[0])

    history = engine.read(spark, Lake(str(lake)).history("orders")).collect()
    got = sorted((r["id"], lsn(r["_seq"]), r["_op"], r["v"], lsn(r["_valid_to"]), r["_is_current"]) for r in history)
    assert got == [
        (1, 10, "c", "a", 12, False),
        (1, 12, "u", "late", 14, False),
        (1, 14, "u", "b", 16, False),
        (1, 16, "d", None, None, False),
        (2, 11, "c", "x", 15, False),
        (2, 15, "d", None, None, False),
        (3, 16, "c", "b", 20, False),  # closed by the truncate
        (4, 21, "c", "d", None, True),
    ]
    # every file re-delivered under new offsets changes nothing
    lines = [p.read_text().splitlines() for p in sorted((tmp_path / "landing").glob("topics/*/*/*.json"))]
    silver = summary_line(land_and_run(100, *[line for chunk in lines for line in chunk]), "silver", "orders")
    assert (silver["inserted"], silver["updated"], silver["deleted"], silver["history_rows"]) == ("0", "0", "0", "0")
    assert engine.read(spark, Lake(str(lake)).history("orders")).count() == len(history)


def test_tombstones_are_kept_by_default_and_expire_after_the_configured_retention(spark, engine, tmp_path, capsys):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n"
                      "  kept: {topic: shop.public.kept, keys: [id]}\n"
                      "  expiring: {topic: shop.public.expiring, keys: [id], tombstone_retention: 1d}\n")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    day_ms = 86_400_000

    def land_and_run(offset, *lines):
        for topic in ("shop.public.kept", "shop.public.expiring"):
            land(landing, topic, list(lines), offset)
        code, out, err = run(capsys, config, landing, lake)
        assert (code, err) == (0, "")
        return out

    import time
    now_ms = int(time.time() * 1000)
    out = land_and_run(0, change_event("c", 10, after={"id": 1}, ts_ms=now_ms - 9 * day_ms),
               change_event("d", 12, before={"id": 1}, ts_ms=now_ms - 8 * day_ms),
               change_event("c", 20, after={"id": 2}, ts_ms=now_ms), change_event("d", 22, before={"id": 2}, ts_ms=now_ms))
    assert summary_line(out, "silver", "kept")["tombstones_expired"] == "0"
    assert summary_line(out, "silver", "expiring")["tombstones_expired"] == "1"  # the 8-day-old delete only
    # changes older than the deletes arrive late: kept tombstones stop both; an expired one no longer can
    land_and_run(4, change_event("u", 11, after={"id": 1}, ts_ms=now_ms - 9 * day_ms),
                 change_event("u", 21, after={"id": 2}, ts_ms=now_ms))
    assert silver_rows(spark, engine, lake, "kept", ("id",)) == {}
    assert silver_rows(spark, engine, lake, "expiring", ("id",)) == {(1,): {"id": 1}}


def test_added_columns_flow_in_and_unsafe_type_changes_are_quarantined(spark, engine, tmp_path, capsys):
    land_and_run, lake = _orders(tmp_path, capsys, ", quality: {max_quarantined: 100%}")

    land_and_run(0, change_event("c", 10, after={"id": 1, "qty": 1}), change_event("c", 11, after={"id": 2, "qty": 1}))
    out = land_and_run(2, change_event("u", 12, after={"id": 1, "qty": 3, "note": "gift"}),  # a column added at the source
               change_event("u", 13, after={"id": 2, "qty": "many"}),  # bigint column, now text: not castable
               change_event("c", 14, after={"id": 3, "qty": 2.5}))  # a double would lose its fraction in bigint
    assert summary_line(out, "silver", "orders")["quarantined"] == "incompatible_type:2"
    assert silver_rows(spark, engine, lake, "orders", ("id",)) == {
        (1,): {"id": 1, "qty": 3, "note": "gift"}, (2,): {"id": 2, "qty": 1, "note": None}}
    quarantine = engine.read(spark, Lake(str(lake)).quarantine("orders")).orderBy("_line").collect()
    assert [(r["_line"], r["reason"]) for r in quarantine] == [
        # the batch's values of qty are text, a fraction and an integer: each read as silver's bigint, or refused
        (2, "incompatible_type: qty (not bigint)"), (3, "incompatible_type: qty (not bigint)")]


def test_one_tables_failed_gate_leaves_the_others_of_the_run_published(spark, engine, tmp_path, capsys):
    """A run over a whole database: one table's bronze gate refuses its batch (a `fail` expectation on its raw
    events), another's silver gate fails (a `fail` expectation on rows); the others, before and after them,
    publish as if alone, and the run fails naming both. The failed tables hold nothing of the batch."""
    config = tmp_path / "tables.yaml"
    config.write_text(
        "tables:\n  good: {topic: shop.public.good, keys: [id]}\n"
        "  bad_lines:\n    topic: shop.public.bad_lines\n    keys: [id]\n    expectations:\n"
        "      - expect_column_values_to_be_in_set: {column: op, value_set: [c, u, d]}\n        layer: bronze\n"
        "        action: fail\n"
        "  bad_rows:\n    topic: shop.public.bad_rows\n    keys: [id]\n    expectations:\n"
        "      - expect_column_values_to_be_between: {column: qty, min_value: 0}\n        action: fail\n"
        "  later: {topic: shop.public.later, keys: [id]}\n")  # after the failing ones: the run goes on to it
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    batches = {"good": [change_event("c", 10, after={"id": 1, "qty": 1})],
               "bad_lines": [change_event("c", 10, after={"id": 1, "qty": 1}), change_event("r", 11, after={"id": 2, "qty": 1})],
               "bad_rows": [change_event("c", 10, after={"id": 1, "qty": 1}), change_event("c", 11, after={"id": 2, "qty": -1})],
               "later": [change_event("c", 10, after={"id": 5, "qty": 2}), change_event("d", 11, before={"id": 5})]}
    for table, lines in batches.items():
        land(landing, f"shop.public.{table}", lines)

    code, out, err = run(capsys, config, landing, lake)

    assert code == 1
    assert [" ".join(w for w in line.split() if w.startswith(("table=", "layer="))) for line in err.strip().splitlines()] == [
        "table=bad_rows layer=silver", "table=bad_lines layer=bronze"]
    assert silver_rows(spark, engine, lake, "good", ("id",)) == {(1,): {"id": 1, "qty": 1}}
    assert silver_rows(spark, engine, lake, "later", ("id",)) == {}
    assert engine.version(Lake(str(lake)).silver("later")) is not None
    assert summary_line(out, "silver", "later")["gate"] == "passed"
    lake_paths = Lake(str(lake))
    assert engine.version(lake_paths.bronze("bad_lines")) is None  # refused: nothing of the batch
    assert silver_rows(spark, engine, lake, "bad_rows", ("id",)) == {}  # the batch's commits undone
    # the run's report holds each table's verdict
    verdicts = {(s["table"], s["layer"]): s["gate"] for s in
                (json.loads(p.read_text()) for p in (lake / "reports" / "runs").glob("*/*.json"))}
    assert {k: v for k, v in verdicts.items() if v in ("failed", "passed")} == {
        ("good", "bronze"): "passed", ("good", "silver"): "passed", ("later", "bronze"): "passed",
        ("later", "silver"): "passed", ("bad_lines", "bronze"): "failed", ("bad_rows", "bronze"): "passed",
        ("bad_rows", "silver"): "failed"}


def test_a_cycle_with_nothing_new_costs_no_spark_job_and_leaves_no_report(spark, tmp_path, capsys):
    """Work follows change: after a run took every table's files, a run over all of them with nothing landed
    asks Spark nothing (each table's listing, ingest log and silver progress are read without it) and
    writes nothing to the reports; each table's line says it was skipped."""
    config = tmp_path / "tables.yaml"
    names = ("a", "b", "c")
    config.write_text("tables:\n" + "".join(f"  {n}: {{topic: shop.public.{n}, keys: [id]}}\n" for n in names))
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    for n in names:
        land(landing, f"shop.public.{n}", [change_event("c", 10, after={"id": 1})])
    assert run(capsys, config, landing, lake)[:1] == (0,)
    runs = sorted(p.name for p in (lake / "reports" / "runs").iterdir())

    spark.sparkContext.setJobGroup("idle-cycle", "a cycle with nothing new")
    try:
        code, out, err = run(capsys, config, landing, lake)
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup("idle-cycle")
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert (code, err, list(jobs)) == (0, "", [])
    assert {(layer, n): summary_line(out, layer, n)["gate"] for layer in ("bronze", "silver") for n in names} == {
        **{("bronze", n): "skipped" for n in names}, **{("silver", n): "skipped" for n in names}}
    assert sorted(p.name for p in (lake / "reports" / "runs").iterdir()) == runs
