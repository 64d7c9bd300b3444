"""The pipeline service's HTTP side (spark_jobs/service.py runs the jobs): who may ask (Listener: the Host names, the
secret, TLS) and what each endpoint answers. The standard library's server: nothing here needs a framework."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import ssl
import threading
from dataclasses import asdict, dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from spark_jobs.service_client import JobRequest, JobStatus
from spark_jobs.settings import settings

MAX_BODY = 8 * 2**20  # bytes of a request body: a backlog's list of a few thousand landing files fits many times over
MAX_CONNECTIONS = 64  # requests handled at once; more are refused with 503 (each takes a thread)
READ_TIMEOUT_S = 15.0  # a client that sends nothing for this long is disconnected
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit also takes '²' and other scripts' digits


def _whole_number(text: str) -> int | None:
    """A header's or query's whole number, None when it is not one."""
    return int(text) if _DIGITS.fullmatch(text) else None


class Job(Protocol):
    id: str

    def status(self, offset: int) -> JobStatus: ...


class Jobs(Protocol):
    """What the endpoints need of the service (spark_jobs.service.PipelineService)."""

    jobs: dict[str, Any]
    spark_stopped: threading.Event

    def running(self) -> int: ...

    def submit(self, request: JobRequest) -> Job: ...


@dataclass(frozen=True)
class Listener:
    """Where the service listens and what it accepts: the Host names a request may carry (its own address and,
    on loopback, loopback's names), the secret, and TLS."""

    host: str
    port: int
    token: str
    tls: ssl.SSLContext | None = None
    allowed_hosts: tuple[str, ...] = ()

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def host_allowed(self, header: str | None) -> bool:
        if not header:
            return False
        name, _, port = header.rpartition(":") if not header.endswith("]") else (header, "", "")
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        if not name or port != str(self.port):
            return False
        own = {self.host, *self.allowed_hosts, *(LOOPBACK_NAMES if is_loopback(self.host) else ())}
        return name.lower() in {h.lower() for h in own}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServiceHandler(BaseHTTPRequestHandler):
    """The endpoints (spark_jobs/service.py's docstring lists them); handler() binds one to its service and listener."""

    service: Jobs
    listener: Listener
    server_version = "cdc-pipeline-service"
    timeout = READ_TIMEOUT_S  # an idle or slow client is disconnected (the socket's timeout)

    def _reply(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def _refused(self) -> bool:
        """Replies and returns True unless the request is the service's own client's: its own Host, no
        Origin (no browser page), and the secret."""
        if not self.listener.host_allowed(self.headers.get("Host")):
            self._reply(HTTPStatus.MISDIRECTED_REQUEST, {"error": "this service answers only at its own address"})
            return True
        if self.headers.get("Origin") is not None:
            self._reply(HTTPStatus.FORBIDDEN, {"error": "requests from web pages are refused"})
            return True
        if not secrets.compare_digest(self.headers.get("Authorization", "").encode(),
                                      f"Bearer {self.listener.token}".encode()):
            self._reply(HTTPStatus.UNAUTHORIZED, {"error": "the service's secret is required as a bearer token "
                                                           "(its Airflow connection's password)"})
            return True
        return False

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        if self._refused():
            return
        url = urlparse(self.path)
        if url.path == "/health":
            self._reply(HTTPStatus.OK, {"ok": not self.service.spark_stopped.is_set(), "jobs_running": self.service.running(),
                                        "jobs_known": len(self.service.jobs)})
            return
        job = self.service.jobs.get(url.path.removeprefix("/jobs/")) if url.path.startswith("/jobs/") else None
        if job is None:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no job {url.path.removeprefix('/jobs/')[:100]!r} on this "
                                                        "service (restarted, or forgotten long after it ended)"})
            return
        offset = _whole_number(parse_qs(url.query).get("offset", ["0"])[0])
        if offset is None:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": "offset: a whole number of characters, 0 or more"})
            return
        self._reply(HTTPStatus.OK, asdict(job.status(offset)))

    def do_POST(self) -> None:  # noqa: N802
        if self._refused():
            return
        if self.path != "/jobs":
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {self.path[:100]}"})
            return
        if self.headers.get_content_type() != "application/json":
            self._reply(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "a job is submitted as application/json"})
            return
        given = self.headers.get("Content-Length", "")
        length = _whole_number(given)
        if length is None:
            self._reply(HTTPStatus.BAD_REQUEST if given else HTTPStatus.LENGTH_REQUIRED,
                        {"error": "Content-Length: the body's size in bytes"})
            return
        if length > MAX_BODY:
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"a request body is at most {MAX_BODY} bytes"})
            return
        if self.service.spark_stopped.is_set():
            self._reply(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the service's Spark stopped; it restarts"})
            return
        try:
            job = self.service.submit(JobRequest.from_json(json.loads(self.rfile.read(length))))
        except (ValueError, TypeError) as exc:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"{type(exc).__name__}: {exc}"})
            return
        except RecursionError:  # JSON nested deeper than Python parses; no request of the service nests past three
            self._reply(HTTPStatus.BAD_REQUEST, {"error": "the body nests too deep to be a job"})
            return
        self._reply(HTTPStatus.ACCEPTED, {"id": job.id})

    def log_message(self, format: str, *args: Any) -> None:  # polls every second: keep the service's log quiet
        pass


def handler(service: Jobs, listener: Listener) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (ServiceHandler,), {"service": service, "listener": listener})


class BoundedServer(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS requests at once; one more is answered 503 at once, holding no thread."""

    daemon_threads = True

    def __init__(self, *args: Any, tls: ssl.SSLContext | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(READ_TIMEOUT_S)  # the TLS handshake too
            if isinstance(request, ssl.SSLSocket):
                request.do_handshake()
            super().process_request_thread(request, client_address)
        except OSError:
            self.shutdown_request(request)
        finally:
            self.slots.release()


def listener(host: str, port: int, tls_cert: str | None, tls_key: str | None,
             allowed_hosts: tuple[str, ...] = (), token_file: str | None = None) -> Listener:
    """The listener's settings, or ConfigError: beyond loopback the service needs TLS and a secret of the
    operator's (CDC_SERVICE_TOKEN, or a file holding it), not one it made up; loopback gets a new secret at each
    start when none is set."""
    from spark_jobs.errors import ConfigError

    token = settings().service_token
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--token-file {token_file}: {exc.strerror}") from None
    if not is_loopback(host) and not (tls_cert and token):
        raise ConfigError(f"--host {host} listens beyond loopback: give it TLS (--tls-cert, --tls-key) and a secret "
                          "(CDC_SERVICE_TOKEN or --token-file), or listen on 127.0.0.1")
    if bool(tls_cert) != bool(tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    if token and len(token) < 16:
        raise ConfigError("CDC_SERVICE_TOKEN: at least 16 characters (e.g. python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))')")
    tls = None
    if tls_cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_cert_chain(tls_cert, tls_key)
    return Listener(host, port, token or secrets.token_urlsafe(32), tls, allowed_hosts)
