"""Data-quality gates: expectations with warn/quarantine/fail, the quarantine threshold, the tombstone
checks and write-audit-publish, through the CLI (the DAG tasks' code path) and on the pure envelope."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from spark_jobs import cli
from spark_jobs.debezium import envelope
from spark_jobs.errors import GateFailed
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.layers import gold
from spark_jobs.quality import docs_assets
from spark_jobs.registry import load_registry
from tests.support import (
    DEMO_CONFIG,
    change_event,
    data_docs_text,
    expected_rows,
    land,
    published_summaries,
    run,
    silver_rows,
    summary_line,
)

ORDERS = "shop.public.orders"


def _config(tmp_path, quality=""):
    path = tmp_path / "tables.yaml"
    path.write_text(f"tables:\n  orders: {{topic: shop.public.orders, keys: [id]{quality}}}\n")
    return path


def _run(capsys, tmp_path, config, *extra):
    return run(capsys, config, tmp_path / "landing", tmp_path / "lake", *extra)


def test_one_keyless_delete_in_a_small_batch_is_quarantined_and_the_other_events_go_on(spark, engine, tmp_path, capsys):
    """The circuit breaker takes a share and a count: one bad event of 16 (6.25%, over the default 5%) is
    quarantined and the 15 others applied; two of 16 stop the table; `min_quarantined_to_fail: 1` makes
    any share over the limit stop it."""
    config = _config(tmp_path)
    land(tmp_path / "landing", ORDERS, offset=0,
         lines=[*[change_event("c", 10 + i, after={"id": i, "v": "x"}) for i in range(15)],
                change_event("d", 30, before={"v": "no key"})])
    code, out, err = _run(capsys, tmp_path, config)
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "orders")
    assert (bronze["events"], bronze["quarantined"], bronze["quarantined_share"], bronze["gate"]) == (
        "15", "delete_has_key:1", "0.0625", "passed-with-warnings")
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(i,) for i in range(15)]
    bronze_checks = published_summaries(tmp_path / "lake", "orders", "bronze")[-1]["checks"]
    finding = [c for c in bronze_checks if c["expectation"] == "max_quarantined"][0]
    assert (finding["success"], finding["observed"]) == (True, "0.0625 (max 0.05), 1 record(s) (fails from 2)")
    shutil.copytree(tmp_path / "landing", tmp_path / "first_batch")

    land(tmp_path / "landing", ORDERS, offset=16,
         lines=[*[change_event("u", 40 + i, after={"id": i, "v": "y"}) for i in range(14)],
                change_event("d", 60, before={"v": "no key"}), change_event("d", 61, before={"v": "no"})])
    code, out, err = _run(capsys, tmp_path, config)
    assert code == 1
    assert err == ("gate failed: table=orders layer=bronze expectation=max_quarantined observed=0.125 (max 0.05), "
                   "2 record(s) (fails from 2); quarantined by delete_has_key unexpected=2 of 2\n")

    strict = _config(tmp_path, ", quality: {min_quarantined_to_fail: 1}")
    code, _, err = run(capsys, strict, tmp_path / "first_batch", tmp_path / "strict_lake")
    assert code == 1 and err.startswith("gate failed: table=orders layer=bronze expectation=max_quarantined "
                                        "observed=0.0625 (max 0.05), 1 record(s) (fails from 1)")


def test_keyless_events_are_quarantined_and_a_batch_of_only_bad_events_fails_leaving_silver_as_it_was(
        spark, engine, tmp_path, capsys):
    config = _config(tmp_path)
    # 40 good events and 2 without their key (4.8% of the batch, under the default 5%)
    good = [change_event("c", 100 + i, after={"id": i, "v": f"v{i}"}) for i in range(40)]
    land(tmp_path / "landing", ORDERS, offset=0, lines=[*good[:20], change_event("c", 90, after={"v": "no key"}), *good[20:],
                                  change_event("d", 91, before={"v": "no key"})])
    code, out, err = _run(capsys, tmp_path, config)
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "orders")
    assert (bronze["events"], bronze["quarantined"], bronze["quarantined_share"], bronze["gate"]) == (
        "40", "delete_has_key:1,event_has_key:1", "0.047619", "passed-with-warnings")
    quarantine = engine.read(spark, Lake(str(tmp_path / "lake")).quarantine("orders")).orderBy("_line").collect()
    assert [(r["_line"], r["reason"], r["layer"]) for r in quarantine] == [
        (21, "event_has_key: id", "bronze"), (42, "delete_has_key: id", "bronze")]
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(i,) for i in range(40)]
    silver_version = engine.version(Lake(str(tmp_path / "lake")).silver("orders"))

    # a batch where every event is bad: one line names table, layer, expectation and counts; nothing published
    land(tmp_path / "landing", ORDERS, offset=42, lines=[change_event("u", 200 + i, after={"v": "no key"}) for i in range(3)])
    code, out, err = _run(capsys, tmp_path, config)
    assert code == 1
    assert err == ("gate failed: table=orders layer=bronze expectation=max_quarantined observed=1.0 (max 0.05), "
                   "3 record(s) (fails from 2); "
                   "quarantined by event_has_key unexpected=3 of 3\n")
    assert engine.version(Lake(str(tmp_path / "lake")).silver("orders")) == silver_version
    assert engine.read(spark, Lake(str(tmp_path / "lake")).quarantine("orders")).count() == 5
    failed = published_summaries(tmp_path / "lake", "orders", "bronze")[-1]
    assert (failed["gate"], failed["quarantined"], failed["error"]) == ("failed", {"event_has_key: id": 3}, err.strip())
    assert [(c["expectation"], c["action"], c["success"]) for c in failed["checks"]][-1] == (
        "max_quarantined", "fail", False)
    docs = data_docs_text(Path(failed["docs"]))  # the bronze pass's site (orders' small batch: a pass of one)
    assert "bronze.audit." in docs
    # the files were not taken: the next run meets them again (and fails again) until they are fixed
    code, _, _ = _run(capsys, tmp_path, config)
    assert code == 1
    assert engine.read(spark, Lake(str(tmp_path / "lake")).quarantine("orders")).count() == 5


def test_tombstone_checks_pass_on_a_clean_batch_and_report_a_violating_one(spark, engine, tmp_path, capsys):
    config = _config(tmp_path, ", quality: {max_quarantined: 50%, checks: {tombstone_follows_delete: warn}}")
    land(tmp_path / "landing", ORDERS, offset=0, lines=[change_event("c", 10 + i, after={"id": i, "v": "a"}) for i in (1, 2, 3)])
    assert _run(capsys, tmp_path, config)[0] == 0
    # clean: each delete has its key, and its tombstone follows it
    land(tmp_path / "landing", ORDERS, offset=3, lines=[
        change_event("d", 20, before={"id": 1}), "null",  # removes a live row
        change_event("d", 21, before={"id": 9}),          # a key silver never had: recorded in the ledger
        change_event("d", 5, before={"id": 3}),           # older than key 3's insert: stale
        change_event("d", 22, before={"id": 2}), "null",
        change_event("c", 23, after={"id": 2, "v": "again"})])  # supersedes the delete before it
    code, out, err = _run(capsys, tmp_path, config)
    assert (code, err) == (0, "")
    bronze, silver = summary_line(out, "bronze", "orders"), summary_line(out, "silver", "orders")
    assert (bronze["tombstones"], bronze["tombstones_matched"], bronze["tombstones_unmatched"], bronze["gate"]) == (
        "2", "2", "0", "passed")
    assert silver["gate"] == "passed"
    report = published_summaries(tmp_path / "lake", "orders", "silver")[-1]
    assert report["deletes"] == {"received": 4, "before_truncate": 0, "superseded": 1, "stale": 1, "absent": 1,
                                 "removed": 1}
    assert (silver["inserted"], silver["updated"], silver["deleted"], silver["stale_ignored"]) == ("0", "1", "1", "1")
    assert all(c["success"] for c in report["checks"])
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(2,), (3,)]

    # violating: a delete without its key, and a tombstone opening a file after a non-delete record
    land(tmp_path / "landing", ORDERS, offset=10,
         lines=["null", change_event("d", 20, before={"v": "x"}), change_event("d", 21, before={"id": 3}),
                "null"])
    code, out, err = _run(capsys, tmp_path, config)
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "orders")
    assert (bronze["quarantined"], bronze["tombstones_matched"], bronze["tombstones_unmatched"], bronze["gate"],
            bronze["warnings"]) == ("delete_has_key:1", "1", "1", "passed-with-warnings", "2")
    checks = {c["expectation"]: c for c in published_summaries(tmp_path / "lake", "orders", "bronze")[-1]["checks"]}
    assert (checks["delete_has_key"]["unexpected"], checks["tombstone_follows_delete"]["unexpected"]) == (1, 1)
    # the same violation under `fail` stops the batch
    strict = _config(tmp_path, ", quality: {max_quarantined: 50%, checks: {tombstone_follows_delete: fail}}")
    land(tmp_path / "landing", ORDERS, offset=14, lines=["null"])
    code, _, err = _run(capsys, tmp_path, strict)
    assert (code, err) == (1, "gate failed: table=orders layer=bronze expectation=tombstone_follows_delete "
                              "unexpected=1 of 1\n")


# the silver pass's batch, and (history keeps its own plan) a table's own: each reads its merged rows back on the driver
@pytest.mark.parametrize("settings", ["", ", history: true"], ids=["pass", "own plan"])
def test_a_merge_that_loses_deletes_fails_the_gate_and_silver_is_restored(spark, engine, tmp_path, capsys, monkeypatch,
                                                                          settings):
    config = _config(tmp_path, settings)
    land(tmp_path / "landing", ORDERS, offset=0, lines=[change_event("c", 10 + i, after={"id": i, "v": "a"}) for i in range(3)])
    assert _run(capsys, tmp_path, config)[0] == 0
    before = silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))

    import spark_jobs.delta.engines as delta

    make_engine = delta.make_engine

    def losing_deletes(session):  # a broken engine: the silver merge forgets its delete clause
        real = make_engine(session)
        merge = real.merge
        real.merge = lambda df, path, spec, *a, **kw: merge(df, path, replace(spec, delete_when=None) if "/silver/" in path
                                                            else spec, *a, **kw)
        return real

    monkeypatch.setattr(delta, "make_engine", losing_deletes)
    land(tmp_path / "landing", ORDERS, offset=3,
         lines=[change_event("d", 20, before={"id": 0}), change_event("u", 21, after={"id": 1, "v": "b"})])
    code, _, err = _run(capsys, tmp_path, config)
    assert (code, err) == (1, "gate failed: table=orders layer=silver expectation=deleted_keys_not_live "
                              "unexpected=1 of 1; expectation=deletes_reconcile observed=1 of 1 deletes received not "
                              "accounted for\n")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == before  # the update is rolled back too
    assert engine.read(spark, Lake(str(tmp_path / "lake")).tombstones("orders")).count() == 0
    monkeypatch.setattr(delta, "make_engine", make_engine)
    code, out, _ = _run(capsys, tmp_path, config)  # the fixed engine applies the same batch
    assert (code, summary_line(out, "silver", "orders")["gate"]) == (0, "passed")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(1,): {"id": 1, "v": "b"},
                                                                                (2,): {"id": 2, "v": "a"}}


def test_flattened_deleted_flag_must_agree_with_the_op(spark):
    lines = spark.createDataFrame([
        ("f", 1, json.dumps({"id": 1, "__op": "d", "__deleted": "true"})),
        ("f", 2, json.dumps({"id": 2, "__op": "u", "__deleted": "false"})),
        ("f", 3, json.dumps({"id": 3, "__op": "u", "__deleted": "true"})),   # disagrees
        ("f", 4, json.dumps({"id": 4, "__deleted": "true"})),               # the flag is the op: nothing to disagree
    ], "_source_file STRING, _line BIGINT, _raw STRING")
    got = envelope.classify(envelope.parse_envelope(lines, "json-flat"), ("id",)).orderBy("_line")
    assert [(r["_line"], r["_flat_op"], r["_flat_deleted"], r["_kind"], r["reason"]) for r in got.collect()] == [
        (1, "d", "true", "event", None), (2, "u", "false", "event", None),
        (3, "u", "true", "quarantine", "deleted_flag_matches_op: __deleted disagrees with __op=u"),
        (4, None, "true", "event", None)]
    kept = envelope.classify(envelope.parse_envelope(lines, "json-flat"), ("id",), frozenset())
    assert [r["_expectation"] for r in kept.orderBy("_line").collect()][2] == (
        "deleted_flag_matches_op: __deleted disagrees with __op=u")


def test_tombstones_are_matched_to_the_delete_at_the_previous_offset_of_their_partition(spark):
    def line(file, n, raw):
        return (f"topics/t/partition=0/{file}.json", n, raw)

    lines = spark.createDataFrame([
        line("t+0+0000000000", 1, change_event("d", 1, before={"id": 1})), line("t+0+0000000000", 2, "null"),
        line("t+0+0000000000", 3, change_event("c", 2, after={"id": 2})), line("t+0+0000000000", 4, "null"),
        line("t+0+0000000004", 1, "null"),  # opens a file: the record before it is in bronze, a delete
        line("t+1+0000000007", 1, "null"),  # partition 1, offset 6 is an update in bronze
    ], "_source_file STRING, _line BIGINT, _raw STRING")
    classified = envelope.classify(envelope.parse_envelope(lines), ("id",))
    earlier = spark.createDataFrame([("topics/t/partition=0/t+0+0000000003.json", 1, "d"),
                                     ("topics/t/partition=1/t+1+0000000005.json", 2, "u")],
                                    "_source_file STRING, _line BIGINT, op STRING")
    got = envelope.match_tombstones(classified, earlier).orderBy("_source_file", "_line").collect()
    assert [(r["_source_file"].rsplit("/", 1)[1], r["_line"], r["_follows_delete"]) for r in got] == [
        ("t+0+0000000000.json", 2, True), ("t+0+0000000000.json", 4, False), ("t+0+0000000004.json", 1, True),
        ("t+1+0000000007.json", 1, False)]


@pytest.mark.parametrize("quality, error", [
    ("quality: {checks: {key_unique: quarantine}}", "expectation 'key_unique' takes action warn | fail"),
    ("quality: {checks: {no_such: warn}}", "unknown expectation 'no_such' in quality.checks"),
    ("quality: {max_quarantined: 120%}", "'max_quarantined' must be a share like 5% or 0.05"),
    ("quality: {min_quarantined_to_fail: 0}", "'min_quarantined_to_fail' must be a whole number of records, 1 or more"),
    ("quality: {min_quarantined_to_fail: 2.5}", "'min_quarantined_to_fail' must be a whole number of records"),
])
def test_quality_settings_are_validated(tmp_path, quality, error):
    from spark_jobs.errors import ConfigError

    path = tmp_path / "tables.yaml"
    path.write_text(f"tables:\n  orders: {{topic: t, keys: [id], {quality}}}\n")
    with pytest.raises(ConfigError, match=error):
        load_registry(path)


def test_gold_checks_keys_row_counts_references_and_freshness(spark, engine, tmp_path):
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "by_customer.sql").write_text(
        "-- keys: customer\n-- sources: orders\nSELECT customer, count(*) AS n FROM orders GROUP BY customer\n")
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders: {topic: t, keys: [id]}\n  customers: {topic: c, keys: [id]}\n"
                      "gold:\n  by_customer:\n    row_count: {min: 1, max: 2}\n    freshness: 1h\n"
                      "    references: [{columns: [customer], table: customers, to: [id]}]\n")
    model = load_registry(config).gold["by_customer"]
    lake = Lake(str(tmp_path / "lake"))
    engine.overwrite(spark.createDataFrame([(1, 10, "1|0", 0), (2, 11, "2|0", 0), (3, 12, "3|0", 0)],
                                           "id INT, customer INT, _seq STRING, _source_ts_ms BIGINT"), lake.silver("orders"))
    engine.overwrite(spark.createDataFrame([(10,), (11,)], "id INT"), lake.silver("customers"))
    with pytest.raises(GateFailed) as failure:
        gold.gold_refresh(spark, engine, model, lake, "b1")
    assert str(failure.value).startswith(
        "gate failed: table=by_customer layer=gold expectation=row_count observed=3 (max 2); "
        "expectation=references unexpected=1 of 3; expectation=freshness observed=")
    assert engine.version(lake.gold("by_customer")) is None  # nothing published
    ok = replace(model, row_count=(1, 3), freshness_s=None)
    engine.overwrite(spark.createDataFrame([(10,), (11,), (12,)], "id INT"), lake.silver("customers"))
    summary = gold.gold_refresh(spark, engine, ok, lake, "b2")
    assert (summary.gate, summary.rows, summary.version) == ("passed", 3, 0)


def test_a_runs_models_are_gated_in_one_validation_and_a_failing_one_fails_alone(spark, engine, tmp_path, capsys,
                                                                                 monkeypatch):
    """A run's gold models ask their audits' gates, answered in one GX validation of the `gold.audit` suite for them
    all (each alone was one): one model's failing gate fails that model only, and the others publish."""
    from spark_jobs.quality import gates

    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "by_customer.sql").write_text(
        "-- keys: customer\n-- sources: orders\nSELECT customer, count(*) AS n FROM orders GROUP BY customer\n")
    (tmp_path / "gold" / "totals.sql").write_text(
        "-- keys: one\n-- sources: orders\nSELECT 1 AS one, count(*) AS n FROM orders\n")
    config = tmp_path / "tables.yaml"
    config.write_text(f"tables:\n  orders: {{topic: {ORDERS}, keys: [id]}}\n"
                      "gold:\n  by_customer:\n    row_count: {max: 1}\n  totals: {}\n")
    validated = []
    joint = gates.run_audit_gates
    monkeypatch.setattr(gates, "run_audit_gates", lambda asked, layer, *rest: validated.append(
        (layer, sorted(g.table for g in asked))) or joint(asked, layer, *rest))
    land(tmp_path / "landing", ORDERS, offset=0,
         lines=[change_event("c", 10 + i, after={"id": i, "customer": i % 2}) for i in range(4)])
    code, out, err = _run(capsys, tmp_path, config)
    assert (code, [w for w in err.split() if w.startswith("table=")]) == (1, ["table=by_customer"]), out + err
    assert ("gold", ["by_customer", "totals"]) in validated and [v for v in validated if v[0] == "gold"] == [
        ("gold", ["by_customer", "totals"])]
    lake = Lake(str(tmp_path / "lake"))
    assert engine.version(lake.gold("by_customer")) is None  # refused: nothing published
    assert [tuple(r) for r in engine.read(spark, lake.gold("totals")).collect()] == [(1, 4)]
    assert summary_line(out, "gold", "totals")["gate"] == "passed"
    assert "FAILED: gate failed: table=by_customer layer=gold expectation=row_count observed=2 (max 1)" in out, out


def test_after_a_failed_gate_a_run_may_raise_the_limit_once_or_set_the_files_aside(spark, engine, tmp_path, capsys):
    """The ways on after a failed gate without editing tables.yaml (docs/data-quality.md "Moving on after a failed
    gate"): `--max-quarantined` for one run, or `--mode skip` for the files, each counted in quarantine."""
    config = _config(tmp_path)
    land(tmp_path / "landing", ORDERS, offset=0,
         lines=[*[change_event("c", 10 + i, after={"id": i, "v": "x"}) for i in range(14)],
                change_event("d", 30, before={"v": "no key"}), change_event("d", 31, before={"v": "no"})])
    assert _run(capsys, tmp_path, config)[0] == 1  # 2 of 16 quarantined: over 5%, and 2 records
    code, out, err = _run(capsys, tmp_path, config, "--max-quarantined", "20%")
    assert (code, err) == (0, "")
    assert summary_line(out, "bronze", "orders")["gate"] == "passed-with-warnings"
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(i,) for i in range(14)]

    # the override was for that run only: the next bad batch stops the table again
    land(tmp_path / "landing", ORDERS, offset=16,
         lines=[change_event("u", 40, after={"v": "no key"}), change_event("u", 41, after={"v": "no"})])
    assert _run(capsys, tmp_path, config)[0] == 1
    bad = "topics/shop.public.orders/partition=0/shop.public.orders+0+0000000016.json"  # relative to the landing root
    code, out, err = _run(capsys, tmp_path, config, "--mode", "skip", "--layers", "bronze", "--files", json.dumps([bad]),
                          "--reason", "export bug, ticket 42")
    assert (code, err) == (0, ""), err
    assert summary_line(out, "bronze", "orders")["mode"] == "skip"
    set_aside = [(r["_source_file"], r["_line"], r["reason"]) for r in engine.read(
        spark, Lake(str(tmp_path / "lake")).quarantine("orders")).where("_line = 0").collect()]
    assert set_aside == [(bad, 0, "skipped: export bug, ticket 42")]
    code, out, err = _run(capsys, tmp_path, config)  # nothing pending: the table goes on
    assert (code, err, summary_line(out, "bronze", "orders")["files"]) == (0, "", "0")
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(i,) for i in range(14)]
    # a skip needs the files named, and only bronze
    code, _, err = _run(capsys, tmp_path, config, "--mode", "skip")
    assert code == 2 and "--mode skip sets landing files aside" in err


def test_a_new_built_in_check_is_its_record_alone(spark, engine, tmp_path, capsys, monkeypatch):
    """A check added as one record and nothing else: bronze quarantines the events failing a row-level one with
    the reason its record gives, a silver one on the merged rows is counted and reported, its action and the
    table's overrides apply, and Data Docs describe both."""
    from spark_jobs.quality.expectations import EXPECTATIONS, POST, QUARANTINE, WARN, Expectation

    monkeypatch.setitem(EXPECTATIONS, "event_has_source_time", Expectation(
        "event_has_source_time", ("bronze",), QUARANTINE, True, "every change event carries its source time",
        "events", "CASE WHEN op IN ('c', 'u', 'r', 'd') THEN ts_ms IS NOT NULL END", "'no ts_ms'"))
    monkeypatch.setitem(EXPECTATIONS, "ids_positive", Expectation(
        "ids_positive", ("silver",), WARN, False, "the merged rows' ids are positive", "rows", "id > 0", phase=POST))
    config = _config(tmp_path, ", quality: {max_quarantined: 50%}")
    land(tmp_path / "landing", ORDERS, offset=0, lines=[change_event("c", 10, after={"id": 1, "v": "a"}),
                                  change_event("c", 11, after={"id": -2, "v": "b"}),
                                  change_event("c", 12, after={"id": 3, "v": "c"}, ts_ms=None),
                                  change_event("c", 13, after={"id": 4, "v": "d"})])
    code, out, err = _run(capsys, tmp_path, config)
    assert (code, err) == (0, "")
    bronze, silver = summary_line(out, "bronze", "orders"), summary_line(out, "silver", "orders")
    assert (bronze["events"], bronze["quarantined"], bronze["gate"]) == ("3", "event_has_source_time:1",
                                                                         "passed-with-warnings")
    quarantine = engine.read(spark, Lake(str(tmp_path / "lake")).quarantine("orders")).collect()
    assert [(r["_line"], r["reason"]) for r in quarantine] == [(3, "event_has_source_time: no ts_ms")]
    assert silver["gate"] == "passed-with-warnings"
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(-2,), (1,), (4,)]
    bronze_checks = {c["expectation"]: c for c in published_summaries(tmp_path / "lake", "orders", "bronze")[-1]["checks"]}
    silver_checks = {c["expectation"]: c for c in published_summaries(tmp_path / "lake", "orders", "silver")[-1]["checks"]}
    assert [(c["action"], c["success"], c["unexpected"], c["total"]) for c in (
        bronze_checks["event_has_source_time"], silver_checks["ids_positive"])] == [
        ("quarantine", False, 1, 4), ("warn", False, 1, 3)]
    # the silver gate's Data Docs site
    pages = Path(published_summaries(tmp_path / "lake", "orders", "silver")[-1]["docs"]).parent / "validations"
    assert any("ids are positive" in page.read_text() for page in pages.rglob("*.html"))
    # an override in tables.yaml applies to it like to any built-in check
    strict = _config(tmp_path, ", quality: {max_quarantined: 50%, checks: {ids_positive: fail}}")
    land(tmp_path / "landing", ORDERS, offset=4, lines=[change_event("u", 20, after={"id": -2, "v": "again"})])
    code, _, err = _run(capsys, tmp_path, strict)
    assert (code, err) == (1, "gate failed: table=orders layer=silver expectation=ids_positive unexpected=1 of 1\n")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))[(-2,)]["v"] == "b"  # restored


def test_a_fail_check_on_the_events_refuses_the_batch_before_anything_is_published(spark, engine, tmp_path, capsys):
    """`sequence_increasing: fail`: two different events of a key at one position (a tie) stop the batch before
    silver is written (no commit at all, not a commit and its restore); the same batch under the default
    `warn` is applied and reported."""
    config = _config(tmp_path, ", quality: {checks: {sequence_increasing: fail}}")
    land(tmp_path / "landing", ORDERS, offset=0, lines=[change_event("c", 10, after={"id": 1, "v": "a"})])
    assert _run(capsys, tmp_path, config)[0] == 0
    lake = Lake(str(tmp_path / "lake"))
    versions = [engine.version(path) for path in lake.silver_tables("orders").values()]
    land(tmp_path / "landing", ORDERS, offset=1, lines=[change_event("u", 20, after={"id": 1, "v": "x"}),
                                  change_event("u", 20, after={"id": 1, "v": "y"}),
                                  change_event("c", 21, after={"id": 2, "v": "b"})])
    code, _, err = _run(capsys, tmp_path, config)
    assert (code, err) == (1, "gate failed: table=orders layer=silver expectation=sequence_increasing "
                              "unexpected=2 of 3\n")
    assert [engine.version(path) for path in lake.silver_tables("orders").values()] == versions
    code, out, err = _run(capsys, tmp_path, _config(tmp_path))
    assert (code, err, summary_line(out, "silver", "orders")["gate"]) == (0, "", "passed-with-warnings")
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(1,), (2,)]


def test_without_the_data_docs_assets_every_table_is_published_and_the_run_says_once_why_no_pages_were_built(
        spark, engine, tmp_path, capsys, monkeypatch):
    """Data Docs are the gates' report, not their verdict: on a checkout where `make assets` has not run, the run
    names the missing assets in one line at its start, every gate still decides, and bronze, silver and gold are
    published; no page is written."""
    monkeypatch.setattr(docs_assets, "assets_dir", lambda: tmp_path / "no_assets")
    registry = load_registry(DEMO_CONFIG)
    generated = generate(registry.select(["customers"]), tmp_path / "landing",
                         Options(rows=20, changes=30, records_per_file=25, seed=5))
    code, out, err = _run(capsys, tmp_path, DEMO_CONFIG, "--tables", "customers", "--models", "customers_by_state")
    assert code == 0, out + err
    said = [line for line in err.splitlines() if line.strip()]
    assert len(said) == 1 and "no Data Docs pages are built in this run: Data Docs assets not fetched (jquery@" in said[0]
    assert "run `make assets`" in said[0]
    assert (summary_line(out, "bronze", "customers")["gate"], summary_line(out, "silver", "customers")["gate"]) == (
        "passed", "passed")
    assert summary_line(out, "gold", "customers_by_state")["gate"] == "passed"
    customers = generated[0]
    assert silver_rows(spark, engine, tmp_path / "lake", "customers", registry.tables["customers"].keys) == \
        expected_rows(customers.topic, customers.final_rows)
    lake = Lake(str(tmp_path / "lake"))
    by_state = {r["state"]: r["customers"] for r in engine.read(spark, lake.gold("customers_by_state")).collect()}
    assert by_state == {s: sum(1 for c in customers.final_rows.values() if c["state"] == s)
                        for s in {c["state"] for c in customers.final_rows.values()}}
    assert not list((tmp_path / "lake" / "reports" / "data_docs").rglob("*.html"))  # the run's own report is written
    assert published_summaries(tmp_path / "lake", "customers", "silver")[-1].get("docs") is None  # no page to link
    # `make demo`'s last check: the lake is complete, and status says why it has no pages
    only = tmp_path / "customers.yaml"  # the tables this run wrote, as the demo's status checks all of its own
    only.write_text(f"tables:\n  customers: {{topic: {customers.topic}, keys: [custkey], history: true}}\n")
    capsys.readouterr()
    assert cli.main(["status", "--config", str(only), "--lake", str(tmp_path / "lake"), "--require-tables"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Data Docs:")]
    assert said == [f"Data Docs: none built here: {docs_assets.not_fetched()}"]


def test_a_data_docs_store_that_fails_fails_no_table_and_its_cause_is_logged(spark, engine, tmp_path, capsys,
                                                                              monkeypatch):
    """A Data Docs build that fails (the reports' store refusing a write) is reported with its cause per site; the
    gates' verdicts stand and the batch is published."""
    from spark_jobs.quality import gx_store

    def refused(self, key, value, **kwargs):  # noqa: ANN001, ANN202
        raise OSError("the reports' bucket refused the write")

    monkeypatch.setattr(gx_store.DataDocsStoreBackend, "_set", refused)
    land(tmp_path / "landing", ORDERS, [change_event("c", 10, after={"id": 1}), change_event("c", 11, after={"id": 2})])
    code, out, err = _run(capsys, tmp_path, _config(tmp_path))
    assert code == 0, out + err
    said = [line for line in err.splitlines() if line.strip()]
    assert said == [f"Data Docs of {layer}-pass not built: OSError: the reports' bucket refused the write; the gate's "
                    "verdict stands" for layer in ("bronze", "silver")], err  # the passes' sites: the table's gates
    assert (summary_line(out, "bronze", "orders")["gate"], summary_line(out, "silver", "orders")["gate"]) == (
        "passed", "passed")
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(1,), (2,)]


def test_every_gates_gx_run_is_the_pipelines_run(spark, engine, tmp_path, capsys):
    """GX's validation results and their Data Docs pages are filed under the pipeline's run id, for a table's own
    gate (a user's expectation on its rows) and the passes' gates alike, so a run's reports are found by its id."""
    config = _config(tmp_path, ", expectations: [{expect_column_values_to_not_be_null: {column: id}, "
                               "layer: silver, action: warn}]")
    land(tmp_path / "landing", ORDERS, [change_event("c", 10, after={"id": 1}), change_event("c", 11, after={"id": 2})])
    code, out, err = _run(capsys, tmp_path, config, "--run-id", "manual__2026-12-02")
    assert (code, err) == (0, ""), out
    results = sorted((tmp_path / "lake").rglob("validations/**/*.json"))
    pages = sorted((tmp_path / "lake" / "reports" / "data_docs").rglob("validations/**/*.html"))
    sites = {p.relative_to(tmp_path / "lake" / "reports" / "data_docs").parts[0] for p in pages}
    assert sites == {"bronze-pass", "orders"}, pages  # bronze's pass; silver's own gate (its user's expectation)
    assert results and all("manual__2026-12-02" in p.parts for p in [*results, *pages]), [*results, *pages]
