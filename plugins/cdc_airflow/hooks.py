"""The landing store as Airflow sees it: S3 credentials from an Airflow AWS connection (the amazon
provider's S3Hook), handed to boto3 here and to the Spark job as AWS_* variables; and the landing files
bronze has not taken yet. The pipeline service's hook is cdc_airflow.service_hook."""

from __future__ import annotations

from typing import Any


def s3_settings(conn_id: str) -> dict[str, str]:
    """boto3 client settings (endpoint, region, keys) from an Airflow AWS connection; an absent connection
    leaves boto3's own chain (environment, instance role)."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id=conn_id)
    credentials = hook.get_credentials()
    settings = {"endpoint_url": hook.conn_config.endpoint_url, "region_name": hook.conn_region_name,
                "aws_access_key_id": credentials.access_key, "aws_secret_access_key": credentials.secret_key,
                "aws_session_token": credentials.token}
    return {k: v for k, v in settings.items() if v}


def s3_environment(settings: dict[str, str]) -> dict[str, str]:
    """The same settings as the AWS_* variables boto3 reads in the Spark job's process."""
    names = {"endpoint_url": "AWS_ENDPOINT_URL_S3", "region_name": "AWS_DEFAULT_REGION",
             "aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
             "aws_session_token": "AWS_SESSION_TOKEN"}
    return {names[k]: v for k, v in settings.items()}


def s3_client(settings: dict[str, str] | None) -> Any:
    """A boto3 S3 client with those settings (None for a local landing)."""
    if settings is None:
        return None
    import boto3

    return boto3.client("s3", **settings)


def pending_landing_files(landing: str, lake: str, table: str, topic: str, since_ms: int | None, until_ms: int | None,
                          client: Any, settings: dict[str, str] | None = None) -> list[str]:
    """Paths of the topic's landing files in the window that bronze has not taken yet; `settings` (the
    connection's) also read an S3 lake's ingest log, leaving the process's environment as it is."""
    import os

    from spark_jobs.lake import Lake
    from spark_jobs.landing import LandingWindow
    from spark_jobs.state import pending_files

    env = s3_environment(settings) if settings else os.environ
    files = pending_files(landing, Lake(lake), table, topic, LandingWindow(since_ms, until_ms), client, env)
    return [f.path for f in files]


def pending_by_table(landing: str, lake: str, tables: dict[str, str], since_ms: int | None, until_ms: int | None,
                     client: Any, settings: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Of `tables` (name -> topic), those with landing files bronze has not taken, with their paths: one listing
    per table, after its landing marks, so it costs what is new."""
    found = {table: pending_landing_files(landing, lake, table, topic, since_ms, until_ms, client, settings)
             for table, topic in tables.items()}
    return {table: files for table, files in found.items() if files}
