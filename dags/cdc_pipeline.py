"""CDC medallion pipeline: for each table in the registry, landing files -> bronze -> silver -> gold.

Wiring only (DESIGN 6): reads tables.yaml and builds tasks. Spark, Great Expectations and deltalake are
imported by the tasks when they run, never here.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the project root holds spark_jobs/ and include/
    sys.path.insert(0, str(ROOT))

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator  # noqa: E402
from airflow.sdk import DAG, PokeReturnValue, TriggerRule, task  # noqa: E402

from spark_jobs.config import env_settings, load_registry, resolve, resolve_uri  # noqa: E402

SETTINGS = env_settings()
CONFIG = str(resolve(SETTINGS["config"]))
LANDING = resolve_uri(SETTINGS["landing"])
LAKE = resolve_uri(SETTINGS["lake"])
REGISTRY = load_registry(CONFIG)
ENTRY_POINT = str(ROOT / "spark_jobs" / "__main__.py")


def spark_job(task_id: str, layer: str, *selection: str) -> SparkSubmitOperator:
    """One Spark application per table (or gold model) and layer, with its gate inside it."""
    return SparkSubmitOperator(
        task_id=task_id,
        conn_id="spark_default",
        application=ENTRY_POINT,
        application_args=["run", "--config", CONFIG, "--landing", LANDING, "--lake", LAKE, "--layers", layer,
                          *selection, "--run-id", "{{ run_id }}"],
        name=f"cdc-{task_id}",
        conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
        env_vars={"PYTHONPATH": str(ROOT), "GX_ANALYTICS_ENABLED": "false"},
        execution_timeout=timedelta(hours=1),
        doc_md=f"Runs `python -m spark_jobs run --layers {layer} {' '.join(selection)}`; fails with one line "
               "naming table, layer and reason when its gate fails.",
    )


with DAG(
    dag_id="cdc_pipeline",
    doc_md=__doc__,
    schedule=timedelta(minutes=15),
    catchup=False,
    max_active_runs=1,  # one writer per Delta table: runs never overlap
    tags=["cdc", "bronze", "silver", "gold"],
    default_args={"owner": "data-engineering", "retries": 0},
) as dag:
    silver_tasks = {}
    for table in REGISTRY.tables.values():

        @task.sensor(task_id=f"landing_sense_{table.name}", poke_interval=float(SETTINGS["sensor_poke_interval"]),
                     timeout=float(SETTINGS["sensor_timeout"]), mode="reschedule", soft_fail=True,
                     doc_md=f"Waits for landing files of `{table.topic}` not yet in bronze; skips the table when none arrive.")
        def landing_sense(name: str = table.name, topic: str = table.topic) -> PokeReturnValue:
            from spark_jobs.state import Lake, pending_files

            pending = pending_files(LANDING, Lake(LAKE), name, topic)
            return PokeReturnValue(is_done=bool(pending), xcom_value=len(pending))

        bronze = spark_job(f"bronze_ingest_{table.name}", "bronze", "--tables", table.name)
        silver = spark_job(f"silver_merge_{table.name}", "silver", "--tables", table.name)
        landing_sense() >> bronze >> silver
        silver_tasks[table.name] = silver

    for model in REGISTRY.gold.values():
        gold = spark_job(f"gold_refresh_{model.name}", "gold", "--models", model.name)
        # refresh when any source changed; skipped sources (no new files) do not block it
        gold.trigger_rule = TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS
        [silver_tasks[s] for s in model.sources] >> gold
