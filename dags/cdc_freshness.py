"""Freshness watchdog, every 15 minutes: per table with `freshness:` in tables.yaml (and per gold model
with one), the age of the newest source change its layer holds, as of its last successful run. A
connector that stopped sending, or a table whose runs keep failing, fails its check even though nothing
ran; the failure notifiers (cdc_airflow.callbacks) alert. Reads the lake's small status files only.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from cdc_airflow.callbacks import run_deadline
from cdc_airflow.checks import FreshnessCheck
from cdc_airflow.wiring import default_args, wiring

W = wiring()
WATCHED = [(t.name, "silver", t.freshness_s) for t in W.registry.tables.values() if t.freshness_s] + \
          [(m.name, "gold", m.freshness_s) for m in W.registry.gold.values() if m.freshness_s]

if WATCHED:
    with DAG(
        dag_id="cdc_freshness",
        doc_md=__doc__,
        schedule=timedelta(minutes=15),
        start_date=datetime(2024, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        tags=["cdc", "freshness"],
        deadline=run_deadline(),
        default_args=default_args(retries=0, execution_timeout=timedelta(minutes=5)),
    ):
        for name, layer, freshness_s in WATCHED:
            FreshnessCheck(task_id=f"fresh_{layer}_{name}", name=name, layer=layer, freshness_s=freshness_s,
                           lake=W.lake, doc_md=f"Fails when `{layer}/{name}`'s newest source change is older "
                                               f"than {freshness_s} s.")
