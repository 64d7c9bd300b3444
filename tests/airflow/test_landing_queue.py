"""Event-driven runs on the real scheduler (docs/operations.md, "Event-driven runs"): the landing bucket notifies an SQS queue
(the local S3 server's) of each object created, and the triggerer's watcher on it starts cdc_bronze. A module of its
own: its Airflow differs from test_scheduler.py's (the queue set: cdc_bronze has no sensor)."""

from __future__ import annotations

import time

import pytest

from spark_jobs.delta.reads import row_count
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.registry import load_registry
from tests.support import (
    AirflowStack,
    airflow_env,
    landing_notifications,
    pipeline_service,
    s3_environment,
    subprocess_env,
    upload_landing,
)

pytest.importorskip("airflow")

DAY = 86_400


def test_a_file_landed_starts_bronze_through_the_bucket_notification_queue_without_a_poll(tmp_path, s3_endpoint,
                                                                                            postgres_server):
    """CDC_LANDING_QUEUE: the landing bucket notifies an SQS queue (the local endpoint's) of each object created; the
    triggerer's watcher on it starts cdc_bronze, whose pass lists the landing and takes the file at once. The run
    the schedule started has ended when the file lands, and no scheduled run is due: the queue's run takes it."""

    config = tmp_path / "include" / "tables.yaml"
    config.parent.mkdir()
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n")
    landing, lake = "s3://landing/cdc", tmp_path / "lake"
    (generated,) = generate(load_registry(str(config)).select(None), tmp_path / "sink", Options(rows=20, changes=20))
    queue = landing_notifications(s3_endpoint)
    deployment = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": landing, "CDC_LAKE_URI": str(lake)}
    # what is tested is not its first job's speed: no warm-up (test_service.py has one)
    service_env = subprocess_env(**deployment, **s3_environment(s3_endpoint), CDC_SERVICE_WARM_UP="false")
    with pipeline_service(service_env, tmp_path / "service.log") as service:
        # cdc_bronze's schedule once a day: its next scheduled run (which would list the landing too) is not due
        env = airflow_env(tmp_path / "airflow", postgres_server.airflow_database("landing_queue"), service, s3_endpoint,
                          deployment, CDC_LANDING_QUEUE=queue, CDC_BRONZE_INTERVAL_MINUTES=str(DAY // 60))
        airflow = AirflowStack(env, tmp_path / "airflow")

        def idle() -> bool:  # a run of cdc_bronze, and none running
            runs = airflow.runs("cdc_bronze")
            return bool(runs) and all(r["state"] in ("success", "failed") for r in runs)

        with airflow.running():
            airflow.wait("the scheduled run to end", idle, 300)
            due = DAY - time.time() % DAY  # the next scheduled run lists the landing: not yet
            if due < 120:
                time.sleep(due + 5)
                airflow.wait("that scheduled run to end", idle, 300)
            landed = time.monotonic()
            upload_landing(s3_endpoint, tmp_path / "sink", landing)

            def announced() -> set[str]:  # the runs whose bronze pass advanced the table: its asset events'
                events = airflow.api("GET", "/assets/events?source_dag_id=cdc_bronze")["asset_events"]
                return {e["source_run_id"] for e in events if (e.get("extra") or {}).get("table") == "customers"}

            run_ids = airflow.wait("bronze to ingest the landed files", announced)
            print(f"landed to bronze through the queue: {time.monotonic() - landed:.1f}s")
            assert {r["run_type"] for r in airflow.runs("cdc_bronze") if r["dag_run_id"] in run_ids} == {"asset_triggered"}
            assert row_count(Lake(str(lake)).bronze("customers")) == generated.events
