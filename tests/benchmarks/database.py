"""D: a whole database captured by one connector, many small tables, on the warm pipeline service.

Every table is pagila's `actor` under a topic of its own (`bench_db.public.t000`, ...): TABLES tables of
ROWS rows, then one change batch of EVENTS events landed for each. One `run` job (bronze and silver, every
table, no file list: the run finds what landed itself) does each of:

- the initial load: every table's snapshot landed at once;
- a change cycle: one batch landed for every table;
- an idle cycle: nothing landed.

Against the floor doing the same per table, warm (its `load` and `apply` called in this process). Every
silver table is checked equal to the floor's and to the generator's state. Then the DAG files parse with
PARSE_TABLES tables registered (Airflow's own DagBag, in a process of its own).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.benchmarks.equality import check_equal
from tests.benchmarks.harness import FLUSH_SIZE, ROOT, Bench, Figure, env, service_job, warm_floor
from tests.support import land_files

TABLES, ROWS, EVENTS, PARSE_TABLES = 100, 200, 50, 1_000


def registry(path: Path, tables: int) -> Path:
    """tables.yaml of a database of `tables` tables shaped like pagila's actor."""
    lines = ["tables:"] + [f"  t{n:03d}:\n    topic: bench_db.public.t{n:03d}\n    keys: [actor_id]" for n in range(tables)]
    path.write_text("\n".join(lines) + "\n")
    return path


def generate(source: Path, tables: int) -> list[tuple[Any, Any]]:
    """(profile, generated table) per table: the snapshot (batch 0) and one shuffled change batch (batch 1)."""
    from spark_jobs.generate import PROFILES, Options, write_table

    shutil.rmtree(source, ignore_errors=True)
    opts = Options(rows=ROWS, changes=EVENTS, batches=1, shuffle=True, records_per_file=FLUSH_SIZE, seed=7)
    out = []
    for n in range(tables):
        profile = dataclasses.replace(PROFILES["pagila.public.actor"], topic=f"bench_db.public.t{n:03d}")
        out.append((profile, write_table(profile, f"t{n:03d}", str(source), opts, n)))
    return out


def cycle(bench: Bench, config: Path, landing: Path, lake: Path) -> tuple[float, int, float]:
    """One `run` of bronze and silver over every table on the warm service: (seconds, Spark jobs, seconds in Great
    Expectations)."""
    assert bench.services is not None
    seconds, status = service_job(bench.services(landing, lake, config),
                                  ["run", "--config", str(config), "--landing", str(landing), "--lake", str(lake),
                                   "--layers", "bronze,silver"], bench.engine)
    return seconds, status.spark_jobs or 0, status.gx_seconds or 0.0


def floor_seconds(bench: Bench, step: str, source: Path, floor_lake: Path, tables: list[tuple[Any, Any]],
                  batch: int, lake: Path) -> float:
    """The warm floor's step over every table's files of `batch` (read where they were generated), one table
    after another."""
    total = 0.0
    for _, generated in tables:
        files = [str(Path(f).relative_to(source)) for f in generated.batches[batch]]
        listed = bench.workdir / f"d-{generated.table}-{batch}.json"
        listed.write_text(json.dumps(files))
        silver = floor_lake / generated.table
        schema_of = lake / "silver" / generated.table if step == "load" else None
        total += warm_floor(step, source, silver, f"@{listed}", schema_of)
    return total


def check_all(lake: Path, floor_lake: Path, tables: list[tuple[Any, Any]], snapshot: bool) -> None:
    for profile, generated in tables:
        check_equal(lake / "silver" / generated.table, floor_lake / generated.table, generated, snapshot, profile)


def dag_parse_seconds(config: Path, landing: Path, lake: Path) -> float:
    """Seconds Airflow's DagBag takes to parse the DAG files with `config` registered, in a fresh process (its
    imports before the clock starts), failing on any import error."""
    code = ("import time, json\nfrom airflow.dag_processing.dagbag import DagBag\nt = time.perf_counter()\n"
            "bag = DagBag(dag_folder='dags')\n"
            "print(json.dumps({'s': time.perf_counter() - t, 'dags': len(bag.dags), 'errors': bag.import_errors}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**env(), "CDC_CONFIG": str(config), "CDC_LANDING_URI": str(landing),
                              "CDC_LAKE_URI": str(lake), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                              "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
                              "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
                              "AIRFLOW_HOME": str(config.parent / "airflow-home")})
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    if parsed["errors"]:
        raise RuntimeError(f"DAG import errors: {parsed['errors']}")
    return float(parsed["s"])


def database(bench: Bench) -> None:
    work = bench.workdir
    source, landing, lake, floor_lake = (work / n for n in ("landing-d-source", "landing-d", "lake-d", "floor-d"))
    for path in (landing, lake, floor_lake):
        shutil.rmtree(path, ignore_errors=True)
    config = registry(work / "tables-d.yaml", TABLES)
    tables = generate(source, TABLES)
    land_files(source, landing, [f for _, g in tables for f in g.batches[0]])
    load_s, load_jobs, load_gx = cycle(bench, config, landing, lake)
    warm_load = floor_seconds(bench, "load", source, floor_lake, tables, 0, lake)
    check_all(lake, floor_lake, tables, snapshot=True)
    figures = [Figure("D", f"initial load of {TABLES} tables x {ROWS} rows (one run), on the pipeline service",
                      load_s, target="<= 6x warm floor", warm_floor=warm_load)]
    land_files(source, landing, [f for _, g in tables for f in g.batches[1]])
    change_s, change_jobs, change_gx = cycle(bench, config, landing, lake)
    warm_apply = floor_seconds(bench, "apply", source, floor_lake, tables, 1, lake)
    check_all(lake, floor_lake, tables, snapshot=False)
    figures.append(Figure("D", f"cycle with {EVENTS} events landed for each of {TABLES} tables, on the pipeline service",
                          change_s, target="<= 4x warm floor", warm_floor=warm_apply))
    idle_s, idle_jobs, _ = cycle(bench, config, landing, lake)
    check_all(lake, floor_lake, tables, snapshot=False)
    figures.append(Figure("D", f"cycle with nothing landed for {TABLES} tables, on the pipeline service", idle_s,
                          target="<= 3 s"))
    for what, jobs in (("initial load", load_jobs), ("change cycle", change_jobs), ("idle cycle", idle_jobs)):
        figures.append(Figure("D", f"Spark jobs of the {what}, {TABLES} tables", jobs,
                              note="a count of Spark jobs, not seconds (the service reads them while the job runs: "
                                   "Spark's status tracker keeps only its last 1000)"))
    for what, gx, total in (("initial load", load_gx, load_s), ("change cycle", change_gx, change_s)):
        figures.append(Figure("D", f"Great Expectations' share of the {what}, {TABLES} tables", 100 * gx / total,
                              target="<= 10 %", note="a share in percent, not seconds (its validations and Data Docs "
                                                   "builds, as the service times them in the job)"))
    parse = Figure("D", f"DAG files parsed with {PARSE_TABLES} tables registered (Airflow DagBag)",
                   dag_parse_seconds(registry(work / "tables-d-parse.yaml", PARSE_TABLES), landing, lake),
                   target="<= 5 s")
    for figure in [*figures, parse]:
        if figure.target.endswith("x warm floor"):  # issue 56's: a ratio, these machines differing up to 2x in speed
            figure.met = figure.project <= float(figure.target.split()[1].rstrip("x")) * (figure.warm_floor or 0)
        elif figure.target:
            figure.met = figure.project <= float(figure.target.split()[1])
        bench.add(figure)


SCHEDULER_TABLES, SCHEDULER_CHANGED = 500, 100


def database_on_airflow(bench: Bench) -> None:
    """DA: two cycles of the real scheduler (PostgreSQL, LocalExecutor, the tasks on the pipeline service) with
    SCHEDULER_TABLES tables registered, SCHEDULER_CHANGED of them landing: their snapshots, then EVENTS changes to
    each. A cycle runs from the landing to every changed table's silver advanced (bronze's one sensor and one bronze
    pass task, then silver's pass DAG runs, started by bronze's asset events, until each changed table's
    `cdc.silver.<table>` has its event). After each, every changed table's silver is checked equal to the
    generator's state, and no task may have been retried."""
    import datetime as dt
    import time

    from tests.support import AirflowStack, airflow_env, pipeline_service, postgres, subprocess_env

    work = bench.workdir / "da"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source, landing, lake = work / "source", work / "landing", work / "lake"
    config = registry(work / "tables.yaml", SCHEDULER_TABLES)
    tables = generate(source, SCHEDULER_CHANGED)
    changed = {g.table for _, g in tables}
    deployment = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": str(landing), "CDC_LAKE_URI": str(lake),
                  "CDC_DELTA_ENGINE": bench.engine}
    figures = []
    with postgres() as server, pipeline_service(subprocess_env(**deployment), work / "service.log") as service:
        # the layer DAGs only: maintenance's first run (500 tasks) and the freshness checks stay paused
        env = airflow_env(work / "airflow", server.airflow_database("airflow"), service, None, deployment,
                          CDC_SENSOR_TIMEOUT="900", CDC_SENSOR_POKE_INTERVAL="2",
                          AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="True")
        airflow = AirflowStack(env, work / "airflow")
        with airflow.running():
            airflow.unpause("cdc_silver", 1)
            airflow.unpause("cdc_bronze", 1)
            for batch, what, limit_s in ((0, "a snapshot", 180), (1, f"{EVENTS} changes each", 120)):
                if batch:  # the next scheduled run is up to 15 minutes away: a manual run's sensor waits the same way
                    airflow.api("POST", "/dags/cdc_bronze/dagRuns", {"logical_date": None})
                airflow.wait("a cdc_bronze run's sensor to defer", airflow.deferred_sensor, 600)
                since = dt.datetime.now(dt.UTC)
                started = time.monotonic()
                land_files(source, landing, [f for _, g in tables for f in g.batches[batch]])

                def silver_done(since: dt.datetime = since) -> bool:
                    failed = [r["dag_run_id"] for r in airflow.runs("cdc_silver") if r["state"] == "failed"]
                    if failed:
                        raise AssertionError(f"silver runs failed: {failed}")
                    return airflow.advanced("cdc_silver", since) >= changed

                airflow.wait(f"silver of the {len(changed)} changed tables", silver_done, 7200)
                seconds = time.monotonic() - started
                for profile, generated in tables:
                    check_equal(lake / "silver" / generated.table, None, generated, snapshot=not batch, profile=profile)
                figures.append(Figure(
                    "DA", f"real-scheduler cycle (Airflow on PostgreSQL, LocalExecutor, tasks on the pipeline service), "
                          f"{SCHEDULER_TABLES} tables registered, {SCHEDULER_CHANGED} landing {what}: landing to every "
                          "changed table's silver", seconds, target=f"<= {limit_s} s", met=seconds <= limit_s))
            retried = sorted(f"{dag_id}.{task}" for dag_id in ("cdc_bronze", "cdc_silver") for run in airflow.runs(dag_id)
                             for task, ti in airflow.task_instances(dag_id, run["dag_run_id"]).items()
                             if ti.get("try_number", 1) > 1)
    if retried:
        raise AssertionError(f"tasks retried: {retried}")
    for figure in figures:
        bench.add(figure)
