"""The pipeline service (spark_jobs/service.py), a process of its own as `make demo` runs it: jobs submitted over
HTTP run as `python -m spark_jobs` would, each with its own settings and log, in one warm Spark, on the service's
own deployment; nobody without its secret, no web page and no caller-chosen path gets a job started."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from spark_jobs.generate import Options, generate
from spark_jobs.registry import load_registry
from spark_jobs.service_client import JobRequest, ServiceConnection, ServiceError, poll, submit
from spark_jobs.settings import environ, job_environment, settings
from tests.support import (
    ROOT,
    SERVICE_CONFIG,
    jobs_known,
    pipeline_service,
    raw_request,
    subprocess_env,
    summary_line,
    wait_for_job,
)


def run(*argv: str) -> JobRequest:
    """A request as the DAG tasks build it (their --config, --landing and --lake are not sent)."""
    return JobRequest.from_argv(["run", "--config", "x", "--landing", "x", "--lake", "x", *argv])


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("service")
    (workdir / "tables.yaml").write_text(SERVICE_CONFIG)
    (workdir / "tmp").mkdir()
    env = {"CDC_CONFIG": str(workdir / "tables.yaml"), "CDC_LANDING_URI": str(workdir / "landing"),
           "CDC_LAKE_URI": str(workdir / "lake"), "TMPDIR": str(workdir / "tmp")}
    with pipeline_service(subprocess_env(**env), workdir / "service.log") as service:
        yield service, workdir


def test_the_service_warmed_up_before_it_took_jobs_and_kept_nothing_of_it(deployment):
    """Its first job pays no JVM warm-up: the pipeline ran over the sample tables before the service said it was
    ready, in a folder of its scratch that is gone, and nothing of it reached the deployment's lake."""
    service, workdir = deployment
    log = (workdir / "service.log").read_text()
    warmed, ready = log.index("warm-up: the pipeline ran over 3 sample tables"), log.index("pipeline service on ")
    assert warmed < ready and "warmed up in " in log[ready:]
    for table in ("warm_actor", "warm_customers", "warm_products"):
        assert summary_line(log, "silver", table)["gate"] == "passed"
    assert list((workdir / "tmp").glob("cdc-service-*/warm-up-*")) == []
    assert not any("warm_" in str(p) for p in (workdir / "lake").rglob("*"))


def test_jobs_run_as_the_cli_would_each_with_its_own_log(deployment):
    service, workdir = deployment
    registry = load_registry(str(workdir / "tables.yaml"))
    generated = {g.table: g for g in generate(registry.select(["customers", "products"]), workdir / "landing",
                                              Options(rows=30, changes=40))}
    lake = workdir / "lake"
    # two tables at once, on the service's two job threads: each log holds its own table's lines only
    runs = {table: submit(service, run("--tables", table, "--layers", "bronze,silver")) for table in generated}
    done = {table: wait_for_job(service, job_id) for table, job_id in runs.items()}
    for table, status in done.items():
        assert (status.state, status.exit_code, status.cause) == ("succeeded", 0, None), status.log
        assert status.spark_jobs and status.spark_jobs > 0  # counted in the job's own Spark job group
        assert status.gx_seconds and 0 < status.gx_seconds < (status.seconds or 0)  # its gates' validations and docs
        other = next(t for t in generated if t != table)
        assert summary_line(status.log, "bronze", table)["gate"] == summary_line(status.log, "silver", table)["gate"] == "passed"
        assert f" {other} " not in status.log
        assert summary_line(status.log, "bronze", table)["files"] == str(len(generated[table].files))
    from deltalake import DeltaTable

    def silver(table: str) -> dict:
        keys = registry.tables[table].keys
        rows = DeltaTable(str(lake / "silver" / table)).to_pyarrow_table().to_pylist()
        return {tuple(r[k] for k in keys): {c: r[c] for c in r if not c.startswith("_")} for r in rows}

    for table, g in generated.items():
        assert silver(table) == g.final_rows

    # the same files again: nothing new, silver unchanged (a run through the service is as idempotent as the CLI)
    again = wait_for_job(service, submit(service, run("--tables", "customers", "--layers", "bronze,silver")))
    assert again.exit_code == 0, again.log
    assert summary_line(again.log, "bronze", "customers")["files"] == "0", again.log
    assert silver("customers") == generated["customers"].final_rows


def test_a_jobs_spark_jobs_are_all_counted_though_spark_keeps_only_its_last_ones(monkeypatch):
    """Spark's status tracker keeps the application's last spark.ui.retainedJobs jobs: a job of more than that is
    counted whole because its jobs are read while it runs. The tracker here keeps the last 3; each Spark job ends
    only once the running count has read the one before it, so no machine's timing decides the result."""
    from spark_jobs import service

    class LastThree:
        def __init__(self):
            self.ended: list[int] = []
            self.newest_read = -1
            self.read = threading.Condition()

        def getJobIdsForGroup(self, group):  # noqa: N802 (Spark's name)
            assert group == "job-1"
            ids = list(self.ended[-3:])
            with self.read:
                self.newest_read = max(ids, default=-1)
                self.read.notify_all()
            return ids

    monkeypatch.setattr(service, "SAMPLE_S", 0.005)
    tracker = LastThree()
    counted = service._SparkJobIds(tracker, "job-1")
    for job_id in range(40):
        tracker.ended.append(job_id)
        with tracker.read:
            assert tracker.read.wait_for(lambda ended=job_id: tracker.newest_read >= ended, timeout=10), \
                f"Spark job {job_id} was not read while the job ran"
    assert counted.finish() == 40
    assert not counted.sampler.is_alive()


def test_failures_keep_the_processs_exit_codes_and_cause(deployment):
    service, _ = deployment
    unknown = wait_for_job(service, submit(service, run("--tables", "nope")))
    assert (unknown.state, unknown.exit_code, unknown.spark_jobs, unknown.gx_seconds) == ("failed", 2, 0, 0.0)  # refused first
    assert unknown.cause is not None and unknown.cause.startswith("config error: unknown table(s) nope; known: ")
    with pytest.raises(ValueError, match="the service runs run and maintain, not 'generate'"):
        JobRequest(command="generate").check()
    with pytest.raises(ServiceError, match="HTTP 404: .*no job 'missing'") as missing:
        poll(service, "missing")
    assert missing.value.permanent


def test_a_job_sees_its_own_settings_and_a_resubmitted_key_its_first_job(deployment):
    service, workdir = deployment
    first = submit(service, JobRequest(tables=("nope",), key="dag/task/run/-1/1"))
    assert submit(service, JobRequest(tables=("nope",), key="dag/task/run/-1/1")) == first  # the same try, twice
    assert submit(service, JobRequest(tables=("nope",), key="dag/task/run/-1/2")) != first  # a retry is a new job
    landed = workdir / "landing" / "topics" / "test.strict.customers" / "partition=0"
    landed.mkdir(parents=True)
    (landed / "test.strict.customers+0+0000000000.json").write_text("{not json}\n")
    # CDC_DEBUG makes a failed run print its traceback: only the job given it does, though both run at once
    traced_id = submit(service, JobRequest(tables=("strict",), layers=("bronze",), settings=(("debug", "1"),)))
    plain_id = submit(service, JobRequest(tables=("strict",), layers=("bronze",)))
    traced, plain = wait_for_job(service, traced_id), wait_for_job(service, plain_id)
    assert traced.exit_code == plain.exit_code == 1, traced.log + plain.log
    assert "Traceback (most recent call last)" in traced.log and "Traceback" not in plain.log
    assert plain.cause and "strict" in plain.cause and "bronze" in plain.cause, plain.cause


def test_nobody_without_the_secret_and_no_web_page_starts_a_job(deployment):
    service, _ = deployment
    body = json.dumps({"command": "run", "tables": ["customers"]}).encode()
    bearer = {"Authorization": f"Bearer {service.token}"}
    before = jobs_known(service)
    refused = {
        "anonymous": raw_request(service, "POST", "/jobs", body, {"Content-Type": "application/json"}),
        "a wrong secret": raw_request(service, "POST", "/jobs", body, {"Content-Type": "application/json",
                                                               "Authorization": "Bearer guessed"}),
        # a page can POST text/plain (or a form) to any address without a CORS preflight
        "text/plain": raw_request(service, "POST", "/jobs", body, {**bearer, "Content-Type": "text/plain"}),
        "a form": raw_request(service, "POST", "/jobs", body, {**bearer, "Content-Type": "application/x-www-form-urlencoded"}),
        "a web page's Origin": raw_request(service, "POST", "/jobs", body, {**bearer, "Content-Type": "application/json",
                                                                    "Origin": "http://attacker.example"}),
        # DNS rebinding: the attacker's name resolves to 127.0.0.1, the browser sends the attacker's Host
        "a rebound Host": raw_request(service, "POST", "/jobs", body, {**bearer, "Content-Type": "application/json",
                                                               "Host": f"attacker.example:{service.url.rsplit(':', 1)[1]}"}),
        "no Host": raw_request(service, "POST", "/jobs", body, {**bearer, "Content-Type": "application/json", "Host": ""}),
    }
    assert {what: status for what, (status, _) in refused.items()} == {
        "anonymous": 401, "a wrong secret": 401, "text/plain": 415, "a form": 415, "a web page's Origin": 403,
        "a rebound Host": 421, "no Host": 421}
    assert raw_request(service, "GET", "/health")[0] == 401
    assert jobs_known(service) == before  # none of them started a job
    with pytest.raises(ServiceError, match="HTTP 401") as anonymous:
        submit(ServiceConnection(service.url, "not-the-secret"), JobRequest(tables=("customers",)))
    assert anonymous.value.permanent


def test_a_caller_names_only_what_a_task_needs_never_a_config_lake_path_or_setting(deployment):
    service, workdir = deployment
    bearer = {"Authorization": f"Bearer {service.token}", "Content-Type": "application/json"}
    before = jobs_known(service)
    outside = workdir / "outside"
    attempts = {
        "a config": {"command": "run", "config": str(workdir / "evil.yaml")},
        "a lake": {"command": "run", "lake": str(outside)},
        "argv": {"argv": ["run", "--config", str(workdir / "evil.yaml")]},
        "an environment": {"command": "run", "env": {"CDC_LAKE_URI": str(outside)}},
        "a setting naming a path": {"command": "run", "settings": {"lake_uri": str(outside)}},
        "a landing file outside the landing": {"command": "run", "files": ["../../etc/passwd"]},
        "an absolute landing file": {"command": "run", "files": ["/etc/passwd"]},
        "a run id that is a path": {"command": "run", "run_id": "../../outside"},
        "an option as a table": {"command": "run", "tables": ["--lake=/tmp/x"]},
        "another command": {"command": "serve"},
        "a layer that is not one": {"command": "run", "layers": ["bronze", "x"]},
        "a list as the mode": {"command": "run", "mode": ["rebuild"]},
        "a negative batch size": {"command": "run", "settings": {"bronze_batch_files": "-1"}},
        "a lock timeout that is not a number": {"command": "run", "settings": {"lock_timeout": "nan"}},
        "an engine that is not one": {"command": "run", "settings": {"delta_engine": "duckdb"}},
    }
    answers = {what: raw_request(service, "POST", "/jobs", json.dumps(body).encode(), bearer) for what, body in attempts.items()}
    assert {what: status for what, (status, _) in answers.items()} == dict.fromkeys(attempts, 400), answers
    assert "unknown field(s) config" in answers["a config"][1]
    assert "lake_uri cannot be set per job" in answers["a setting naming a path"][1]
    assert "CDC_BRONZE_BATCH_FILES='-1': it must be 1 or more" in answers["a negative batch size"][1]
    assert "CDC_LOCK_TIMEOUT='nan' is not a finite number" in answers["a lock timeout that is not a number"][1]
    assert "CDC_DELTA_ENGINE='duckdb': choose from delta-rs, delta-spark" in answers["an engine that is not one"][1]
    assert jobs_known(service) == before and not outside.exists()
    assert not (workdir / "lake" / "outside").exists()


def test_the_connection_file_holds_the_secret_for_its_user_only(deployment):
    service, workdir = deployment
    written = workdir / "service.connection.json"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    connection = json.loads(written.read_text())
    assert (connection["conn_type"], connection["host"], connection["schema"]) == (
        "cdc_pipeline_service", "127.0.0.1", "http")
    assert len(connection["password"]) >= 32 and connection["password"] == service.token


def test_its_spark_listens_on_the_services_own_address_only(deployment):
    """A service on loopback keeps its Spark there too: the driver's ports and the Spark UI (every job, and the JVM's
    environment) on 127.0.0.1, nothing on the host's other addresses or on every interface."""
    import psutil

    service, workdir = deployment
    connection_file = str(workdir / "service.connection.json")
    (server,) = [p for p in psutil.process_iter(["cmdline"]) if connection_file in (p.info["cmdline"] or [])]
    listening = {(c.laddr.ip, c.laddr.port) for p in (server, *server.children(recursive=True))
                 for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert int(service.url.rsplit(":", 1)[1]) in {port for _, port in listening}
    assert len(listening) >= 4, listening  # the service, py4j's gateway, the driver's RPC and the Spark UI at least
    # Java's sockets show IPv4 addresses in their IPv6 form (::ffff:127.0.0.1)
    assert {address.removeprefix("::ffff:") for address, _ in listening} == {"127.0.0.1"}, listening


def test_run_ids_are_names_on_the_command_line_too(tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    for bad in ("../../outside", "/tmp/x", "a/b", ".hidden", ""):
        done = subprocess.run([sys.executable, "-m", "spark_jobs", "run", "--landing", str(landing), "--lake", str(lake),
                               "--run-id", bad], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and "run id" in done.stderr, (bad, done.stderr)
    assert not lake.exists() and not (tmp_path / "outside").exists()
    done = subprocess.run([sys.executable, "-m", "spark_jobs", "run", "--landing", str(landing), "--lake", str(lake),
                           "--files", json.dumps(["../outside.json"])], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "landing file '../outside.json'" in done.stderr, done.stderr


def test_a_jobs_variables_are_seen_in_its_thread_only(monkeypatch):
    """What lets jobs share the process: the overlay applies to the thread (context) that set it."""
    monkeypatch.setenv("CDC_LAKE_URI", "/own")
    seen: dict[str, tuple[str, str]] = {}
    barrier = threading.Barrier(2)

    def job(name: str, lake: str) -> None:
        with job_environment({"CDC_LAKE_URI": lake, "AWS_ACCESS_KEY_ID": name}):
            barrier.wait()  # both overlays in place at once
            seen[name] = (settings().lake_uri, environ["AWS_ACCESS_KEY_ID"])

    threads = [threading.Thread(target=job, args=(n, f"/lake-{n}")) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a": ("/lake-a", "a"), "b": ("/lake-b", "b")}
    assert settings().lake_uri == "/own" and environ.get("AWS_ACCESS_KEY_ID") == os.environ.get("AWS_ACCESS_KEY_ID")
