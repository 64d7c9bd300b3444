"""The pipeline service's HTTP edge (spark_jobs/service_http.py) on its real server, uvicorn on loopback, in this process
with a stand-in for the job runner: the deadline for a whole request (a client trickling its header is cut, however
often it sends), the bound on connections, TLS that one silent client does not stall, and malformed requests answered.
The service's own process and its jobs are tests/airflow/test_service.py's."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

import pytest

from spark_jobs import service_http
from spark_jobs.service_client import JobRequest, JobStatus
from spark_jobs.service_credentials import self_signed

TOKEN = "a-secret-of-sixteen-or-more"
DEADLINE_S = 2.0  # the whole-request deadline here (the service's is REQUEST_TIMEOUT_S): the tests wait on it


@dataclass
class _Job:
    id: str

    def status(self, offset: int) -> JobStatus:
        return JobStatus(self.id, "succeeded", 0, None, "a log"[offset:], 5, 0.1, 0)


@dataclass
class StandIn:
    """The service's side the endpoints call (service_http.Jobs), with no Spark behind it."""

    jobs: dict[str, _Job] = field(default_factory=dict)
    spark_stopped: threading.Event = field(default_factory=threading.Event)
    submitted: list[JobRequest] = field(default_factory=list)

    def running(self) -> int:
        return 0

    def submit(self, request: JobRequest) -> _Job:
        request.check()
        self.submitted.append(request)
        job = self.jobs[f"job-{len(self.jobs)}"] = _Job(f"job-{len(self.jobs)}")
        return job


@pytest.fixture()
def serve(monkeypatch):
    """Starts the server on a free loopback port, over TLS with a context given: (the stand-in, the server)."""
    monkeypatch.setattr(service_http, "REQUEST_TIMEOUT_S", DEADLINE_S)
    started: list[service_http.HttpServer] = []

    def start(tls: ssl.SSLContext | None = None) -> tuple[StandIn, service_http.HttpServer]:
        jobs = StandIn()
        server = service_http.HttpServer(jobs, service_http.Listener("127.0.0.1", 0, TOKEN, tls))
        server.start()
        started.append(server)
        deadline = time.monotonic() + 30
        while not server.server.started:
            assert time.monotonic() < deadline and server.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        return jobs, server

    yield start
    for server in started:
        server.stop()


@pytest.fixture()
def served(serve):
    return serve()


def ask(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None) -> tuple[int, dict]:
    """A request as anyone could send it: any headers (the service's own Host and secret unless given)."""
    given = {"Host": f"127.0.0.1:{port}", "Authorization": f"Bearer {TOKEN}", **(headers or {})}
    connection = (http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context) if context
                  else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in given.items():
        connection.putheader(name, value)
    if body is not None and "Content-Length" not in given:
        connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    try:
        return response.status, json.loads(text)
    except ValueError:
        return response.status, {"text": text}


def closed_after(connection: socket.socket, trickle: bytes, every_s: float) -> float:
    """Seconds until the server closes the connection while the client sends `trickle` a byte every `every_s`."""
    started = time.monotonic()
    connection.settimeout(every_s)
    for byte in trickle:
        try:
            connection.sendall(bytes([byte]))
            if connection.recv(1024) == b"":
                break
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    else:
        connection.settimeout(DEADLINE_S * 4)
        assert connection.recv(1024) == b""
    return time.monotonic() - started


def test_a_client_that_trickles_its_request_is_cut_at_the_whole_requests_deadline(served):
    """Each read comes well within any per-read timeout (a byte every DEADLINE_S / 4), and still the connection is
    closed once the request as a whole is late; an idle connection too; a client meanwhile is answered."""
    _, server = served
    slow = socket.create_connection(("127.0.0.1", server.port))
    idle = socket.create_connection(("127.0.0.1", server.port))
    header = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nX-Slow: {'a' * 100}".encode()
    took = closed_after(slow, header, DEADLINE_S / 4)
    assert DEADLINE_S - 0.5 < took < DEADLINE_S + 2, took
    assert ask(server.port, "GET", "/health")[0] == 200
    idle.settimeout(DEADLINE_S * 4)
    assert idle.recv(1024) == b""
    # a kept-alive connection's next request has its own deadline: answered, then trickled, then cut
    again = socket.create_connection(("127.0.0.1", server.port))
    again.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
                  .encode())
    again.settimeout(10)
    assert again.recv(4096).startswith(b"HTTP/1.1 200 ")
    assert DEADLINE_S - 0.5 < closed_after(again, header, DEADLINE_S / 4) < DEADLINE_S + 2
    for connection in (slow, idle, again):
        connection.close()


def _open_after_one_request(port: int, secret: str) -> socket.socket:
    """A kept-alive connection that has asked once with `secret` and been answered."""
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {secret}\r\n\r\n"
                       .encode())
    connection.settimeout(10)
    assert connection.recv(4096).startswith(b"HTTP/1.1 ")
    return connection


def _is_closed(connection: socket.socket) -> bool:
    """Does the server end the connection: its end arrives (after what is left of an answer) within the wait."""
    connection.settimeout(DEADLINE_S * 4)
    try:
        while connection.recv(1024):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_without_the_secret_never_take_the_places_of_callers_who_have_it(served):
    """As many connections as the bound, none of which has shown the secret (held open, idle): the oldest are cut as
    new ones come, and a caller with the secret is answered. A request refused for want of the secret ends its
    connection, so none is held open by asking again. Past the bound of connections that have shown the secret, a
    request is answered 503, and the places come back once they close."""
    _, server = served
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(service_http.MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)
        assert ask(server.port, "GET", "/health")[0] == 200
        cut = sum(_is_closed(c) for c in idle[:service_http.MAX_CONNECTIONS - service_http.MAX_UNAUTHENTICATED])
        assert cut == service_http.MAX_CONNECTIONS - service_http.MAX_UNAUTHENTICATED  # the oldest
    finally:
        for connection in idle:
            connection.close()
    refused = _open_after_one_request(server.port, "not-the-secret-at-all")
    assert _is_closed(refused)
    own = [_open_after_one_request(server.port, TOKEN) for _ in range(service_http.MAX_CONNECTIONS)]
    try:
        assert ask(server.port, "GET", "/health")[0] == 503
    finally:
        for connection in own:
            connection.close()
    deadline = time.monotonic() + 10
    while ask(server.port, "GET", "/health")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_body_past_the_limit_is_refused_whatever_its_framing(served, monkeypatch):
    """A job's request is sized (Content-Length) and small: chunked framing is refused, Content-Length beside it too
    (h11 reads the chunks and ignores the length), and the bytes read are counted against the limit."""
    monkeypatch.setattr(service_http, "MAX_BODY", 64)
    jobs, server = served
    body = json.dumps({"command": "run", "reason": "x" * 200}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    for headers in ({"Transfer-Encoding": "chunked"}, {"Transfer-Encoding": "chunked", "Content-Length": "10"}):
        connection = socket.create_connection(("127.0.0.1", server.port))
        head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"127.0.0.1:{server.port}", "Authorization": f"Bearer {TOKEN}",
                                                     "Content-Type": "application/json", **headers}.items())
        connection.sendall(f"POST /jobs HTTP/1.1\r\n{head}\r\n".encode() + chunked)
        connection.settimeout(10)
        answer = connection.recv(4096)
        assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 411 ")), answer[:200]
        connection.close()
    assert ask(server.port, "POST", "/jobs", body, {"Content-Type": "application/json"})[0] == 413
    assert jobs.submitted == []


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    key, cert = self_signed("127.0.0.1")
    (folder / "service.key").write_bytes(key)
    (folder / "service.crt").write_bytes(cert)
    return str(folder / "service.crt"), str(folder / "service.key")


def test_under_tls_a_silent_client_stalls_nobody(certificate, serve):
    """A connection that never starts its TLS handshake holds no one up: another client is answered meanwhile."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(*certificate)
    _, server = serve(tls)
    silent = socket.create_connection(("127.0.0.1", server.port))
    client = ssl.create_default_context(cafile=certificate[0])
    client.check_hostname = False
    started = time.monotonic()
    assert ask(server.port, "GET", "/health", context=client)[0] == 200
    assert time.monotonic() - started < DEADLINE_S
    plain = socket.create_connection(("127.0.0.1", server.port))  # plain HTTP to a TLS port: refused by the handshake
    plain.sendall(b"GET /health HTTP/1.1\r\n\r\n")
    plain.settimeout(10)
    assert not plain.recv(1024).startswith(b"HTTP/1.1 200")
    for connection in (silent, plain):
        connection.close()


def test_malformed_requests_are_answered_4xx_and_start_nothing(served):
    jobs, server = served
    port = server.port
    json_type = {"Content-Type": "application/json"}
    status, body = ask(port, "POST", "/jobs", json.dumps({"command": "run", "tables": ["customers"]}).encode(),
                       json_type)
    assert (status, body) == (202, {"id": "job-0"})
    status, body = ask(port, "GET", "/jobs/job-0?offset=2")
    assert (status, body["log"], body["offset"]) == (200, "log", 5)
    answers = {
        "an offset that is not a number": ask(port, "GET", "/jobs/job-0?offset=abc"),
        "a negative offset": ask(port, "GET", "/jobs/job-0?offset=-1"),
        "an offset in another script's digits": ask(port, "GET", "/jobs/job-0?offset=%C2%B2"),
        "an offset that is not UTF-8": ask(port, "GET", "/jobs/job-0?offset=%FF"),
        "a negative Content-Length": ask(port, "POST", "/jobs", b"{}", {**json_type, "Content-Length": "-5"}),
        "a Content-Length in another script's digits": ask(port, "POST", "/jobs", b"{}",
                                                           {**json_type, "Content-Length": "\u00b2"}),
        "a body over the bound": ask(port, "POST", "/jobs", b"", {**json_type,
                                                                 "Content-Length": str(service_http.MAX_BODY + 1)}),
        "not JSON": ask(port, "POST", "/jobs", b"{not json", json_type),
        "not UTF-8": ask(port, "POST", "/jobs", b'{"tables": ["\xff"]}', json_type),
        "a list": ask(port, "POST", "/jobs", b"[]", json_type),
        "nested past Python's parser": ask(port, "POST", "/jobs", b"[" * 100_000 + b"]" * 100_000, json_type),
        "no Content-Length": ask(port, "POST", "/jobs", None, json_type),
        "not JSON's type": ask(port, "POST", "/jobs", b"{}", {"Content-Type": "text/plain"}),
        "an unknown endpoint": ask(port, "GET", "/admin"),
        "a method the endpoint lacks": ask(port, "DELETE", "/jobs"),
        "an unknown job": ask(port, "GET", "/jobs/nope"),
    }
    assert {what: status for what, (status, _) in answers.items()} == {
        **dict.fromkeys(answers, 400), "a body over the bound": 413, "no Content-Length": 411, "not JSON's type": 415,
        "an unknown endpoint": 404, "a method the endpoint lacks": 404, "an unknown job": 404}
    assert answers["an unknown job"][1] == {
        "error": "no job 'nope' on this service (restarted, or forgotten long after it ended)"}
    assert answers["nested past Python's parser"][1] == {"error": "the body nests too deep to be a job"}
    assert [r.tables for r in jobs.submitted] == [("customers",)]  # the well-formed one alone


def connection(monkeypatch, server: service_http.HttpServer, token: str = TOKEN, scheme: str = "http",
               verify: str | None = None) -> str:
    """An Airflow connection of the service's own type, as the service writes it, in the environment; its id."""
    from spark_jobs.service_client import ServiceConnection

    written = ServiceConnection.at(scheme, "127.0.0.1", server.port, token, verify).airflow_json()
    assert json.loads(written)["conn_type"] == "cdc_pipeline_service"
    monkeypatch.setenv("AIRFLOW_CONN_CDC_TEST", written)
    return "cdc_test"


def test_a_refused_request_whose_body_is_still_coming_gets_its_answer(served):
    """Bad headers are answered 400 at once, while the client is still sending the body behind them: closing then,
    with its bytes unread, would make the kernel reset the connection and the client lose the answer."""
    _, server = served
    client = socket.create_connection(("127.0.0.1", server.port))
    head = (f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: -5\r\n\r\n").encode()
    sending = threading.Thread(target=client.sendall, args=(head + b" " * 4 * 2**20,))  # more than one read takes
    sending.start()
    client.settimeout(10)
    answer = b""
    while chunk := client.recv(4096):
        answer += chunk
    sending.join()
    client.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer


def test_the_hook_submits_and_polls_through_its_connection(served, monkeypatch):
    """PipelineServiceHook (the service's Airflow connection, its secret sent as a bearer token): a job submitted
    and polled; a wrong secret is a permanent refusal, an unreachable service worth a retry; the UI's Test button."""
    from cdc_airflow.service_hook import PipelineServiceHook
    from spark_jobs.service_client import ServiceError

    jobs, server = served
    hook = PipelineServiceHook(connection(monkeypatch, server))
    job_id = hook.submit(JobRequest(tables=("customers",), layers=("bronze",)))
    assert [(r.tables, r.layers) for r in jobs.submitted] == [(("customers",), ("bronze",))]
    status = hook.poll(job_id, 2)
    assert (status.id, status.state, status.log, status.offset) == (job_id, "succeeded", "log", 5)
    assert hook.test_connection() == (True, f"pipeline service http://127.0.0.1:{server.port}: 0 job(s) running")

    wrong = PipelineServiceHook(connection(monkeypatch, server, token="not-the-secret-at-all"))
    with pytest.raises(ServiceError, match="HTTP 401") as refused:
        wrong.submit(JobRequest(tables=("customers",)))
    assert refused.value.permanent and len(jobs.submitted) == 1
    assert wrong.test_connection()[0] is False
    server.stop()
    with pytest.raises(ServiceError, match="unreachable") as unreachable:
        PipelineServiceHook(connection(monkeypatch, server)).poll(job_id)
    assert not unreachable.value.permanent


def test_the_hook_trusts_the_ca_its_connection_names(certificate, serve, monkeypatch):
    from cdc_airflow.service_hook import PipelineServiceHook
    from spark_jobs.service_client import ServiceError

    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(*certificate)
    _, server = serve(tls)
    assert PipelineServiceHook(connection(monkeypatch, server, scheme="https", verify=certificate[0])).health()["ok"]
    with pytest.raises(ServiceError, match="unreachable: .*CERTIFICATE_VERIFY_FAILED"):  # the system's CAs do not
        PipelineServiceHook(connection(monkeypatch, server, scheme="https")).health()


def test_airflow_knows_the_services_connection_type():
    """The distribution's provider entry point: the Connections UI offers the type, its fields relabelled."""
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert manager.providers["cdc-medallion"].data["connection-types"][0]["hook-class-name"] == \
        "cdc_airflow.service_hook.PipelineServiceHook"
    assert manager.field_behaviours["cdc_pipeline_service"]["relabeling"] == {"password": "Secret", "schema": "Scheme"}
    assert manager.connection_form_widgets["extra__cdc_pipeline_service__verify"].field_name == "verify"


def test_the_client_sends_the_secret_over_http_on_loopback_alone_and_follows_no_redirect(monkeypatch):
    """Beyond loopback the secret goes over https only; a redirect is an answer (urllib would send the request,
    the secret in it, again to wherever it points), refused as a failure that a retry would not mend."""
    import http.server

    from spark_jobs.service_client import ServiceConnection, ServiceError, health

    with pytest.raises(ServiceError, match="over https beyond loopback") as plain:
        health(ServiceConnection("http://10.0.0.5:8793", TOKEN))
    assert plain.value.permanent
    asked: list[str | None] = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            asked.append(self.headers.get("Authorization"))
            self.send_response(307 if self.path == "/health" else 200)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):  # noqa: ANN002
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(ServiceError, match="HTTP 307") as redirected:
            health(ServiceConnection(f"http://127.0.0.1:{server.server_port}", TOKEN))
        assert redirected.value.permanent and asked == [f"Bearer {TOKEN}"]  # asked once, never at /elsewhere
    finally:
        server.shutdown()
