"""Great Expectations gates: findings per expectation with its action; a gate fails on a `fail` finding
(one line naming table, layer, expectation and counts) and publishes Data Docs either way."""

from pathlib import Path

import pytest

from spark_jobs.errors import GateFailed
from spark_jobs.lake import Lake
from spark_jobs.quality.expectations import Quality
from spark_jobs.quality.gates import run_gate, silver_checks
from spark_jobs.registry import TableConfig

TABLE = TableConfig(name="orders", topic="t", keys=("id",))
PAIR = TableConfig(name="pairs", topic="t", keys=("a", "b"))


def _rows_only(table):
    return [c for c in silver_checks(table) if c.frame == "rows"]


def test_silver_key_checks_pass_and_publish_data_docs(spark, tmp_path):
    df = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    result = run_gate({"rows": df}, "orders", "silver", _rows_only(TABLE), Lake(str(tmp_path)))
    assert (result.verdict(), [(f.check, f.action) for f in result.findings]) == (
        "passed", [("key_not_null(id)", "fail"), ("key_unique(id)", "fail")])
    assert result.docs == str(tmp_path / "reports" / "data_docs" / "orders" / "index.html")
    assert Path(result.docs).read_text().count("orders.silver.rows") >= 1


def test_silver_gate_fails_on_duplicate_and_null_keys(spark, tmp_path):
    df = spark.createDataFrame([(1, "x"), (1, "y"), (None, "z"), (4, "w")], "id INT, v STRING")
    with pytest.raises(GateFailed) as failure:
        run_gate({"rows": df}, "orders", "silver", _rows_only(TABLE), Lake(str(tmp_path)))
    assert str(failure.value) == (
        "gate failed: table=orders layer=silver expectation=key_not_null(id) unexpected=1 of 4; "
        "expectation=key_unique(id) unexpected=2 of 4")
    assert (tmp_path / "reports" / "data_docs" / "orders" / "index.html").exists()


def test_compound_keys_are_checked_together_and_warn_actions_never_fail(spark, tmp_path):
    ok = spark.createDataFrame([(1, 1), (1, 2), (2, 1)], "a INT, b INT")
    assert run_gate({"rows": ok}, "pairs", "silver", _rows_only(PAIR), Lake(str(tmp_path))).success
    bad = spark.createDataFrame([(1, 1), (1, 1), (2, 1)], "a INT, b INT")
    with pytest.raises(GateFailed, match=r"expectation=key_unique\(a,b\) unexpected=2 of 3$"):
        run_gate({"rows": bad}, "pairs", "silver", _rows_only(PAIR), Lake(str(tmp_path)))
    lenient = TableConfig(name="pairs", topic="t", keys=("a", "b"), quality=Quality(overrides=(("key_unique", "warn"),)))
    result = run_gate({"rows": bad}, "pairs", "silver", _rows_only(lenient), Lake(str(tmp_path)))
    assert (result.verdict(), result.warnings()) == ("passed-with-warnings", 1)


def test_a_frame_of_flags_costs_no_spark_job_for_samples_of_its_unexpected_values(spark, tmp_path):
    """GX's BASIC result samples each map expectation's unexpected values in a Spark job of its own; on flags
    (always False) the sample says nothing, so the gate asks for none: one job per flag column for its
    counts and the table's row count, not one more per flag (8 jobs here before)."""
    events = spark.createDataFrame([(True, True, None), (False, True, True)],
                                   "_seq_present BOOLEAN, _no_tie BOOLEAN, _not_live_after BOOLEAN").localCheckpoint()
    checks = [c for c in silver_checks(TABLE) if c.frame == "events"]
    context = spark.sparkContext
    context.setJobGroup("flags-gate", "a gate on flags only")
    try:
        result = run_gate({"events": events}, "orders", "silver", checks, Lake(str(tmp_path)), raise_on_failure=False)
    finally:
        context.setJobGroup("", "")
    assert [(f.check, f.unexpected, f.total) for f in result.findings] == [
        ("sequence_present", 1, 2), ("sequence_increasing", 0, 2), ("deleted_keys_not_live", 0, 1)]
    assert len(context.statusTracker().getJobIdsForGroup("flags-gate")) <= len(checks) + 2
