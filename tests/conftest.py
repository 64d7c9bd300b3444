"""Shared fixtures: one local[1] Spark session for the whole run (DESIGN 6), UTC everywhere."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ["TZ"] = "UTC"
time.tzset()
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ["CDC_SHUFFLE_PARTITIONS"] = "1"
os.environ["CDC_DELTA_ENGINE"] = "delta-rs"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from spark_jobs.session import SESSION_CONF

    builder = SparkSession.builder.master("local[1]").appName("cdc-tests")
    # one JVM serves the whole suite: let it drop unreferenced checkpoints often, not every 30 minutes
    test_conf = {"spark.sql.shuffle.partitions": "1", "spark.cleaner.periodicGC.interval": "1min"}
    for key, value in {**SESSION_CONF, **test_conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture()
def engine(spark):
    from spark_jobs.delta.delta_rs import DeltaRsEngine

    return DeltaRsEngine()


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: the project on PYTHONPATH, the venv's tools on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "CDC_"))}
    env.update(PYTHONPATH=str(ROOT), TZ="UTC", GX_ANALYTICS_ENABLED="false",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", CDC_SHUFFLE_PARTITIONS="1")
    env.update(extra)
    return env
