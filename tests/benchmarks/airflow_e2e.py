"""W5: a file landing to its rows in gold through Airflow as a deployment runs it, event-driven: the scheduler,
dag-processor, triggerer and API server on PostgreSQL with the LocalExecutor, the tasks on the pipeline service, the
landing in S3 (moto's server) whose object-created notifications go to an SQS queue that the triggerer's watcher
reads (CDC_LANDING_QUEUE). The lake is local: what is timed is the path from a landing to gold, not moto's speed.

The snapshot lands first and goes through to gold, untimed. Then each run lands a batch of change files (t0, when
the last upload returns) and ends when `cdc_gold_<model>`'s refresh task has ended. From Airflow's REST API and the
service's log:

- detection: t0 to the `cdc_bronze` run the notification started (the queue's long poll, the triggerer's event,
  the scheduler's asset-triggered run);
- compute: the three jobs on the service (bronze's pass, silver's pass, the gold model), as the service timed them;
- scheduling: the rest (task starts, deferrals and resumes, the asset events that start silver and gold).
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.equality import check_equal, check_gold_by_last_name
from tests.benchmarks.harness import CONFIG, MODEL, TABLE, Bench, Figure, file_list, floor_load, floor_run, generate

LANDING = "s3://landing/cdc"
DAGS = ("cdc_bronze", "cdc_silver", f"cdc_gold_{MODEL}")
JOB_TASKS = {"cdc_bronze": "bronze_ingest", "cdc_silver": "silver_merge", f"cdc_gold_{MODEL}": f"gold_refresh_{MODEL}"}


def _at(value: str | None) -> float:
    assert value, "a time Airflow has not set"
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def job_seconds(service_log: Path, dag_id: str, run_id: str) -> float:
    """The seconds the service spent on the job of `dag_id`'s run (its log: `job <id> started: <key> ...`, then
    `job <id> succeeded (exit 0) in <s>s`); the key names the DAG, task and run."""
    text = service_log.read_text()
    task = JOB_TASKS[dag_id]
    started = re.findall(rf"job (\S+) started: {re.escape(f'{dag_id}/{task}/{run_id}/')}", text)
    assert started, f"no job of {dag_id} {run_id} in the service's log"
    return sum(float(m) for job in started for m in re.findall(rf"job {re.escape(job)} succeeded \(exit 0\) in ([0-9.]+)s", text))


def upload(endpoint: str, staging: Path, files: list[str]) -> float:
    """The batch's files put in the landing bucket as the S3 sink puts them; when the last put returned."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    bucket, _, prefix = LANDING.removeprefix("s3://").partition("/")
    for f in files:
        client.upload_file(f, bucket, f"{prefix}/{Path(f).relative_to(staging).as_posix()}")
    return time.time()


def to_gold(airflow: Any, since: float) -> dict[str, dict]:
    """Waits for the gold model's run that follows a landing at `since` (each layer's first run started after it) to
    succeed; each DAG's run, as the REST API lists it."""

    def run_of(dag_id: str) -> dict | None:
        runs = [r for r in airflow.runs(dag_id) if r.get("queued_at") and _at(r["queued_at"]) >= since]
        failed = [r["dag_run_id"] for r in runs if r["state"] == "failed"]
        if failed:
            raise AssertionError(f"{dag_id} runs failed: {failed}\n{airflow.logs()}")
        return min(runs, key=lambda r: _at(r["queued_at"]), default=None)

    def done() -> dict[str, dict] | None:
        runs = {dag_id: run_of(dag_id) for dag_id in DAGS}
        gold = runs[DAGS[-1]]
        return runs if gold is not None and gold["state"] == "success" else None  # type: ignore[return-value]

    return airflow.wait(f"{DAGS[-1]} after the landing", done, 600, poll_s=0.5)


def one_landing(airflow: Any, endpoint: str, service_log: Path, staging: Path, files: list[str]) -> dict[str, float]:
    t0 = upload(endpoint, staging, files)
    runs = to_gold(airflow, t0 - 1)
    tasks = {dag_id: airflow.task_instances(dag_id, run["dag_run_id"]) for dag_id, run in runs.items()}
    for dag_id, run in runs.items():  # where the scheduling goes: each task's queue, start and end after t0
        print(f"  {dag_id} run {run['dag_run_id']} queued +{_at(run['queued_at']) - t0:.1f}s, started "
              f"+{_at(run['start_date']) - t0:.1f}s: " + ", ".join(
            f"{task} +{_at(ti['queued_when']) - t0:.1f}/+{_at(ti['start_date']) - t0:.1f}/+{_at(ti['end_date']) - t0:.1f}s"
            for task, ti in sorted(tasks[dag_id].items(), key=lambda kv: kv[1].get("start_date") or "")
            if ti.get("start_date") and ti.get("end_date") and ti.get("queued_when")), flush=True)
    gold = tasks[DAGS[-1]][JOB_TASKS[DAGS[-1]]]
    total = _at(gold["end_date"]) - t0
    detection = max(0.0, _at(runs["cdc_bronze"]["queued_at"]) - t0)
    compute = sum(job_seconds(service_log, dag_id, run["dag_run_id"]) for dag_id, run in runs.items())
    scheduling = total - detection - compute
    return {"total": total, "detection": detection, "compute": compute, "scheduling": scheduling,
            "orchestration": detection + scheduling}


def w5(bench: Bench) -> None:
    from tests.support import (
        AirflowStack,
        airflow_env,
        landing_notifications,
        pipeline_service,
        postgres,
        s3_environment,
        s3_server,
        subprocess_env,
    )

    work = bench.workdir / "w5"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    staging, lake = work / "staging", work / "lake"
    generated = generate(staging, rows=10_000, changes=1_000 * bench.runs, batches=bench.runs)
    deployment = {"CDC_CONFIG": str(CONFIG), "CDC_LANDING_URI": LANDING, "CDC_LAKE_URI": str(lake),
                  "CDC_DELTA_ENGINE": bench.engine}
    results: list[dict[str, float]] = []
    with s3_server(work / "moto.log") as endpoint:
        queue = landing_notifications(endpoint)
        service_log = work / "service.log"
        with postgres() as server, \
                pipeline_service(subprocess_env(**deployment, **s3_environment(endpoint)), service_log) as service:
            env = airflow_env(work / "airflow", server.airflow_database("airflow"), service, endpoint, deployment,
                              CDC_LANDING_QUEUE=queue, AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="True")
            airflow = AirflowStack(env, work / "airflow")
            with airflow.running():
                for dag_id in DAGS:
                    airflow.unpause(dag_id, 1)
                # the run the schedule starts on unpausing finds nothing (with a landing queue its sensor lists
                # once): then only the queue's watcher starts runs
                airflow.wait("the scheduled run to end", lambda: [r for r in airflow.runs("cdc_bronze")
                                                                  if r["state"] in ("success", "failed")], 300)
                snapshot = upload(endpoint, staging, generated.batches[0])
                to_gold(airflow, snapshot - 1)  # the tables made: not timed
                for batch in generated.batches[1:]:
                    results.append(one_landing(airflow, endpoint, service_log, staging, batch))
                    print("W5 run: " + " ".join(f"{k}={v:.1f}s" for k, v in results[-1].items()), flush=True)
    median: dict[str, Any] = {k: statistics.median(r[k] for r in results) for k in results[0]}
    how = "event-driven (S3 notifications, SQS), Airflow on PostgreSQL, on the warm pipeline service"
    bench.add(Figure("W5", f"landing to gold, p50 (1,000 events into 10,000 rows), {how}", median["total"],
                     target="p50 <= 15 s", met=median["total"] <= 15))
    bench.add(Figure("W5", "  orchestration (detection + scheduling), p50", median["orchestration"], target="<= 3 s",
                     met=median["orchestration"] <= 3))
    for part in ("detection", "scheduling", "compute"):
        bench.add(Figure("W5", f"  {part}", median[part]))
    check_landed(bench, generated, staging, lake)


def check_landed(bench: Bench, generated: Any, staging: Path, lake: Path) -> None:
    """W5's equality check: the floor loads the same snapshot and merges the same batches; silver equals
    its silver and the source's final state, gold the model over it."""
    floor_silver = bench.workdir / "floor-w5"
    shutil.rmtree(floor_silver, ignore_errors=True)
    for n, files in enumerate(generated.batches):
        listed = file_list(bench.workdir / f"w5-{n}.json", staging, files)
        if n == 0:
            floor_load(staging, floor_silver, listed, lake / "silver" / TABLE)
        else:
            floor_run(staging, floor_silver, listed)
    check_equal(lake / "silver" / TABLE, floor_silver, generated)
    check_gold_by_last_name(lake / "gold" / MODEL, floor_silver)
