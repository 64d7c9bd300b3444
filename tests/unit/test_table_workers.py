"""A run's tables side by side (steps.each_table): each worker sees the caller's context (a service job's settings
and output) and Spark job group, and the first failure stops what has not started."""

from __future__ import annotations

import contextvars
import threading
import time
from types import SimpleNamespace

import pytest

from spark_jobs.steps import each_table
from spark_jobs.stopwatch import counting, in_gx

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


def test_a_jobs_time_in_great_expectations_sums_its_worker_threads_and_no_other_jobs(spark):
    """stopwatch: time inside `in_gx` on the threads a job runs its tables in adds to that job's count; a job
    counting beside it (the service runs two at once) and code outside any job count nothing of it."""
    def work(table):
        with in_gx():
            time.sleep(0.1)

    with in_gx():  # no job counting: nowhere to add it
        time.sleep(0.05)
    with counting() as spent:
        with counting() as other:
            pass
        each_table(spark, [SimpleNamespace(name=n) for n in "abcd"], work, 2)
    assert 0.4 <= spent.seconds < 1.0 and other.seconds == 0.0


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


def _busy(lake, name: str) -> bool:
    """Is the table's writer lock held (by anyone, this process too: an OS file lock per open file)?"""
    from spark_jobs.errors import TableBusy
    from spark_jobs.state import writer_lock

    try:
        with writer_lock(lake, name, "probe", timeout_s=0):
            return False
    except TableBusy:
        return True


def test_steps_run_together_answer_every_question_at_once_under_each_tables_lock_and_fail_alone(spark, tmp_path):
    """Steps.run_together: each step runs to its question under its lock, the questions are answered in one call,
    each step ends with its own answer; a step that asks nothing just runs; a step failing before or after its
    question fails alone; every lock is released at the end."""
    from spark_jobs.errors import PipelineError
    from spark_jobs.lake import Lake
    from spark_jobs.layers.summary import LayerSummary
    from spark_jobs.steps import Steps

    lake = Lake(str(tmp_path / "lake"))
    ended: dict[str, object] = {}

    def step(spark, engine, name: str):
        if name == "plain":  # asks nothing
            return LayerSummary(table=name, layer="silver", batch_id="b1", gate="passed")
        return asking(name)

    def asking(name: str):
        if name == "early":
            raise PipelineError(name, "silver", "bad input before its question")
        answer = yield f"question of {name}"
        if name == "late":
            raise PipelineError(name, "silver", "its gate failed after its question")
        ended[name] = answer
        return LayerSummary(table=name, layer="silver", batch_id="b1", gate="passed")

    calls: list[dict[str, str]] = []

    def answer(questions: dict[str, str]) -> dict[str, str]:
        calls.append(dict(questions))
        assert all(_busy(lake, name) for name in questions)  # each asking table's lock held while it waits
        return {name: f"answer to {question}" for name, question in questions.items()}

    steps = Steps(spark, None, lake, "b1")
    names = ["a", "b", "plain", "early", "late", "c"]
    steps.run_together([(n, "silver", n, step, (n,)) for n in names], answer, 2)
    assert calls == [{n: f"question of {n}" for n in ("a", "b", "late", "c")}]
    assert ended == {n: f"answer to question of {n}" for n in ("a", "b", "c")}
    assert steps.failed_tables == {"early", "late"}
    assert sorted(steps.published) == sorted(names)  # failed ones too, with their cause
    assert not any(_busy(lake, n) for n in names)


def test_a_lone_step_is_answered_alone_and_steps_whose_joint_answer_fails_are_each_answered_alone(spark, tmp_path):
    """Steps.run answers a step's question alone; when run_together's joint answer fails, each step is answered alone
    (one table's input never fails the others), and every lock is released."""
    from spark_jobs.lake import Lake
    from spark_jobs.layers.summary import LayerSummary
    from spark_jobs.steps import Steps

    lake = Lake(str(tmp_path / "lake"))
    ended: dict[str, str] = {}

    class Question:
        def __init__(self, name: str):
            self.name = name

        def answer_alone(self):
            if self.name == "poison":
                raise ValueError("poison's own rows cannot be tallied")
            return f"{self.name} alone"

    def step(spark, engine, name: str):
        ended[name] = yield Question(name)
        return LayerSummary(table=name, layer="silver", batch_id="b1", gate="passed")

    steps = Steps(spark, None, lake, "b1")
    assert steps.run("a", "silver", "a", step, "a") and ended == {"a": "a alone"} and not _busy(lake, "a")

    def broken(questions):
        raise ValueError("one table's rows broke the joint answer")

    steps.run_together([(n, "silver", n, step, (n,)) for n in ("b", "poison", "c")], broken, 2)
    assert ended == {"a": "a alone", "b": "b alone", "c": "c alone"}
    assert steps.failed_tables == {"poison"}
    assert not any(_busy(lake, n) for n in ("b", "poison", "c"))
