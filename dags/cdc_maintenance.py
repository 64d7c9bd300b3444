"""Table maintenance, daily (`python -m spark_jobs maintain`; docs/operations.md, "Operating for months"): per source table
and per gold model, Delta's OPTIMIZE once small files have piled up (silver and gold Z-ordered by key), a
checkpoint, and VACUUM keeping every version of the time-travel window readable; then run reports, GX
validation results and their Data Docs pages past their retention go. Settings: tables.yaml `maintenance:`.

One task for every table and model, a pass like the layers' (a task per table cost a task process per table, daily):
each table's upkeep holds that table's writer lock, so it never compacts under a run, and a table that fails does
not stop the others; the task then fails naming it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from cdc_airflow.callbacks import run_deadline
from cdc_airflow.operators import CdcSparkJob
from cdc_airflow.wiring import default_args, wiring

W = wiring()

with DAG(
    dag_id="cdc_maintenance",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["cdc", "maintenance"],
    deadline=run_deadline(),
    default_args=default_args(),
):
    CdcSparkJob(task_id="maintain", command="maintain", landing=W.landing, cli_args=W.maintain_args(),
                # every table's upkeep in one job: at a thousand tables, more than the hour other tasks are given
                execution_timeout=timedelta(hours=12),
                doc_md="Compacts, checkpoints and vacuums every table's Delta tables (bronze, silver, its state, "
                       "quarantine) and every gold model's, each under its writer lock; drops GX results and run "
                       "reports past their retention and renders the pages again.")
