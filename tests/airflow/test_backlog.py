"""A backlog after an outage (issue 19, item 2): pending landing files, several batches' worth (5,000 at the default
batch size in `make soak`), go through `airflow dags test cdc_bronze` (sensor -> the file list as a file -> bronze in
bounded batches, progress in the task log), and every landing line is accounted for: in bronze, or a tombstone
matched to its delete."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.delta.reads import read_columns, row_count
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.registry import load_registry
from spark_jobs.state import pending_files, read_marks
from tests.support import BIN, ROOT, AirflowCli, airflow_home, pipeline_service, service_airflow_env, subprocess_env

pytest.importorskip("airflow")


@pytest.mark.scale
def test_a_backlog_of_several_batches_lands_in_bounded_batches_with_every_line_accounted_for(tmp_path, soak):
    """Over five batches' worth of files: over 5,000 at the default 1,000 a batch (make soak), over 125 at 25 a batch
    (make test)."""
    batch = 1_000 if soak else 25
    config = tmp_path / "include" / "tables.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    (landed,) = generate(load_registry(config).select(None), landing,
                         Options(rows=2 * batch, changes=3 * batch, records_per_file=1, seed=19))
    assert len(landed.files) > 5 * batch  # one line a file: a record or a tombstone
    deployment = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": str(landing), "CDC_LAKE_URI": str(lake),
                  **({} if soak else {"CDC_BRONZE_BATCH_FILES": str(batch)})}
    # what is tested is not its first job's speed: no warm-up (test_service.py has one)
    with pipeline_service(subprocess_env(**deployment, CDC_SERVICE_WARM_UP="false"), tmp_path / "service.log") as service:
        env = subprocess_env(
            **service_airflow_env(service),
            AIRFLOW_HOME=str(tmp_path / "airflow"), AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
            AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}',
            CDC_CONFIG=str(config), CDC_LANDING_URI=str(landing), CDC_LAKE_URI=str(lake),
            CDC_SENSOR_TIMEOUT="3", CDC_SENSOR_POKE_INTERVAL="1")
        airflow = AirflowCli(env, tmp_path / "dags-test.log")
        airflow_home(tmp_path / "airflow")  # `airflow db migrate`'s database
        airflow.sh(str(BIN / "python"), "-m", "cdc_airflow.pools")

        log = airflow.dag_test("cdc_bronze")
        files = len(landed.files)
        assert f"table=customers: {files} landing file(s) for bronze" in log
        batches = -(-files // batch)
        for number in range(1, batches + 1):  # the progress of each bounded batch, in the task's log
            done = min(number * batch, files)
            assert f"bronze customers: batch {number}/{batches} committed: " in log and f"({done} of {files} files)" in log

        # every line accounted for: the ingest log has every file with its one line, bronze every event, and
        # each tombstone followed its delete (none quarantined, none left pending)
        logged = read_columns(Lake(str(lake)).ingest_log("customers"), ["file", "lines", "events", "tombstones",
                                                                        "quarantined"])
        assert logged is not None
        assert sorted(logged["file"]) == sorted(str(Path(f).relative_to(landing)) for f in landed.files)
        assert (sum(logged["lines"]), sum(logged["events"]), sum(logged["tombstones"]), sum(logged["quarantined"])) == (
            files, landed.events, landed.tombstones, 0)
        assert row_count(Lake(str(lake)).bronze("customers")) == landed.events
        assert row_count(Lake(str(lake)).quarantine("customers")) is None
        assert "tombstones_unmatched=0" in log and f"lines={files} events={landed.events}" in log

        # the marks moved to each partition's last file: the next listing starts there and finds nothing
        relative = sorted(str(Path(f).relative_to(landing)) for f in landed.files)
        assert read_marks(Lake(str(lake)), "customers") == {
            folder: max(p for p in relative if p.startswith(folder + "/")) for folder in {p.rsplit("/", 1)[0] for p in relative}}
        assert pending_files(str(landing), Lake(str(lake)), "customers", "burst.burst_bank.customers") == []
