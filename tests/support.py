"""The tests' helpers, one per act: landing files, change events, the expected state, the source model, the
processes a test starts (S3, the pipeline service, Spark clusters, PostgreSQL, Airflow), browsers and the compose file.
Test modules import these and pytest's fixtures (conftest.py), never each other. Unlike conftest, importing this sets
no environment (the benchmarks use it too)."""

from __future__ import annotations

import datetime as dt
import email
import email.message
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck
from hypothesis import strategies as st
from pyspark.sql import functions as F

from spark_jobs import cli
from spark_jobs.debezium import envelope
from spark_jobs.delta.reads import row_count
from spark_jobs.lake import Lake
from spark_jobs.registry import TableConfig, load_registry
from spark_jobs.service_client import JobStatus, ServiceConnection, poll

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DEMO_CONFIG = ROOT / "include" / "tables.yaml"
# the recorded connector output (tests/fixtures/debezium) and its tables' registry
FIXTURES = ROOT / "tests" / "fixtures" / "debezium"
# C1 alone and the serial collector: what the JVMs a test starts run with (conftest.pytest_configure)
SERIAL_GC = "-XX:+UseSerialGC"
SHORT_LIVED_JVM = f"-XX:TieredStopAtLevel=1 {SERIAL_GC}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(capsys, config, landing, lake, *extra):
    code = cli.main(["run", "--config", str(config), "--landing", str(landing), "--lake", str(lake), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def own_steps(monkeypatch, capsys, config, landing, lake, *extra):
    """`run` with every table on its own step, as a run over the tables no shared pass can take (history,
    transactions, large batches) goes: what the passes' tests hold each pass's outcome equal to."""
    from spark_jobs.layers import bronze, silver

    def no_rounds(spark, engine, tables, *args):  # type: ignore[no-untyped-def]
        yield tables, {}

    with monkeypatch.context() as patched:
        patched.setattr(bronze, "read_rounds", no_rounds)
        patched.setattr(silver, "read_pass", lambda *args: {})
        return run(capsys, config, landing, lake, *extra)


def planner_run(monkeypatch, own_plan: bool):  # noqa: ANN001, ANN201
    """`run` through the shared passes, or (`own_plan`) through each table's own plan (`own_steps`)."""
    return partial(own_steps, monkeypatch) if own_plan else run


def summary_line(out: str, layer: str, table: str) -> dict[str, str]:
    for line in out.splitlines():
        parts = line.split()
        if parts[:2] == [layer, table]:
            return dict(p.split("=", 1) for p in parts[2:] if "=" in p)
    raise AssertionError(f"no {layer} {table} line in:\n{out}")


def published_summaries(lake: Path | str, table: str, layer: str) -> list[dict]:
    """Every summary the runs published for the table's `layer` (reports/runs/<run id>/<table>.<layer>.json),
    oldest run first."""
    runs = sorted((Path(lake) / "reports" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    return [json.loads(f.read_text()) for r in runs for f in r.glob(f"{table}.{layer}.json")]


def silver_rows(spark, engine, lake, table, keys):
    df = engine.read(spark, Lake(str(lake)).silver(table))
    return {tuple(r[k] for k in keys): {c: r[c] for c in df.columns if not c.startswith("_")} for r in df.collect()}


@contextmanager
def standalone_cluster(workdir: Path, cores: int = 1, memory: str = "1g",
                       ui_ports: tuple[int, int] | None = None) -> Iterator[str]:
    """A Spark standalone master and one worker on loopback, from pyspark's own jars and scripts (what a
    cluster deployment runs), their web UIs on `ui_ports` (else free ones); yields the master's URL."""
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    master_ui, worker_ui = ui_ports or (free_port(), free_port())
    workdir.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen] = []

    def start(name: str, args: list[str], ready: str) -> str:
        log = workdir / f"{name}.log"
        with log.open("w") as out:
            started.append(subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 120
        while ready not in (text := log.read_text()):
            if started[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Spark {name} did not start:\n{text[-3000:]}")
            time.sleep(0.3)
        return text

    try:
        master = start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                  str(free_port()), "--webui-port", str(master_ui)], "I have been elected leader")
        # the port the master bound: another process may have taken the free one first, and the master then binds
        # the next (its spark.port.maxRetries), where a worker given the first would be refused
        url = re.search(r"Starting Spark master at (spark://\S+)", master).group(1)  # type: ignore[union-attr]
        start("worker", ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", str(cores),
                         "--memory", memory, "--work-dir", str(workdir / "work"), "--webui-port", str(worker_ui)],
              "Successfully registered with master")
        yield url
    finally:
        stop_process_groups(started, grace_s=60)


def stop_process_groups(processes: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to each process's group at once, SIGKILL to the groups still running after one shared grace."""
    for process in processes:
        with suppress(ProcessLookupError):  # one that already ended (its log says why)
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def pipeline_service(env: dict[str, str], log: Path) -> Iterator[ServiceConnection]:
    """The pipeline service as `make demo` runs it (`python -m spark_jobs serve`), a process of its own on a
    free loopback port serving the deployment `env` names (CDC_CONFIG, CDC_LANDING_URI, CDC_LAKE_URI, AWS_*);
    yields its address and secret, read from the Airflow connection it writes."""
    connection_file = log.with_suffix(".connection.json")
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "spark_jobs", "serve", "--port", "0", "--connection-file",
                                    str(connection_file)],
                                   cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not connection_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the pipeline service did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield ServiceConnection.from_file(connection_file)
    finally:
        process.terminate()  # SIGTERM: the service stops its Spark in order
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# a deployment the service tests share (tests/airflow/test_service.py, test_service_process.py)
SERVICE_CONFIG = """tables:
  customers:
    topic: burst.burst_bank.customers
    keys: [custkey]
  products:
    topic: dbserver1.inventory.products
    keys: [id]
  strict:
    topic: test.strict.customers
    keys: [custkey]
    quality:
      max_quarantined: 1%
      min_quarantined_to_fail: 1
"""


def wait_for_job(service: ServiceConnection, job_id: str, timeout_s: float = 300) -> JobStatus:
    """The job's status once it ended, with its whole log, read the way the trigger reads it: from the last offset on."""
    log, offset, deadline = "", 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = poll(service, job_id, offset)
        log, offset = log + status.log, status.offset
        if status.done:
            status.log = log
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end:\n{log}")


def raw_request(service: ServiceConnection, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, str]:
    """A request to the service as anyone could send it: no client, any headers (none added but Content-Length)."""
    import http.client

    host, port = service.url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest(method, path, skip_host="Host" in (headers or {}), skip_accept_encoding=True)
    for name, value in (headers or {}).items():
        connection.putheader(name, value)
    if body is not None and "Content-Length" not in (headers or {}):
        connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    response = connection.getresponse()
    return response.status, response.read().decode()


def jobs_known(service: ServiceConnection) -> int:
    """How many jobs the service knows (its health endpoint's count)."""
    answer = raw_request(service, "GET", "/health", headers={"Authorization": f"Bearer {service.token}"})[1]
    return int(json.loads(answer)["jobs_known"])


_MIGRATED: list[Path] = []  # this process's migrated Airflow database (one per test worker)


def airflow_home(home: Path) -> Path:
    """A new AIRFLOW_HOME holding a migrated SQLite metadata database, as `airflow db migrate` leaves one. The
    migration (about 10 s of a process start and 100 migrations) runs once per test worker; each home gets a copy
    of that database file, so every test still starts from an empty database of its own."""
    import atexit
    import shutil
    import tempfile

    if not _MIGRATED:
        template = Path(tempfile.mkdtemp(prefix="cdc-airflow-db-"))
        atexit.register(shutil.rmtree, template, ignore_errors=True)  # the worker's template goes with the worker
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], cwd=ROOT, check=True,
                       capture_output=True, env=subprocess_env(AIRFLOW_HOME=str(template)), timeout=600)
        _MIGRATED.append(template / "airflow.db")
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MIGRATED[0], home / "airflow.db")
    return home


def service_airflow_env(service: ServiceConnection) -> dict[str, str]:
    """What points Airflow's tasks at the service: its connection, as `make demo` sets it up."""
    return {"CDC_SERVICE_CONN_ID": "cdc_service", "AIRFLOW_CONN_CDC_SERVICE": service.airflow_json()}


def data_docs_text(page: Path) -> str:
    """A Data Docs page's text, its tables' rows included (JSON blocks in the page: spark_jobs/quality/docs_assets.py),
    with no script file beside it (the store writes none)."""
    assert not list(page.parent.glob(f"{page.name}.script-*.js")), page
    return page.read_text()


@contextmanager
def smtp_sink() -> Iterator[tuple[int, list[email.message.Message]]]:
    """A local SMTP server (aiosmtpd) on a free loopback port keeping every message it is sent (what a notifier
    mails): yields its port and the list the messages arrive in."""
    from aiosmtpd.controller import Controller

    received: list[email.message.Message] = []

    class Keep:
        async def handle_DATA(self, server, session, envelope):  # noqa: ANN001, N802 (aiosmtpd's hook)
            received.append(email.message_from_bytes(envelope.original_content or envelope.content))
            return "250 OK"

    controller = Controller(Keep(), hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller.port, received
    finally:
        controller.stop()


def smtp_connection(port: int) -> str:
    """An Airflow SMTP connection (JSON, as AIRFLOW_CONN_<ID> reads it) to the sink on `port`."""
    return json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": port,
                       "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "cdc@example.com",
                                 "timeout": 10}})


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: the project on PYTHONPATH, the venv's tools on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "CDC_"))}
    env.update(PYTHONPATH=str(ROOT), TZ="UTC", GX_ANALYTICS_ENABLED="false",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", CDC_SHUFFLE_PARTITIONS="1")
    env.update(extra)
    return env


@contextmanager
def s3_server(log: Path, buckets: tuple[str, ...] = ("landing", "lake")) -> Iterator[str]:
    """A local S3 (and SQS) endpoint: moto's server mode in a process of its own (as MinIO would be: nothing shared
    with the caller's process, no GIL to wait on) on a free loopback port, with `buckets`; yields its URL."""
    import urllib.request

    import boto3

    url = f"http://127.0.0.1:{free_port()}"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", url.rsplit(":", 1)[1]],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=5).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id="test", aws_secret_access_key="test",
                              region_name="us-east-1")
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def landing_notifications(endpoint: str, bucket: str = "landing") -> str:
    """The bucket's object-created notifications to a new SQS queue of the local endpoint, as its owner sets them up
    (docs/operations.md, "Event-driven runs"); the queue's URL (CDC_LANDING_QUEUE)."""
    import boto3

    aws = {"endpoint_url": endpoint, "aws_access_key_id": "test", "aws_secret_access_key": "test",
           "region_name": "us-east-1"}
    sqs = boto3.client("sqs", **aws)
    queue = sqs.create_queue(QueueName=f"{bucket}-created")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    boto3.client("s3", **aws).put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
        "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]})
    return str(queue)


def s3_environment(endpoint: str) -> dict[str, str]:
    """The AWS_* variables of the local endpoint, as a job reads them (spark_jobs/storage.py)."""
    return {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1"}


def aws_connection(endpoint: str) -> str:
    """`aws_default` as Airflow reads it from the environment, pointing at the local endpoint."""
    return json.dumps({"conn_type": "aws", "login": "test", "password": "test",
                       "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}})


# --- landing files ------------------------------------------------------------------------------------------------

def land(landing: Path, topic: str, lines: list[str], offset: int = 0, partition: int = 0, suffix: str = ".json") -> Path:
    """`lines` as one sink file of `topic` (the S3 sink's default partitioner's layout); its path."""
    folder = landing / "topics" / topic / f"partition={partition}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{topic}+{partition}+{offset:010d}{suffix}"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def land_files(source: Path, landing: Path, files: list[str]) -> list[str]:
    """Sink files written under `source` copied to the same places under the landing area, as the sink uploads them;
    their landing paths."""
    landed = []
    for f in files:
        dest = landing / Path(f).relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
        landed.append(str(dest))
    return landed


def land_generated(landing: Path, source: Path, generated: list, batch: int) -> None:
    """The generated tables' files of `batch` (spark_jobs.generate), copied from `source` to the landing area."""
    for g in generated:
        land_files(source, landing, g.batches[batch])


def upload_landing(endpoint: str, local: Path, uri: str) -> list[str]:
    """Land local sink files in S3 as the S3 sink would: the same keys under the URI's prefix."""
    import boto3

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    keys = []
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        keys.append(f"{prefix}/{path.relative_to(local).as_posix()}")
        client.upload_file(str(path), bucket, keys[-1])
    return keys


def customers_project(root: Path) -> Path:
    """A deployment's project folder under `root` with one table, the sample customers, and its gold model
    customers_by_state: its include/tables.yaml."""
    config = root / "include" / "tables.yaml"
    (root / "include" / "gold").mkdir(parents=True)
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n")
    shutil.copy(ROOT / "include" / "gold" / "customers_by_state.sql", root / "include" / "gold")
    return config


def demo_registry(tmp_path: Path, names: list[str], hand_made: dict | None = None) -> Path:
    """A registry of the demo's tables `names` (as include/tables.yaml declares them) and `hand_made` ones."""
    demo = yaml.safe_load(DEMO_CONFIG.read_text())["tables"]
    config = tmp_path / "tables.yaml"
    config.write_text(yaml.safe_dump({"tables": {**{n: demo[n] for n in names}, **(hand_made or {})}}))
    return config


# --- change events ------------------------------------------------------------------------------------------------

def change_event(op: str, lsn: int | None, *, before: dict | None = None, after: dict | None = None,
                 ts_ms: int | None = 1, snapshot: bool = False, transaction: dict | None = None, **source: Any) -> str:
    """One change event as PostgreSQL's connector writes it without the schema envelope (the JSON converter's
    `schemas.enable=false`): its images, its source block (`lsn` left out when None; `source` adds fields) and
    `transaction` when the connector provides transaction metadata."""
    block = {"connector": "postgresql", **({"lsn": lsn} if lsn is not None else {}),
             "snapshot": "true" if snapshot else "false", "ts_ms": ts_ms, **source}
    event = {"before": before, "after": after, "source": block, "op": op, "ts_ms": ts_ms}
    if transaction is not None:
        event["transaction"] = transaction
    return json.dumps(event, ensure_ascii=False)


def mongo_event(op: str, order: int, document: dict, ts_s: int = 1_730_000_000) -> str:
    """One change event as Debezium's MongoDB connector writes it: the document as extended JSON text in `after`, the
    oplog position as the source block's `ts_ms` (whole seconds) and `ord`."""
    block = {"connector": "mongodb", "name": "mongo1", "ts_ms": ts_s * 1000, "snapshot": "false", "db": "inventory",
             "collection": "things", "ord": order, "lsid": None, "txnNumber": None}
    return json.dumps({"before": None, "after": json.dumps(document), "updateDescription": None, "source": block,
                       "op": op, "ts_ms": ts_s * 1000 + order, "transaction": None})


# --- the expected state -------------------------------------------------------------------------------------------

def expected_rows(topic: str, final_rows: dict) -> dict:
    """A generated source's final state as silver shows it: logical types with the envelope, JSON types without."""
    from spark_jobs.generate import PROFILES

    profile = PROFILES[topic]
    if profile.envelope:
        return final_rows
    return {k: {c.name: c.encode(row[c.name]) for c in profile.columns} for k, row in final_rows.items()}


def assert_silver_is_the_source(spark, engine, lake: Path | str, generated: list, config: Path | str) -> None:  # noqa: ANN001
    """Each generated table's silver holds its source's final state, row for row, and bronze every event once."""
    registry = load_registry(str(config))
    for g in generated:
        assert silver_rows(spark, engine, lake, g.table, registry.tables[g.table].keys) == \
            expected_rows(g.topic, g.final_rows), g.table
        assert row_count(Lake(str(lake)).bronze(g.table)) == g.events, g.table


# the source tables' final state after the recorded connector output in tests/fixtures/debezium
RECORDED_FINAL = {
    "pg_customers": {
        (1001,): {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "st@thomas.name"},
        (1004,): {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "anne@kretchmar.org"},
        (1005,): {"id": 1005, "first_name": "Jane", "last_name": "Roe-Doe", "email": "jane@roe-doe.org"},
        (1103,): {"id": 1103, "first_name": "Edward", "last_name": "Walker", "email": "ed@walker.com"},
    },
    "mysql_customers": {
        (1001,): {"id": 1001, "first_name": "Sally", "last_name": "Thomas-Walker", "email": "sally@thomas.name"},
        (1002,): {"id": 1002, "first_name": "George", "last_name": "Bailey", "email": "george@bailey.name"},
        (1003,): {"id": 1003, "first_name": "Edward", "last_name": "Walker", "email": "ed@walker.com"},
        (1004,): {"id": 1004, "first_name": "Anne Marie", "last_name": "Kretchmar", "email": "anne.marie@kretchmar.org"},
    },
}


def table_commits(engine, path: str) -> int | None:  # noqa: ANN001
    """A table's commits, not counting its creation when that wrote no rows: into no table, the silver pass's rows
    (on the driver) merge as delta-rs does it, the table created empty and then merged, where a table's own plan writes
    its first rows in one commit."""
    history = sorted(engine.history(path), key=lambda h: int(h["version"]))
    if not history:
        return None
    empty = history[0]["operation"] == "WRITE" and not int((history[0].get("operationMetrics") or {}).get(
        "num_added_rows", 1))
    return len(history) - empty


def step_summary(out: str, layer: str, table: str) -> dict:
    """A step's summary line without its timings; silver's without its version (compare its commits instead:
    `table_commits`)."""
    line = summary_line(out, layer, table)
    return {k: v for k, v in line.items() if k not in ("seconds", "lag_s") and (layer != "silver" or k != "version")}


# --- the source model: histories, their delivery, and the reference that applies them in order -------------------
# (tests/properties/test_properties.py; the crash-safety and incremental-gold tests draw on it too)

HISTORIES_PER_EXAMPLE = 40  # more makes Hypothesis overrun its buffer and draw shorter histories
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
          "derandomize": False}

TABLE = TableConfig(name="items", topic="src.public.items", keys=("tenant", "id"), history=True)
KEYS = st.integers(1, 6)
VALUES = st.text(alphabet="abcxyz", min_size=1, max_size=3)
SNAPSHOT_LSN = 5_000


@dataclass
class Event:
    tenant: int
    op: str
    key: int | None
    value: str | None
    lsn: int
    snapshot: bool
    clock: int
    tombstone: bool = False
    number: int | None = None  # the nullable integer column `n`

    @property
    def image(self) -> tuple[str | None, int | None]:
        """The row's (v, n) as the model keeps it: none for a delete."""
        return (None, None) if self.op == "d" else (self.value, self.number)

    @property
    def position(self) -> tuple[int, int]:
        """(lsn, 0 for snapshot events, 1 for streaming ones): the order the model applies."""
        return self.lsn, 0 if self.snapshot else 1

    def line(self) -> str:
        image = {"tenant": self.tenant, "id": self.key, "v": self.value, "n": self.number}
        images = {"before": {**image, "v": None, "n": None}} if self.op == "d" else {"after": image} if self.op in "cur" else {}
        return change_event(self.op, self.lsn, **images, ts_ms=self.clock, snapshot=self.snapshot, txId=self.lsn // 10)


@st.composite
def histories(draw, tenant: int, truncates: bool):
    """One source table's change log (for one tenant's keys) in commit order."""
    live: set[int] = set()
    log: list[Event] = []
    clock = draw(st.integers(0, 3))

    def emit(op, key=None, lsn=SNAPSHOT_LSN, snapshot=False, tombstone=False):
        nonlocal clock
        clock += draw(st.integers(0, 1))  # ts_ms ties on purpose: the order must not come from it
        value = draw(VALUES) if op in "cur" else None
        log.append(Event(tenant, op, key, value, lsn, snapshot, clock, tombstone))

    for key in sorted(draw(st.sets(KEYS, max_size=4))):
        live.add(key)
        emit("r", key, snapshot=True)
    # streaming may start at the snapshot's own LSN: snapshot events still come first
    lsn = SNAPSHOT_LSN if draw(st.booleans()) else SNAPSHOT_LSN + 1
    kinds = ["upsert", "upsert", "upsert", "delete", "delete", "rekey"] + (["truncate"] if truncates else [])
    for step in draw(st.lists(st.sampled_from(kinds), min_size=2, max_size=14)):
        if step == "upsert":
            key = draw(KEYS)
            emit("u" if key in live else "c", key, lsn)
            live.add(key)
        elif step == "delete" and live:
            key = draw(st.sampled_from(sorted(live)))
            live.discard(key)
            emit("d", key, lsn, tombstone=draw(st.booleans()))
        elif step == "rekey" and live and len(live) < 6:
            old = draw(st.sampled_from(sorted(live)))
            new = draw(st.sampled_from([k for k in range(1, 7) if k not in live]))
            live.discard(old)
            live.add(new)
            emit("d", old, lsn, tombstone=True)
            lsn += 1
            emit("c", new, lsn)
        elif step == "truncate":
            live.clear()
            emit("t", lsn=lsn)
        lsn += draw(st.integers(1, 3))
    return log


def reference(log: list[Event]) -> tuple[dict, list]:
    """The model: apply the log in order. Silver = the live rows; history = one row per row event, valid
    until the key's next event or (for versions) the next truncate, current when open and not a delete."""
    ordered = sorted(log, key=lambda e: e.position)  # commit order; the sort is stable for equal positions
    state: dict[tuple[int, int], tuple[str | None, int | None]] = {}
    history: list[list] = []
    open_rows: dict[tuple[int, int], list] = {}
    for e in ordered:
        if e.op == "t":
            state.clear()
            for row in open_rows.values():  # closes open versions; a delete stays open for the key's next event
                if row[2] != "d" and row[4] is None:
                    row[4] = e.position
            continue
        key = (e.tenant, e.key)
        if key in open_rows and open_rows[key][4] is None:
            open_rows[key][4] = e.position
        row = [key, e.position, e.op, e.image, None]
        history.append(row)
        open_rows[key] = row
        if e.op == "d":
            state.pop(key, None)
        else:
            state[key] = e.image
    return state, sorted((*r, r[4] is None and r[2] != "d") for r in history)


def deliver(draw, log: list[Event]):
    """The log cut into sink files, some re-delivered under new offsets, shuffled into runs."""
    lines = []
    for e in log:
        lines.append(e.line())
        if e.tombstone:
            lines.append("null")
    files, offset = [], 0
    while offset < len(lines):
        size = draw(st.integers(1, 3 * max(1, len(lines) // 12)))
        files.append((offset, lines[offset:offset + size]))
        offset += size
    redelivered = [(offset + 100_000 * (i + 1), chunk) for i, (offset, chunk) in enumerate(files) if draw(st.booleans())]
    arrivals = draw(st.permutations(files + redelivered))
    runs = draw(st.sampled_from([1, 2, 3, 3, 4]))
    cut = sorted(draw(st.lists(st.integers(0, len(arrivals)), min_size=runs - 1, max_size=runs - 1)))
    bounds = [0, *cut, len(arrivals)]
    return [arrivals[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@st.composite
def bundles(draw, tenants: range = range(HISTORIES_PER_EXAMPLE)):
    """Independent tenants' logs interleaved into one topic partition (each keeps its own order)."""
    logs = [draw(histories(tenant, truncates=False)) for tenant in tenants]
    merged, cursors = [], [0] * len(logs)
    while any(c < len(log) for c, log in zip(cursors, logs, strict=True)):
        tenant = draw(st.sampled_from([t for t, log in enumerate(logs) if cursors[t] < len(log)]))
        merged.append(logs[tenant][cursors[tenant]])
        cursors[tenant] += 1
    numbered(draw, merged)
    return deliver(draw, merged), logs


def numbered(draw, log: list[Event]) -> None:
    """`n` for the rows of the log from a drawn point on (an integer or null each): null in every event before it."""
    start = draw(st.integers(0, len(log)))
    for e in log[start:]:
        if e.op in "cur":
            e.number = draw(st.one_of(st.none(), st.integers(-(2**40), 2**40)))


@st.composite
def truncate_histories(draw):
    log = draw(histories(0, truncates=True))
    numbered(draw, log)
    return deliver(draw, log), [log]


def bronze_batch(spark, files, run: int, table: TableConfig = TABLE, version: int | None = None):
    """What bronze holds for these files: the same transforms the bronze job runs (rows of bronze's `version`; else
    the run's)."""
    rows = [(f"topics/{table.topic}/partition=0/{table.topic}+0+{offset:010d}.json", i + 1, line)
            for offset, chunk in files for i, line in enumerate(chunk)]
    lines = spark.createDataFrame(rows, "_source_file STRING, _line BIGINT, _raw STRING")
    classified = envelope.classify(envelope.parse_envelope(lines), table.keys)
    return classified.where("_kind = 'event'").select(
        "_source_file", "_line", "_raw", "op", "ts_ms", "source", "before", "after", "_schema",
        F.lit(f"run-{run}").alias("_batch_id"), F.lit(run if version is None else version).cast("long").alias(
            "_bronze_version"), F.current_timestamp().alias("_ingested_at"))


def position(seq: str | None) -> tuple[int, int] | None:
    """The pipeline's `_seq` for PostgreSQL ('<lsn, padded>|<snapshot rank>') as the model's position."""
    if seq is None:
        return None
    lsn, rank = seq.split("|")
    return int(lsn), int(rank)


def silver_gate(audit, frames, table, layer, checks, lake, summary):
    """The silver gate's fail checks on every batch, without Great Expectations."""
    assert audit.figures.quarantined_share == 0 and audit.figures.deletes_unaccounted in (0, None)  # None: before
    if "key_unique" in audit.tallies:
        assert (audit.tallies["deleted_keys_not_live"].failed, audit.tallies["key_unique"].failed,
                audit.tallies["key_not_null"].failed) == (0, 0, 0)
    summary.gate = "passed"


def gold_gate_stubbed():  # noqa: ANN201
    """Every gold.gold_refresh with its gate stubbed to pass (gold_refresh's `gate`): a test that holds the rows to
    the model's SQL over silver instead, over data a real gate would refuse (NULL keys)."""
    from unittest import mock

    from spark_jobs.layers import gold

    def passed(audit, frames, table, layer, checks, lake, summary):  # noqa: ANN001, ANN202
        summary.gate = "passed"

    return mock.patch.object(gold, "gold_refresh", partial(gold.gold_refresh, gate=passed))


def image(row) -> tuple[str | None, int | None]:
    """A silver or history row's (v, n): `n` is not a column before its first value."""
    return row["v"], row.asDict().get("n")


# --- a source with transaction metadata (PostgreSQL, provide.transaction.metadata=true) ---------------------------
# An order's `total` equals the sum of its lines in every transaction: T1 inserts order 2 with two lines, T2 raises
# order 1 and adds a line to it, T3 deletes order 2 and its lines. Every state the source had is one of `TX_STATES`; the
# gold model shows each order's total beside the sum of its lines (tests/layers/test_transactions.py)

TX_PREFIX = "shop"
TX_ORDERS, TX_LINES, TX_TOPIC = f"{TX_PREFIX}.public.orders", f"{TX_PREFIX}.public.order_lines", f"{TX_PREFIX}.transaction"
# as the PostgreSQL connector (Debezium 2.x) names transactions: `<txId>:<LSN of the record>` on each record, so
# BEGIN, END and every change event of one transaction carry different ids that share the txId; T1-T3 are the ENDs'
TX_T1, TX_T2, TX_T3 = "801:33900000", "802:33900100", "803:33900200"

# (order id, total, sum of its lines) per order, in each state the source went through
TX_STATES = [
    {(1, 10, 10)},  # the snapshot
    {(1, 10, 10), (2, 30, 30)},  # after T1
    {(1, 15, 15), (2, 30, 30)},  # after T2
    {(1, 15, 15)},  # after T3
]

TX_GOLD_SQL = """-- keys: order_id
-- sources: orders, order_lines
SELECT o.id AS order_id, o.total, CAST(coalesce(sum(l.amount), 0) AS BIGINT) AS lines_total
FROM orders o LEFT JOIN order_lines l ON l.order_id = o.id
GROUP BY o.id, o.total
"""

_tx_lsn = iter(range(33_300_000, 34_000_000, 8))


def _tx_id(end_id: str) -> str:
    return end_id.split(":")[0]


def tx_event(table, op, row, txn=None, order=None) -> str:
    """One change event of the source (`change_event`'s shape, with the connector's whole source block); `txn`: its
    transaction's END id, `order`: its (total_order, data_collection_order) in the transaction."""
    lsn = next(_tx_lsn)
    transaction = {"id": f"{_tx_id(txn)}:{lsn}", "total_order": order[0], "data_collection_order": order[1]} if txn else None
    images = {"before": row} if op == "d" else {"after": row}
    return change_event(op, lsn, **images, ts_ms=1_730_000_000_000 + lsn, snapshot=op == "r", transaction=transaction,
                        version="2.7.3.Final", name=TX_PREFIX, db="shop", schema="public", table=table,
                        txId=int(_tx_id(txn)) if txn else 700, xmin=None)


def tx_boundaries(txn, counts):
    total = sum(counts.values())
    begin = f"{_tx_id(txn)}:{int(txn.split(':')[1]) - 99_000}"  # the BEGIN's own LSN
    return [{"status": "BEGIN", "id": begin, "ts_ms": 1_730_000_100_000, "event_count": None, "data_collections": None},
            {"status": "END", "id": txn, "ts_ms": 1_730_000_100_000, "event_count": total,
             "data_collections": [{"data_collection": f"public.{t}", "event_count": n} for t, n in counts.items()]}]


# the landing files: (topic, start offset, records), named in the order the source wrote them
TX_FILES = {
    "orders_snapshot": (TX_ORDERS, 0, [tx_event("orders", "r", {"id": 1, "total": 10})]),
    "lines_snapshot": (TX_LINES, 0, [tx_event("order_lines", "r", {"id": 11, "order_id": 1, "amount": 10})]),
    "orders_t1_t2": (TX_ORDERS, 1, [tx_event("orders", "c", {"id": 2, "total": 30}, TX_T1, (1, 1)),
                                 tx_event("orders", "u", {"id": 1, "total": 15}, TX_T2, (1, 1))]),
    "lines_t1_first": (TX_LINES, 1, [tx_event("order_lines", "c", {"id": 21, "order_id": 2, "amount": 10}, TX_T1, (2, 1))]),
    "lines_t1_rest_t2": (TX_LINES, 2, [tx_event("order_lines", "c", {"id": 22, "order_id": 2, "amount": 20}, TX_T1, (3, 2)),
                                    tx_event("order_lines", "c", {"id": 12, "order_id": 1, "amount": 5}, TX_T2, (2, 1))]),
    "orders_t3": (TX_ORDERS, 3, [tx_event("orders", "d", {"id": 2, "total": 30}, TX_T3, (1, 1))]),
    "lines_t3": (TX_LINES, 4, [tx_event("order_lines", "d", {"id": 21, "order_id": 2, "amount": 10}, TX_T3, (2, 1)),
                            tx_event("order_lines", "d", {"id": 22, "order_id": 2, "amount": 20}, TX_T3, (3, 2))]),
    "tx_t1_t2": (TX_TOPIC, 0, tx_boundaries(TX_T1, {"orders": 1, "order_lines": 2})
                 + tx_boundaries(TX_T2, {"orders": 1, "order_lines": 1})),
    "tx_t3": (TX_TOPIC, 4, tx_boundaries(TX_T3, {"orders": 1, "order_lines": 2})),
}

# the worst order: the snapshots, then each transaction's events for orders long before its lines, the END events
# before the lines too, and T1's lines split across two runs
TX_WORST_ORDER = [["orders_snapshot", "lines_snapshot"], ["orders_t1_t2"], ["tx_t1_t2"], ["lines_t1_first"], ["tx_t3"],
               ["orders_t3"], ["lines_t1_rest_t2"], ["lines_t3"]]


def tx_registry(tmp_path: Path, with_metadata: bool) -> Path:
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "order_totals.sql").write_text(TX_GOLD_SQL)
    extra = f", transactions: {TX_TOPIC}" if with_metadata else ""
    config = tmp_path / "tables.yaml"
    config.write_text(f"tables:\n  orders: {{topic: {TX_ORDERS}, keys: [id]{extra}}}\n"
                      f"  order_lines: {{topic: {TX_LINES}, keys: [id]{extra}}}\n")
    return config


def tx_land(landing: Path, name: str) -> Path:
    """One of the source's files (TX_FILES), landed."""
    topic, offset, records = TX_FILES[name]
    return land(landing, topic, [r if isinstance(r, str) else json.dumps(r) for r in records], offset)


def tx_gold_versions(spark, engine, lake: Lake) -> list[set[tuple]]:
    path = lake.gold("order_totals")
    return [{tuple(r) for r in engine.read(spark, path, version=v).select("order_id", "total", "lines_total").collect()}
            for v in range(engine.version(path) + 1)]


# every END first, then each table's files newest first: T3's deletes land before the inserts they delete
TX_ENDS_FIRST_NEWEST_FIRST = [["orders_snapshot", "lines_snapshot", "tx_t1_t2", "tx_t3"], ["lines_t3"], ["lines_t1_rest_t2"],
                           ["orders_t3"], ["lines_t1_first"], ["orders_t1_t2"]]


def tx_run_in_order(capsys, tmp_path: Path, with_metadata: bool, order=TX_WORST_ORDER) -> tuple[Lake, list[str]]:  # noqa: ANN001
    """The source's files landed in `order`, a run after each group: the lake and each run's output."""
    config, landing, lake = tx_registry(tmp_path, with_metadata), tmp_path / "landing", Lake(str(tmp_path / "lake"))
    lines = []
    for files in order:
        for name in files:
            tx_land(landing, name)
        code, out, err = run(capsys, config, landing, lake.root)
        assert (code, err) == (0, ""), out
        lines.append(out)
    return lake, lines


# --- Airflow ------------------------------------------------------------------------------------------------------
# Airflow for real, as a deployment runs it: a throwaway PostgreSQL for its metadata database, its components
# (api-server, scheduler, dag-processor, triggerer) as processes with the LocalExecutor, the project's DAGs and
# plugins, and its REST API as the admin user; and its CLI (`airflow dags test`, as `make demo` runs the DAGs)

PG_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), default=None, key=lambda p: int(p.parent.name))


def _as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as the `postgres` user the Debian package creates, when root."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class Postgres:
    """A PostgreSQL cluster of this process (one per test worker: `postgres`), each test's Airflow a database of its
    own on it. Airflow's migrations (about 100, a process start) run once, into a template each new database copies."""

    TEMPLATE = "airflow_template"

    def __init__(self, root: Path, port: int):
        self.root, self.port, self.migrated = root, port, False

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str) -> None:
        subprocess.run(_as_postgres([str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                                     "-v", "ON_ERROR_STOP=1", "-c", statement]), check=True, capture_output=True)

    def database(self, name: str) -> str:
        """A new empty database (what `airflow db migrate` starts from); its URL."""
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def airflow_database(self, name: str) -> str:
        """A new database holding Airflow's migrated schema, as `airflow db migrate` leaves it; its URL."""
        if not self.migrated:
            url = self.database(self.TEMPLATE)
            subprocess.run([str(BIN / "airflow"), "db", "migrate"], cwd=ROOT, check=True, capture_output=True,
                           env=subprocess_env(AIRFLOW_HOME=str(self.root / "airflow-home"),
                                              AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=url), timeout=600)
            self.migrated = True
        self.sql(f'CREATE DATABASE "{name}" TEMPLATE {self.TEMPLATE}')
        return self.url(name)


@contextmanager
def postgres() -> Iterator[Postgres]:
    """A throwaway PostgreSQL cluster on a free loopback port."""
    assert PG_BIN is not None, "PostgreSQL is needed: apt-get install postgresql (.ci/run and make test do)"
    root = Path(tempfile.mkdtemp(prefix="cdc-pg-"))  # outside pytest's 0700 folders: the postgres user reads it
    root.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    try:
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                     "--no-sync"]), check=True, capture_output=True)
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w",
                                     "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"]),
                       check=True, capture_output=True)
        yield Postgres(root, port)
    finally:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


class AirflowStack:
    """Airflow's components as their own processes, and its REST API as the admin user."""

    def __init__(self, env: dict[str, str], home: Path):
        self.env, self.home, self.base, self.token = env, home, env["AIRFLOW__API__BASE_URL"], ""

    @contextmanager
    def running(self) -> Iterator[None]:
        processes: list[subprocess.Popen] = []
        try:
            for component in (["api-server", "-H", "127.0.0.1", "-p", self.base.rsplit(":", 1)[1], "-w", "1"],
                              ["scheduler"], ["dag-processor"], ["triggerer"]):
                with (self.home / f"{component[0]}.log").open("w") as log:
                    processes.append(subprocess.Popen([str(BIN / "airflow"), *component], cwd=ROOT, env=self.env,
                                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            self._wait_for_api()
            yield
        finally:
            # all stopped at once, with one grace: stopped in turn, each waited out its own shutdown (67 s in all);
            # the stack's database is thrown away after, so nothing they would still write matters
            stop_process_groups(processes, grace_s=5)

    def _wait_for_api(self) -> None:
        deadline = time.monotonic() + 180
        while True:
            try:
                login = urllib.request.Request(f"{self.base}/auth/token", headers={"Content-Type": "application/json"},
                                               data=json.dumps({"username": "admin", "password": "admin"}).encode())
                with urllib.request.urlopen(login, timeout=10) as r:
                    self.token = json.loads(r.read())["access_token"]
                return
            except OSError:
                assert time.monotonic() < deadline, self.logs()
                time.sleep(1)

    def api(self, method: str, path: str, body: dict | None = None, prefix: str = "/api/v2") -> Any:
        """The REST API (the UI's own endpoints with prefix /ui)."""
        request = urllib.request.Request(f"{self.base}{prefix}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    def runs(self, dag_id: str) -> list[dict]:
        """The DAG's runs; none while the dag-processor has not parsed it yet (a 404)."""
        from urllib.error import HTTPError

        try:
            return self.api("GET", f"/dags/{dag_id}/dagRuns?order_by=start_date&limit=100")["dag_runs"]
        except HTTPError as error:
            if error.code == 404:
                return []
            raise

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        from urllib.parse import quote

        found = self.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")["task_instances"]
        return {t["task_id"]: t for t in found}

    def wait(self, what: str, condition, timeout_s: float = 600, poll_s: float = 2):  # noqa: ANN001
        """`condition()`'s first true value; a REST call that times out (an API server on a loaded machine) is asked
        again at the next poll, until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                found = condition()
            except TimeoutError:
                found = None
            if found:
                return found
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.logs()}"
            time.sleep(poll_s)

    def finished(self, dag_id: str, run_id: str) -> dict:
        run = self.wait(f"{dag_id} {run_id}", lambda: next(
            (r for r in self.runs(dag_id) if r["dag_run_id"] == run_id and r["state"] in ("success", "failed")), None))
        assert run["state"] == "success", (run, self.task_instances(dag_id, run_id), self.logs())
        return run

    def advanced(self, dag_id: str, since: dt.datetime | None = None) -> set[str]:
        """The tables whose asset the DAG's pass tasks have updated (each event's `table`; `since`: at or after), in
        pages of the API's listing."""
        from urllib.parse import quote

        found: set[str] = set()
        offset = 0
        after = f"&timestamp_gte={quote(since.isoformat())}" if since else ""
        while True:
            page = self.api("GET", f"/assets/events?source_dag_id={dag_id}&limit=100&offset={offset}{after}")["asset_events"]
            found |= {e["extra"].get("table") for e in page if e.get("extra")}
            if len(page) < 100:
                return found
            offset += len(page)

    def unpause(self, dag_id_pattern: str, count: int, timeout_s: float = 600) -> None:
        """Unpauses the DAGs whose ids match the SQL LIKE pattern, once the dag-processor has parsed `count` of them."""
        from urllib.parse import quote

        query = f"/dags?dag_id_pattern={quote(dag_id_pattern)}"
        self.wait(f"{count} DAGs like {dag_id_pattern}", lambda: self.api("GET", f"{query}&limit=1")["total_entries"]
                  >= count, timeout_s)
        self.api("PATCH", query, {"is_paused": False})

    def deferred_sensor(self) -> str | None:
        """The cdc_bronze run whose landing sensor waits deferred, if any."""
        for run in self.runs("cdc_bronze"):
            if self.task_instances("cdc_bronze", run["dag_run_id"]).get("landing_sense", {}).get("state") == "deferred":
                return run["dag_run_id"]
        return None

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(self.home.glob("*.log")))


def airflow_env(home: Path, database: str, service, s3_endpoint: str | None, deployment: dict[str, str],  # noqa: ANN001
                **extra: str) -> dict[str, str]:
    """Airflow's components on `database` (migrated: Postgres.airflow_database) with the LocalExecutor, the project's
    DAGs and plugins, its tasks submitting to `service`, S3 at the local endpoint (if any); the admin user's password
    is `admin`. The pools made, as the README sets them up."""
    from cryptography.fernet import Fernet

    home.mkdir()
    (home / "passwords.json").write_text(json.dumps({"admin": "admin"}))
    port = free_port()
    settings = dict(
        **service_airflow_env(service),
        AIRFLOW_HOME=str(home), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=database,
        AIRFLOW__CORE__EXECUTOR="LocalExecutor", AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
        AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}", AIRFLOW__API_AUTH__JWT_SECRET="e2e-secret",
        # one key for every component, as compose gives them: left to Airflow, the first component to start wrote a new
        # airflow.cfg with a key of its own while another had started without one, and the triggerer died on the
        # first trigger the other had stored encrypted (JSONDecodeError: every deferred sensor then waited for ever)
        AIRFLOW__CORE__FERNET_KEY=Fernet.generate_key().decode(),
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / "passwords.json"),
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5", AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
        AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME="0.25",
        AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}',
        **({"AIRFLOW_CONN_AWS_DEFAULT": aws_connection(s3_endpoint)} if s3_endpoint else {}), **deployment)
    env = subprocess_env(**{**settings, **extra})
    subprocess.run([str(BIN / "python"), "-m", "cdc_airflow.pools"], cwd=ROOT, env=env, check=True, capture_output=True)
    return env



def silver_table(path: str) -> list[dict]:
    """Rows of a Delta table read without Spark, local or on S3 (spark_jobs.delta.reads.read_columns)."""
    import pyarrow as pa

    from spark_jobs.delta.reads import read_columns

    return sorted(pa.table(read_columns(path)).to_pylist(), key=lambda r: r["custkey"])


class AirflowCli:
    """The Airflow CLI of the test's AIRFLOW_HOME; every call must succeed."""

    def __init__(self, env: dict[str, str], log: Path):
        self.env, self.log = env, log

    def sh(self, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(args, cwd=ROOT, env={**self.env, **(extra_env or {})}, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        return done

    def dag_test(self, dag_id: str, *args: str) -> str:
        return self.dag_runs((dag_id, *args))[0]

    def dag_runs(self, *runs: tuple[str, ...], last_fails: bool = False) -> list[str]:
        """`airflow dags test` runs in turn in one Airflow process (cdc_airflow.dag_runs, as `make demo` runs the
        layer DAGs): each run's log. Each must succeed; with `last_fails`, the last must fail and end the process."""
        done = subprocess.run([str(BIN / "python"), "-m", "cdc_airflow.dag_runs", *(shlex.join(run) for run in runs)],
                              cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=900)
        with self.log.open("a") as saved:
            saved.write(done.stdout)
        assert done.returncode == (1 if last_fails else 0), done.stdout[-4000:]
        logs = re.split(r"^airflow dags test .*$", done.stdout, flags=re.MULTILINE)[1:]
        assert len(logs) == len(runs), done.stdout[-4000:]
        for log in logs[:-1] if last_fails else logs:
            assert "state=success" in log, log[-4000:]
        return logs



def first_run_reaches_gold(airflow: AirflowCli, config: Path, lake_root: Path | str, final: dict,
                           bronze_rows: int = 100) -> list[dict]:
    """The layer DAGs in turn: bronze takes the sensor's files, silver equals the source (`final`), gold passes."""
    from spark_jobs.lake import Lake

    lake = Lake(str(lake_root))
    bronze_log, _, _ = airflow.dag_runs(("cdc_bronze",), ("cdc_silver",), ("cdc_gold_customers_by_state",))
    assert "table=customers: 2 landing file(s) for bronze" in bronze_log
    assert "spark_ui=" not in bronze_log  # Spark's UI is off unless CDC_SPARK_UI asks for it
    # `status` run by hand: an S3 lake's endpoint and keys from the AWS_* environment, as this process has them
    status = airflow.sh(str(BIN / "python"), "-m", "spark_jobs", "status", "--config", str(config), "--lake", lake.root,
                        "--require-tables", extra_env={k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    table = {tuple(line.split()[:2]): line.split()[2:] for line in status.stdout.splitlines()[1:] if line.strip()}
    assert table[("bronze", "customers")][:2] == [str(bronze_rows), "passed"]
    assert table[("gold", "customers_by_state")][1] == "passed"
    assert table[("silver", "customers")][1] == "passed"
    silver = silver_table(lake.silver("customers"))
    assert {(r["custkey"],): {c: r[c] for c in r if not c.startswith("_")} for r in silver} == final
    # its small batches' gates, in the passes' Data Docs (a single table's small batch is a pass of one)
    for site in ("bronze-pass", "silver-pass"):
        assert lake.files.exists(f"{lake.data_docs(site)}/index.html"), site
    return silver


# --- browsers and the compose file --------------------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def chromium():  # noqa: ANN201 (selenium's driver)
    """Debian's chromium, headless, through its chromedriver (quit it when done)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking",
                "--allow-file-access-from-files", "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def opened_in_chromium(page: Path) -> dict[str, str]:
    """A local page's title and text as chromium renders it."""
    driver = chromium()
    try:
        driver.get(page.as_uri())
        driver.execute_script("return document.readyState")
        return {"title": driver.title, "text": driver.find_element("tag name", "body").text}
    finally:
        driver.quit()


def compose_file() -> dict[str, Any]:
    """docker-compose.yaml, parsed."""
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


# the compose stack's Airflow services, its init first
COMPOSE_AIRFLOW = ["airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
