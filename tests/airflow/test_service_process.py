"""The pipeline service as a process: what only a service of its own can show (its start beyond loopback, its stop
and kill, a job that takes its heap, TLS), each test starting its own. test_service.py holds the tests that share
one warm service; the two modules split over the two test workers."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.generate import Options, generate
from spark_jobs.registry import load_registry
from spark_jobs.service_client import JobRequest, ServiceConnection, ServiceError, poll, submit
from tests.support import ROOT, SERVICE_CONFIG, jobs_known, pipeline_service, subprocess_env, summary_line, wait_for_job


def test_beyond_loopback_without_tls_and_a_secret_the_service_refuses_to_start(tmp_path):
    for extra, env in ([], {}), (["--tls-cert", str(tmp_path / "c.pem")], {}), ([], {"CDC_SERVICE_TOKEN": "x" * 32}):
        done = subprocess.run([sys.executable, "-m", "spark_jobs", "serve", "--host", "0.0.0.0", "--port", "0", *extra],
                              cwd=ROOT, env=subprocess_env(**env), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert ("listens beyond loopback: give it TLS (--tls-cert, --tls-key) and a secret (CDC_SERVICE_TOKEN or "
                "--token-file)") in done.stderr
    # a secret file that is not there is a config error naming it, not a service with no secret
    done = subprocess.run([sys.executable, "-m", "spark_jobs", "serve", "--host", "0.0.0.0", "--port", "0",
                           "--token-file", str(tmp_path / "missing.token"), "--tls-cert", "c", "--tls-key", "k"],
                          cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"--token-file {tmp_path / 'missing.token'}: No such file" in done.stderr


def test_a_stopped_or_killed_service_leaves_no_jvm_and_no_scratch(tmp_path):
    (tmp_path / "tmp").mkdir()
    # its start and stop are what is tested, three times: without the warm-up's run (test_service.py has one)
    env = subprocess_env(CDC_LAKE_URI=str(tmp_path / "lake"), CDC_LANDING_URI=str(tmp_path / "landing"),
                         TMPDIR=str(tmp_path / "tmp"), CDC_SERVICE_WARM_UP="false")

    def jvms(pid: int) -> list[int]:
        children = Path(f"/proc/{pid}/task/{pid}/children")
        return [int(c) for c in children.read_text().split()] if children.exists() else []

    for stop in (signal.SIGTERM, signal.SIGKILL):
        log = tmp_path / f"service-{stop.name}.log"
        with pipeline_service(env, log):
            service_pid = int(next(p for p in os.listdir("/proc") if p.isdigit() and
                                   f"--connection-file\0{log.with_suffix('.connection.json')}".encode()
                                   in Path(f"/proc/{p}/cmdline").read_bytes()))
            jvm = jvms(service_pid)
            assert jvm and "java" in Path(f"/proc/{jvm[0]}/cmdline").read_bytes().decode(), jvm
            scratch = list((tmp_path / "tmp").iterdir())
            assert len(scratch) == 1 and scratch[0].name.startswith(f"cdc-service-{service_pid}-"), scratch
            os.kill(service_pid, stop)
            deadline = time.monotonic() + 60
            while Path(f"/proc/{jvm[0]}").exists() and b"java" in Path(f"/proc/{jvm[0]}/cmdline").read_bytes():
                assert time.monotonic() < deadline, f"the JVM outlived the service ({stop.name})"
                time.sleep(0.5)
        assert "warm-up" not in log.read_text()
        if stop == signal.SIGTERM:
            assert list((tmp_path / "tmp").iterdir()) == []  # removed on the way out, and so is its connection
            assert not log.with_suffix(".connection.json").exists()
    # a killed service's scratch is swept at the next start
    with pipeline_service(env, tmp_path / "service-next.log"):
        assert len(list((tmp_path / "tmp").iterdir())) == 1


@pytest.mark.scale
def test_a_file_of_a_tenth_of_the_heap_ingests_and_a_job_beside_it_succeeds(tmp_path, soak):
    """What a sink with flush.size 100k writes: 120k events in one file of over 200 MB, read line by line across
    tasks with the default driver memory (2 GB, make soak); in make test a quarter of it at a quarter of the heap
    (30k events, over 50 MB, at 512 MB, the least a driver runs in). Every line accounted for, and another table's
    job meanwhile."""
    events, megabytes = (120_000, 200) if soak else (30_000, 50)
    config = tmp_path / "tables.yaml"
    config.write_text(SERVICE_CONFIG)
    registry = load_registry(str(config))
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    (big,) = generate(registry.select(["customers"]), landing, Options(rows=events, changes=0, partitions=1,
                                                                        records_per_file=200_000))
    (path,) = big.files
    with open(path, "ab") as handle:  # bad lines and tombstones among the events: each ends somewhere countable
        handle.write(b"{not json\nnull\n\n" * 5)
    assert Path(path).stat().st_size > megabytes * 2**20
    (small,) = generate(registry.select(["products"]), landing, Options(rows=50, changes=50))
    env = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": str(landing), "CDC_LAKE_URI": str(lake),
           **({} if soak else {"CDC_DRIVER_MEMORY": "512m"})}
    # what is tested is not its first job's speed: no warm-up (test_service.py has one)
    with pipeline_service(subprocess_env(**env, CDC_SERVICE_WARM_UP="false"), tmp_path / "service.log") as service:
        heavy = submit(service, JobRequest(tables=("customers",), layers=("bronze",)))
        while poll(service, heavy, 0).state == "queued":  # the big file is being read once it runs
            time.sleep(0.2)
        beside = wait_for_job(service, submit(service, JobRequest(tables=("products",), layers=("bronze", "silver"))))
        assert (beside.state, beside.exit_code) == ("succeeded", 0), beside.log
        done = wait_for_job(service, heavy)
    assert (done.state, done.exit_code) == ("succeeded", 0), done.log[-3000:]
    bronze = summary_line(done.log, "bronze", "customers")
    from spark_jobs.delta.reads import row_count
    from spark_jobs.lake import Lake

    quarantined = row_count(Lake(str(lake)).quarantine("customers"))
    assert (int(bronze["lines"]), int(bronze["events"]), int(bronze["tombstones"]), quarantined) == (
        events + 15, events, 5, 10)
    assert row_count(Lake(str(lake)).bronze("customers")) == events
    from deltalake import DeltaTable

    rows = DeltaTable(str(lake / "silver" / "products")).to_pyarrow_table().to_pylist()
    assert {(r["id"],): {c: r[c] for c in r if not c.startswith("_")} for r in rows} == small.final_rows


def test_a_job_that_runs_out_of_memory_fails_alone_naming_its_file_and_the_setting(tmp_path):
    """A line longer than the heap can hold still runs a job out of memory: its cause names the file and
    CDC_DRIVER_MEMORY (exit 1: the same file would do it again), and the service goes on with the other jobs (Spark
    4.2 would end the shared JVM on a task's OutOfMemoryError: the service's session keeps it)."""
    config = tmp_path / "tables.yaml"
    config.write_text(SERVICE_CONFIG)
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    folder = landing / "topics" / "burst.burst_bank.customers" / "partition=0"
    folder.mkdir(parents=True)
    huge = folder / "burst.burst_bank.customers+0+0000000000.json"
    with open(huge, "wb") as handle:  # one line of 700 MB
        handle.write(b'{"x": "')
        for _ in range(700):
            handle.write(b"a" * 2**20)
        handle.write(b'"}\n')
    (small,) = generate(load_registry(str(config)).select(["products"]), landing, Options(rows=50, changes=50))
    env = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": str(landing), "CDC_LAKE_URI": str(lake),
           "CDC_DRIVER_MEMORY": "512m"}
    # what is tested is not its first job's speed: no warm-up (test_service.py has one)
    with pipeline_service(subprocess_env(**env, CDC_SERVICE_WARM_UP="false"), tmp_path / "service.log") as service:
        heavy = submit(service, JobRequest(tables=("customers",), layers=("bronze",)))
        beside = submit(service, JobRequest(tables=("products",), layers=("bronze", "silver")))
        failed, done = wait_for_job(service, heavy), wait_for_job(service, beside)
        assert (failed.state, failed.exit_code) == ("failed", 1), failed.log[-3000:]
        assert failed.cause == (
            "table=customers layer=bronze: the Spark driver ran out of memory reading "
            f"topics/burst.burst_bank.customers/partition=0/{huge.name} ({huge.stat().st_size:,} bytes); a line must fit in "
            "the driver's heap, CDC_DRIVER_MEMORY=512m: raise it, or set the file aside (run --mode skip --files ...)")
        assert (done.state, done.exit_code) == ("succeeded", 0), done.log[-3000:]
        assert jobs_known(service) == 2  # and it still serves
    from spark_jobs.delta.reads import row_count
    from spark_jobs.lake import Lake

    assert row_count(Lake(str(lake)).bronze("customers")) is None  # nothing of the failed batch was written
    assert row_count(Lake(str(lake)).silver("products")) == len(small.final_rows)


def test_beyond_loopback_it_serves_https_with_the_operators_secret(tmp_path):
    """Listening on every address takes TLS and a secret of the operator's; clients verify the certificate (here
    a self-signed one, given as the connection's CA file) and a plain HTTP request gets nowhere. Its Spark UI, asked for
    (CDC_SPARK_UI), answers only a token made from that secret."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cdc-service")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    secret = "operators-own-secret-0123456789"
    log, connection_file = tmp_path / "service.log", tmp_path / "connection.json"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "spark_jobs", "serve", "--host", "0.0.0.0", "--port", "0", "--allow-host", "127.0.0.1",
             "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"),
             "--connection-file", str(connection_file)],
            cwd=ROOT, env=subprocess_env(CDC_SERVICE_TOKEN=secret, CDC_LAKE_URI=str(tmp_path / "lake"), CDC_SPARK_UI="true",
                                         CDC_SERVICE_WARM_UP="false"), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not connection_file.exists():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        written = ServiceConnection.from_file(connection_file)
        assert written.url.startswith("https://127.0.0.1:") and written.token == secret
        service = ServiceConnection(written.url, secret, str(tmp_path / "cert.pem"))
        assert wait_for_job(service, submit(service, JobRequest(tables=("nope",)))).exit_code == 2  # a job, over TLS
        with pytest.raises(ServiceError, match="CERTIFICATE_VERIFY_FAILED"):  # a certificate nobody vouched for
            poll(ServiceConnection(written.url, secret), "x")
        spark_ui_answers_the_secret_alone(log.read_text(), connection_file)
        port = int(written.url.rsplit(":", 1)[1])
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/health", headers={"Authorization": f"Bearer {secret}"})
            plain.getresponse()
    finally:
        process.terminate()
        process.wait(timeout=60)


def spark_ui_answers_the_secret_alone(log: str, connection_file) -> None:  # noqa: ANN001
    """The service's Spark UI (off unless CDC_SPARK_UI) behind Spark's JWS filter, its key made from the service's
    secret: nothing without the token `spark-ui-token` prints, the pages with it; no kill link (a GET) at all."""
    import re
    import urllib.error
    import urllib.request

    ui = re.search(r"its Spark UI at (http://\S+),", log)
    assert ui, log[-2000:]
    token = subprocess.run([sys.executable, "-m", "spark_jobs", "spark-ui-token", "--connection-file", str(connection_file)],
                           cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60).stdout.strip()

    def answer(path: str, bearer: str | None) -> tuple[int, bytes]:
        request = urllib.request.Request(ui[1] + path, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
        try:
            with urllib.request.urlopen(request, timeout=30) as answered:
                return answered.status, answered.read()
        except urllib.error.HTTPError as refused:
            return refused.code, b""

    assert answer("/jobs/", None)[0] in (401, 403)
    assert answer("/jobs/", token[:-4] + "AAAA")[0] in (401, 403)  # a signature of another key
    assert answer("/jobs/", token)[0] == 200
    app = json.loads(answer("/api/v1/applications", token)[1])[0]["id"]
    properties = dict(json.loads(answer(f"/api/v1/applications/{app}/environment", token)[1])["sparkProperties"])
    assert properties["spark.ui.killEnabled"] == "false"  # no kill link, which is a GET
