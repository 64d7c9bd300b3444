"""Event-driven runs on the real scheduler (docs/operations.md, "Event-driven runs"): the landing bucket notifies an SQS queue
(the local S3 server's) of each object created, and the triggerer's watcher on it starts cdc_bronze. A module of its
own: its Airflow differs from test_scheduler.py's (the queue set, sensors that give up at once), and the two stacks
split over the two test workers."""

from __future__ import annotations

import time

import pytest

from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake, row_count
from spark_jobs.registry import load_registry
from tests.airflow.scheduler import Airflow, airflow_env, postgres
from tests.conftest import s3_environment, subprocess_env, upload_landing
from tests.support import pipeline_service

pytest.importorskip("airflow")


def test_a_file_landed_starts_bronze_through_the_bucket_notification_queue_without_a_poll(tmp_path, s3_endpoint):
    """CDC_LANDING_QUEUE: the landing bucket notifies an SQS queue (the local endpoint's) of each object created; the
    triggerer's watcher on it starts cdc_bronze, whose sensor takes the file at once. No sensor is waiting when the
    file lands (the scheduled run's gave up after a second), and no scheduled run is due: the queue's run takes it."""
    import boto3

    config = tmp_path / "include" / "tables.yaml"
    config.parent.mkdir()
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n")
    landing, lake = "s3://landing/cdc", tmp_path / "lake"
    (generated,) = generate(load_registry(str(config)).select(None), tmp_path / "sink", Options(rows=20, changes=20))
    # the bucket's notifications, as its owner sets them up (docs/operations.md, "Event-driven runs")
    aws = {"endpoint_url": s3_endpoint, "aws_access_key_id": "test", "aws_secret_access_key": "test",
           "region_name": "us-east-1"}
    sqs = boto3.client("sqs", **aws)
    queue = sqs.create_queue(QueueName="landing-created")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    boto3.client("s3", **aws).put_bucket_notification_configuration(Bucket="landing", NotificationConfiguration={
        "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]})
    deployment = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": landing, "CDC_LAKE_URI": str(lake)}
    # what is tested is not its first job's speed: no warm-up (test_service.py has one)
    service_env = subprocess_env(**deployment, **s3_environment(s3_endpoint), CDC_SERVICE_WARM_UP="false")
    with postgres() as database, pipeline_service(service_env, tmp_path / "service.log") as service:
        env = airflow_env(tmp_path / "airflow", database, service, s3_endpoint, deployment, CDC_LANDING_QUEUE=queue,
                          CDC_SENSOR_TIMEOUT="1", CDC_SENSOR_POKE_INTERVAL="1")
        airflow = Airflow(env, tmp_path / "airflow")

        def idle() -> bool:  # a run of cdc_bronze, and none running
            runs = airflow.runs("cdc_bronze")
            return bool(runs) and all(r["state"] in ("success", "failed") for r in runs)

        with airflow.running():
            airflow.wait("the scheduled run's sensor to give up", idle, 300)
            due = 900 - time.time() % 900  # the next scheduled run (every 15 minutes) lists the landing: not yet
            if due < 120:
                time.sleep(due + 5)
                airflow.wait("that scheduled run to end", idle, 300)
            landed = time.monotonic()
            upload_landing(s3_endpoint, tmp_path / "sink", landing)

            def ingested() -> list[dict]:  # each notification may start a run: one of them ingests
                return [r for r in airflow.runs("cdc_bronze") if airflow.task_instances("cdc_bronze", r["dag_run_id"])
                        .get("bronze_ingest", {}).get("state") == "success"]

            runs = airflow.wait("bronze to ingest the landed files", ingested)
            print(f"landed to bronze through the queue: {time.monotonic() - landed:.1f}s")
            assert {r["run_type"] for r in runs} == {"asset_triggered"}
            assert row_count(Lake(str(lake)).bronze("customers")) == generated.events
