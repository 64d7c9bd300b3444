"""The pipeline on a live Spark cluster: a standalone master and a worker on loopback (pyspark's own jars,
as the compose deployment's Spark services run them), jobs pointed at it with CDC_SPARK_MASTER and writing
with the delta-spark engine, so every Delta write runs in the worker's executor, not in the driver; the
landing and the lake on a local S3 server, read and written by the executor through s3a://."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.generate import Options, generate
from spark_jobs.registry import load_registry
from tests.conftest import s3_environment, subprocess_env, upload_landing
from tests.layers.test_pipeline import expected_rows
from tests.support import airflow_home, silver_rows, standalone_cluster

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, soak):
    """(master URL, the worker's folder: its executors' logs are under work/)."""
    import os

    workdir = tmp_path_factory.mktemp("cluster")
    # the executors the worker starts for each application run C1 alone, as the tests' other JVMs (tests/conftest.py):
    # their options are the application's, which every spark-submit here reads from SPARK_CONF_DIR
    conf = workdir / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("" if soak else "spark.executor.extraJavaOptions -XX:TieredStopAtLevel=1\n")
    earlier = os.environ.get("SPARK_CONF_DIR")
    os.environ["SPARK_CONF_DIR"] = str(conf)
    try:
        with standalone_cluster(workdir) as master:
            yield master, workdir
    finally:
        if earlier is None:
            os.environ.pop("SPARK_CONF_DIR", None)
        else:
            os.environ["SPARK_CONF_DIR"] = earlier


def cli(master: str, s3_endpoint: str, *args: str) -> subprocess.CompletedProcess:
    env = subprocess_env(CDC_SPARK_MASTER=master, CDC_DELTA_ENGINE="delta-spark", SPARK_LOCAL_IP="127.0.0.1",
                         PYSPARK_PYTHON=sys.executable, **s3_environment(s3_endpoint))
    return subprocess.run([sys.executable, "-m", "spark_jobs", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def test_the_cli_on_a_standalone_cluster_gives_the_source_state(spark, cluster, tmp_path, s3_endpoint, monkeypatch):
    from spark_jobs.delta.delta_spark import DeltaSparkEngine
    from spark_jobs.session import use_s3_settings

    config = tmp_path / "tables.yaml"
    config.write_text(CONFIG)
    # with the schema envelope: logical types decoded on the executor
    generated = generate(load_registry(str(config)).select(None), tmp_path / "sink",
                         Options(rows=30, changes=60, records_per_file=20))
    upload_landing(s3_endpoint, tmp_path / "sink", "s3://landing/cdc")
    lake, (master, workdir) = "s3://lake/cdc", cluster
    done = cli(master, s3_endpoint, "run", "--config", str(config), "--landing", "s3://landing/cdc", "--lake", lake)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "engine=delta-spark" in done.stdout
    for name, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    use_s3_settings(spark)
    engine = DeltaSparkEngine(spark)
    for g in generated:
        keys = load_registry(str(config)).tables[g.table].keys
        assert silver_rows(spark, engine, lake, g.table, keys) == expected_rows(g.topic, g.final_rows)
    # the work ran in the worker's executor: its stderr holds the tasks it ran
    executor_logs = list((workdir / "work").glob("app-*/*/stderr"))
    assert executor_logs and any("Finished task" in log.read_text() for log in executor_logs)


def test_the_pipeline_service_runs_every_job_in_one_application_of_the_cluster(spark, cluster, tmp_path, s3_endpoint,
                                                                             monkeypatch):
    """The compose picture: the service's driver is the cluster's one application (its jobs start no other), the
    jobs write with delta-spark from the worker's executor, and silver equals the source."""
    from spark_jobs.delta.delta_spark import DeltaSparkEngine
    from spark_jobs.service_client import JobRequest, poll, submit
    from spark_jobs.session import use_s3_settings
    from tests.support import pipeline_service

    config = tmp_path / "tables.yaml"
    config.write_text(CONFIG)
    generated = generate(load_registry(str(config)).select(None), tmp_path / "sink",
                         Options(rows=30, changes=60, records_per_file=20))
    landing, lake, (master, workdir) = "s3://landing/service", "s3://lake/service", cluster
    upload_landing(s3_endpoint, tmp_path / "sink", landing)
    apps_before = set((workdir / "work").glob("app-*"))
    env = subprocess_env(CDC_SPARK_MASTER=master, CDC_DELTA_ENGINE="delta-spark", SPARK_LOCAL_IP="127.0.0.1",
                         PYSPARK_PYTHON=sys.executable, CDC_CONFIG=str(config), CDC_LANDING_URI=landing,
                         CDC_LAKE_URI=lake, **s3_environment(s3_endpoint))
    with pipeline_service(env, tmp_path / "service.log") as service:
        for _ in range(2):  # the run, and the same run again (nothing new): one application
            job = submit(service, JobRequest.from_argv(["run", "--config", "x", "--landing", "x", "--lake", "x"]))
            deadline = time.monotonic() + 600
            while not (status := poll(service, job)).done:
                assert time.monotonic() < deadline, status.log[-3000:]
                time.sleep(0.5)
            assert status.exit_code == 0, status.log[-5000:]
    assert len(set((workdir / "work").glob("app-*")) - apps_before) == 1
    for name, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    use_s3_settings(spark)
    g = generated[0]
    assert silver_rows(spark, DeltaSparkEngine(spark), lake, g.table, ("custkey",)) == expected_rows(g.topic, g.final_rows)


def test_airflow_submits_the_layer_jobs_to_the_cluster(cluster, tmp_path, s3_endpoint, monkeypatch):
    """The layer DAGs with `spark_default` pointing at the standalone master (SparkSubmitOperator in client
    mode, the pinned jars passed by the operator), the landing and the lake on a local S3 server (the
    sensor reads the lake's ingest log there, the plugin the reports): silver equals the source and gold
    passes, as in the embedded demo."""
    from tests.airflow.test_demo import BIN, Airflow, api_server, check_reports_behind_airflow_auth, first_run_reaches_gold
    from tests.conftest import aws_connection

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
        AIRFLOW_CONN_AWS_DEFAULT=aws_connection(s3_endpoint), CDC_DELTA_ENGINE="delta-spark",
        SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
        CDC_CONFIG=str(config), CDC_LANDING_URI=landing, CDC_LAKE_URI=str(lake),
        CDC_SENSOR_TIMEOUT="3", CDC_SENSOR_POKE_INTERVAL="1")
    airflow = Airflow(env, tmp_path / "dags-test.log")
    airflow_home(tmp_path / "airflow")  # `airflow db migrate`'s database
    airflow.sh(str(BIN / "python"), "-m", "cdc_airflow.pools")  # the writer pools, as the README sets them up
    for name, value in s3_environment(s3_endpoint).items():  # this process reads the lake too
        monkeypatch.setenv(name, value)
    first_run_reaches_gold(airflow, config, lake, generated[0].final_rows)
    # bronze, silver and gold each ran as an application of the cluster
    assert len(set((workdir / "work").glob("app-*")) - apps_before) == 3
    # the reports, served from the bucket by the plugin with aws_default's credentials, behind Airflow's login
    with api_server(env, tmp_path / "airflow") as base:
        check_reports_behind_airflow_auth(base)


@pytest.mark.parametrize("how", ["cli", "spark-submit"])
def test_a_master_that_does_not_answer_fails_the_run_as_transient_at_once_writing_nothing(tmp_path, how):
    """Retries are for infrastructure: exit 75 (the operator retries with backoff) within a minute, one line naming
    the master, and no lake: Spark alone would retry registering for a minute and fail the first job with exit 1.
    The same whether the run starts its own JVM (CDC_SPARK_MASTER) or spark-submit started it (the DAG tasks)."""
    import time

    import pyspark

    from tests.support import free_port

    master = f"spark://127.0.0.1:{free_port()}"  # nothing listens there
    config = tmp_path / "tables.yaml"
    config.write_text(CONFIG)
    args = ["run", "--config", str(config), "--landing", str(tmp_path / "landing"), "--lake", str(tmp_path / "lake"),
            "--layers", "bronze,silver"]
    home = Path(pyspark.__file__).parent
    command = ([sys.executable, "-m", "spark_jobs", *args] if how == "cli" else
               [str(home / "bin" / "spark-submit"), "--master", master, str(ROOT / "spark_jobs" / "__main__.py"), *args])
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=subprocess_env(CDC_SPARK_MASTER=master, SPARK_HOME=str(home)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 75, done.stderr[-3000:]
    assert time.monotonic() - started < 60
    cause = f"infrastructure: the Spark master {master} does not answer ({master.removeprefix('spark://')}: Connection refused)"
    # spark-submit merges the job's stderr into its stdout, among the JVM's log lines
    assert [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("infrastructure:")] == [cause]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables.yaml"]
