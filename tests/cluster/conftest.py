"""The live standalone cluster the tests in this folder run on, one per test module (each module on one worker)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import SHORT_LIVED_JVM
from tests.support import standalone_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, soak):
    """(master URL, the worker's folder: its executors' logs are under work/)."""
    workdir = tmp_path_factory.mktemp("cluster")
    # the executors the worker starts for each application run C1 alone, as the tests' other JVMs (tests/conftest.py):
    # their options are the application's, which every spark-submit here reads from SPARK_CONF_DIR
    conf = workdir / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("" if soak else f"spark.executor.extraJavaOptions {SHORT_LIVED_JVM}\n")
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
