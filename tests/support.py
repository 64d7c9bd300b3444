"""Test helpers that are safe to import anywhere: unlike conftest, importing this sets no environment
(the benchmarks use it too)."""

from __future__ import annotations

import email
import email.message
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spark_jobs import cli
from spark_jobs.lake import Lake
from spark_jobs.service_client import ServiceConnection

ROOT = Path(__file__).resolve().parent.parent


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


def summary_line(out: str, layer: str, table: str) -> dict[str, str]:
    for line in out.splitlines():
        parts = line.split()
        if parts[:2] == [layer, table]:
            return dict(p.split("=", 1) for p in parts[2:] if "=" in p)
    raise AssertionError(f"no {layer} {table} line in:\n{out}")


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
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master_ui, worker_ui = ui_ports or (free_port(), free_port())
    workdir.mkdir(parents=True, exist_ok=True)
    daemons = [
        ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                    "--webui-port", str(master_ui)], "I have been elected leader"),
        ("worker", ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", str(cores),
                    "--memory", memory, "--work-dir", str(workdir / "work"), "--webui-port", str(worker_ui)],
         "Successfully registered with master"),
    ]
    started: list[subprocess.Popen] = []
    try:
        for name, args, ready in daemons:
            log = workdir / f"{name}.log"
            with log.open("w") as out:
                started.append(subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True))
            deadline = time.monotonic() + 120
            while ready not in log.read_text():
                if started[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Spark {name} did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.3)
        yield url
    finally:
        for process in reversed(started):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)


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
