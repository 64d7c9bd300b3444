"""CDC medallion pipeline, one DAG per layer, linked by assets (docs/architecture.md):

- `cdc_bronze` (every 15 minutes, at once when CDC_LANDING_QUEUE notifies a landing, or backfilled over a date
  range): one deferrable sensor waits for landing
  files bronze has not taken, of any table, and hands each table's exact list to its bronze task; a branch
  skips the bronze tasks of tables with none, which start no process. A backfill run takes the files whose
  landing time falls in its data interval. Each bronze task updates the asset `cdc.bronze.<table>`.
- `cdc_silver_<table>`: scheduled by `cdc.bronze.<table>`; applies the new bronze rows to silver.
- `cdc_gold_<model>`: scheduled by any of its sources' `cdc.silver.<table>` (and every 15 minutes when its sources
  publish their transactions: it takes the transaction topic's files); refreshes the model.

Every layer job is `python -m spark_jobs run` through spark-submit, gated inside (a failed gate fails the
task with one line naming table, layer and reason). Wiring only: Spark, Great Expectations and deltalake
are imported by the tasks when they run, never here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, AssetAny, AssetOrTimeSchedule, DeltaDataIntervalTimetable, get_parsing_context, task

from cdc_airflow.callbacks import run_deadline
from cdc_airflow.operators import CdcSparkJob
from cdc_airflow.params import window_params
from cdc_airflow.sensors import LandingSensor
from cdc_airflow.wiring import default_args, wiring, writer_pool

W = wiring()
START = datetime(2024, 1, 1, tzinfo=UTC)
EVERY_15_MINUTES = DeltaDataIntervalTimetable(timedelta(minutes=15))  # data intervals: what a backfill run covers
# A task's own process parses this file for its one DAG, which Airflow's parsing context names: only that DAG is
# built, so a task start does not pay for every table's (3 s at 500 tables; far more on a loaded worker, past the
# import timeout). The dag-processor (no DAG named) builds them all.
PARSING = get_parsing_context().dag_id


def wanted(dag_id: str) -> bool:
    return PARSING is None or PARSING == dag_id


if wanted("cdc_bronze"):
    with DAG(
        dag_id="cdc_bronze",
        doc_md=__doc__,
        # notified landings start a run at once; the schedule's runs stay, and catch what a lost notification missed
        schedule=AssetOrTimeSchedule(timetable=EVERY_15_MINUTES, assets=W.landing_notified()) if W.landing_queue
        else EVERY_15_MINUTES,
        start_date=START,
        catchup=False,
        # one scheduled, manual or notified run at a time: a run's sensor starting while an earlier run's bronze tasks
        # still wait for their turn found the same untaken files again (241 bronze starts for 100 tables at 500,
        # tests/benchmarks/RESULTS.md, DA). A backfill has its own max_active_runs, apart from this one
        max_active_runs=1,
        params=window_params("taken by a manual run (a backfill run takes its data interval)"),
        tags=["cdc", "bronze", "landing"],
        deadline=run_deadline(),
        default_args=default_args(),
    ):
        sense = LandingSensor(
            task_id="landing_sense", tables={t.name: t.topic for t in W.registry.tables.values()}, landing=W.landing,
            lake=W.lake, timeout=W.sensor_timeout_s, poke_interval=W.sensor_poke_s, retries=1,
            doc_md="Waits (deferred, on the triggerer) for landing files bronze has not taken, of any table; returns "
                   "each such table's paths. A backfill run takes its data interval's files without waiting. Skips "
                   "the run when nothing arrives.")

        @task.branch(task_id="changed_tables", retries=0,
                     doc_md="Picks the bronze tasks of the tables the sensor found files for; the others are skipped "
                            "without starting.")
        def changed_tables(found: dict[str, list[str]]) -> list[str]:
            return [f"bronze_ingest_{table}" for table in sorted(found)]

        changed = changed_tables(sense.output)  # type: ignore[arg-type]  # the sensor's XCom, resolved at run time
        for table in W.registry.tables.values():
            changed >> CdcSparkJob(
                task_id=f"bronze_ingest_{table.name}", landing=W.landing, files_from=(sense.task_id, table.name),
                cli_args=W.cli_args("--layers", "bronze", "--tables", table.name),
                inlets=W.reads("bronze", table.name), outlets=[W.asset("bronze", table.name)],
                pool=writer_pool(table.name),  # one writer per table: others wait queued (cdc_airflow.wiring)
                doc_md="Ingests exactly the sensor's files of its table: bad lines to quarantine with a reason, the "
                       "rest appended to bronze when the bronze gate passes.")

for table in W.registry.tables.values():
    if not wanted(f"cdc_silver_{table.name}"):
        continue
    with DAG(
        dag_id=f"cdc_silver_{table.name}",
        doc_md=f"Silver `{table.name}`: current state per key `{', '.join(table.keys)}` from the new bronze rows "
               "(order by log position, duplicates and stale events dropped, deletes applied), gated. Runs when "
               f"`cdc.bronze.{table.name}` is updated; trigger it by hand to apply what bronze holds.",
        schedule=[W.asset("bronze", table.name)],
        start_date=START,
        catchup=False,
        max_active_runs=1,  # one writer per Delta table
        tags=["cdc", "silver", f"source:{table.topic.split('.')[0]}"],
        deadline=run_deadline(),
        default_args=default_args(),
    ):
        CdcSparkJob(task_id=f"silver_merge_{table.name}", landing=W.landing, pool=writer_pool(table.name),
                    cli_args=W.cli_args("--layers", "silver", "--tables", table.name),
                    inlets=W.reads("silver", table.name), outlets=[W.asset("silver", table.name)],
                    doc_md="Applies the bronze rows silver has not seen; the gate's report is in Browse > CDC data quality.")

for model in W.registry.gold.values():
    if not wanted(f"cdc_gold_{model.name}"):
        continue
    sources_changed = AssetAny(*[W.asset("silver", source) for source in model.sources])
    with DAG(
        dag_id=f"cdc_gold_{model.name}",
        doc_md=f"Gold `{model.name}` (`include/gold/{model.name}.sql`) over silver {', '.join(model.sources)}: "
               "recomputed and gated when any source changes.",
        # a model read at a transaction watermark also runs on the clock: a transaction's END event may land after
        # every event it counts, and no silver run follows it (the refresh is skipped when nothing new landed)
        schedule=AssetOrTimeSchedule(timetable=EVERY_15_MINUTES, assets=sources_changed) if model.transactions
        else sources_changed,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["cdc", "gold", *[f"source:{W.registry.tables[s].topic.split('.')[0]}" for s in model.sources]],
        deadline=run_deadline(),
        default_args=default_args(),
    ):
        CdcSparkJob(task_id=f"gold_refresh_{model.name}", landing=W.landing, pool=writer_pool(model.name, gold=True),
                    cli_args=W.cli_args("--layers", "gold", "--models", model.name),
                    inlets=W.reads("gold", model.name), outlets=[W.asset("gold", model.name)],
                    doc_md="Runs the model's SQL over silver; publishes it when the gold gate passes.")
