"""The users' own expectations (tables.yaml `expectations:`): each action at silver and at gold, with the
exact rows that reach the tables and the quarantine, and the config errors that name table and expectation."""

from __future__ import annotations

import json

import pytest

from spark_jobs.errors import ConfigError, GateFailed
from spark_jobs.lake import Lake
from spark_jobs.layers import gold, silver
from spark_jobs.quality.user_expectations import validate
from spark_jobs.registry import load_registry
from tests.support import change_event, land, run, silver_rows, summary_line

BETWEEN = "expect_column_values_to_be_between: {column: fico, min_value: 300, max_value: 850}"
BETWEEN_REASON = "expectation: expect_column_values_to_be_between(fico) max_value=850, min_value=300"

ORDERS = "shop.public.orders"


def _config(tmp_path, expectations: str, quality: str = "") -> object:
    path = tmp_path / "tables.yaml"
    path.write_text(f"tables:\n  orders:\n    topic: shop.public.orders\n    keys: [id]\n{quality}"
                    f"    expectations:\n{expectations}")
    return path


def _row(i, fico, state="CA"):
    return {"id": i, "fico": fico, "state": state}


def _quarantine(spark, engine, tmp_path, name="orders"):
    rows = engine.read(spark, Lake(str(tmp_path / "lake")).quarantine(name))
    found = [(r["layer"], json.loads(r["_raw"])["after"], r["reason"]) for r in rows.collect()]
    return sorted(found, key=lambda row: (row[0], row[1]["id"], row[1]["fico"]))


def test_quarantine_and_warn_at_silver_keep_the_keys_previous_state(spark, engine, tmp_path, capsys):
    config = _config(tmp_path, f"      - {BETWEEN}\n        action: quarantine\n"
                               "      - expect_column_values_to_not_be_null: {column: state}\n"
                               "        description: every customer has a state\n",
                     "    quality: {max_quarantined: 50%}\n")
    land(tmp_path / "landing", ORDERS, offset=0,
         lines=[change_event("c", 10, after=_row(1, 700)), change_event("c", 11, after=_row(2, 900)),
                change_event("c", 12, after=_row(3, 600, None))])
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    assert "1 of 1 tables' new bronze rows planned in one pass" in out and "plans its own" not in out, out
    silver = summary_line(out, "silver", "orders")
    assert (silver["gate"], silver["warnings"]) == ("passed-with-warnings", "2")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {
        (1,): _row(1, 700), (3,): _row(3, 600, None)}
    assert _quarantine(spark, engine, tmp_path) == [("silver", _row(2, 900), BETWEEN_REASON)]

    # an update that fails leaves its key as it was; a later failing update after a good one keeps the good
    # one; a delete is never judged by its before image
    land(tmp_path / "landing", ORDERS, offset=3,
         lines=[change_event("u", 20, after=_row(1, 950)), change_event("u", 21, after=_row(3, 640, None)),
                change_event("u", 22, after=_row(3, 999, None)), change_event("c", 23, after=_row(4, 500)),
                change_event("d", 24, before=_row(4, 100))])
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {
        (1,): _row(1, 700), (3,): _row(3, 640, None)}
    assert _quarantine(spark, engine, tmp_path) == [
        ("silver", _row(1, 950), BETWEEN_REASON), ("silver", _row(2, 900), BETWEEN_REASON),
        ("silver", _row(3, 999, None), BETWEEN_REASON)]
    silver = summary_line(out, "silver", "orders")
    # key 4's insert and delete net out (had the delete been quarantined, 4 would be live with fico 500)
    assert (silver["inserted"], silver["updated"], silver["deleted"]) == ("0", "1", "0")

    # the same input again changes nothing
    version = engine.version(Lake(str(tmp_path / "lake")).silver("orders"))
    assert run(capsys, config, tmp_path / "landing", tmp_path / "lake")[0] == 0
    assert engine.version(Lake(str(tmp_path / "lake")).silver("orders")) == version
    assert len(_quarantine(spark, engine, tmp_path)) == 3


def test_findings_of_user_expectations_are_reported_with_their_counts(spark, engine, tmp_path, capsys):
    config = _config(tmp_path, f"      - {BETWEEN}\n        action: quarantine\n"
                               "      - expect_column_values_to_not_be_null: {column: state}\n",
                     "    quality: {max_quarantined: 50%}\n")
    land(tmp_path / "landing", ORDERS, offset=0,
         lines=[change_event("c", 10, after=_row(1, 700)), change_event("c", 11, after=_row(2, 900)),
                change_event("c", 12, after=_row(3, 600, None))])
    assert run(capsys, config, tmp_path / "landing", tmp_path / "lake")[0] == 0
    report = json.loads(next((tmp_path / "lake" / "reports" / "runs").glob("*/orders.silver.json")).read_text())
    found = {c["expectation"]: (c["action"], c["success"], c["unexpected"], c["total"]) for c in report["checks"]}
    assert found["expect_column_values_to_be_between(fico)"] == ("quarantine", False, 1, 3)
    assert found["expect_column_values_to_not_be_null(state)"] == ("warn", False, 1, 3)
    assert (report["gate"], report["quarantined"]) == ("passed-with-warnings", {BETWEEN_REASON: 1})


def test_a_failing_user_expectation_at_silver_publishes_nothing(spark, engine, tmp_path, capsys):
    config = _config(tmp_path, "      - expect_column_values_to_not_be_null: {column: state}\n        action: fail\n")
    land(tmp_path / "landing", ORDERS, offset=0, lines=[change_event("c", 10, after=_row(1, 700))])
    assert run(capsys, config, tmp_path / "landing", tmp_path / "lake")[0] == 0
    land(tmp_path / "landing", ORDERS, offset=1,
         lines=[change_event("u", 20, after=_row(1, 710)), change_event("c", 21, after=_row(2, 600, None))])
    code, _, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (1, "gate failed: table=orders layer=silver "
                              "expectation=expect_column_values_to_not_be_null(state) unexpected=1 of 2\n")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(1,): _row(1, 700)}


def _gold_model(tmp_path, expectations: str):
    (tmp_path / "gold").mkdir(exist_ok=True)
    (tmp_path / "gold" / "scores.sql").write_text("-- keys: id\n-- sources: orders\nSELECT id, fico FROM orders\n")
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders: {topic: t, keys: [id]}\n"
                      f"gold:\n  scores:\n    quality: {{max_quarantined: 30%}}\n    expectations:\n{expectations}")
    return load_registry(config).gold["scores"]


def _silver(spark, engine, lake, ficos):
    engine.overwrite(spark.createDataFrame([(i, f, f"{i}|0", 0) for i, f in enumerate(ficos, 1)],
                                           "id INT, fico INT, _seq STRING, _source_ts_ms BIGINT"), lake.silver("orders"))


def test_user_expectations_at_gold_quarantine_warn_and_fail(spark, engine, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    _silver(spark, engine, lake, [700, 900, 20, 640, 500, 610, 720, 800, 810, 820])
    model = _gold_model(tmp_path, f"      - {BETWEEN}\n        action: quarantine\n"
                                  "      - expect_column_values_to_be_in_set: {column: fico, value_set: [700]}\n")
    summary = gold.gold_refresh(spark, engine, model, lake, "b1")
    assert (summary.gate, summary.rows, summary.quarantined) == ("passed-with-warnings", 10, {BETWEEN_REASON: 2})
    published = engine.read(spark, lake.gold("scores"))
    assert sorted((r["id"], r["fico"]) for r in published.collect()) == [
        (1, 700), (4, 640), (5, 500), (6, 610), (7, 720), (8, 800), (9, 810), (10, 820)]
    assert sorted((r["layer"], r["_raw"], r["reason"]) for r in engine.read(spark, lake.quarantine("scores")).collect()) == [
        ("gold", '{"id":2,"fico":900}', BETWEEN_REASON), ("gold", '{"id":3,"fico":20}', BETWEEN_REASON)]
    found = {c["expectation"]: (c["action"], c["success"], c["unexpected"]) for c in summary.checks or []}
    assert found["expect_column_values_to_be_in_set(fico)"] == ("warn", False, 9)

    # most rows refused: the breaker stops the refresh, gold stays at its version
    _silver(spark, engine, lake, [900, 901, 902, 700])
    with pytest.raises(GateFailed, match="expectation=max_quarantined observed=0.75 "):
        gold.gold_refresh(spark, engine, model, lake, "b2")
    assert engine.version(lake.gold("scores")) == 0

    failing = _gold_model(tmp_path, f"      - {BETWEEN}\n        action: fail\n")
    with pytest.raises(GateFailed) as failure:
        gold.gold_refresh(spark, engine, failing, lake, "b3")
    assert str(failure.value) == ("gate failed: table=scores layer=gold "
                                  "expectation=expect_column_values_to_be_between(fico) unexpected=3 of 4")
    assert engine.version(lake.gold("scores")) == 0


@pytest.mark.parametrize(("expectation", "error"), [
    ("- expect_column_values_to_be_pretty: {column: fico}",
     "table 'orders': unknown expectation 'expect_column_values_to_be_pretty'"),
    ("- expect_column_values_to_be_between: {column: fico, min_value: low}",
     "table 'orders': expectation 'expect_column_values_to_be_between' has bad arguments .*min_value"),
    ("- expect_column_values_to_be_between: {column: fico, colour: red}",
     "table 'orders': expectation 'expect_column_values_to_be_between' has bad arguments .*colour"),
    ("- {expect_table_row_count_to_be_between: {min_value: 1}, action: quarantine}",
     "table 'orders': expectation 'expect_table_row_count_to_be_between' is not row-level, so it cannot quarantine"),
    ("- {expect_column_values_to_be_unique: {column: fico}, action: quarantine}",
     "table 'orders': expectation 'expect_column_values_to_be_unique' is not row-level"),
])
def test_bad_user_expectations_are_config_errors_naming_table_and_expectation(tmp_path, expectation, error):
    table = load_registry(_config(tmp_path, f"      {expectation}\n")).tables["orders"]
    with pytest.raises(ConfigError, match=error):
        validate(table.expectations)


@pytest.mark.parametrize(("expectation", "error"), [
    ("- {expect_column_values_to_be_between: {column: fico}, action: drop}",
     "table 'orders': expectation 'expect_column_values_to_be_between' takes action warn | quarantine | fail"),
    ("- column_values_between: {column: fico}", "table 'orders': 'column_values_between' is not a GX expectation name"),
    ("- expect_column_values_to_not_be_null: fico", "expectation 'expect_column_values_to_not_be_null' takes a mapping"),
    ("- {expect_a: {}, expect_b: {}}", "table 'orders': each expectation is"),
    ("- {expect_column_values_to_not_be_null: {column: fico}, layer: gold}",
     "table 'orders': expectation 'expect_column_values_to_not_be_null' takes layer silver | bronze, got 'gold'"),
])
def test_the_shape_of_user_expectations_is_checked_when_the_registry_loads(tmp_path, expectation, error):
    with pytest.raises(ConfigError, match=error):
        load_registry(_config(tmp_path, f"      {expectation}\n"))


def test_a_run_with_a_bad_or_misnamed_expectation_stops_with_a_config_error(spark, engine, tmp_path, capsys,
                                                                             monkeypatch):
    bad = _config(tmp_path, "      - expect_column_values_to_be_between: {column: fico, colour: red}\n")
    land(tmp_path / "landing", ORDERS, offset=0, lines=[change_event("c", 10, after=_row(1, 700))])
    code, _, err = run(capsys, bad, tmp_path / "landing", tmp_path / "lake")
    assert code == 2 and "table 'orders': expectation 'expect_column_values_to_be_between' has bad arguments" in err
    misnamed = _config(tmp_path, "      - expect_column_values_to_not_be_null: {column: ficoo}\n")
    # the silver pass finds it: the table's own plan never runs
    monkeypatch.setattr(silver, "apply_changes", lambda *args: pytest.fail("the table's own plan ran"))
    code, _, err = run(capsys, misnamed, tmp_path / "landing", tmp_path / "lake")
    # found when silver meets the batch's columns: a config error (exit 2, no retry), naming table, expectation, layer
    assert (code, err) == (2, "config error: table 'orders': expectation expect_column_values_to_not_be_null(ficoo) "
                              "names column(s) ficoo not in silver's columns (fico, id, state) (layer silver)\n")


def test_data_docs_of_a_failed_run_show_the_failing_expectation_offline_and_gx_actions_run(
        spark, engine, tmp_path, capsys):
    """The failed run's Data Docs page names the failing expectation by its description with its counts,
    and loads nothing from the internet; a GX Checkpoint action declared in tables.yaml (here GX's Slack
    notification, to a local webhook) receives each validation's outcome."""
    import http.server
    import re
    import threading

    received: list[dict] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the standard library's name)
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = _config(tmp_path, "      - expect_column_values_to_not_be_null: {column: state}\n"
                                   "        action: fail\n        description: every customer has a state\n",
                         "    quality:\n      actions:\n        - {type: slack, name: notify, notify_on: failure, "
                         f"slack_webhook: 'http://127.0.0.1:{server.server_port}/hook'}}\n")
        land(tmp_path / "landing", ORDERS, offset=0,
             lines=[change_event("c", 10, after=_row(1, 700)), change_event("c", 21, after=_row(2, 600, None))])
        assert run(capsys, config, tmp_path / "landing", tmp_path / "lake")[0] == 1
    finally:
        server.shutdown()
    docs = tmp_path / "lake" / "reports" / "data_docs"
    page = next((docs / "orders" / "validations" / "orders" / "silver" / "upserts").rglob("*.html")).read_text()
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "every customer has a state 1 unexpected values found. 50% of 2 total rows." in text
    # the breaker and delete reconciliation are GX expectations too, described in plain words
    figures = next((docs / "orders" / "validations" / "orders" / "silver" / "audit").rglob("*.html")).read_text()
    assert "of the batch is quarantined, once 2 or more records are" in figures
    for html in docs.rglob("*.html"):
        loads = re.findall(r'<(?:script|img|link)[^>]*(?:src|href)="([^"]+)"', html.read_text())
        assert loads and not [u for u in loads if "://" in u], (html, loads)
        for url in loads:  # each relative link resolves to a file in the lake
            assert (html.parent / url.split("?")[0]).resolve().is_file(), (html, url)
    # one message per failed validation: silver's rows of upserts (the bronze gate and silver's other
    # frames passed)
    messages = [json.dumps(m) for m in received]
    assert len(messages) == 1 and "orders.silver.upserts" in messages[0] and "Failure" in messages[0], messages


def test_bronze_layer_expectations_judge_the_raw_events(spark, engine, tmp_path, capsys):
    """`layer: bronze`: on each change event as it landed (op, ts_ms, the source block's fields, the keys);
    a quarantined event never enters bronze, a failing `fail` one stops the batch before bronze."""
    config = _config(tmp_path, "      - expect_column_values_to_not_be_null: {column: source_ts_ms}\n"
                               "        layer: bronze\n        action: quarantine\n"
                               "      - expect_column_values_to_be_in_set: {column: op, value_set: [c, u, d]}\n"
                               "        layer: bronze\n        action: fail\n",
                     "    quality: {max_quarantined: 50%}\n")
    no_time = json.dumps({"before": None, "after": _row(2, 650), "op": "c", "ts_ms": 1,
                          "source": {"connector": "postgresql", "lsn": 11, "snapshot": "false"}})
    land(tmp_path / "landing", ORDERS, offset=0,
         lines=[change_event("c", 10, after=_row(1, 700)), no_time, change_event("c", 12, after=_row(3, 600))])
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "orders")
    assert (bronze["events"], bronze["gate"]) == ("2", "passed-with-warnings")
    lake = Lake(str(tmp_path / "lake"))
    assert sorted(r["_line"] for r in engine.read(spark, lake.bronze("orders")).collect()) == [1, 3]
    assert [(r["_line"], r["reason"]) for r in engine.read(spark, lake.quarantine("orders")).collect()] == [
        (2, "expectation: expect_column_values_to_not_be_null(source_ts_ms)")]
    assert sorted(silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",))) == [(1,), (3,)]

    land(tmp_path / "landing", ORDERS, offset=3,
         lines=[change_event("r", 20, after=_row(4, 700)), change_event("u", 21, after=_row(1, 710))])
    code, _, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (1, "gate failed: table=orders layer=bronze expectation=expect_column_values_to_be_in_set(op) "
                              "unexpected=1 of 2\n")
    assert engine.version(lake.bronze("orders")) == 0
