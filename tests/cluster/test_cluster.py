"""The pipeline on a live Spark cluster: a standalone master and a worker on loopback (pyspark's own jars,
as the compose deployment's Spark services run them), jobs pointed at it with CDC_SPARK_MASTER and writing
with the delta-spark engine, so every Delta write runs in the worker's executor, not in the driver; the
landing and the lake on a local S3 server, read and written by the executor through s3a://."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.generate import Options, generate
from spark_jobs.registry import load_registry
from tests.support import expected_rows, s3_environment, silver_rows, subprocess_env, upload_landing

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n"


def test_the_pipeline_service_runs_every_job_in_one_application_of_the_cluster(spark, cluster, tmp_path, s3_endpoint,
                                                                             monkeypatch):
    """The compose picture: the service's driver is the cluster's one application (its jobs start no other), the
    jobs write with delta-spark from the worker's executor (its log holds the tasks it ran), and silver equals the
    source, decoded from the schema envelope on the executor. A CLI run with CDC_SPARK_MASTER builds its session the
    same way (spark_jobs/session.py; its refusal when the master is down is the last test here)."""
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
            assert "engine=delta-spark" in status.log
    apps = set((workdir / "work").glob("app-*")) - apps_before
    assert len(apps) == 1
    executor_logs = list(next(iter(apps)).glob("*/stderr"))
    assert executor_logs and any("Finished task" in log.read_text() for log in executor_logs)
    for name, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    use_s3_settings(spark)
    g = generated[0]
    assert silver_rows(spark, DeltaSparkEngine(spark), lake, g.table, ("custkey",)) == expected_rows(g.topic, g.final_rows)


OUTSIDER = """
import sys
from pyspark import SparkConf, SparkContext
conf = SparkConf().setMaster(sys.argv[1]).setAppName(sys.argv[2]).set("spark.ui.enabled", "false")
for key, value in (setting.split("=", 1) for setting in sys.argv[3:]):
    conf.set(key, value)
SparkContext(conf=conf)
sys.stdin.read()  # held until the test has seen what the master answered
"""


def test_a_driver_without_the_clusters_secret_is_refused(cluster, tmp_path):
    """The cluster authenticates its RPC (tests/cluster/conftest.py, as docker-compose.yaml runs it): a program that
    reaches the master's port without the secret, or with a guessed one, cannot register, so it never gets an
    executor to run code on. The tests beside this one run their applications with the secret."""
    from spark_jobs.session import SPARK_SECRET_VARIABLE as SECRET

    master, workdir = cluster
    script = tmp_path / "outsider.py"
    script.write_text(OUTSIDER)
    env = {name: value for name, value in subprocess_env().items() if name != SECRET}
    for name, settings in (("no-secret", ["spark.authenticate=false"]),
                           ("guessed-secret", ["spark.authenticate=true", "spark.authenticate.secret=guessed"])):
        log = tmp_path / f"{name}.log"
        with log.open("w") as out:
            driver = subprocess.Popen([sys.executable, str(script), master, name, *settings], env=env,
                                      stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while "Failed to connect to master" not in log.read_text():  # its first attempt, refused
                assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        finally:
            driver.kill()
            driver.wait()
        assert f"Registering app {name}" not in (workdir / "master.log").read_text()


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
