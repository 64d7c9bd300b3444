"""Airflow for real: the api-server, scheduler, dag-processor and triggerer with the LocalExecutor on a PostgreSQL
metadata database (Debian's `postgresql`, started here), no `dags test`, one stack for the module. Its healthchecks as
compose runs them, a backfill created through the REST API; files landing on a local S3 server to gold through the
deferred sensor and the assets, and replays through the REST API waiting on a table's writer lock."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from spark_jobs.delta.reads import row_count
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.registry import load_registry
from spark_jobs.report import load_run
from tests.support import (
    COMPOSE_AIRFLOW,
    ROOT,
    AirflowStack,
    airflow_env,
    compose_file,
    customers_project,
    pipeline_service,
    s3_environment,
    s3_server,
    smtp_connection,
    smtp_sink,
    subprocess_env,
    upload_landing,
)

pytest.importorskip("airflow")


@dataclass(frozen=True)
class Deployment:
    """The module's Airflow, its pipeline service's deployment (customers and customers_by_state, the landing on a local
    S3 server), the generated files it lands and the mails its alerts send."""

    airflow: AirflowStack
    s3_endpoint: str
    root: Path
    landing: str
    lake: Path
    generated: object
    mails: list


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, postgres_server):
    """One stack for the module's tests (their start is not what they test): PostgreSQL's database copied from one
    migrated once per worker, the service without its warm-up (test_service.py has one), Airflow's four components."""
    root = tmp_path_factory.mktemp("scheduler")
    config = customers_project(root)
    landing, lake = "s3://landing/cdc", root / "lake"
    # one file: the sensor hands over the files it lists when it wakes, and a second one uploaded an instant later
    # would go to the next run, which the tests' counts of one run's work do not wait for
    (generated,) = generate(load_registry(str(config)).select(None), root / "sink",
                            Options(rows=40, changes=40, partitions=1))
    # the tasks submit their jobs to the pipeline service, the default way to run (docs/operations.md); they wait deferred
    deployment = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": landing, "CDC_LAKE_URI": str(lake)}
    with ExitStack() as stack:
        endpoint = stack.enter_context(s3_server(root / "moto.log"))
        service = stack.enter_context(pipeline_service(subprocess_env(
            **deployment, **s3_environment(endpoint), CDC_SERVICE_WARM_UP="false"), root / "service.log"))
        smtp, mails = stack.enter_context(smtp_sink())
        home = root / "airflow"
        env = airflow_env(home, postgres_server.airflow_database("scheduler"), service, endpoint, deployment,
                          AIRFLOW__CORE__DAGS_FOLDER=str(dags_with_a_gold_consumer(root / "dags")),
                          # the first scheduled run's sensor outwaits the module's tests before the landing: one that
                          # timed out skipped its run, and the files went to the next interval's run, which the
                          # test does not follow (CI, 2026-12-07: the landing came seconds before a 240 s timeout)
                          CDC_SENSOR_TIMEOUT="1800", CDC_SENSOR_POKE_INTERVAL="2",
                          # a job held back by a table's writer lock outlasts its task's wait on the worker: it defers
                          CDC_TASK_WAIT="2",
                          # a sensor whose trigger fires within seconds of its deferral is failed by Airflow's scheduler
                          # (a stale executor event: apache/airflow#72716) and retried: without the 30 s wait
                          CDC_RETRY_DELAY="2",
                          # alerts through the SMTP provider's notifier; a deadline the waiting bronze run is sure to pass
                          AIRFLOW_CONN_SMTP_ALERTS=smtp_connection(smtp), CDC_ALERT_SMTP_CONN_ID="smtp_alerts",
                          CDC_ALERT_TO="ops@example.com", CDC_RUN_DEADLINE="10")
        airflow = AirflowStack(env, home)
        stack.enter_context(airflow.running())
        yield Deployment(airflow, endpoint, root, landing, lake, generated, mails)


GOLD_CONSUMER = "reads_customers_by_state"


def dags_with_a_gold_consumer(folder: Path) -> Path:
    """The project's DAG files beside a user's DAG scheduled on the gold model's asset, as a team adds its own."""
    folder.mkdir()
    for dag in (ROOT / "dags").glob("*.py"):
        (folder / dag.name).symlink_to(dag)
    (folder / f"{GOLD_CONSUMER}.py").write_text(f"""from airflow.sdk import DAG, Asset, task

with DAG("{GOLD_CONSUMER}", schedule=[Asset.ref(name="cdc.gold.customers_by_state")]):
    @task
    def read_the_model() -> None:
        pass

    read_the_model()
""")
    return folder


def test_compose_healthchecks_and_the_service_connection_form_on_the_running_stack(deployment):
    airflow = deployment.airflow
    compose_healthchecks_pass(airflow)
    # the Connections UI's form for the service's own connection type (the distribution's provider entry point)
    forms = {m["connection_type"]: m for m in airflow.api("GET", "/connections/hook_meta", prefix="/ui")}
    service_form = forms["cdc_pipeline_service"]
    assert (service_form["hook_name"], service_form["standard_fields"]["password"]["title"],
            service_form["standard_fields"]["login"]["hidden"]) == ("CDC pipeline service", "Secret", True)
    assert service_form["extra_fields"]["verify"]["schema"]["title"] == "CA file"


def test_a_backfill_created_through_the_api_runs_each_interval_and_skips_where_nothing_landed(deployment):
    airflow = deployment.airflow
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


def test_landed_files_reach_gold_through_the_sensor_and_the_assets_then_replays_wait_on_the_writer_lock(deployment):
    """Files land on the S3 server while the scheduled run's sensor waits deferred in the triggerer; bronze's asset
    event schedules silver, silver's schedules gold. Then a replay through the REST API beside a manual silver run,
    while a writer outside Airflow holds the table: both wait on its writer lock, deferred, holding no worker slot."""
    airflow, tmp_path, landing, lake = deployment.airflow, deployment.root, deployment.landing, deployment.lake
    s3_endpoint, generated, mails = deployment.s3_endpoint, deployment.generated, deployment.mails
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
    # the model published: the DAG scheduled on its asset runs once. A manual refresh finds its sources unchanged
    # and publishes nothing: no gold event, nothing queued for that DAG, no second run
    consumed = airflow.wait("the gold consumer's run", lambda: airflow.runs(GOLD_CONSUMER) or None)
    assert [r["run_type"] for r in consumed] == ["asset_triggered"]
    noop = airflow.api("POST", "/dags/cdc_gold_customers_by_state/dagRuns", {"logical_date": None})["dag_run_id"]
    airflow.finished("cdc_gold_customers_by_state", noop)
    assert airflow.api("GET", "/assets/events?source_dag_id=cdc_gold_customers_by_state"
                              f"&source_run_id={quote(noop, safe='')}")["asset_events"] == []
    assert airflow.api("GET", f"/dags/{GOLD_CONSUMER}/assets/queuedEvents")["queued_events"] == []
    assert len(airflow.runs(GOLD_CONSUMER)) == 1
    tables = Lake(str(lake))
    assert row_count(tables.bronze("customers")) == generated.events
    assert silver_rows(tables) == generated.final_rows
    assert row_count(tables.gold("customers_by_state")) == len({r["state"] for r in generated.final_rows.values()})

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


def work_done_is_not_lost_to_the_scheduler(airflow: AirflowStack, s3_endpoint: str, tmp_path: Path, landing: str,
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


def compose_healthchecks_pass(airflow: AirflowStack) -> None:
    """docker-compose.yaml's healthchecks of its four Airflow services, run against this stack as Docker runs them in
    each container: a service is healthy at its check's first success, and unhealthy after `retries` failures in a
    row, `interval` apart (the file had none: `docker compose ps` could not show them healthy)."""
    services = compose_file()["services"]
    with ThreadPoolExecutor(len(COMPOSE_AIRFLOW) - 1) as pool:  # at once: each is a process start of its own
        verdicts = list(pool.map(lambda name: (name, _healthy(airflow, services[name]["healthcheck"])),
                                 COMPOSE_AIRFLOW[1:]))
    for name, (healthy, out) in verdicts:
        assert healthy, (name, out[-2000:])


def _healthy(airflow: AirflowStack, check: dict) -> tuple[bool, str]:
    """Whether `check` passes within its retries, and the output of its last try."""
    assert check["test"][0] == "CMD", check
    command = [sys.executable if part == "python" else part.replace("http://localhost:8080", airflow.base)
               for part in check["test"][1:]]
    for attempt in range(check.get("retries", 3)):  # Docker's default
        if attempt:
            time.sleep(int(check.get("interval", "30s").removesuffix("s")))
        done = subprocess.run(command, env=airflow.env, capture_output=True, text=True, timeout=300)
        if done.returncode == 0:
            return True, done.stdout
    return False, done.stdout + done.stderr


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
    from spark_jobs.delta.reads import read_columns

    columns = read_columns(lake.silver("customers"))
    assert columns is not None
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    return {(r["custkey"],): {c: v for c, v in r.items() if not c.startswith("_")} for r in rows}
