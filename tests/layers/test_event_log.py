"""The event log (spark_jobs/event_log.py): the pipeline's runs over two weeks, then the trend questions users ask,
answered in Spark SQL over the Delta table with exact figures; the trend pages, the history page and `status`
read it, and a retried run is not in it twice."""

from __future__ import annotations

import datetime as dt
import json

from spark_jobs import cli, report
from spark_jobs.lake import Lake
from tests.support import change_event, land, run

CONFIG = """\
quality: {max_quarantined: 100%}
tables:
  orders:
    topic: shop.public.orders
    keys: [id]
    expectations:
      - expect_column_values_to_be_between: {column: qty, min_value: 0}
        action: warn
  customers:
    topic: shop.public.customers
    keys: [id]
"""


def _at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def _land(landing, topic: str, offset: int, changed_at: str, rows: list[dict], bad_lines: int = 0) -> None:
    """Inserts of `rows` whose source changed them at `changed_at`, and `bad_lines` malformed lines, as one sink file."""
    ts_ms = int(_at(changed_at).timestamp() * 1000)
    lines = [change_event("c", offset + n, after=row, ts_ms=ts_ms) for n, row in enumerate(rows)]
    land(landing, topic, lines + ['{"before":null,"after":{"id":'] * bad_lines, offset)


def test_the_event_log_answers_the_trend_questions_and_the_pages_read_it(spark, tmp_path, capsys, monkeypatch):
    config, landing, lake_dir = tmp_path / "tables.yaml", tmp_path / "landing", tmp_path / "lake"
    config.write_text(CONFIG)
    clock: list[dt.datetime] = []
    monkeypatch.setattr(report, "published_now", lambda: clock[0])  # each run publishes at its own hour

    def run_at(when: str, run_id: str) -> None:
        clock[:] = [_at(when)]
        code, out, err = run(capsys, config, landing, lake_dir, "--run-id", run_id)
        assert (code, err) == (0, ""), out

    orders, customers = "shop.public.orders", "shop.public.customers"
    # last week: both tables clean
    _land(landing, orders, 0, "2026-11-09 08:00", [{"id": i, "qty": 1} for i in range(4)])
    _land(landing, customers, 0, "2026-11-09 08:30", [{"id": i} for i in range(4)])
    run_at("2026-11-09 09:00", "r1")
    # this week: a quarter of orders' lines are malformed, one order's quantity fails its (warn) expectation
    _land(landing, orders, 4, "2026-11-16 08:20", [{"id": 4, "qty": 2}, {"id": 5, "qty": -1}, {"id": 6, "qty": 3}],
          bad_lines=1)
    _land(landing, customers, 4, "2026-11-16 08:10", [{"id": i} for i in range(4, 8)])
    run_at("2026-11-16 08:30", "r2")
    # after 9:00, customers only (orders is idle: no step of it is published); run again under its id (a retry),
    # with a file landed since: the run's rows are replaced by its report's, never added twice
    _land(landing, customers, 8, "2026-11-16 09:15", [{"id": 8}, {"id": 9}])
    run_at("2026-11-16 09:30", "r3")
    _land(landing, customers, 10, "2026-11-16 09:20", [{"id": 10}])
    run_at("2026-11-16 09:40", "r3")

    lake = Lake(str(lake_dir))
    spark.read.format("delta").load(lake.event_log).createOrReplaceTempView("event_log")

    def sql(text: str) -> list[tuple]:
        return [tuple(r) for r in spark.sql(text).collect()]

    assert sql("SELECT run_id, layer, table_name, verdict FROM event_log WHERE kind = 'step' "
               "ORDER BY run_id, layer, table_name") == [
        ("r1", "bronze", "customers", "passed"), ("r1", "bronze", "orders", "passed"),
        ("r1", "silver", "customers", "passed"), ("r1", "silver", "orders", "passed"),
        ("r2", "bronze", "customers", "passed"), ("r2", "bronze", "orders", "passed"),
        ("r2", "silver", "customers", "passed"), ("r2", "silver", "orders", "passed-with-warnings"),
        ("r3", "bronze", "customers", "passed"), ("r3", "silver", "customers", "passed")]
    assert sql("SELECT events, published_at FROM event_log WHERE kind = 'step' AND run_id = 'r3' AND layer = 'bronze'") == [
        (1, dt.datetime(2026, 11, 16, 9, 40))]  # the retry's summary (Spark shows the session's zone, UTC)

    # which table's quarantine rate rose this week?
    assert sql("""
        WITH weekly AS (
          SELECT table_name, date_trunc('week', published_at) AS week, sum(quarantined) / sum(lines) AS rate
          FROM event_log WHERE kind = 'step' AND layer = 'bronze' GROUP BY 1, 2)
        SELECT this.table_name, last.rate, this.rate FROM weekly this
        JOIN weekly last ON last.table_name = this.table_name AND last.week = this.week - INTERVAL 7 DAYS
        WHERE this.week = date_trunc('week', TIMESTAMP '2026-11-18 00:00:00') AND this.rate > last.rate""") == [
        ("orders", 0.0, 0.25)]

    # how far behind was silver at 9:00 (seconds between 9:00 and the newest source change silver held)?
    assert sql("""
        SELECT table_name, unix_timestamp(TIMESTAMP '2026-11-16 09:00:00') - unix_timestamp(max(newest_change_at))
        FROM event_log WHERE kind = 'step' AND layer = 'silver' AND verdict LIKE 'passed%'
          AND published_at <= TIMESTAMP '2026-11-16 09:00:00'
        GROUP BY table_name ORDER BY table_name""") == [("customers", 50 * 60), ("orders", 40 * 60)]

    # which expectations did not pass this week, in how many runs, on how many rows?
    assert sql("""
        SELECT table_name, layer, expectation, action, count(*), sum(unexpected) FROM event_log
        WHERE kind = 'expectation' AND NOT success AND published_at >= TIMESTAMP '2026-11-16 00:00:00'
        GROUP BY 1, 2, 3, 4""") == [("orders", "silver", "expect_column_values_to_be_between(qty)", "warn", 1, 1)]

    # the pages read the log: orders' trend page has its two runs, the quarantined share and the failed check
    page = (lake_dir / "reports" / "tables" / "orders.html").read_text()
    assert "bronze 25.0%</title>" in page and "bronze 0.0%</title>" in page
    assert page.index("r2") < page.index("r1") and "r3" not in page
    assert "<td>expect_column_values_to_be_between(qty)</td>" in page
    history = (lake_dir / "reports" / "index.html").read_text()
    assert history.index("runs/r3/") < history.index("runs/r2/") < history.index("runs/r1/")

    # `status` reads it too: each layer's newest verdict and last success
    assert cli.main(["status", "--config", str(config), "--lake", str(lake_dir), "--json"]) == 0
    state = {t["name"]: t["layers"] for t in json.loads(capsys.readouterr().out)["tables"]}
    assert (state["orders"]["silver"]["last_verdict"], state["orders"]["silver"]["last_run"]) == ("passed-with-warnings", "r2")
    assert state["orders"]["silver"]["last_success"] == "2026-11-16T08:30:00+00:00"
    assert state["customers"]["silver"]["last_success"] == "2026-11-16T09:40:00+00:00"
