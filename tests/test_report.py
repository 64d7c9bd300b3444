import json
import os

from spark_jobs.report import load_runs, publish, render_index
from spark_jobs.state import Lake


def test_runs_are_listed_newest_first_with_their_verdicts(tmp_path):
    lake = Lake(str(tmp_path))
    publish(lake, "run-a", {"table": "orders", "layer": "silver", "gate": "passed", "events": 3, "quarantined": {"x": 2}})
    publish(lake, "run-b", {"table": "orders", "layer": "gold", "gate": "failed", "rows": 0})
    os.utime(tmp_path / "reports" / "runs" / "run-a", (1, 1))  # make run-a clearly older
    runs = load_runs(lake)
    assert [(run_id, [s["layer"] for s in summaries]) for run_id, summaries in runs] == [
        ("run-b", ["gold"]), ("run-a", ["silver"])]
    assert [run_id for run_id, _ in load_runs(lake, newest=1)] == ["run-b"]
    page = render_index(lake).read_text()
    assert page.index("run-b") < page.index("run-a")
    assert "<td>run-a</td><td>orders</td><td>silver</td><td>passed</td><td>3</td><td>2</td>" in page
    summary = json.loads((tmp_path / "reports" / "runs" / "run-a" / "orders.silver.json").read_text())
    assert summary["quarantined"] == {"x": 2}
