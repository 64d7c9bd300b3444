"""The pipeline service's hook and connection type. A module of its own: the HTTP provider's hook takes a quarter of a
second to import, which the DAG files (parsed often, at every table count) do not pay; the tasks and the trigger
import it when they run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.providers.http.hooks.http import HttpHook
from requests import Request, RequestException

from spark_jobs.service_client import CONN_TYPE, JobRequest, JobStatus, ServiceError

if TYPE_CHECKING:
    from requests import Session


class PipelineServiceHook(HttpHook):
    """The pipeline service (spark_jobs/service.py) through an Airflow connection of its own type, as the service
    writes it at start (CDC_SERVICE_CONNECTION_FILE) or the operator sets it up (docs/operations.md, "The pipeline
    service"): host and port, the scheme (http on loopback, https beyond it), the secret as the password (sent as a
    bearer token) and, in the extra `verify`, the CA file that signed the service's certificate. The HTTP provider's
    hook makes the session (address, TLS verification, proxies); this one adds the bearer token, the service's
    endpoints and its errors (ServiceError: permanent for a refusal, worth a retry otherwise)."""

    conn_name_attr = "cdc_service_conn_id"
    default_conn_name = "cdc_pipeline_service"
    conn_type = CONN_TYPE
    hook_name = "CDC pipeline service"

    def __init__(self, cdc_service_conn_id: str = default_conn_name, timeout_s: float = 30):
        super().__init__(method="GET", http_conn_id=cdc_service_conn_id)
        self.timeout_s = timeout_s
        self._session: Session | None = None

    def get_conn(self, headers: dict[Any, Any] | None = None, extra_options: dict[str, Any] | None = None) -> Session:
        """The HTTP provider's session for the connection, with the service's secret as a bearer token (made once
        per hook: a trigger polls through the same session each second)."""
        if self._session is None:
            connection = self.get_connection(self.http_conn_id)
            if not (connection.host and connection.port and connection.password):
                raise ValueError(f"Airflow connection {self.http_conn_id!r}: the pipeline service's host, port and "
                                 "secret (password) are required")
            session = super().get_conn(headers, extra_options)
            session.headers["Authorization"] = f"Bearer {connection.password}"
            self._session = session
        return self._session

    @property
    def url(self) -> str:
        self.get_conn()
        return self.base_url

    def _call(self, method: str, endpoint: str, body: dict[str, Any] | None = None) -> Any:
        session = self.get_conn()
        url = self.url_from_endpoint(endpoint)
        prepared = session.prepare_request(Request(method, url, json=body))
        try:  # the HTTP provider's send: the connection's `verify` over REQUESTS_CA_BUNDLE, as requests alone would not
            response = self.run_and_check(session, prepared, {"check_response": False, "timeout": self.timeout_s,
                                                              "allow_redirects": False})
        except RequestException as exc:
            raise ServiceError(f"pipeline service {url} unreachable: {exc}") from None
        if response.status_code >= 300:
            raise ServiceError.answered(url, response.status_code, response.text)
        return response.json()

    def submit(self, request: JobRequest) -> str:
        """Queues the job on the service; returns the job's id."""
        return str(self._call("POST", "/jobs", request.as_json())["id"])

    def poll(self, job_id: str, offset: int = 0) -> JobStatus:
        return JobStatus(**self._call("GET", f"/jobs/{quote(job_id, safe='')}?offset={offset}"))

    def health(self) -> dict[str, Any]:
        return dict(self._call("GET", "/health"))

    def test_connection(self) -> tuple[bool, str]:
        """The Connections UI's Test button: the service answers at this address, over TLS with this CA, to this
        secret, and its Spark runs."""
        try:
            answer = self.health()
        except (ServiceError, ValueError) as exc:
            return False, str(exc)
        if not answer.get("ok"):
            return False, f"pipeline service {self.url}: its Spark has stopped"
        return True, f"pipeline service {self.url}: {answer.get('jobs_running')} job(s) running"
