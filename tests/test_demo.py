"""Demo smoke test: generate files, run the DAG through Airflow (`airflow dags test`, SQLite, a fresh
AIRFLOW_HOME, SparkSubmitOperator on local[*]), then check every layer and the report exist."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_airflow_runs_the_pipeline_end_to_end(tmp_path):
    config = tmp_path / "include" / "tables.yaml"
    (tmp_path / "include" / "gold").mkdir(parents=True)
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n")
    shutil.copy(ROOT / "include" / "gold" / "customers_by_state.sql", tmp_path / "include" / "gold")
    env = subprocess_env(
        AIRFLOW_HOME=str(tmp_path / "airflow"), AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}',
        CDC_CONFIG=str(config), CDC_LANDING_URI=str(tmp_path / "landing"), CDC_LAKE_URI=str(tmp_path / "lake"),
        CDC_SENSOR_TIMEOUT="3", CDC_SENSOR_POKE_INTERVAL="1")

    def sh(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        return done

    sh(str(BIN / "python"), "-m", "spark_jobs", "generate", "--config", str(config), "--landing", str(tmp_path / "landing"),
       "--rows", "50", "--changes", "50")
    sh(str(BIN / "airflow"), "db", "migrate")
    run = sh(str(BIN / "airflow"), "dags", "test", "cdc_pipeline")
    assert "state=success" in run.stdout + run.stderr
    status = sh(str(BIN / "python"), "-m", "spark_jobs", "status", "--config", str(config), "--lake", str(tmp_path / "lake"),
                "--require-tables")
    table = {tuple(line.split()[:2]): line.split()[2:] for line in status.stdout.splitlines()[1:] if line.strip()}
    assert table[("bronze", "customers")] == ["100", "passed"]
    assert table[("gold", "customers_by_state")][1] == "passed"
    assert table[("silver", "customers")][1] == "passed"
    assert (tmp_path / "lake" / "reports" / "index.html").is_file()
    assert (tmp_path / "lake" / "reports" / "data_docs" / "customers" / "index.html").is_file()

    # a second run finds nothing new: the sensor skips the table, nothing is written twice
    silver_log = sorted((tmp_path / "lake" / "silver" / "customers" / "_delta_log").glob("*.json"))
    again = sh(str(BIN / "airflow"), "dags", "test", "cdc_pipeline")
    assert "state=success" in again.stdout + again.stderr
    assert sorted((tmp_path / "lake" / "silver" / "customers" / "_delta_log").glob("*.json")) == silver_log
    status = sh(str(BIN / "python"), "-m", "spark_jobs", "status", "--config", str(config), "--lake", str(tmp_path / "lake"))
    assert "bronze     customers                    100  passed" in status.stdout
