"""DAG integrity in a fresh AIRFLOW_HOME: no import errors, the expected tasks and edges, and nothing
heavy (Spark, GX, deltalake) imported while parsing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, subprocess_env

PARSE = """
import json, os, sys, warnings
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.definitions.param import process_params

# the project's DAGs and plugins use no deprecated API: a deprecation met while parsing them is an import error (Airflow
# warns of its moved imports with a FutureWarning; DagBag names a DAG file's module after the file)
for category in (DeprecationWarning, FutureWarning):
    warnings.filterwarnings("error", category=category, module=r".*cdc_")

def names(condition):  # an asset's name, or those of every asset under an AssetAll / AssetAny
    if hasattr(condition, "objects"):
        return [n for c in condition.objects for n in names(c)]
    return [condition.name] if hasattr(condition, "name") else []  # a non-asset schedule has a null condition

def every(timetable):  # Airflow 3.3 parses into the task SDK's timetables, which carry no summary; the scheduler's do
    delta = getattr(timetable, "delta", None)
    return getattr(timetable, "summary", None) or getattr(timetable, "expression", None) or (delta and str(delta))

def schedule(dag):
    condition = getattr(dag.timetable, "asset_condition", None)
    assets = sorted(names(condition)) if condition is not None else []
    time = getattr(dag.timetable, "timetable", None)  # assets or a time (AssetOrTimeSchedule): both
    return [*assets, every(time)] if assets and time else assets or every(dag.timetable) or str(dag.schedule)

def parsed(bag):
  return {
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": {dag_id: {
        "schedule": schedule(dag), "tags": sorted(dag.tags), "max_active_runs": dag.max_active_runs, "doc": bool(dag.doc_md),
        "deadlines": [str(d.interval) for d in dag.deadline or []],
        "tasks": {t.task_id: {"down": sorted(t.downstream_task_ids), "outlets": [o.name for o in t.outlets],
                              "inlets": [i.name for i in t.inlets],
                              "doc": bool(t.doc_md), "retries": t.retries, "timeout": str(t.execution_timeout),
                              "on_failure": bool(t.on_failure_callback), "type": type(t).__name__, "pool": t.pool,
                              # the params its templates read at run time (the DAG's, merged with the task's own)
                              "params": sorted(process_params(dag, t, None, suppress_exception=True))}
                  for t in dag.tasks}} for dag_id, dag in bag.dags.items()}}

results = []
for variables in json.loads(sys.argv[2]):  # each parse with its own variables, as a process of its own would have them
    os.environ.update(variables)
    results.append(parsed(DagBag(dag_folder=sys.argv[1])))  # examples: AIRFLOW__CORE__LOAD_EXAMPLES=False
    for name in variables:
        del os.environ[name]
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"pyspark", "great_expectations", "deltalake"})
# a task's process parses its DAG file at every start: the Spark provider's operator module alone costs it 0.3 s
# (OpenLineage's listener, Airflow's ORM), on the path from a landing to gold
heavy += sorted({m for m in sys.modules} & {"airflow.providers.apache.spark.operators.spark_submit"})
print(json.dumps([{**r, "heavy": heavy} for r in results]))
"""


def parse_dags(tmp_path: Path, **env: str) -> dict:
    return parse_each(tmp_path, env)[0]


def parse_each(tmp_path: Path, *variants: dict[str, str]) -> list[dict]:
    """The DAG folder parsed once per variant (the CDC_* and Airflow variables it sets), in one fresh process and
    AIRFLOW_HOME; `heavy` is what all of them imported."""
    done = subprocess.run([sys.executable, "-c", PARSE, str(ROOT / "dags"), json.dumps(variants)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env=subprocess_env(AIRFLOW_HOME=str(tmp_path / "airflow_home"), AIRFLOW__CORE__LOAD_EXAMPLES="False"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_dag_folder_parses_in_a_fresh_home_without_errors_or_heavy_imports(tmp_path):
    task_dags = ("cdc_silver", "cdc_bronze", "cdc_gold_customers_by_state")
    parsed, notified, *own_dags = parse_each(
        tmp_path, {}, {"CDC_LANDING_QUEUE": "https://sqs.us-east-1.amazonaws.com/1/landing", "CDC_LANDING_URI": "s3://landing/cdc"},
        *({"_AIRFLOW_PARSING_CONTEXT_DAG_ID": dag_id} for dag_id in task_dags))
    assert (parsed["errors"], parsed["heavy"]) == ({}, [])
    dags = parsed["dags"]
    tables = ["actor", "customers", "film", "film_actor", "inventory_customers", "products"]
    models = ["customer_email_domains", "customers_by_state", "films_per_actor", "products_by_weight"]
    # a DAG per layer pass (bronze, silver), whatever the number of tables; gold's per model
    assert sorted(dags) == sorted(["cdc_bronze", "cdc_silver", "cdc_replay", "cdc_maintenance",
                                   *[f"cdc_gold_{m}" for m in models]])
    assert {dag_id: d["deadlines"] for dag_id, d in dags.items()} == {dag_id: ["2:00:00"] for dag_id in dags}  # CDC_RUN_DEADLINE

    bronze = dags["cdc_bronze"]
    assert bronze["schedule"] == "0:15:00" and bronze["tags"] == ["bronze", "cdc", "landing"]
    # a run's sensor never starts while an earlier run's bronze tasks wait: it would hand them the same files
    assert bronze["max_active_runs"] == 1
    # one sensor for every table, one bronze task for every table it found files for (a pass), whatever their number:
    # its outlet is an alias, resolved to the tables it advanced; then the verdicts of those it could not
    assert bronze["tasks"]["landing_sense"] == {
        "down": ["bronze_ingest"], "outlets": [], "doc": True, "retries": 1, "timeout": "1:00:00",
        "on_failure": True, "type": "LandingSensor", "pool": "default_pool", "inlets": [],
        "params": ["since", "until"]}
    assert bronze["tasks"]["bronze_ingest"] == {
        "down": ["bronze_verdicts"], "outlets": ["cdc.bronze.advanced"], "doc": True, "retries": 3,
        "timeout": "1:00:00", "on_failure": True, "type": "CdcSparkJob", "pool": "default_pool", "inlets": [],
        "params": ["since", "until"]}
    assert bronze["tasks"]["bronze_verdicts"]["type"] == "TableVerdicts"
    assert (bronze["tasks"]["bronze_verdicts"]["down"], bronze["tasks"]["bronze_verdicts"]["retries"]) == ([], 0)
    assert len(bronze["tasks"]) == 3
    # with the landing bucket's notifications on a queue, a notified landing starts it too; its pass lists the landing
    # itself (in the run's window), no sensor's task start before it
    notified_bronze = notified["dags"]["cdc_bronze"]
    assert notified_bronze["schedule"] == ["cdc.landing.notified", "0:15:00"]
    assert sorted(notified_bronze["tasks"]) == ["bronze_ingest", "bronze_verdicts"]
    assert notified_bronze["tasks"]["bronze_ingest"] == bronze["tasks"]["bronze_ingest"]
    # a task's process parses for its own DAG (Airflow's parsing context): the layers' file builds only that one
    for dag_id, parsed_for_task in zip(task_dags, own_dags, strict=True):
        own = parsed_for_task["dags"]
        assert sorted(own) == sorted([dag_id, "cdc_replay", "cdc_maintenance"]), dag_id
        assert own[dag_id] == dags[dag_id]

    # each layer's DAG is scheduled by the assets it reads, and updates those it writes: silver's pass by any table's
    # bronze, its outlet the alias its run resolves to the silver tables it advanced
    silver = dags["cdc_silver"]
    # no limit of one run (Airflow's cached limit can stall a DAG until its next parse): table locks keep passes apart
    assert (silver["schedule"], silver["max_active_runs"], silver["tags"]) == (
        [f"cdc.bronze.{t}" for t in tables], 16, ["cdc", "silver"])
    assert silver["tasks"]["silver_merge"] == {
        "down": ["silver_verdicts"], "outlets": ["cdc.silver.advanced"], "doc": True, "retries": 3,
        "timeout": "1:00:00", "on_failure": True, "type": "CdcSparkJob", "pool": "default_pool", "inlets": [],
        "params": ["tables"]}
    assert silver["tasks"]["silver_verdicts"]["type"] == "TableVerdicts"
    gold = dags["cdc_gold_films_per_actor"]
    assert gold["schedule"] == ["cdc.silver.actor", "cdc.silver.film", "cdc.silver.film_actor"]
    assert (gold["max_active_runs"], gold["tasks"]["gold_refresh_films_per_actor"]["pool"]) == (16, "cdc_gold_films_per_actor")
    # its asset's event through the alias, only from a refresh that published (test_orchestration.py)
    assert gold["tasks"]["gold_refresh_films_per_actor"]["outlets"] == ["cdc.gold.advanced"]
    assert gold["tasks"]["gold_refresh_films_per_actor"]["inlets"] == ["cdc.silver.actor", "cdc.silver.film_actor",
                                                                       "cdc.silver.film"]

    replay = dags["cdc_replay"]
    assert (replay["schedule"], replay["max_active_runs"]) == ("None", 1)
    # one pass over the param's tables, whatever their number; the plan's branch picks the models to refresh after it
    assert replay["tasks"]["replay_plan"]["down"] == sorted(["replay", *(f"gold_refresh_{m}" for m in models)])
    assert replay["tasks"]["replay"]["down"] == sorted(["replay_verdicts", *(f"gold_refresh_{m}" for m in models)])
    assert replay["tasks"]["replay_verdicts"]["type"] == "TableVerdicts"
    # a replay updates the assets of what it rewrote, as the scheduled DAGs do: its aliases resolve to them
    assert replay["tasks"]["replay"]["outlets"] == ["cdc.bronze.advanced", "cdc.silver.advanced"]
    assert len(replay["tasks"]) == 3 + len(models)
    # set on the DAG after its tasks are made (none of them copies them), its params are still what each task reads
    assert {t["params"] == ["max_quarantined", "mode", "since", "tables", "until"] for t in replay["tasks"].values()} == {True}
    assert all(t["doc"] and t["on_failure"] for d in dags.values() for t in d["tasks"].values())
    assert all(d["doc"] for d in dags.values())

    # every task refreshing a gold model, in any DAG, waits in that model's pool of one slot (tables are written by
    # passes over many: the tables' writer locks keep them apart)
    writers = {(dag_id, task_id): t["pool"] for dag_id, d in dags.items() for task_id, t in d["tasks"].items()
               if t["type"] == "CdcSparkJob" and task_id not in ("maintain", "bronze_ingest", "silver_merge", "replay")}
    for (dag_id, task_id), pool in writers.items():
        assert pool == f"cdc_gold_{task_id.removeprefix('gold_refresh_')}", (dag_id, task_id)
    # gold and replay's gold per model
    assert len(writers) == 2 * len(models)

    # maintenance is one pass over every table and model (each under its writer lock), then the reports' retention
    upkeep = dags["cdc_maintenance"]
    assert (upkeep["schedule"], upkeep["max_active_runs"]) == ("0 0 * * *", 1)
    assert upkeep["tasks"] == {"maintain": {
        "down": [], "outlets": [], "doc": True, "retries": 3, "timeout": "12:00:00", "on_failure": True,
        "type": "CdcSparkJob", "pool": "default_pool", "inlets": [], "params": []}}


def test_dags_follow_the_cdc_config_environment(tmp_path):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders:\n    topic: shop.public.orders\n    keys: [id]\n    freshness: 2h\n")
    parsed = parse_dags(tmp_path, CDC_CONFIG=str(config))
    assert parsed["errors"] == {}
    # a table with `freshness` is watched: cdc_freshness appears (the demo's tables have none: no such DAG)
    assert sorted(parsed["dags"]) == ["cdc_bronze", "cdc_freshness", "cdc_maintenance", "cdc_replay", "cdc_silver"]
    assert parsed["dags"]["cdc_freshness"]["tasks"]["fresh_silver_orders"]["type"] == "FreshnessCheck"
    assert sorted(parsed["dags"]["cdc_bronze"]["tasks"]) == ["bronze_ingest", "bronze_verdicts", "landing_sense"]


def test_a_gold_model_read_at_a_transaction_watermark_also_runs_on_the_clock(tmp_path):
    """Its transaction topic's END events may land after every event they count: no silver run follows them."""
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders: {topic: shop.public.orders, keys: [id], transactions: shop.transaction}\n"
                      "  lines: {topic: shop.public.lines, keys: [id], transactions: shop.transaction}\n")
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "totals.sql").write_text("-- keys: id\n-- sources: orders, lines\nSELECT 1 AS id\n")
    dags = parse_dags(tmp_path, CDC_CONFIG=str(config))["dags"]
    assert dags["cdc_gold_totals"]["schedule"] == ["cdc.silver.lines", "cdc.silver.orders", "0:15:00"]


def test_a_broken_registry_is_an_import_error_naming_the_field(tmp_path):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders:\n    topic: t\n    keys: [id]\n    colour: red\n")
    parsed = parse_dags(tmp_path, CDC_CONFIG=str(config))
    assert list(parsed["errors"].values())[0].strip().endswith("ConfigError: table 'orders': unknown field(s) colour")
