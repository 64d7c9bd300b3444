"""DAG integrity in a fresh AIRFLOW_HOME: no import errors, the expected tasks and edges, and nothing
heavy (Spark, GX, deltalake) imported while parsing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent

PARSE = """
import json, sys
from airflow.models.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1], include_examples=False)
dag = bag.dags.get("cdc_pipeline")
print(json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": sorted(bag.dags),
    "edges": sorted([t.task_id, sorted(t.downstream_task_ids)] for t in dag.tasks) if dag else [],
    "heavy": sorted({m.split(".")[0] for m in sys.modules} & {"pyspark", "great_expectations", "deltalake"}),
}))
"""


def parse_dags(tmp_path: Path, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PARSE, str(ROOT / "dags")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=subprocess_env(AIRFLOW_HOME=str(tmp_path / "airflow_home"),
                                                          AIRFLOW__CORE__LOAD_EXAMPLES="False", **env))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_dag_folder_parses_without_errors_or_heavy_imports(tmp_path):
    parsed = parse_dags(tmp_path)
    assert (parsed["errors"], parsed["dags"], parsed["heavy"]) == ({}, ["cdc_pipeline"], [])
    edges = dict((task, set(down)) for task, down in parsed["edges"])
    assert edges["landing_sense_customers"] == {"bronze_ingest_customers"}
    assert edges["bronze_ingest_customers"] == {"silver_merge_customers"}
    assert edges["silver_merge_customers"] == {"gold_refresh_customers_by_state"}
    assert edges["silver_merge_film"] == {"gold_refresh_films_per_actor"}
    assert edges["silver_merge_actor"] == {"gold_refresh_films_per_actor"}
    assert len(edges) == 6 * 3 + 4


def test_dag_follows_the_cdc_config_environment(tmp_path):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders:\n    topic: shop.public.orders\n    keys: [id]\n")
    parsed = parse_dags(tmp_path, CDC_CONFIG=str(config))
    assert parsed["errors"] == {}
    assert sorted(task for task, _ in parsed["edges"]) == [
        "bronze_ingest_orders", "landing_sense_orders", "silver_merge_orders"]


def test_a_broken_registry_is_an_import_error_naming_the_field(tmp_path):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders:\n    topic: t\n    keys: [id]\n    colour: red\n")
    parsed = parse_dags(tmp_path, CDC_CONFIG=str(config))
    assert list(parsed["errors"].values())[0].strip().endswith("ConfigError: table 'orders': unknown field(s) colour")
