"""The pipeline service's HTTP side (spark_jobs/service.py runs the jobs): who may ask (Listener: the Host names, the
secret, TLS) and what each endpoint answers (a Starlette app), served by uvicorn (HttpServer)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import secrets
import socket
import ssl
import threading
from dataclasses import asdict, dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Protocol

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from spark_jobs.service_client import JobRequest, JobStatus, is_loopback
from spark_jobs.settings import settings

MAX_BODY = 8 * 2**20  # bytes of a request body: a backlog's list of a few thousand landing files fits many times over
MAX_CONNECTIONS = 64  # connections open at once; a request past them is answered 503
# connections that have not yet shown the secret, at most: the oldest is cut to make room for a new one, so that callers
# who hold the secret always find a place however many connections others hold open
MAX_UNAUTHENTICATED = 48
REQUEST_TIMEOUT_S = 15.0  # a request must arrive whole, and be answered, within this; else its connection is closed
LINGER_S = 2.0  # after an answer that ends its connection, how long what the client still sends is read and dropped
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

    def refusal(self, headers: Headers) -> tuple[HTTPStatus, dict[str, str]] | None:
        """Why a request is refused, None when it is the service's own client's: its own Host, no Origin (no
        browser page), and the secret."""
        if not self.host_allowed(headers.get("host")):
            return HTTPStatus.MISDIRECTED_REQUEST, {"error": "this service answers only at its own address"}
        if headers.get("origin") is not None:
            return HTTPStatus.FORBIDDEN, {"error": "requests from web pages are refused"}
        if not secrets.compare_digest(headers.get("authorization", "").encode(), f"Bearer {self.token}".encode()):
            return HTTPStatus.UNAUTHORIZED, {"error": "the service's secret is required as a bearer token (its "
                                                      "Airflow connection's password)"}
        return None

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


def _answer(status: HTTPStatus, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


class _OnlyItsOwnClient:
    """Every request, whatever its path, is refused unless it is the service's own client's (Listener.refusal). A
    refusal ends its connection (one refused request per connection: a client without the secret cannot hold one open
    by asking again); a request that passes marks its connection as its own client's (`Connections`)."""

    def __init__(self, app: ASGIApp, listener: Listener, connections: Connections):
        self.app, self.listener, self.connections = app, listener, connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self.listener.refusal(Headers(scope=scope)) if scope["type"] == "http" else None
        if refused is not None:
            status, body = refused
            await JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store", "Connection": "close"})(
                scope, receive, send)
            return
        if scope["type"] == "http":
            self.connections.authenticated(scope.get("client"))
        await self.app(scope, receive, send)


class Connections:
    """The server's open connections by client address, and which have shown the secret: those that have not are at
    most MAX_UNAUTHENTICATED, the oldest cut first (uvicorn counts every connection alike against its limit)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], _WholeRequestDeadline] = {}

    def opened(self, protocol: _WholeRequestDeadline) -> None:
        waiting = sorted((c for c in self.open.values() if not c.authenticated), key=lambda c: c.opened_at)
        for oldest in waiting[:max(0, len(waiting) + 1 - MAX_UNAUTHENTICATED)]:
            oldest.cut()
        if protocol.client:
            self.open[protocol.client] = protocol

    def closed(self, protocol: _WholeRequestDeadline) -> None:
        if protocol.client and self.open.get(protocol.client) is protocol:
            del self.open[protocol.client]

    def authenticated(self, client: Any) -> None:
        protocol = self.open.get(tuple(client)) if client else None
        if protocol is not None:
            protocol.authenticated = True


def application(service: Jobs, listener: Listener, connections: Connections | None = None) -> Starlette:
    """The endpoints (spark_jobs/service.py's docstring lists them), behind the listener's refusals."""

    async def health(request: Request) -> Response:
        return _answer(HTTPStatus.OK, {"ok": not service.spark_stopped.is_set(), "jobs_running": service.running(),
                                       "jobs_known": len(service.jobs)})

    async def job_status(request: Request) -> Response:
        name = request.path_params["job_id"]
        job = service.jobs.get(name)
        if job is None:
            return _answer(HTTPStatus.NOT_FOUND, {"error": f"no job {name[:100]!r} on this service (restarted, or "
                                                           "forgotten long after it ended)"})
        offset = _whole_number(request.query_params.get("offset", "0"))
        if offset is None:
            return _answer(HTTPStatus.BAD_REQUEST, {"error": "offset: a whole number of characters, 0 or more"})
        return _answer(HTTPStatus.OK, asdict(job.status(offset)))

    async def submit(request: Request) -> Response:
        if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
            return _answer(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "a job is submitted as application/json"})
        given = request.headers.get("content-length", "")
        length = _whole_number(given)
        if length is None or "transfer-encoding" in request.headers:  # a job's request is small and sized, not chunked
            return _answer(HTTPStatus.BAD_REQUEST if given else HTTPStatus.LENGTH_REQUIRED,
                           {"error": "Content-Length: the body's size in bytes (and no Transfer-Encoding)"})
        if length > MAX_BODY:
            return _answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"a request body is at most {MAX_BODY} bytes"})
        if service.spark_stopped.is_set():
            return _answer(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the service's Spark stopped; it restarts"})
        body = bytearray()
        async for chunk in request.stream():  # the bytes read are counted, whatever the headers said
            body += chunk
            if len(body) > MAX_BODY:
                return _answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               {"error": f"a request body is at most {MAX_BODY} bytes"})
        try:
            job = service.submit(JobRequest.from_json(json.loads(bytes(body))))
        except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
            return _answer(HTTPStatus.BAD_REQUEST, {"error": f"{type(exc).__name__}: {exc}"})
        except RecursionError:  # JSON nested deeper than Python parses; no request of the service nests past three
            return _answer(HTTPStatus.BAD_REQUEST, {"error": "the body nests too deep to be a job"})
        return _answer(HTTPStatus.ACCEPTED, {"id": job.id})

    async def no_endpoint(request: Request, exc: Exception) -> Response:
        return _answer(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {request.method} {request.url.path[:100]}"})

    routes = [Route("/health", health, methods=["GET"]), Route("/jobs/{job_id}", job_status, methods=["GET"]),
              Route("/jobs", submit, methods=["POST"])]
    return Starlette(routes=routes, middleware=[Middleware(_OnlyItsOwnClient, listener=listener,
                                                           connections=connections or Connections())],
                     exception_handlers={HTTPStatus.NOT_FOUND: no_endpoint, HTTPStatus.METHOD_NOT_ALLOWED: no_endpoint})


class _LingeringClose:
    """The connection's transport as uvicorn sees it, but closing as HTTP servers do (RFC 9112, 9.6): stop writing,
    read and drop what the client still sends, close at its end or after LINGER_S. uvicorn closes at once, also after
    refusing a request whose body is still on its way (a 400 for its headers, a 413 for its size); the kernel then
    resets the connection for the unread bytes, and the client loses the answer written just before."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self.transport = transport
        self.loop = loop
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self.transport.is_closing()

    def close(self) -> None:
        if self.is_closing():
            return
        if not self.transport.can_write_eof():  # TLS: its close_notify ends the connection in order
            self.transport.close()
            return
        self.lingering = True
        self.transport.write_eof()  # once what is written has gone out
        self.transport.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)  # the client's end (eof_received) closes it sooner


class _WholeRequestDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 with a deadline for each whole request. uvicorn has none: its keep-alive timer stops at a
    request's first byte, and h11 waits as long as bytes keep coming, so a client sending a header byte every few
    seconds would hold its connection (and a place under limit_concurrency) for ever. Here a connection must deliver
    each request, and take its answer, within REQUEST_TIMEOUT_S of opening or of the answer before; else it is
    closed."""

    deadline: asyncio.TimerHandle | None = None
    registry: Connections  # the server's (HttpServer sets it on its own subclass)
    authenticated = False  # a request on it has shown the secret

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.closer = _LingeringClose(transport, self.loop)
        super().connection_made(self.closer)  # type: ignore[arg-type]
        self.opened_at = self.loop.time()
        self.registry.opened(self)
        self._arm()

    def cut(self) -> None:
        self.closer.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.closer.lingering:  # else the rest of a request already answered: dropped
            super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request on this kept-alive connection has a deadline of its own

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.registry.closed(self)
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        if not self.transport.is_closing():
            self.deadline = self.loop.call_later(REQUEST_TIMEOUT_S, self._expire)

    def _expire(self) -> None:
        self.closer.transport.close()  # at once: the deadline is for clients that hold on


class HttpServer:
    """The app on uvicorn in a thread of its own (the process's main thread waits on the service's Spark): uvicorn
    parses HTTP, answers 503 past MAX_CONNECTIONS connections and serves TLS; the socket is bound here, so that its
    port (0: any free one) is known before the first request."""

    def __init__(self, service: Jobs, listener: Listener):
        family = socket.getaddrinfo(listener.host, listener.port, type=socket.SOCK_STREAM)[0][0]
        self.socket = socket.create_server((listener.host, listener.port), family=family)
        self.port = self.socket.getsockname()[1]
        self.listener = dataclasses.replace(listener, port=self.port)  # the Host it must be asked by names this port
        tls = self.listener.tls
        connections = Connections()
        protocol = type("_ServerProtocol", (_WholeRequestDeadline,), {"registry": connections})
        config = uvicorn.Config(
            application(service, self.listener, connections), http=protocol, loop="asyncio", lifespan="off",
            limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=int(REQUEST_TIMEOUT_S),
            ssl_context_factory=None if tls is None else (lambda config, default: tls),
            log_config=None, log_level="warning", access_log=False, server_header=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="cdc-service-http", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()


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
