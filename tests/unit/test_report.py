import json

from spark_jobs import event_log
from spark_jobs.delta.delta_rs import DeltaRsEngine
from spark_jobs.lake import Lake
from spark_jobs.report import load_run, load_runs, publish, render_pages

CHECKS = [{"expectation": "event_has_key(id)", "action": "quarantine", "success": False, "unexpected": 2, "total": 5,
           "observed": None},
          {"expectation": "max_quarantined", "action": "fail", "success": False, "unexpected": None, "total": None,
           "observed": "0.4 (max 0.05)"}]


def finish(lake: Lake, run_id: str, tables: list[str]) -> None:
    """What a run does at its end (steps.Steps): its report into the event log, then its pages."""
    event_log.record_run(DeltaRsEngine(), lake, run_id, lambda: load_run(lake, run_id))
    render_pages(lake, run_id, tables)


def test_runs_are_listed_newest_first_and_each_run_has_its_page(tmp_path):
    lake = Lake(str(tmp_path))
    publish(lake, "run-a", {"table": "orders", "layer": "silver", "gate": "passed", "events": 3,
                            "quarantined": {"event_has_key: id": 2},
                            "deletes": {"received": 3, "superseded": 1, "stale": 0, "absent": 1, "removed": 1}})
    publish(lake, "run-b", {"table": "orders", "layer": "bronze", "gate": "failed", "checks": CHECKS,
                            "error": "gate failed: table=orders layer=bronze expectation=max_quarantined <x>",
                            "docs": str(tmp_path / "reports" / "data_docs" / "orders" / "index.html")})
    for run_id in ("run-a", "run-b"):
        finish(lake, run_id, ["orders"])
    assert [(run_id, [s["layer"] for s in summaries]) for run_id, summaries in load_runs(lake)] == [
        ("run-b", ["bronze"]), ("run-a", ["silver"])]
    assert [run_id for run_id, _ in load_runs(lake, newest=1)] == ["run-b"]
    history = (tmp_path / "reports" / "index.html").read_text()
    assert history.index("run-b") < history.index("run-a")
    assert ("<a href='runs/run-a/index.html'>run-a</a>" in history
            and "<td><span class='failed'>failed</span></td><td>0</td>" in history)
    run_b = (tmp_path / "reports" / "runs" / "run-b" / "index.html").read_text()
    assert "<code>gate failed: table=orders layer=bronze expectation=max_quarantined &lt;x&gt;</code>" in run_b
    assert ("<tr><td><code>event_has_key(id)</code></td><td>quarantine</td><td><span class='passed-with-warnings'>"
            "passed-with-warnings</span></td><td>2 of 5</td><td></td></tr>") in run_b
    assert "<a href='../../data_docs/orders/index.html'>" in run_b
    run_a = (tmp_path / "reports" / "runs" / "run-a" / "index.html").read_text()
    assert "<td>3</td><td>1</td><td>1</td><td>0</td><td>1</td><td>3</td>" in run_a  # received .. superseded, accounted
    assert json.loads((tmp_path / "reports" / "runs" / "run-a" / "orders.silver.json").read_text())["events"] == 3


def test_each_table_has_a_trend_page_with_charts_over_its_runs_in_human_units(tmp_path):
    lake = Lake(str(tmp_path))
    for n, (inserted, share, lag) in enumerate([(5, 0.0, 95406427.398), (3, 0.25, 42.0), (0, 0.5, 7200.0)]):
        publish(lake, f"run-{n}", {"table": "orders", "layer": "bronze", "gate": "passed", "events": 10 + n,
                                   "quarantined_share": share})
        publish(lake, f"run-{n}", {"table": "orders", "layer": "silver", "gate": "failed" if n == 2 else "passed",
                                   "inserted": inserted, "updated": 1, "deleted": 0, "lag_s": lag, "seconds": 0.85,
                                   "newest_change_ms": 1_700_000_000_000 if n == 0 else None,
                                   "checks": [{**CHECKS[1], "success": n != 2}]})
        finish(lake, f"run-{n}", ["orders"])
    page = (tmp_path / "reports" / "tables" / "orders.html").read_text()
    assert page.count("<svg class='chart'") == 3
    assert page.count("<polyline class='series'") == 1 + 4 + 2  # lag; in, inserted, updated, deleted; two layers
    assert "<title>" in page and "silver 3.0 years</title>" in page and "silver 2.0 h</title>" in page
    assert "bronze 50.0%</title>" in page
    # every point labelled with its value, where the tooltip alone once said it
    assert page.count("<text class='point'") == 3 + 4 * 3 + 3  # silver's share has no figure: no point
    assert ">3.0 years</text>" in page and ">42.0 s</text>" in page and ">2.0 h</text>" in page
    # runs newest first, each with its verdicts and the checks that did not pass
    assert page.index("run-2") < page.index("run-1") < page.index("run-0")
    assert "<span class='failed'>failed</span></td><td></td><td>max_quarantined</td>" in page
    assert "<a href='tables/orders.html'>orders</a>" in (tmp_path / "reports" / "index.html").read_text()
    run_page = (tmp_path / "reports" / "runs" / "run-0" / "index.html").read_text()
    # a lag over a day names the source commit it is measured from
    assert ("<tr><th>lag_s</th><td>3.0 years (since the source&#x27;s commit at 2023-11-14 22:13 UTC)</td></tr>"
            in run_page)
    assert "<td>850 ms</td>" in run_page
    assert "<tr><th>lag_s</th><td>42.0 s</td></tr>" in (tmp_path / "reports" / "runs" / "run-1" / "index.html").read_text()


def test_a_chart_of_one_run_labels_its_point_and_one_of_many_labels_the_newest():
    from spark_jobs.report import LABELLED, line_chart

    one = line_chart("Lag", ["12:00"], {"silver": [30.0]}, lambda v: f"{v:.0f} s")
    assert "<circle" in one and "<text class='point' x='78.0' y='23.0' font-size='10' fill='#0969da' " \
        "text-anchor='middle'>30 s</text>" in one
    many = line_chart("Lag", [str(i) for i in range(LABELLED + 1)], {"silver": [float(i) for i in range(LABELLED + 1)]})
    assert many.count("<circle") == LABELLED + 1 and many.count("<text class='point'") == 1
    assert f">{float(LABELLED)}</text>" in many


def test_the_status_page_shows_every_layer_with_its_lag_verdict_and_last_success_and_escapes_names():
    from spark_jobs.report import render_status
    from spark_jobs.status import LakeStatus, LayerStatus, TableStatus

    fresh = LayerStatus(rows=1200, last_verdict="passed", last_run="manual__<run>", lag_s=95.5,
                        last_success="2026-12-02T11:58:00+00:00", newest_change_at="2026-12-02T11:58:24.500000+00:00")
    old = LayerStatus(rows=3, last_verdict="failed", last_run="r2", lag_s=3 * 365.25 * 86400,
                      last_success="2026-12-01T12:00:00+00:00", newest_change_at="2023-12-02T12:00:00+00:00")
    state = LakeStatus("lake", "2026-12-02T12:00:00+00:00", [
        TableStatus("<b>orders</b>", "table", layers={"bronze": fresh, "silver": LayerStatus()}),
        TableStatus("by_state", "gold", layers={"gold": old})])
    page = render_status(state)
    assert "<b>orders</b>" not in page and "&lt;b&gt;orders&lt;/b&gt;" in page  # a source's names are escaped
    assert ("<td>bronze</td><td>1,200</td><td>1.6 min</td><td><span class='passed'>passed</span></td>"
            "<td>2.0 min ago</td><td><a href='runs/manual__&lt;run&gt;/index.html'>manual__&lt;run&gt;</a></td>") in page
    assert "<td>silver</td><td></td><td></td><td>no run yet</td><td></td><td></td>" in page
    assert ("<td>3.0 years (since the source&#x27;s commit at 2023-12-02 12:00 UTC)</td><td><span class='failed'>failed"
            "</span></td><td>1.0 d ago</td>") in page


def test_the_report_retention_removes_old_runs_from_the_event_log_and_records_the_reports_it_lacks(tmp_path,
                                                                                                   monkeypatch):
    import datetime as dt

    from spark_jobs import maintenance, report
    from spark_jobs.registry import load_registry

    config = tmp_path / "tables.yaml"
    config.write_text("maintenance: {report_retention: 30d}\ntables:\n  orders: {topic: shop.public.orders, keys: [id]}\n")
    lake = Lake(str(tmp_path / "lake"))
    now = dt.datetime.now(dt.UTC)
    for run_id, age_days in (("run-old", 31), ("run-new", 29)):
        monkeypatch.setattr(report, "published_now", lambda age=age_days: now - dt.timedelta(days=age))
        publish(lake, run_id, {"table": "orders", "layer": "bronze", "gate": "passed", "events": 1, "checks": CHECKS})
        finish(lake, run_id, ["orders"])
    # a run report the log lacks (written before the log, or by a run that could not write it)
    monkeypatch.setattr(report, "published_now", lambda: now)
    publish(lake, "run-unlogged", {"table": "orders", "layer": "silver", "gate": "passed", "lag_s": 5.0})
    assert {s.run_id for s in event_log.recent_steps(lake)} == {"run-old", "run-new"}
    assert maintenance.expire_reports(DeltaRsEngine(), lake, load_registry(str(config))) == ["run-old"]
    assert [s.run_id for s in event_log.recent_steps(lake)] == ["run-new", "run-unlogged"]
    assert set(event_log.failed_checks(lake, ["run-old", "run-new"])) == {("run-new", "orders", "bronze")}
    history = (tmp_path / "lake" / "reports" / "index.html").read_text()
    assert "run-new" in history and "run-unlogged" in history and "run-old" not in history
