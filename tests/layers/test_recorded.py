"""Recorded connector output (tests/fixtures/debezium: PostgreSQL without the schema envelope, MySQL with
it) through the CLI, compared with the source tables' final state, with each Delta engine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import run, silver_rows, summary_line

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "debezium"


# the source tables' final state after the recorded connector output in tests/fixtures/debezium
RECORDED_FINAL = {
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
}


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
    assert silver_rows(spark, engine, lake, table, ("id",)) == RECORDED_FINAL[table]
    # and the same files applied in one run, in landing order, give the same table
    one_run = tmp_path / "lake_one_run"
    code, _, _ = run(capsys, FIXTURES / "tables.yaml", landing, one_run, "--tables", table)
    assert code == 0
    assert silver_rows(spark, engine, one_run, table, ("id",)) == RECORDED_FINAL[table]


@pytest.mark.parametrize("source, table", [("postgres", "pg_customers"), ("mysql", "mysql_customers")])
def test_recorded_connector_output_written_with_delta_spark_gives_the_same_tables(spark, tmp_path, capsys, monkeypatch,
                                                                                  source, table):
    """The same recorded output through the delta-spark engine (deletion vectors on): silver and the ledger
    of deletes as delta-rs leaves them. One run of all files (late events across runs meet the same merge
    conditions, which the engine contract suite checks on both engines)."""
    from spark_jobs.delta.delta_spark import DeltaSparkEngine

    monkeypatch.setenv("CDC_DELTA_ENGINE", "delta-spark")
    shutil.copytree(FIXTURES / source, tmp_path / "landing")
    code, out, err = run(capsys, FIXTURES / "tables.yaml", tmp_path / "landing", tmp_path / "lake", "--tables", table)
    assert (code, err) == (0, "")
    assert "engine=delta-spark " in out
    engine = DeltaSparkEngine(spark)
    assert silver_rows(spark, engine, tmp_path / "lake", table, ("id",)) == RECORDED_FINAL[table]
    assert summary_line(out, "silver", table)["gate"] == "passed"
