"""The pipeline service's hook and connection type. A module of its own, imported by the tasks and the trigger when
they run, never by the DAG files."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from spark_jobs import service_client
from spark_jobs.service_client import CONN_TYPE, JobRequest, JobStatus, ServiceConnection, ServiceError


class PipelineServiceHook(BaseHook):
    """The pipeline service (spark_jobs/service.py) through an Airflow connection of its own type, as the service
    writes it at start (CDC_SERVICE_CONNECTION_FILE) or the operator sets it up (docs/operations.md, "The pipeline
    service"): host and port, the scheme (http on loopback, https beyond it), the secret as the password (sent as a
    bearer token) and, in the extra `verify`, the CA file that signed the service's certificate. Requests go through
    the project's own client of the service (spark_jobs.service_client, which scripts and healthchecks use too),
    not the HTTP provider's hook: that module imports aiohttp, 0.2 s of every layer task's start on the path from a
    landing to gold (tests/benchmarks/RESULTS.md, W5). Errors are ServiceError: permanent for a refusal, worth a
    retry otherwise."""

    conn_name_attr = "cdc_service_conn_id"
    default_conn_name = "cdc_pipeline_service"
    conn_type = CONN_TYPE
    hook_name = "CDC pipeline service"

    def __init__(self, cdc_service_conn_id: str = default_conn_name):
        super().__init__()
        self.conn_id = cdc_service_conn_id
        self._service: ServiceConnection | None = None

    def get_conn(self) -> ServiceConnection:
        """The service's address, secret and CA file from the connection (read once per hook: a trigger polls through
        the same hook each second)."""
        if self._service is None:
            connection = self.get_connection(self.conn_id)
            if not (connection.host and connection.port and connection.password):
                raise ValueError(f"Airflow connection {self.conn_id!r}: the pipeline service's host, port and "
                                 "secret (password) are required")
            self._service = ServiceConnection.at(connection.schema, connection.host, connection.port,
                                                 connection.password,
                                                 service_client.ca_file(connection.extra_dejson.get("verify")))
        return self._service

    @property
    def url(self) -> str:
        return self.get_conn().url

    def submit(self, request: JobRequest) -> str:
        """Queues the job on the service; returns the job's id."""
        return service_client.submit(self.get_conn(), request)

    def poll(self, job_id: str, offset: int = 0) -> JobStatus:
        return service_client.poll(self.get_conn(), job_id, offset)

    def health(self) -> dict[str, Any]:
        """The service's /health; ServiceError when it does not answer, refuses, or its Spark has stopped."""
        return service_client.health(self.get_conn())

    def test_connection(self) -> tuple[bool, str]:
        """The Connections UI's Test button: the service answers at this address, over TLS with this CA, to this
        secret, and its Spark runs."""
        try:
            answer = self.health()
        except (ServiceError, ValueError) as exc:
            return False, str(exc)
        return True, f"pipeline service {self.url}: {answer.get('jobs_running')} job(s) running"
