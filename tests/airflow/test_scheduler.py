"""Airflow for real (issue 19, item 0): the api-server, scheduler, dag-processor and triggerer with the
LocalExecutor on a PostgreSQL metadata database (Debian's `postgresql`, started here), no `dags test`.
Files land on a local S3 server while the scheduled run's sensor waits deferred in the triggerer; bronze's
asset event schedules silver, silver's schedules gold; then a backfill and a replay created through the
REST API, and a replay beside a manual silver run while a writer outside Airflow holds the table: both wait on the
table's writer lock, deferred, holding no worker slot."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake, row_count
from spark_jobs.registry import load_registry
from spark_jobs.report import load_run
from tests.airflow.scheduler import Airflow, airflow_env, postgres
from tests.conftest import ROOT, s3_environment, subprocess_env, upload_landing
from tests.support import pipeline_service, smtp_connection, smtp_sink

pytest.importorskip("airflow")


def test_the_scheduler_triggerer_and_assets_run_landing_to_gold_then_a_backfill_and_replays_from_the_api(
        tmp_path, s3_endpoint):
    config = tmp_path / "include" / "tables.yaml"
    (tmp_path / "include" / "gold").mkdir(parents=True)
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n")
    shutil.copy(ROOT / "include" / "gold" / "customers_by_state.sql", tmp_path / "include" / "gold")
    landing, lake = "s3://landing/cdc", tmp_path / "lake"
    (generated,) = generate(load_registry(str(config)).select(None), tmp_path / "sink", Options(rows=40, changes=40))
    home = tmp_path / "airflow"
    # the tasks submit their jobs to the pipeline service, the default way to run (docs/operations.md); they wait deferred
    deployment = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": landing, "CDC_LAKE_URI": str(lake)}
    with postgres() as database, pipeline_service(subprocess_env(**deployment, **s3_environment(s3_endpoint)),
                                                  tmp_path / "service.log") as service, smtp_sink() as (smtp, mails):
        env = airflow_env(home, database, service, s3_endpoint, deployment,
                          CDC_SENSOR_TIMEOUT="240", CDC_SENSOR_POKE_INTERVAL="2",
                          # a job held back by a table's writer lock outlasts its task's wait on the worker: it defers
                          CDC_TASK_WAIT="2",
                          # a sensor whose trigger fires within seconds of its deferral is failed by Airflow's scheduler
                          # (a stale executor event: apache/airflow#72716) and retried: without the 30 s wait
                          CDC_RETRY_DELAY="2",
                          # alerts through the SMTP provider's notifier; a deadline the waiting bronze run is sure to pass
                          AIRFLOW_CONN_SMTP_ALERTS=smtp_connection(smtp), CDC_ALERT_SMTP_CONN_ID="smtp_alerts",
                          CDC_ALERT_TO="ops@example.com", CDC_RUN_DEADLINE="10")
        airflow = Airflow(env, home)
        with airflow.running():
            # the scheduled run's sensor finds nothing and waits deferred, in the triggerer; files land, the trigger
            # wakes it, and its bronze task is failed after handing its job over: the work is not lost
            scheduled = airflow.wait("the sensor to defer", airflow.deferred_sensor, 300)
            work_done_is_not_lost_to_the_scheduler(airflow, s3_endpoint, tmp_path, landing, scheduled, generated)
            assert airflow.finished("cdc_bronze", scheduled)["run_type"] == "scheduled"
            # one bronze task for the tables found (a pass); its alias resolved to the table's asset, with the run's figures
            assert {t: ti["state"] for t, ti in airflow.task_instances("cdc_bronze", scheduled).items()} == {
                "landing_sense": "success", "bronze_ingest": "success", "bronze_verdicts": "success"}
            (event,) = airflow.api("GET", "/assets/events?source_dag_id=cdc_bronze")["asset_events"]
            (summary,) = [s for s in load_run(Lake(str(lake)), scheduled) if s["layer"] == "bronze"]
            assert (event["name"], event["extra"]["table"], event["extra"]["gate"], event["extra"]["files"],
                    event["extra"]["run_id"]) == ("cdc.bronze.customers", "customers", "passed", summary["files"], scheduled)
            # it waited past its deadline: the triggerer mailed it through the SMTP connection
            missed = airflow.wait("the deadline alert's mail", lambda: [
                m for m in mails if m["Subject"] == "CDC run past its deadline: cdc_bronze"] or None)
            assert missed[0]["To"] == "ops@example.com"
            assert scheduled in next(p.get_payload(decode=True).decode() for p in missed[0].walk()
                                     if p.get_content_type() == "text/html")
            silver_run = airflow.wait("silver from bronze's asset event", lambda: next(
                (r["dag_run_id"] for r in airflow.runs("cdc_silver") if r["run_type"] == "asset_triggered"), None))
            airflow.finished("cdc_silver", silver_run)
            # that run's event (a loaded CI machine once showed a second silver event: the runs say whose it was)
            silver_events = airflow.api(
                "GET", f"/assets/events?source_dag_id=cdc_silver&source_run_id={quote(silver_run, safe='')}")
            assert len(silver_events["asset_events"]) == 1, (silver_events, airflow.runs("cdc_silver"))
            (event,) = silver_events["asset_events"]
            assert (event["name"], event["extra"]["table"], event["extra"]["gate"]) == (
                "cdc.silver.customers", "customers", "passed")
            gold_run = airflow.wait("gold from silver's asset event", lambda: next(
                (r["dag_run_id"] for r in airflow.runs("cdc_gold_customers_by_state")
                 if r["run_type"] == "asset_triggered"), None))
            airflow.finished("cdc_gold_customers_by_state", gold_run)
            compose_healthchecks_pass(airflow)
            # the Connections UI's form for the service's own connection type (the distribution's provider entry point)
            forms = {m["connection_type"]: m for m in airflow.api("GET", "/connections/hook_meta", prefix="/ui")}
            service_form = forms["cdc_pipeline_service"]
            assert (service_form["hook_name"], service_form["standard_fields"]["password"]["title"],
                    service_form["standard_fields"]["login"]["hidden"]) == ("CDC pipeline service", "Secret", True)
            assert service_form["extra_fields"]["verify"]["schema"]["title"] == "CA file"
            tables = Lake(str(lake))
            assert row_count(tables.bronze("customers")) == generated.events
            assert silver_rows(tables) == generated.final_rows
            assert row_count(tables.gold("customers_by_state")) == len({r["state"] for r in generated.final_rows.values()})

            # a backfill created through the REST API, run by the scheduler: two past intervals, nothing landed
            # in them, so their sensors skip without waiting
            start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=3)
            backfill = airflow.api("POST", "/backfills", {
                "dag_id": "cdc_bronze", "from_date": start.isoformat(), "to_date": (start + dt.timedelta(minutes=15)).isoformat(),
                "reprocess_behavior": "none", "max_active_runs": 2, "run_backwards": False, "dag_run_conf": {}})
            backfilled = airflow.wait("the backfill's runs", lambda: [
                r for r in airflow.runs("cdc_bronze") if r["run_type"] == "backfill"
                and r["state"] in ("success", "failed")] or None)
            assert backfill["dag_id"] == "cdc_bronze" and {r["state"] for r in backfilled} == {"success"}
            for run in backfilled:
                assert airflow.task_instances("cdc_bronze", run["dag_run_id"])["bronze_ingest"]["state"] == "skipped"

            # a replay through the REST API with params, beside a manual silver run of the same table, while a
            # writer outside Airflow holds the table: both Airflow writers wait deferred on their jobs (each a pass of
            # the tables it is given: no pool of one table holds it back), and the table's writer lock keeps them
            # apart from the outside writer and from each other
            from spark_jobs.state import writer_lock

            with writer_lock(tables, "customers", "e2e-outside-writer"):
                replay = airflow.api("POST", "/dags/cdc_replay/dagRuns", {
                    "logical_date": None, "conf": {"tables": ["customers"], "mode": "rebuild"}})["dag_run_id"]
                manual = airflow.api("POST", "/dags/cdc_silver/dagRuns", {
                    "logical_date": None, "conf": {"tables": ["customers"]}})["dag_run_id"]

                def writers() -> dict[str, str | None]:
                    return {"replay": airflow.task_instances("cdc_replay", replay).get("replay", {})
                            .get("state"), "manual": airflow.task_instances("cdc_silver", manual)
                            .get("silver_merge", {}).get("state")}

                airflow.wait("both writers deferred on their jobs", lambda: set(writers().values()) == {"deferred"})
                time.sleep(4)
                assert set(writers().values()) == {"deferred"}, writers()  # neither could write: the lock is held
            airflow.finished("cdc_replay", replay)
            airflow.finished("cdc_silver", manual)
            jobs = service_jobs(tmp_path / "service.log")
            assert {f"cdc_replay/replay/{replay}", f"cdc_silver/silver_merge/{manual}"} <= set(jobs)
            assert silver_rows(tables) == generated.final_rows


def work_done_is_not_lost_to_the_scheduler(airflow: Airflow, s3_endpoint: str, tmp_path: Path, landing: str,
                                           run: str, generated) -> None:  # noqa: ANN001
    """The files land while another writer holds the table: `run`'s bronze job waits for the lock, and its task is
    failed meanwhile (a scheduler losing it, an operator's mistake). The job still does its work once the lock is free,
    but no asset event follows a failed task: silver waits. Cleared, the task's next try finds its work done (the same
    run's report) and announces it: silver and gold follow (the caller sees them), with no new landing."""
    from spark_jobs.state import writer_lock

    tables = Lake(str(tmp_path / "lake"))
    with writer_lock(tables, "customers", "e2e-outside-writer"):
        upload_landing(s3_endpoint, tmp_path / "sink", landing)
        airflow.wait("bronze's job to wait for the lock", lambda: airflow.task_instances("cdc_bronze", run)
                     .get("bronze_ingest", {}).get("state") == "deferred")
        airflow.api("PATCH", f"/dags/cdc_bronze/dagRuns/{quote(run, safe='')}/taskInstances/bronze_ingest",
                    {"new_state": "failed"})
    airflow.wait("the failed task's job to succeed", lambda: f"cdc_bronze/bronze_ingest/{run}" in service_jobs(
        tmp_path / "service.log"))
    assert row_count(tables.bronze("customers")) == generated.events  # the work is done
    time.sleep(4)
    assert airflow.api("GET", "/assets/events?source_dag_id=cdc_bronze")["asset_events"] == []  # and unannounced
    assert airflow.runs("cdc_silver") == []
    airflow.api("POST", "/dags/cdc_bronze/clearTaskInstances", {
        "dry_run": False, "dag_run_id": run, "task_ids": ["bronze_ingest"], "include_downstream": True,
        "only_failed": False, "reset_dag_runs": True})


def compose_healthchecks_pass(airflow: Airflow) -> None:
    """docker-compose.yaml's healthchecks of its four Airflow services, run against this stack as they would run in
    each container (the file had none: `docker compose ps` could not show them healthy)."""
    from tests.airflow.test_compose import AIRFLOW, SERVICES

    checks = []
    for name in AIRFLOW[1:]:
        test = SERVICES[name]["healthcheck"]["test"]
        assert test[0] == "CMD", test
        command = [sys.executable if part == "python" else part.replace("http://localhost:8080", airflow.base)
                   for part in test[1:]]
        checks.append((name, subprocess.Popen(command, env=airflow.env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True)))
    for name, check in checks:  # at once: each is a process start of its own
        out, _ = check.communicate(timeout=300)
        assert check.returncode == 0, (name, out[-2000:])


def service_jobs(log: Path) -> dict[str, tuple[str, str]]:
    """Each task's job on the pipeline service (dag/task/run), with when it started and ended, from its log."""
    started, ended, keys = {}, {}, {}
    for line in log.read_text().splitlines():
        if match := re.match(r"(\S+) job (\S+) started: (\S+)/-1/\d+ ", line):
            started[match[2]], keys[match[2]] = match[1], match[3]
        elif match := re.match(r"(\S+) job (\S+) (succeeded|failed) ", line):
            ended[match[2]] = match[1]
    return {keys[job]: (started[job], ended[job]) for job in keys if job in ended}


def silver_rows(lake: Lake) -> dict:
    from spark_jobs.lake import read_columns

    columns = read_columns(lake.silver("customers"))
    assert columns is not None
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    return {(r["custkey"],): {c: v for c, v in r.items() if not c.startswith("_")} for r in rows}
