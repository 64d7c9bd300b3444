"""A run's tables side by side (steps.each_table): each worker sees the caller's context (a service job's settings
and output) and Spark job group, and the first failure stops what has not started."""

from __future__ import annotations

import contextvars
import threading
import time
from types import SimpleNamespace

import pytest

from spark_jobs.steps import each_table

JOB = contextvars.ContextVar("job", default=None)


def test_each_table_runs_in_worker_threads_with_the_callers_context_and_job_group(spark):
    JOB.set("job-1")
    spark.sparkContext.setJobGroup("group-1", "a service job")
    seen: dict[str, tuple[object, ...]] = {}

    def work(table):
        time.sleep(0.05)
        seen[table.name] = (JOB.get(), spark.sparkContext.getLocalProperty("spark.jobGroup.id"),
                            threading.current_thread().name.startswith("cdc-table"))

    try:
        each_table(spark, [SimpleNamespace(name=n) for n in "abcd"], work, 2)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert seen == {n: ("job-1", "group-1", True) for n in "abcd"}


def test_the_first_failure_stops_the_tables_not_started_and_is_raised_once_the_running_ones_end(spark):
    ran: list[str] = []

    def work(table):
        if table.name == "b":
            raise RuntimeError("b failed")
        time.sleep(0.3)
        ran.append(table.name)

    with pytest.raises(RuntimeError, match="b failed"):
        each_table(spark, [SimpleNamespace(name=n) for n in "abcde"], work, 2)
    # a, running beside b, ended first; b's worker may have taken c before the rest were called off
    assert "a" in ran and set(ran) <= {"a", "c"}
