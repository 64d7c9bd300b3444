"""The live standalone cluster the tests in this folder run on, one per test module (each module on one worker)."""

from __future__ import annotations

import os
import secrets

import pytest

from spark_jobs.session import SPARK_SECRET_VARIABLE
from tests.support import SHORT_LIVED_JVM, standalone_cluster

# Spark's RPC authenticated as the compose deployment has it (include/spark-conf/spark-defaults.conf, its secret in
# _SPARK_AUTH_SECRET): the master, the worker, the executors it starts and every driver here hold the secret
AUTHENTICATED = "spark.authenticate true\n"
SECRET = SPARK_SECRET_VARIABLE


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, soak):
    """(master URL, the worker's folder: its executors' logs are under work/)."""
    workdir = tmp_path_factory.mktemp("cluster")
    # the executors the worker starts for each application run C1 alone, as the tests' other JVMs (tests/conftest.py):
    # their options are the application's, which every spark-submit here reads from SPARK_CONF_DIR
    conf = workdir / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        AUTHENTICATED + ("" if soak else f"spark.executor.extraJavaOptions {SHORT_LIVED_JVM}\n"))
    mine = {"SPARK_CONF_DIR": str(conf), SECRET: secrets.token_hex(32)}
    earlier = {name: os.environ.get(name) for name in mine}
    os.environ.update(mine)  # the daemons, and each driver a test here starts, inherit them
    try:
        with standalone_cluster(workdir) as master:
            yield master, workdir
    finally:
        # each application's executor fetched its own copy of the pinned jars (672 MB) into work/; its logs stay
        for copy in workdir.glob("work/app-*/*/*.jar"):
            copy.unlink()
        for name, value in earlier.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
