"""The pipeline service (spark_jobs/service.py), a process of its own as `make demo` runs it: jobs submitted over
HTTP run as `python -m spark_jobs` would, each with its own settings and log, in one warm Spark."""

from __future__ import annotations

import os
import threading
import time

import pytest

from spark_jobs.generate import Options, generate
from spark_jobs.registry import load_registry
from spark_jobs.service import JobStatus, ServiceError, poll, submit
from spark_jobs.settings import environ, job_environment, settings
from tests.conftest import subprocess_env
from tests.support import pipeline_service, summary_line

TOKEN = "s3cret-token"


def wait(url: str, job_id: str) -> JobStatus:
    """The job's whole log, read the way the trigger reads it: from the last offset on."""
    log, offset, deadline = "", 0, time.monotonic() + 300
    while time.monotonic() < deadline:
        status = poll(url, job_id, offset)
        log, offset = log + status.log, status.offset
        if status.done:
            status.log = log
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end:\n{log}")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("service")
    with pipeline_service(subprocess_env(CDC_SERVICE_TOKEN=TOKEN), workdir / "service.log") as url:
        yield url, workdir


@pytest.fixture()
def token(monkeypatch):
    monkeypatch.setenv("CDC_SERVICE_TOKEN", TOKEN)


def test_jobs_run_as_the_cli_would_each_with_its_own_log(service, token, tmp_path):
    url, _ = service
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n"
                      "  products:\n    topic: dbserver1.inventory.products\n    keys: [id]\n")
    registry = load_registry(str(config))
    generated = {g.table: g for g in generate(registry.select(None), tmp_path / "landing", Options(rows=30, changes=40))}
    lake = tmp_path / "lake"

    def job(table: str, *extra: str) -> str:
        return submit(url, ["run", "--config", str(config), "--landing", str(tmp_path / "landing"), "--lake", str(lake),
                            "--tables", table, "--layers", "bronze,silver", *extra], {"CDC_SHUFFLE_PARTITIONS": "1"})

    # two tables at once, on the service's two job threads: each log holds its own table's lines only
    runs = {table: job(table) for table in generated}
    done = {table: wait(url, job_id) for table, job_id in runs.items()}
    for table, status in done.items():
        assert (status.state, status.exit_code, status.cause) == ("succeeded", 0, None), status.log
        assert status.spark_jobs and status.spark_jobs > 0  # counted in the job's own Spark job group
        other = next(t for t in generated if t != table)
        assert summary_line(status.log, "bronze", table)["gate"] == summary_line(status.log, "silver", table)["gate"] == "passed"
        assert f" {other} " not in status.log
        assert summary_line(status.log, "bronze", table)["files"] == str(len(generated[table].files))
    from deltalake import DeltaTable

    for table, g in generated.items():
        keys = registry.tables[table].keys
        rows = DeltaTable(str(lake / "silver" / table)).to_pyarrow_table().to_pylist()
        assert {tuple(r[k] for k in keys): {c: r[c] for c in r if not c.startswith("_")} for r in rows} == g.final_rows

    # the same files again: nothing new, silver unchanged (a run through the service is as idempotent as the CLI)
    again = wait(url, job("customers"))
    assert again.exit_code == 0, again.log
    assert summary_line(again.log, "bronze", "customers")["files"] == "0", again.log
    rows = DeltaTable(str(lake / "silver" / "customers")).to_pyarrow_table().to_pylist()
    keys = registry.tables["customers"].keys
    assert {tuple(r[k] for k in keys): {c: r[c] for c in r if not c.startswith("_")} for r in rows} == \
        generated["customers"].final_rows


def test_failures_keep_the_processs_exit_codes_and_cause(service, token, tmp_path):
    url, _ = service
    unknown = wait(url, submit(url, ["run", "--landing", str(tmp_path), "--lake", str(tmp_path / "lake"),
                                     "--tables", "nope"], {}))
    assert (unknown.state, unknown.exit_code, unknown.spark_jobs) == ("failed", 2, 0)  # refused before any Spark
    assert unknown.cause is not None and unknown.cause.startswith("config error: unknown table(s) nope; known: ")
    bad_args = wait(url, submit(url, ["run", "--bogus"], {}))
    assert bad_args.exit_code == 2 and "the following arguments are required: --landing, --lake" in bad_args.log
    with pytest.raises(ServiceError, match="the service runs run and maintain, not \\['generate'\\]") as refused:
        submit(url, ["generate", "--landing", str(tmp_path)], {})
    assert refused.value.permanent
    with pytest.raises(ServiceError, match="HTTP 404: .*no job 'missing'") as missing:
        poll(url, "missing")
    assert missing.value.permanent


def test_a_job_sees_its_own_settings_and_a_resubmitted_key_its_first_job(service, token, tmp_path):
    url, _ = service
    first = submit(url, ["run", "--bogus"], {}, key="dag/task/run/-1/1")
    assert submit(url, ["run", "--bogus"], {}, key="dag/task/run/-1/1") == first  # the same try, submitted twice
    assert submit(url, ["run", "--bogus"], {}, key="dag/task/run/-1/2") != first  # a retry is a new job
    landed = tmp_path / "landing" / "topics" / "burst.burst_bank.customers" / "partition=0"
    landed.mkdir(parents=True)
    (landed / "burst.burst_bank.customers+0+0000000000.json").write_text("{not json}\n")
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n"
                      "    quality:\n      max_quarantined: 1%\n      min_quarantined_to_fail: 1\n")
    run = ["run", "--config", str(config), "--landing", str(tmp_path / "landing"), "--lake", str(tmp_path / "lake"),
           "--layers", "bronze"]
    # CDC_DEBUG makes a failed run print its traceback: only the job given it does, though both run at once
    traced_id, plain_id = submit(url, run, {"CDC_DEBUG": "1"}), submit(url, run, {})
    traced, plain = wait(url, traced_id), wait(url, plain_id)
    assert traced.exit_code == plain.exit_code == 1, traced.log + plain.log
    assert "Traceback (most recent call last)" in traced.log and "Traceback" not in plain.log
    assert plain.cause and "customers" in plain.cause and "bronze" in plain.cause, plain.cause


def test_requests_without_the_token_are_refused(service, monkeypatch):
    url, _ = service
    monkeypatch.delenv("CDC_SERVICE_TOKEN", raising=False)
    with pytest.raises(ServiceError, match="HTTP 401") as refused:
        submit(url, ["run", "--bogus"], {})
    assert refused.value.permanent


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
