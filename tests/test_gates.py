"""Great Expectations gates: each fails with one line naming table, layer, expectation and counts."""

from pathlib import Path

import pytest

from spark_jobs.config import GoldModel, TableConfig
from spark_jobs.gates import GateFailed, bronze_checks, gold_checks, run_gate, silver_checks

TABLE = TableConfig(name="orders", topic="t", keys=("id",))
PAIR = TableConfig(name="pairs", topic="t", keys=("a", "b"))


def test_silver_gate_passes_and_publishes_data_docs(spark, tmp_path):
    df = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    result = run_gate(df, "orders", "silver", silver_checks(TABLE), str(tmp_path))
    assert (result.success, [f.check for f in result.findings]) == (
        True, ["expect_column_values_to_not_be_null(id)", "expect_column_values_to_be_unique(id)"])
    assert result.docs == str(tmp_path / "reports" / "data_docs" / "orders" / "index.html")
    assert Path(result.docs).read_text().count("orders.silver") >= 1


def test_silver_gate_fails_on_duplicate_and_null_keys(spark, tmp_path):
    df = spark.createDataFrame([(1, "x"), (1, "y"), (None, "z"), (4, "w")], "id INT, v STRING")
    with pytest.raises(GateFailed) as failure:
        run_gate(df, "orders", "silver", silver_checks(TABLE), str(tmp_path))
    assert str(failure.value) == (
        "gate failed: table=orders layer=silver expectation=expect_column_values_to_not_be_null(id) unexpected=1 of 4; "
        "expectation=expect_column_values_to_be_unique(id) unexpected=2 of 4")
    assert (tmp_path / "reports" / "data_docs" / "orders" / "index.html").exists()


def test_compound_keys_are_checked_together(spark, tmp_path):
    ok = spark.createDataFrame([(1, 1), (1, 2), (2, 1)], "a INT, b INT")
    assert run_gate(ok, "pairs", "silver", silver_checks(PAIR), str(tmp_path)).success
    bad = spark.createDataFrame([(1, 1), (1, 1), (2, 1)], "a INT, b INT")
    with pytest.raises(GateFailed, match=r"expectation=expect_compound_columns_to_be_unique\(a,b\) unexpected=2 of 3$"):
        run_gate(bad, "pairs", "silver", silver_checks(PAIR), str(tmp_path))


def test_bronze_gate_needs_keys_except_on_truncates_and_known_ops(spark, tmp_path):
    ok = spark.createDataFrame([("c", "1"), ("d", "2"), ("t", None)], "op STRING, id STRING")
    assert run_gate(ok, "orders", "bronze", bronze_checks(TABLE), str(tmp_path)).success
    bad = spark.createDataFrame([("c", None), ("x", "2"), ("t", None)], "op STRING, id STRING")
    with pytest.raises(GateFailed) as failure:
        run_gate(bad, "orders", "bronze", bronze_checks(TABLE), str(tmp_path))
    assert str(failure.value) == (
        "gate failed: table=orders layer=bronze expectation=expect_column_values_to_not_be_null(id) unexpected=1 of 2; "
        "expectation=expect_column_values_to_be_in_set(op) unexpected=1 of 3")


def test_gold_gate_needs_rows(spark, tmp_path):
    model = GoldModel(name="by_state", sql="", keys=("state",), sources=("orders",), path=Path("m.sql"))
    empty = spark.createDataFrame([], "state STRING, n BIGINT")
    with pytest.raises(GateFailed, match=r"expectation=expect_table_row_count_to_be_between\(1\) observed=0$"):
        run_gate(empty, "by_state", "gold", gold_checks(model), str(tmp_path))
