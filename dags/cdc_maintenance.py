"""Table maintenance, daily (`python -m spark_jobs maintain`; docs/operations.md, "Operating for months"): per source table
and per gold model, Delta's OPTIMIZE once small files have piled up (silver and gold Z-ordered by key), a
checkpoint, and VACUUM keeping every version of the time-travel window readable; then run reports, GX
validation results and their Data Docs pages past their retention go. Settings: tables.yaml `maintenance:`.

Each task waits in its table's pool like every other writer of that table, so it never compacts under a run.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG

from cdc_airflow.callbacks import run_deadline
from cdc_airflow.operators import CdcSparkJob
from cdc_airflow.wiring import default_args, wiring, writer_pool

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
    upkeep = [
        *(CdcSparkJob(task_id=f"maintain_{t}", command="maintain", landing=W.landing, pool=writer_pool(t),
                      cli_args=W.maintain_args("--tables", t),
                      doc_md=f"Compacts, checkpoints and vacuums the Delta tables of `{t}` (bronze, silver, its state, "
                             "quarantine); drops its GX results past their retention.")
          for t in W.registry.tables),
        *(CdcSparkJob(task_id=f"maintain_gold_{m}", command="maintain", landing=W.landing,
                      pool=writer_pool(m, gold=True), cli_args=W.maintain_args("--models", m),
                      doc_md=f"Compacts, checkpoints and vacuums gold `{m}`.")
          for m in W.registry.gold),
    ]
    upkeep >> CdcSparkJob(task_id="expire_reports", command="maintain", landing=W.landing,
                          cli_args=W.maintain_args("--reports"),
                          doc_md="Removes run reports past the report retention and renders the pages again.")
