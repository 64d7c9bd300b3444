"""The pipeline service: one long-lived process that runs the layer jobs (`run`, `maintain`) with Spark, Delta and
Great Expectations loaded once, so that a job pays neither a JVM start, the JIT warm-up nor the GX import
(docs/architecture.md, "The pipeline service"). Airflow tasks submit a job here and wait deferred, holding no
worker slot (cdc_airflow.operators, cdc_airflow.triggers).

A few JSON endpoints over HTTP (the standard library's server: nothing here needs a framework):
  POST /jobs          {"argv": [...], "env": {...}, "files": [...], "key": "..."}  ->  202 {"id": ...}
  GET  /jobs/<id>?offset=N                                  ->  the job's state, exit code, cause and log from N
  GET  /health                                              ->  {"ok": true, "jobs_running": N, ...}
A job is what `python -m spark_jobs <argv>` would do as a process, with the same exit codes and the same
one-line cause; `env` (the task's CDC_* and AWS_* variables) applies to that job only; `files` is the sensor's
list, handed to the job as `--files @file`; a second submission with the same `key` (a task's try) returns
the first job. With CDC_SERVICE_TOKEN set, every request must carry it as a bearer token.

The client half (submit, poll) is pure Python: the Airflow plugin imports it."""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlparse

from spark_jobs.settings import Settings, job_environment, settings

COMMANDS = ("run", "maintain")  # what the service runs; the others are a user's own process
KEEP_FINISHED = 1000  # finished jobs kept for their logs (a task reads its job's log once it ends)


@dataclass
class JobStatus:
    """What a poll returns: the log from the asked offset on, and where the next poll starts."""

    id: str
    state: str  # queued | running | succeeded | failed
    exit_code: int | None = None
    cause: str | None = None  # the job's one-line failure cause (table, layer, reason), as a process writes it
    log: str = ""
    offset: int = 0
    seconds: float | None = None
    spark_jobs: int | None = None  # the Spark jobs the job ran (its job group's), once it ended

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed")


class ServiceError(Exception):
    """The service could not be reached or refused the request: worth a retry unless `permanent`."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


# ---- client -------------------------------------------------------------------------------------------------

def _request(url: str, method: str = "GET", body: dict[str, Any] | None = None, timeout: float = 30) -> Any:
    token = settings().service_token
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        raise ServiceError(f"pipeline service {url}: HTTP {exc.code}: {detail}", permanent=exc.code < 500) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceError(f"pipeline service {url} unreachable: {exc}") from None


def submit(base_url: str, argv: list[str], env: dict[str, str], files: list[str] | None = None,
           key: str | None = None) -> str:
    """Queues `python -m spark_jobs <argv>` on the service; returns the job's id."""
    body = {"argv": argv, "env": env, "files": files, "key": key}
    return str(_request(f"{base_url.rstrip('/')}/jobs", "POST", body)["id"])


def poll(base_url: str, job_id: str, offset: int = 0) -> JobStatus:
    return JobStatus(**_request(f"{base_url.rstrip('/')}/jobs/{job_id}?offset={offset}"))


# ---- server -------------------------------------------------------------------------------------------------

@dataclass
class _Job:
    id: str
    argv: list[str]
    env: dict[str, str]
    key: str | None = None
    state: str = "queued"
    exit_code: int | None = None
    cause: str | None = None
    started: float | None = None
    finished: float | None = None
    spark_jobs: int | None = None
    chunks: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, text: str) -> None:
        with self.lock:
            self.chunks.append(text)

    def status(self, offset: int) -> JobStatus:
        with self.lock:
            text = "".join(self.chunks)
            self.chunks = [text]
        seconds = None if self.started is None else round((self.finished or time.time()) - self.started, 3)
        return JobStatus(self.id, self.state, self.exit_code, self.cause, text[offset:], len(text), seconds,
                         self.spark_jobs)


_current_job: contextvars.ContextVar[_Job | None] = contextvars.ContextVar("cdc_current_job", default=None)


class _Routed:
    """sys.stdout / sys.stderr while the service runs: what a job prints goes to that job's log (its thread's
    context), everything else to the service's own output."""

    def __init__(self, own: IO[str]):
        self.own = own

    def write(self, text: str) -> int:
        job = _current_job.get()
        if job is None:
            return self.own.write(text)
        job.write(text)
        return len(text)

    def flush(self) -> None:
        self.own.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.own, name)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


class PipelineService:
    """Runs submitted jobs on `workers` threads, in the one Spark session of this process."""

    def __init__(self, workers: int):
        self.jobs: dict[str, _Job] = {}
        self.by_key: dict[str, str] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cdc-job")
        self.scratch = Path(tempfile.mkdtemp(prefix="cdc-service-"))
        self.spark_stopped = threading.Event()

    def start_spark(self) -> str:
        """The session every job will share, and the Great Expectations import, paid once here."""
        import importlib

        from spark_jobs.session import build_session

        spark = build_session("cdc-pipeline-service")
        importlib.import_module("great_expectations")
        return str(spark.sparkContext.master)

    def submit(self, argv: list[str], env: dict[str, str], files: list[str] | None, key: str | None) -> _Job:
        if not argv or argv[0] not in COMMANDS:
            raise ValueError(f"the service runs {' and '.join(COMMANDS)}, not {argv[:1]}")
        if not all(isinstance(a, str) for a in argv) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError("argv and env take strings only")
        with self.lock:
            if key and key in self.by_key:
                return self.jobs[self.by_key[key]]
            job = _Job(id=time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(4), argv=list(argv), env=dict(env),
                       key=key)
            if files is not None:  # as a file, the way a process gets a long list (spark_jobs.cli, --files @file)
                listed = self.scratch / f"{job.id}.files.json"
                listed.write_text(json.dumps(files))
                job.argv += ["--files", f"@{listed}"]
            self.jobs[job.id] = job
            if key:
                self.by_key[key] = job.id
            self._forget_old()
        self.pool.submit(self._execute, job)
        return job

    def _forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if j.finished is not None]
        for job in sorted(finished, key=lambda j: j.finished or 0)[:max(0, len(finished) - KEEP_FINISHED)]:
            del self.jobs[job.id]
            if job.key:
                self.by_key.pop(job.key, None)

    def _execute(self, job: _Job) -> None:
        from spark_jobs.cli import main

        failure = self.scratch / f"{job.id}.failure.txt"
        job.state, job.started = "running", time.time()
        print(f"{_now()} job {job.id} started: {job.key or ''} {' '.join(job.argv[:2])} ...", flush=True)
        token = _current_job.set(job)
        spark = self._spark_context()
        if spark is not None:  # the job's Spark jobs in a group of their own: counted, and named in the Spark UI
            spark.setJobGroup(job.id, job.key or " ".join(job.argv[:2]))
        try:
            with job_environment({**job.env, Settings.variable("failure_file"): str(failure)}):
                code = main(job.argv)
        except SystemExit as exc:  # argparse refusing the arguments, as a process would exit
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:  # what would end a process with a traceback and exit 1
            traceback.print_exc()
            code = 1
        finally:
            _current_job.reset(token)
        if spark is not None:
            job.spark_jobs = len(spark.statusTracker().getJobIdsForGroup(job.id))
        job.cause = failure.read_text().strip() if failure.exists() else None
        job.exit_code, job.finished = code, time.time()
        job.state = "succeeded" if code == 0 else "failed"
        failure.unlink(missing_ok=True)
        print(f"{_now()} job {job.id} {job.state} (exit {code}) in {job.finished - job.started:.1f}s, "
              f"{job.spark_jobs} Spark jobs", flush=True)
        if self._spark_is_stopped():
            print("Spark stopped under the service (its JVM died?): stopping, for the supervisor to restart it",
                  file=sys.stderr, flush=True)
            self.spark_stopped.set()

    @staticmethod
    def _spark_context() -> Any:
        from pyspark import SparkContext

        return SparkContext._active_spark_context

    def _spark_is_stopped(self) -> bool:
        context = self._spark_context()
        try:
            return context is None or bool(context._jsc.sc().isStopped())
        except Exception:  # the JVM is gone: py4j cannot even ask
            return True

    def running(self) -> int:
        return sum(1 for j in list(self.jobs.values()) if j.state == "running")


def _handler(service: PipelineService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "cdc-pipeline-service"

        def _reply(self, status: HTTPStatus, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            token = settings().service_token
            if token and not secrets.compare_digest(self.headers.get("Authorization", ""), f"Bearer {token}"):
                self._reply(HTTPStatus.UNAUTHORIZED, {"error": "a bearer token (CDC_SERVICE_TOKEN) is required"})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            if not self._authorised():
                return
            url = urlparse(self.path)
            if url.path == "/health":
                self._reply(HTTPStatus.OK, {"ok": not service.spark_stopped.is_set(), "jobs_running": service.running(),
                                            "jobs_known": len(service.jobs)})
                return
            job = service.jobs.get(url.path.removeprefix("/jobs/")) if url.path.startswith("/jobs/") else None
            if job is None:
                self._reply(HTTPStatus.NOT_FOUND, {"error": f"no job {url.path.removeprefix('/jobs/')!r} on this "
                                                            "service (restarted, or forgotten long after it ended)"})
                return
            offset = int(parse_qs(url.query).get("offset", ["0"])[0])
            self._reply(HTTPStatus.OK, asdict(job.status(offset)))

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            if self.path != "/jobs":
                self._reply(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {self.path}"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                job = service.submit(list(body["argv"]), dict(body.get("env") or {}), body.get("files"), body.get("key"))
            except (ValueError, KeyError, TypeError) as exc:
                self._reply(HTTPStatus.BAD_REQUEST, {"error": f"{type(exc).__name__}: {exc}"})
                return
            self._reply(HTTPStatus.ACCEPTED, {"id": job.id})

        def log_message(self, format: str, *args: Any) -> None:  # polls every second: keep the service's log quiet
            pass

    return Handler


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def serve(host: str, port: int, workers: int, url_file: str | None = None) -> int:
    """Runs the service until interrupted, or until its Spark stops (exit 1, for a supervisor to restart it).
    Once it takes jobs, its URL is written to `url_file` (a script's sign that it is ready, and of the port)."""
    # a long-lived driver serves its Spark UI (every task's jobs) unless told otherwise
    os.environ.setdefault(Settings.variable("spark_ui"), "true")
    sys.stdout, sys.stderr = _Routed(sys.stdout), _Routed(sys.stderr)  # type: ignore[assignment]
    signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's stop ends it like ^C: Spark shut down in order
    service = PipelineService(workers)
    started = time.monotonic()
    master = service.start_spark()
    server = ThreadingHTTPServer((host, port), _handler(service))
    server.daemon_threads = True
    print(f"pipeline service on http://{host}:{server.server_port} ({workers} job threads, Spark {master}, ready in "
          f"{time.monotonic() - started:.1f}s): Airflow tasks submit with CDC_SERVICE_URL=http://{host}:{server.server_port}",
          flush=True)
    threading.Thread(target=server.serve_forever, name="cdc-service-http", daemon=True).start()
    if url_file:
        Path(url_file).write_text(f"http://{host}:{server.server_port}\n")
    try:
        while not service.spark_stopped.wait(1.0):
            pass
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.shutdown()
        service.pool.shutdown(wait=False, cancel_futures=True)
