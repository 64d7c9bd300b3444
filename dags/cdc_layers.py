"""CDC medallion pipeline, one DAG per layer, linked by assets (docs/architecture.md):

- `cdc_bronze` (every 15 minutes, at once when CDC_LANDING_QUEUE notifies a landing, or backfilled over a date
  range): one deferrable sensor waits for landing files bronze has not taken, of any table, and hands their exact
  lists to one bronze task, which ingests every such table in one pass on the pipeline service; with notified
  landings there is no sensor, and the bronze task's pass lists the landing itself. A backfill run takes the files
  whose landing time falls in its data interval. The task updates the asset `cdc.bronze.<table>`
  of each table it advanced (through the alias `cdc.bronze.advanced`); `bronze_verdicts` then fails the run if a
  table could not be advanced.
- `cdc_silver`: scheduled by any table's `cdc.bronze.<table>`; applies the new bronze rows of every table the run's
  events name to silver in one pass, updating `cdc.silver.<table>` of each table it advanced.
- `cdc_gold_<model>`: scheduled by any of its sources' `cdc.silver.<table>` (and every 15 minutes when its sources
  publish their transactions: it takes the transaction topic's files); refreshes the model.

Every layer job is `python -m spark_jobs run` on the pipeline service (or through spark-submit), gated inside (a
failed gate fails the task, or for a pass the run's verdicts task, with one line naming table, layer and reason).
Wiring only: Spark, Great Expectations and deltalake
are imported by the tasks when they run, never here.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, AssetAny, AssetOrTimeSchedule, DeltaDataIntervalTimetable, get_parsing_context

from cdc_airflow.callbacks import run_deadline
from cdc_airflow.operators import CdcSparkJob, TableVerdicts
from cdc_airflow.params import pass_params, window_params
from cdc_airflow.sensors import LandingSensor
from cdc_airflow.wiring import default_args, gold_pool, wiring

W = wiring()
START = datetime(2024, 1, 1, tzinfo=UTC)
# data intervals, what a backfill run covers: every 15 minutes unless CDC_BRONZE_INTERVAL_MINUTES says otherwise
BRONZE_INTERVALS = DeltaDataIntervalTimetable(W.bronze_interval)
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
        schedule=AssetOrTimeSchedule(timetable=BRONZE_INTERVALS, assets=W.landing_notified()) if W.landing_queue
        else BRONZE_INTERVALS,
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
        if W.landing_queue:
            # a notified landing starts a run at once: its pass lists the landing itself, on the warm service, where a
            # sensor's task process would add a second or two to every landing (tests/benchmarks/RESULTS.md, W5)
            ingest = CdcSparkJob(
                task_id="bronze_ingest", landing=W.landing,
                topic_tables={t.topic: t.name for t in W.registry.tables.values()},
                cli_args=W.cli_args("--layers", "bronze"),
                announces=[W.pass_outlets("bronze")], outlets=[W.advanced("bronze")],
                doc_md="Ingests the landing files bronze has not taken (a backfill run: those of its data interval), "
                       "every table's in one pass: bad lines to quarantine with a reason, the rest appended to each "
                       "table's bronze when its gate passes. Emits `cdc.bronze.<table>` for each table it advanced, "
                       "even when another table failed.")
        else:
            sense = LandingSensor(
                task_id="landing_sense", tables={t.name: t.topic for t in W.registry.tables.values()},
                landing=W.landing, lake=W.lake, timeout=W.sensor_timeout_s, poke_interval=W.sensor_poke_s, retries=1,
                doc_md="Waits (deferred, on the triggerer) for landing files bronze has not taken, of any table; "
                       "returns each such table's paths. A backfill run takes its data interval's files without "
                       "waiting. Skips the run when nothing arrives.")
            # one pass for every table with files: a task per table cost a task process per table (Airflow at 500
            # tables never finished a cycle: tests/benchmarks/RESULTS.md, DA). Another writer of a table (a replay,
            # maintenance) is kept apart by the table's writer lock in the lake, which the job waits for
            ingest = CdcSparkJob(
                task_id="bronze_ingest", landing=W.landing, files_from=sense.task_id,
                cli_args=W.cli_args("--layers", "bronze"),
                announces=[W.pass_outlets("bronze")], outlets=[W.advanced("bronze")],
                doc_md="Ingests exactly the sensor's files, every table's in one pass: bad lines to quarantine with a "
                       "reason, the rest appended to each table's bronze when its gate passes. Emits "
                       "`cdc.bronze.<table>` for each table it advanced, even when another table failed.")
            sense >> ingest
        ingest >> TableVerdicts(
            task_id="bronze_verdicts", of=ingest.task_id, retries=0,
            doc_md="Fails the run with the failure line of the tables bronze_ingest could not advance (the others' "
                   "assets are updated already).")

if wanted("cdc_silver"):
    bronze_of = {W.asset("bronze", t).name: t for t in W.registry.tables}
    with DAG(
        dag_id="cdc_silver",
        doc_md="Silver: each table's current state per key from its new bronze rows (ordered by log position, "
               "duplicates and stale events dropped, deletes applied), gated, every table whose `cdc.bronze.<table>` "
               "was updated in one pass. Trigger it by hand to apply what bronze holds (param `tables`; none: every "
               "table).",
        schedule=AssetAny(*[W.asset("bronze", t) for t in W.registry.tables]),
        start_date=START,
        catchup=False,
        # no max_active_runs: a pass that bronze's events start while another runs waits for each table's writer lock
        # in the service. A limit would stall silver for up to half a minute now and then: Airflow 3.3 caches "at
        # max_active_runs" on the DAG, and when its dag-processor writes the flag just after a run has ended, it stays
        # set until the next parse (apache/airflow#56050); measured in W5 (tests/benchmarks/RESULTS.md)
        params=pass_params(list(W.registry.tables)),
        tags=["cdc", "silver"],
        deadline=run_deadline(),
        default_args=default_args(),
    ):
        merge = CdcSparkJob(
            task_id="silver_merge", landing=W.landing, tables_from=bronze_of, cli_args=W.cli_args("--layers", "silver"),
            announces=[W.pass_outlets("silver")], outlets=[W.advanced("silver")],
            doc_md="Applies the bronze rows silver has not seen, of every table the run's asset events name, in one "
                   "pass; emits `cdc.silver.<table>` for each table it advanced. The gates' reports are in Browse > "
                   "CDC data quality.")
        merge >> TableVerdicts(
            task_id="silver_verdicts", of=merge.task_id, retries=0,
            doc_md="Fails the run with the failure line of the tables silver_merge could not advance (the others' "
                   "assets are updated already).")

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
        schedule=AssetOrTimeSchedule(timetable=BRONZE_INTERVALS, assets=sources_changed) if model.transactions
        else sources_changed,
        start_date=START,
        catchup=False,
        # runs queue in the model's writer pool, not in max_active_runs (why: cdc_silver's)
        tags=["cdc", "gold", *[f"source:{W.registry.tables[s].topic.split('.')[0]}" for s in model.sources]],
        deadline=run_deadline(),
        default_args=default_args(),
    ):
        # its asset's event comes only from a refresh that published (through the alias: none when nothing was new)
        CdcSparkJob(task_id=f"gold_refresh_{model.name}", landing=W.landing, pool=gold_pool(model.name),
                    cli_args=W.cli_args("--layers", "gold", "--models", model.name),
                    announces=[W.gold_outlets(model.name)], inlets=W.reads("gold", model.name),
                    outlets=[W.advanced("gold")],
                    doc_md="Runs the model's SQL over silver; publishes it when the gold gate passes.")
