"""A lake on S3 (CDC_LAKE_URI=s3://bucket/prefix) on a local S3 server (moto): every table, the state, the
GX stores and the reports go to the bucket, Spark reads the landing files through s3a:// where they are,
and one writer per table holds through a lease object instead of an OS file lock."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import boto3
import pytest

from spark_jobs import cli, state
from spark_jobs.delta.reads import row_count
from spark_jobs.errors import TableBusy
from spark_jobs.lake import Lake
from spark_jobs.state import writer_lock
from spark_jobs.storage import S3Files
from tests.support import FIXTURES, RECORDED_FINAL, run, s3_environment, silver_rows, summary_line, upload_landing

LAKE = "s3://lake/cdc"


@pytest.fixture()
def s3(s3_endpoint, monkeypatch):
    """This process's AWS_* pointing at the local server (the CLI, delta-rs and the GX stores read them)."""
    for name, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    return boto3.client("s3", endpoint_url=s3_endpoint)


def keys(client, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_recorded_connector_output_with_landing_and_lake_on_s3_gives_the_source_state(spark, engine, tmp_path,
                                                                                      capsys, s3):
    """PostgreSQL's recorded output landed in one bucket, the lake in another: silver equals the source, the
    reports and Data Docs are objects of the lake, nothing is written to the local disk, and a second run
    changes nothing. One landing file has a name Spark would read as a glob: it is copied into the lake's
    staging under a safe name, and the copy is gone after the run."""
    upload_landing(s3.meta.endpoint_url, FIXTURES / "postgres", "s3://landing/cdc")
    folder = "cdc/topics/pgserver1.public.customers/partition=0"
    s3.copy_object(Bucket="landing", Key=f"{folder}/batch [2] 50%.json",
                   CopySource={"Bucket": "landing", "Key": f"{folder}/pgserver1.public.customers+0+0000000006.json"})
    s3.delete_object(Bucket="landing", Key=f"{folder}/pgserver1.public.customers+0+0000000006.json")

    code, out, err = run(capsys, FIXTURES / "tables.yaml", "s3://landing/cdc", LAKE, "--tables", "pg_customers")
    assert (code, err) == (0, "")
    assert summary_line(out, "bronze", "pg_customers")["files"] == "3"
    assert summary_line(out, "silver", "pg_customers")["gate"] == "passed"
    assert silver_rows(spark, engine, LAKE, "pg_customers", ("id",)) == RECORDED_FINAL["pg_customers"]

    lake = Lake(LAKE)
    stored = keys(s3, "lake", "cdc/")
    for prefix in ("cdc/bronze/pg_customers/_delta_log/", "cdc/silver/pg_customers/_delta_log/",
                   "cdc/_state/ingest_log/pg_customers/_delta_log/", "cdc/reports/runs/",
                   # its small batches' gates, in the passes' GX projects and Data Docs (a pass of one)
                   "cdc/reports/data_docs/bronze-pass/validations/", "cdc/reports/data_docs/silver-pass/validations/",
                   "cdc/_state/gx/bronze-pass/", "cdc/_state/gx/silver-pass/"):
        assert any(k.startswith(prefix) for k in stored), prefix
    assert {"cdc/reports/index.html", "cdc/reports/data_docs/bronze-pass/index.html",
            "cdc/reports/data_docs/silver-pass/index.html"} <= set(stored)
    assert not [k for k in stored if k.startswith("cdc/_state/staging/") or k.startswith("cdc/_state/locks/")]
    assert not Path("s3:").exists() and not list(tmp_path.iterdir())  # no s3:// path taken for a local one
    assert "pg_customers" in lake.files.read(lake.reports_index).decode()
    bronze_rows = row_count(lake.bronze("pg_customers"))

    code, out, err = run(capsys, FIXTURES / "tables.yaml", "s3://landing/cdc", LAKE, "--tables", "pg_customers")
    assert (code, err) == (0, "")
    assert summary_line(out, "bronze", "pg_customers")["gate"] == "skipped"
    assert row_count(lake.bronze("pg_customers")) == bronze_rows
    assert silver_rows(spark, engine, LAKE, "pg_customers", ("id",)) == RECORDED_FINAL["pg_customers"]

    assert cli.main(["status", "--config", str(FIXTURES / "tables.yaml"), "--lake", LAKE]) == 0
    out = capsys.readouterr().out
    status = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines()[1:]
              if line.strip() and not line.startswith(("tables:", "reports:", "lag:"))}
    assert status[("silver", "pg_customers")][:2] == [str(len(RECORDED_FINAL["pg_customers"])), "passed"]
    # the recorded connector output is years old: the lag says it is measured from the source's commit time
    assert re.search(r"^lag: now less the source commit time of the newest change a layer holds; (bronze|silver)/"
                     r"pg_customers's is \d+\.\d years \(since the source's commit at 20\d\d-\d\d-\d\d \d\d:\d\d UTC\)$",
                     out, re.MULTILINE), out


def test_one_writer_per_table_holds_on_s3_and_a_dead_writers_lease_is_taken_over(s3, monkeypatch, capsys):
    lake = Lake(LAKE)
    with writer_lock(lake, "customers", "first"):
        with pytest.raises(TableBusy, match=r"customers is being written by another run \(run first, pid \d+, host .*"
                                            r"its lease unchanged for \ds of 60s\); waited 1s$"):
            with writer_lock(lake, "customers", "second", timeout_s=1):
                pass
    said = capsys.readouterr().out.splitlines()  # the waiter says at once whose lease it waits for
    assert len(said) == 1 and said[0].startswith("waiting for the writer lock of customers, held by run first, pid ")
    assert said[0].endswith("; up to 1s (CDC_LOCK_TIMEOUT)")
    with writer_lock(lake, "customers", "after", timeout_s=0.5):  # released with its holder
        pass
    assert keys(s3, "lake", "cdc/_state/locks/") == []

    # a run killed while holding the table leaves its lease behind, unrenewed: after a whole lease unchanged,
    # a waiter takes the table over
    monkeypatch.setattr(state, "LEASE_S", 1.0)
    S3Files().write(lake.lock("customers"), "run killed, pid 1, host gone")
    started = time.monotonic()
    with writer_lock(lake, "customers", "next", timeout_s=10):
        held = S3Files().read(lake.lock("customers")).decode()
        assert held.startswith("run next, pid") and held.endswith("took over from: run killed, pid 1, host gone")
    assert 1.0 <= time.monotonic() - started < 5


def test_a_writer_whose_lease_was_taken_over_fails_instead_of_carrying_on_unnoticed(s3, monkeypatch):
    """A holder that could not renew in time (a long GC pause, a partition) finds its lease replaced: the
    run fails with the cause, and the new holder's lease is left alone."""
    monkeypatch.setattr(state, "LEASE_S", 0.6)
    lake, files = Lake(LAKE), S3Files()
    with pytest.raises(TableBusy, match="writer lock lapsed"):
        with writer_lock(lake, "customers", "slow"):
            files.write(lake.lock("customers"), "run other")  # another run's takeover
            threading.Event().wait(0.6)  # at least one renewal falls due meanwhile
    assert files.read(lake.lock("customers")) == b"run other"


def test_a_renewal_that_fails_on_an_s3_error_is_tried_again_and_the_lease_is_kept(s3, monkeypatch):
    """One renewal meets an S3 error: the holder tries again at its next tick, so a waiter never sees the
    lease unchanged for a whole lease and does not take the table over (without the retry it would)."""
    from botocore.exceptions import EndpointConnectionError

    monkeypatch.setattr(state, "LEASE_S", 1.5)  # renewals every 0.5 s
    lake, replace, calls = Lake(LAKE), S3Files.replace, []

    def flaky(self, path, data, tag):
        calls.append(path)
        if len(calls) == 1:
            raise EndpointConnectionError(endpoint_url=s3.meta.endpoint_url)
        return replace(self, path, data, tag)

    monkeypatch.setattr(S3Files, "replace", flaky)
    waiter: list[BaseException | None] = []

    def wait_for_the_table() -> None:
        try:
            with writer_lock(lake, "customers", "waiter", timeout_s=2.5):
                waiter.append(None)
        except TableBusy as exc:
            waiter.append(exc)

    with writer_lock(lake, "customers", "steady"):
        thread = threading.Thread(target=wait_for_the_table)
        thread.start()
        time.sleep(3.0)
    thread.join()
    assert len(calls) >= 3 and isinstance(waiter[0], TableBusy)
    assert keys(s3, "lake", "cdc/_state/locks/") == []


def test_a_dead_local_holders_lease_is_taken_at_once_a_live_ones_waited_for(s3):
    lake = Lake(LAKE)
    # a run of this host killed while holding the table: its pid is gone, so the lease is taken at once, not after
    # a whole lease (60 s) unchanged
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = f"run killed, pid {dead.pid}, host {state.process_space()}, since 2026-11-25T00:00:00+00:00"
    S3Files().write(lake.lock("customers"), left)
    started = time.monotonic()
    with writer_lock(lake, "customers", "next", timeout_s=60):
        assert S3Files().read(lake.lock("customers")).decode().endswith(f"took over from: {left}")
    assert time.monotonic() - started < 5
    # a live holder of this host is waited for as any other
    alive = f"run busy, pid {os.getpid()}, host {state.process_space()}, since 2026-11-25T00:00:00+00:00"
    S3Files().write(lake.lock("customers"), alive)
    with pytest.raises(TableBusy, match="run busy"):
        with writer_lock(lake, "customers", "third", timeout_s=1):
            pass
    # a holder of another container with the same hostname (compose names the service's): its pid says nothing here
    elsewhere = f"run elsewhere, pid {dead.pid}, host {socket.gethostname()}@0.1, since 2026-11-25T00:00:00+00:00"
    assert state.process_space().startswith(f"{socket.gethostname()}@")  # Linux: the boot and the pid namespace
    S3Files().write(lake.lock("customers"), elsewhere)
    with pytest.raises(TableBusy, match="run elsewhere"):
        with writer_lock(lake, "customers", "fourth", timeout_s=1):
            pass


def test_a_lock_timeout_shorter_than_the_lease_is_refused_before_any_work(s3, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CDC_LOCK_TIMEOUT", "30")
    code = cli.main(["run", "--config", str(FIXTURES / "tables.yaml"), "--landing", str(tmp_path), "--lake", LAKE])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "config error: CDC_LOCK_TIMEOUT=30 is shorter than the lease of an S3 lake's writer lock (60 s): a lock left "
        "by a killed run could never be taken over; set it to at least 60")
    assert keys(s3, "lake", "cdc/") == []
