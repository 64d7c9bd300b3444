import json

from spark_jobs.lake import Lake
from spark_jobs.report import load_runs, publish

CHECKS = [{"expectation": "event_has_key(id)", "action": "quarantine", "success": False, "unexpected": 2, "total": 5,
           "observed": None},
          {"expectation": "max_quarantined", "action": "fail", "success": False, "unexpected": None, "total": None,
           "observed": "0.4 (max 0.05)"}]


def test_runs_are_listed_newest_first_and_each_run_has_its_page(tmp_path):
    lake = Lake(str(tmp_path))
    publish(lake, "run-a", {"table": "orders", "layer": "silver", "gate": "passed", "events": 3,
                            "quarantined": {"event_has_key: id": 2},
                            "deletes": {"received": 3, "superseded": 1, "stale": 0, "absent": 1, "removed": 1}})
    publish(lake, "run-b", {"table": "orders", "layer": "bronze", "gate": "failed", "checks": CHECKS,
                            "error": "gate failed: table=orders layer=bronze expectation=max_quarantined <x>",
                            "docs": str(tmp_path / "reports" / "data_docs" / "orders" / "index.html")})
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
