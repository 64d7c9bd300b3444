"""The layer DAGs on a live Spark cluster: SparkSubmitOperator in client mode submitting each layer's job to a
standalone master and worker on loopback (tests/cluster/conftest.py), the landing and the lake on a local S3 server.
A module of its own so that the cluster's tests split over the two workers."""

from __future__ import annotations

import json
import shutil
import sys

from spark_jobs.generate import Options, generate
from spark_jobs.registry import load_registry
from tests.support import (
    BIN,
    ROOT,
    AirflowCli,
    airflow_home,
    aws_connection,
    first_run_reaches_gold,
    s3_environment,
    subprocess_env,
    upload_landing,
)

CONFIG = "tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n"


def test_airflow_submits_the_layer_jobs_to_the_cluster(cluster, tmp_path, s3_endpoint, monkeypatch):
    """The layer DAGs with `spark_default` pointing at the standalone master (SparkSubmitOperator in client
    mode, the pinned jars passed by the operator), the landing and the lake on a local S3 server (the
    sensor reads the lake's ingest log there, the plugin the reports): silver equals the source and gold
    passes, as in the embedded demo. The worker holds the pinned jars (CDC_JARS_ON_WORKERS, as in compose): shipping
    them to the executors is tests/cluster/test_cluster.py's. The jobs write with the default engine (delta-rs, from
    the driver): delta-spark on the cluster, its executors writing, is tests/cluster/test_cluster.py's, and it costs
    this test a minute of cold executor work for no path of its own (the three applications' code is the same
    whichever engine writes)."""

    master, workdir = cluster
    host, port = master.rsplit(":", 1)
    config = tmp_path / "include" / "tables.yaml"
    (tmp_path / "include" / "gold").mkdir(parents=True)
    config.write_text(CONFIG)
    shutil.copy(ROOT / "include" / "gold" / "customers_by_state.sql", tmp_path / "include" / "gold")
    landing, lake = "s3://landing/cdc", "s3://lake/airflow"
    generated = generate(load_registry(str(config)).select(None), tmp_path / "sink", Options(rows=50, changes=50))
    upload_landing(s3_endpoint, tmp_path / "sink", landing)
    apps_before = set((workdir / "work").glob("app-*"))
    env = subprocess_env(
        AIRFLOW_HOME=str(tmp_path / "airflow"), AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": host, "port": int(port),
                                               "extra": {"deploy-mode": "client"}}),
        AIRFLOW_CONN_AWS_DEFAULT=aws_connection(s3_endpoint), CDC_DELTA_ENGINE="delta-rs", CDC_JARS_ON_WORKERS="true",
        SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
        CDC_CONFIG=str(config), CDC_LANDING_URI=landing, CDC_LAKE_URI=str(lake),
        CDC_SENSOR_TIMEOUT="3", CDC_SENSOR_POKE_INTERVAL="1")
    airflow = AirflowCli(env, tmp_path / "dags-test.log")
    airflow_home(tmp_path / "airflow")  # `airflow db migrate`'s database
    airflow.sh(str(BIN / "python"), "-m", "cdc_airflow.pools")  # the writer pools, as the README sets them up
    for name, value in s3_environment(s3_endpoint).items():  # this process reads the lake too
        monkeypatch.setenv(name, value)
    first_run_reaches_gold(airflow, config, lake, generated[0].final_rows)
    # bronze, silver and gold each ran as an application of the cluster, its executor reading the worker's own jars
    # (the worker holds them at the driver's path, as compose's image does): none copied the 672 MB of them
    apps = set((workdir / "work").glob("app-*")) - apps_before
    assert len(apps) == 3
    assert [jar for app in apps for jar in app.glob("*/*.jar")] == []
    # the reports, served from the bucket by the plugin with aws_default's credentials. The plugin's app is called
    # in-process: Airflow's login in front of it is the demo's test (tests/airflow/test_demo.py), on a local lake
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", env["AIRFLOW_CONN_AWS_DEFAULT"])
    monkeypatch.setenv("CDC_LAKE_URI", lake)
    reports_from_the_bucket(monkeypatch)


def reports_from_the_bucket(monkeypatch) -> None:
    """The plugin's pages from an S3 lake: the run history, and the silver pass's Data Docs (customers' small batches
    are passes of one), its folder sent to the trailing slash its relative links need."""
    from fastapi.testclient import TestClient

    monkeypatch.syspath_prepend(str(ROOT / "plugins"))  # where Airflow loads its plugins from
    import cdc_reports

    async def allowed(request):  # type: ignore[no-untyped-def]
        return None

    monkeypatch.setattr(cdc_reports, "_authorized", allowed)
    client = TestClient(cdc_reports.app, follow_redirects=False)
    page = client.get("/")
    assert page.status_code == 200 and "CDC pipeline runs" in page.text
    assert "; script-src http://testserver/data_docs/_assets/; " in page.headers["content-security-policy"]
    folder = client.get("/data_docs/silver-pass")
    assert (folder.status_code, folder.headers["location"]) == (307, "/cdc-reports/data_docs/silver-pass/")
    docs = client.get("/data_docs/silver-pass/")
    assert docs.status_code == 200 and docs.headers["content-type"].startswith("text/html")
    assert "Great Expectations" in docs.text
