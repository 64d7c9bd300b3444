"""The pipeline service: one long-lived process that runs the layer jobs (`run`, `maintain`) with Spark, Delta and
Great Expectations loaded once, so that a job pays neither a JVM start, the JIT warm-up nor the GX import
(docs/architecture.md, "The pipeline service"). Airflow tasks submit a job here and wait deferred, holding no
worker slot (cdc_airflow.operators, cdc_airflow.triggers).

A few JSON endpoints over HTTP (spark_jobs/service_http.py, on uvicorn):
  POST /jobs          a JobRequest as JSON                      ->  202 {"id": ...}
  GET  /jobs/<id>?offset=N                                      ->  the job's state, exit code, cause and log from N
  GET  /health                                                  ->  {"ok": true, "jobs_running": N, ...}

The service serves one deployment: the registry, landing and lake are its own settings (CDC_CONFIG,
CDC_LANDING_URI, CDC_LAKE_URI and its AWS_* credentials). A caller names only what a task needs (tables, layers,
models, mode, window, landing files, run id), each validated; the job is what `python -m spark_jobs run|maintain`
would do with those, with the same exit codes and one-line cause.

Every request must carry the service's secret as a bearer token; with none configured (CDC_SERVICE_TOKEN) the
service makes one at start and writes it, with its address, as an Airflow connection to a file only its user can
read. Requests a browser could be made to send are refused: a Host other than the service's own address (DNS
rebinding), any Origin, and POSTs that are not JSON (a form or text/plain POST needs no CORS preflight).

The client half (JobRequest, ServiceConnection, submit, poll, health) is spark_jobs/service_client.py."""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from spark_jobs.errors import EXIT_TRANSIENT
from spark_jobs.logs import StandardStreams, logger, use_handler
from spark_jobs.service_client import JobRequest, JobStatus, ServiceConnection
from spark_jobs.service_credentials import write_private
from spark_jobs.service_http import HttpServer, Listener, listener
from spark_jobs.settings import Settings, job_environment, resolve, resolve_uri, settings
from spark_jobs.stopwatch import Spent, counting
from spark_jobs.warm_up import warm_up

log = logger(__name__)

KEEP_FINISHED = 1000  # finished jobs kept for their logs (a task reads its job's log once it ends)
LINGER_S = 10.0  # after its Spark stopped, how long the service still answers polls before it exits


@dataclass
class _Job:
    id: str
    request: JobRequest
    argv: list[str] = field(default_factory=list)
    state: str = "queued"
    exit_code: int | None = None
    cause: str | None = None
    started: float | None = None
    finished: float | None = None
    spark_jobs: int | None = None
    gx_seconds: float | None = None
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
                         self.spark_jobs, self.gx_seconds)


_current_job: contextvars.ContextVar[_Job | None] = contextvars.ContextVar("cdc_current_job", default=None)


class _Routed:
    """sys.stdout / sys.stderr while the service runs: what a job prints (its libraries: the project logs, _JobLog)
    goes to that job's log (its thread's context), everything else to the service's own output."""

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


class _JobLog(StandardStreams):
    """The `cdc` logger's lines (spark_jobs.logs) while the service runs: a job's into that job's log (its thread's
    context); the service's own to its standard output or error, by level, as anywhere else."""

    def emit(self, record: logging.LogRecord) -> None:
        job = _current_job.get()
        if job is None:
            super().emit(record)
            return
        try:
            job.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


# how often a running job's Spark jobs are read: Spark's status tracker keeps only the application's last
# spark.ui.retainedJobs (1000) jobs, dropping the oldest tenth once past it, and far fewer than that end in this time
SAMPLE_S = 2.0


class _SparkJobIds:
    """The ids of a job group's Spark jobs, gathered while it runs (a daemon thread reads them every SAMPLE_S): read
    only at its end, a job of more than the tracker keeps would count what is left of them. Spark offers Python no
    listener of its jobs, so the tracker is read."""

    def __init__(self, tracker: Any, group: str):
        self.tracker, self.group = tracker, group
        self.ids: set[int] = set()
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self._sample, daemon=True, name=f"cdc-jobs-{group}")
        self.sampler.start()

    def _read(self) -> None:
        self.ids.update(self.tracker.getJobIdsForGroup(self.group))

    def _sample(self) -> None:
        while not self.done.wait(SAMPLE_S):
            try:
                self._read()
            except Exception:  # the JVM is gone: the job's end reports it, and finish() fails to count
                return

    def finish(self) -> int:
        """The count once the job has ended (raises when Spark cannot be asked)."""
        self.done.set()
        self.sampler.join()
        self._read()
        return len(self.ids)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


class PipelineService:
    """Runs submitted jobs on `workers` threads, in the one Spark session of this process, on its own deployment
    (the registry, landing and lake of the settings it started with)."""

    def __init__(self, workers: int, deployment: Settings, run_job: Callable[[list[str]], int]):
        self.deployment, self.run_job = deployment, run_job  # run_job: the command line's main (spark_jobs.cli)
        self.jobs: dict[str, _Job] = {}
        self.by_key: dict[str, str] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cdc-job")
        _sweep_scratch()
        self.scratch = Path(tempfile.mkdtemp(prefix=f"cdc-service-{os.getpid()}-"))
        self.spark_stopped = threading.Event()

    def start_spark(self, secret: str) -> str:
        """The session every job will share, and the Great Expectations import, paid once here: side by side (the
        import is seconds of Python, the JVM starts in a process of its own). Its Spark UI, when asked for
        (CDC_SPARK_UI), answers only requests that carry a token made from the service's `secret`."""
        import importlib

        from spark_jobs import session
        from spark_jobs.service_client import spark_ui_key

        session.SHARED_JVM = True
        gx = threading.Thread(target=importlib.import_module, args=("great_expectations",), daemon=True)
        gx.start()
        ui = session.ui_filter(spark_ui_key(secret)) if self.deployment.spark_ui else {}
        spark = session.build_session("cdc-pipeline-service", ui)
        gx.join()
        importlib.import_module("great_expectations")  # raises here if the import in the thread failed
        return str(spark.sparkContext.master)

    def spark_ui_url(self) -> str | None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        return spark.sparkContext.uiWebUrl if spark is not None else None

    def submit(self, request: JobRequest) -> _Job:
        request.check()
        with self.lock:
            if request.key and request.key in self.by_key:
                return self.jobs[self.by_key[request.key]]
            job = _Job(id=time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(4), request=request)
            listed = None
            if request.files is not None:
                listed = self.scratch / f"{job.id}.files.json"
                listed.write_text(json.dumps(list(request.files)))
            job.argv = request.argv(self.deployment, listed)
            self.jobs[job.id] = job
            if request.key:
                self.by_key[request.key] = job.id
            self._forget_old()
        self.pool.submit(self._execute, job)
        return job

    def _forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if j.finished is not None]
        for job in sorted(finished, key=lambda j: j.finished or 0)[:max(0, len(finished) - KEEP_FINISHED)]:
            del self.jobs[job.id]
            if job.request.key:
                self.by_key.pop(job.request.key, None)

    def _execute(self, job: _Job) -> None:
        failure = self.scratch / f"{job.id}.failure.txt"
        job.state, job.started = "running", time.time()
        if self.spark_stopped.is_set():  # queued when Spark stopped: never started, a retry runs it on the next start
            job.exit_code, job.finished, job.state = EXIT_TRANSIENT, time.time(), "failed"
            job.cause = "the pipeline service's Spark stopped before this job started; the service restarts, retry it"
            return
        log.info(f"{_now()} job {job.id} started: {job.request.key or ''} {' '.join(job.argv[:2])} ...")
        token = _current_job.set(job)
        spark = self._spark_context()
        counted = None
        if spark is not None:  # the job's Spark jobs in a group of their own: counted, and named in the Spark UI
            spark.setJobGroup(job.id, job.request.key or job.argv[0])
            counted = _SparkJobIds(spark.statusTracker(), job.id)
        variables = {Settings.variable(name): value for name, value in job.request.settings}
        gx = Spent()
        try:
            with job_environment({**variables, Settings.variable("failure_file"): str(failure)}), counting() as gx:
                code = self.run_job(job.argv)
        except SystemExit as exc:  # argparse refusing the arguments, as a process would exit
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:  # what would end a process with a traceback and exit 1
            traceback.print_exc()
            code = 1
        finally:
            _current_job.reset(token)
        job.gx_seconds = round(gx.seconds, 3)
        if counted is not None:
            try:
                job.spark_jobs = counted.finish()
            except Exception:  # the JVM died under the job (Spark 4.2 ends it on an OutOfMemoryError, local mode
                pass  # too): the count stays unknown, and the death is dealt with below, the job reported first
        job.cause = failure.read_text().strip() if failure.exists() else None
        job.exit_code, job.finished = code, time.time()
        job.state = "succeeded" if code == 0 else "failed"
        failure.unlink(missing_ok=True)
        (self.scratch / f"{job.id}.files.json").unlink(missing_ok=True)
        log.info(f"{_now()} job {job.id} {job.state} (exit {code}) in {job.finished - job.started:.1f}s, "
                 f"{job.spark_jobs} Spark jobs")
        if self._spark_is_stopped():
            log.error("Spark stopped under the service (its JVM died?): stopping, for the supervisor to restart it")
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

    def unfinished(self) -> int:
        return sum(1 for j in list(self.jobs.values()) if not j.finished)


def _sweep_scratch() -> None:
    """Scratch folders of services that were killed (their pid gone), removed at the next start."""
    for folder in Path(tempfile.gettempdir()).glob("cdc-service-*-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def write_connection(path: Path, own: Listener) -> None:
    """The service's address and secret as an Airflow connection (JSON form: AIRFLOW_CONN_<ID>, or `airflow
    connections import`), readable by this user only."""
    connection = ServiceConnection.at(own.scheme, "127.0.0.1" if own.host in ("0.0.0.0", "::") else own.host,
                                      own.port, own.token)
    write_private(path, (connection.airflow_json() + "\n").encode())


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def serve(run_job: Callable[[list[str]], int], host: str, port: int, workers: int, connection_file: str | None = None,
          tls_cert: str | None = None, tls_key: str | None = None, allowed_hosts: tuple[str, ...] = (),
          token_file: str | None = None) -> int:
    """Runs the service, each job by `run_job(argv)`, until interrupted, or until its Spark stops (exit 1, for a
    supervisor to restart it).
    Once it takes jobs, its address and secret are written to `connection_file` (CDC_SERVICE_CONNECTION_FILE):
    a script's sign that it is ready, and the Airflow connection the tasks use."""
    own = listener(host, port, tls_cert, tls_key, allowed_hosts, token_file)
    from spark_jobs.session import bind_spark

    bind_spark(host)  # its Spark on the service's own address, as the service itself
    use_handler(_JobLog())
    # what the libraries print (Spark's Python side, a traceback) follows the job too
    sys.stdout, sys.stderr = _Routed(sys.stdout), _Routed(sys.stderr)  # type: ignore[assignment]
    signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's stop ends it like ^C: Spark shut down in order
    service = PipelineService(workers, settings(), run_job)
    try:
        started = time.monotonic()
        master = service.start_spark(own.token)
        # on a cluster the samples would have to be where its executors read: its jobs pay their own warm-up
        warmed = (f", warmed up in {warm_up(run_job, service.scratch):.1f}s"
                  if service.deployment.service_warm_up and master.startswith("local") else "")
        server = HttpServer(service, own)
        own = server.listener
        target = resolve(connection_file or settings().service_connection_file)
        ui = service.spark_ui_url()
        log.info(f"pipeline service on {own.scheme}://{host}:{own.port} ({workers} job threads, Spark {master}, "
                 f"ready in {time.monotonic() - started:.1f}s{warmed}) for the lake "
                 f"{resolve_uri(service.deployment.lake_uri)}; "
                 f"its Airflow connection (address and secret) is in {target}"
                 + (f"; its Spark UI at {ui}, for a bearer token from `python -m spark_jobs spark-ui-token`" if ui else ""))
        server.start()
        write_connection(target, own)
        try:
            while not service.spark_stopped.wait(1.0):
                pass
            # every job it had ends failed (queued ones as retryable), and is reported before the service goes
            deadline = time.monotonic() + 120
            while service.unfinished() and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(LINGER_S)  # the triggers poll each second: they read how their jobs ended
            return 1
        except KeyboardInterrupt:
            return 0
        finally:
            server.stop()
            service.pool.shutdown(wait=False, cancel_futures=True)
            target.unlink(missing_ok=True)  # its secret and address are of no use once it is gone
    finally:
        shutil.rmtree(service.scratch, ignore_errors=True)
