"""The Airflow side (plugins/cdc_airflow) without a scheduler: which files a run takes, the landing
trigger, replay params, and how a layer job's failure becomes a task failure (retried or not)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import stat
from types import SimpleNamespace

import pytest

pytest.importorskip("airflow")

from airflow.sdk import ParamsDict  # noqa: E402
from airflow.sdk.exceptions import AirflowException, AirflowFailException, ParamValidationError  # noqa: E402

from cdc_airflow.operators import CdcSparkJob  # noqa: E402
from cdc_airflow.params import check_replay, landing_window, landing_window_args, replay_params  # noqa: E402
from cdc_airflow.triggers import LandingTrigger  # noqa: E402
from tests.support import ROOT, subprocess_env

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def context(run_type: str, **params: str | None) -> dict:
    return {"params": params, "dag_run": SimpleNamespace(run_type=run_type),
            "data_interval_start": T0, "data_interval_end": T0 + dt.timedelta(minutes=15)}


def ms(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_a_backfill_run_takes_its_data_interval_and_other_runs_everything_pending():
    assert landing_window(context("backfill")) == (ms(T0), ms(T0 + dt.timedelta(minutes=15)))
    assert landing_window(context("scheduled")) == (None, None)
    assert landing_window(context("manual")) == (None, None)
    assert landing_window(context("scheduled", since="2026-03-01", until=None)) == (ms(T0), None)
    assert landing_window(context("backfill", since=None, until="2026-03-01T00:00:00Z")) == (None, ms(T0))
    # with no sensor (landings notified), the bronze job takes the same window as its own --since/--until
    assert landing_window_args(context("backfill")) == [
        "--since", "2026-03-01T00:00:00+00:00", "--until", "2026-03-01T00:15:00+00:00"]
    assert landing_window_args(context("asset_triggered")) == []
    assert landing_window_args(context("manual", since="2026-03-01 00:00:00.123")) == [
        "--since", "2026-03-01T00:00:00.123000+00:00", "--until", ""]


def test_replay_params_are_checked_before_any_work_naming_the_param():
    params = ParamsDict(replay_params(["customers", "orders"]))
    assert params.validate() == {"tables": ["customers", "orders"], "mode": "reprocess", "since": None, "until": None,
                                 "max_quarantined": None}
    for bad, name in (({"tables": ["nope"]}, "tables"), ({"tables": []}, "tables"), ({"mode": "replace"}, "mode"),
                      ({"since": "last tuesday"}, "since"), ({"max_quarantined": "lots"}, "max_quarantined")):
        with pytest.raises(ParamValidationError, match=f"Invalid input for param {name}:"):
            ParamsDict(replay_params(["customers", "orders"])).update(bad)
    known = ["customers", "orders"]
    with pytest.raises(AirflowFailException, match=r"^param since \(2026-03-02\) must be before until \(2026-03-01\)$"):
        check_replay({"tables": known, "mode": "reprocess", "since": "2026-03-02", "until": "2026-03-01"}, known)
    with pytest.raises(AirflowFailException, match="^param max_quarantined: 'max_quarantined' must be a share like 5%"):
        check_replay({"tables": known, "mode": "reprocess", "max_quarantined": "150%"}, known)
    with pytest.raises(AirflowFailException, match="^param since/until: a rebuild recomputes from all of bronze"):
        check_replay({"tables": known, "mode": "rebuild", "since": "2026-03-01", "until": None}, known)
    assert check_replay({"tables": ["orders"], "mode": "reprocess", "since": "2026-03-01", "until": None}, known) == {
        "tables": ["orders"], "mode": "reprocess", "window": "[2026-03-01T00:00:00+00:00, ...)"}


def test_the_landing_trigger_hands_over_each_tables_pending_files_or_nothing_after_waiting(tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    folder = landing / "topics" / "db.s.t" / "partition=0"
    folder.mkdir(parents=True)

    def first_event(**overrides: object) -> dict:
        kwargs = {"landing": str(landing), "lake": str(lake), "tables": {"t": "db.s.t", "idle": "db.s.idle"},
                  "since_ms": None,
                  "until_ms": None, "wait_s": 1.0, "poke_s": 0.2, "aws_conn_id": "aws_default", **overrides}
        trigger = LandingTrigger(**kwargs)
        assert LandingTrigger(**trigger.serialize()[1]).serialize() == trigger.serialize()

        async def first() -> dict:
            async for event in trigger.run():
                return dict(event.payload)
            raise AssertionError("no event")
        return asyncio.run(first())

    assert first_event() == {"files": {}}  # nothing landed within wait_s
    (folder / "db.s.t+0+0000000000.json").write_text("{}\n")
    (folder / ".db.s.t+0+0000000001.json.tmp").write_text("")
    # only the tables with files: the idle one's bronze task is skipped
    assert first_event() == {"files": {"t": ["topics/db.s.t/partition=0/db.s.t+0+0000000000.json"]}}
    assert first_event(until_ms=1) == {"files": {}}  # landed after the window
    assert first_event(landing="ftp://elsewhere")["error"].startswith("ValueError: landing ftp://elsewhere: use a local path")


@pytest.mark.parametrize("exit_code, failure_line, raised, message", [
    (1, "gate failed: table=t layer=bronze expectation=key_not_null", AirflowFailException,
     "gate failed: table=t layer=bronze expectation=key_not_null"),
    (75, "table=t layer=bronze failed: TableBusy: t is being written by another run", AirflowException,
     "table=t layer=bronze failed: TableBusy: t is being written by another run"),
    (137, None, AirflowException, "spark-submit exited 137"),
])
def test_a_failed_layer_job_fails_its_task_with_the_cause_and_only_transient_ones_are_retried(
        tmp_path, monkeypatch, exit_code, failure_line, raised, message):
    # stands in for Spark (spark-submit): what the job would print and exit with
    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    write = f'echo "{failure_line}" > "$CDC_FAILURE_FILE"; ' if failure_line else ""
    # it keeps its arguments and the file list it was handed (`--files @path`: gone with the task's scratch)
    keep_list = f'for a in "$@"; do case "$a" in @*) cp "${{a#@}}" {tmp_path}/files.json;; esac; done\n'
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\n{keep_list}{write}exit {exit_code}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = subprocess_env(PATH=f"{fake.parent}:{os.environ['PATH']}",
                         AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}')
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = CdcSparkJob(task_id="bronze_ingest", landing=str(tmp_path / "landing"), files_from="landing_sense",
                      cli_args=["--layers", "bronze"])
    # a backlog after an outage: as one argument its list would be over Linux's 128 KiB per argument
    backlog = [f"topics/t/partition=0/t+0+{n:019d}.json" for n in range(5_000, 0, -1)]
    other = ["topics/o/partition=0/o+0+0.json"]
    ti = SimpleNamespace(xcom_pull=lambda task_ids: {"t": backlog, "other": other} if task_ids == "landing_sense" else None)
    with pytest.raises(raised) as failed:
        job.execute({"ti": ti})
    assert type(failed.value) is raised and str(failed.value).startswith(message)
    args = (tmp_path / "args").read_text()
    assert str(ROOT / "spark_jobs" / "__main__.py") in args
    # every table the sensor found files for, with exactly those files
    assert re.search(r"--tables other,t --files @\S+/files\.json$", args.rstrip())
    assert json.loads((tmp_path / "files.json").read_text()) == sorted(backlog + other)


@pytest.fixture()
def spark_master() -> str:
    """The master of the spark_default connection the `submitted` fixture sets (a test may parametrize it)."""
    return "local[1]"


@pytest.fixture()
def submitted(tmp_path, monkeypatch, spark_master):
    """A spark-submit on PATH that records its arguments: what the job was given after its run id (not rendered
    here, outside a run), or with `whole` every argument."""
    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    connection = json.dumps({"conn_type": "spark", "host": spark_master})
    for name, value in subprocess_env(PATH=f"{fake.parent}:{os.environ['PATH']}",
                                      AIRFLOW_CONN_SPARK_DEFAULT=connection).items():
        monkeypatch.setenv(name, value)

    def arguments(whole: bool = False) -> list[str]:
        text = (tmp_path / "args").read_text()
        return text.split() if whole else text.split("--run-id {{ run_id }}", 1)[1].split()

    return arguments


@pytest.mark.parametrize("events, params, tables", [
    (["cdc.bronze.b", "cdc.bronze.a", "elsewhere"], {"tables": ["c"]}, "--tables a,b"),  # the events' tables, known ones
    ([], {"tables": ["c", "a"]}, "--tables c,a"),  # by hand: the param's
    ([], {"tables": []}, None),  # by hand, none named: every table
])
def test_silvers_pass_takes_the_tables_whose_bronze_started_its_run_else_the_param(tmp_path, submitted, events, params,
                                                                                    tables):
    from airflow.sdk import Asset

    job = CdcSparkJob(task_id="silver_merge", landing=str(tmp_path / "landing"), cli_args=["--layers", "silver"],
                      tables_from={f"cdc.bronze.{t}": t for t in "abc"})
    triggering = {Asset(name=name, uri=f"file:///lake/{name}"): [] for name in events}
    assert job.execute({"ti": SimpleNamespace(), "triggering_asset_events": triggering, "params": params}) is None
    assert submitted() == ([] if tables is None else tables.split())


@pytest.mark.parametrize("spark_master, given, not_given", [
    ("local[1]", "--driver-class-path", "--jars"),  # on the class path: spark.jars would copy 672 MB per task
    ("spark://127.0.0.1:7077", "--jars", "--driver-class-path"),  # a cluster's executors get them shipped
])
def test_spark_submit_gets_the_pinned_jars_as_its_connections_master_needs_them(tmp_path, submitted, spark_master,
                                                                                 given, not_given):
    from spark_jobs import jvm

    job = CdcSparkJob(task_id="silver_merge", landing=str(tmp_path / "landing"), cli_args=["--layers", "silver"])
    job.execute({"ti": SimpleNamespace(), "params": {"tables": []}})
    args = submitted(whole=True)
    assert args[args.index("--master") + 1] == spark_master
    separator = os.pathsep if given == "--driver-class-path" else ","
    assert args[args.index(given) + 1] == separator.join(jvm.jars()) and not_given not in args


@pytest.mark.parametrize("run_type, payloads, expected", [
    # its data interval, every table
    ("backfill", [], "--since 2026-03-01T00:00:00+00:00 --until 2026-03-01T00:15:00+00:00"),
    # a notified landing: the tables of the topics its notifications named (an unregistered topic's files are no
    # table's), their files bronze has not taken
    ("asset_triggered", [{"landed": 3, "topics": ["db.a"]}, {"landed": 1, "topics": ["db.c", "db.other"]}],
     "--tables a,c"),
    ("asset_triggered", [{"landed": 1, "topics": ["db.other"]}], ""),  # no registered table named: every table
    ("asset_triggered", [{"landed": 1, "topics": ["db.a"]}, {"landed": 1}], ""),  # an event that names none
])
def test_with_no_sensor_bronzes_pass_lists_the_notified_tables_in_the_runs_window(submitted, run_type, payloads,
                                                                                  expected):
    from airflow.sdk import Asset

    job = CdcSparkJob(task_id="bronze_ingest", landing="data/landing", cli_args=["--layers", "bronze"],
                      topic_tables={f"db.{t}": t for t in "abc"})
    notified = {Asset(name="cdc.landing.notified", uri="x-cdc://landing/notified"): [
        SimpleNamespace(extra={"from_trigger": True, "payload": p}) for p in payloads]} if payloads else {}
    job.execute({**context(run_type), "ti": SimpleNamespace(), "triggering_asset_events": notified})
    assert submitted() == expected.split()  # no --files: the job lists the landing itself


@pytest.mark.parametrize("exit_code, failure_line", [(0, None), (1, "gate failed: table=u layer=bronze expectation=x")])
def test_a_pass_task_announces_each_table_it_advanced_and_hands_on_the_others_failure(tmp_path, monkeypatch, exit_code,
                                                                                       failure_line):
    """One job for many tables: each table whose bronze took files through a passing gate gets its asset event (and
    lineage), whether or not another table failed; the failure line goes to the verdicts task, which fails the run."""
    from airflow.sdk import Asset, AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from cdc_airflow.operators import PassOutlets, TableVerdicts
    from spark_jobs import report
    from spark_jobs.lake import Lake

    lake = Lake(str(tmp_path / "lake"))
    for table, summary in {"t": {"files": 2, "events": 7, "gate": "passed"},
                           "w": {"files": 1, "events": 0, "gate": "passed-with-warnings"},
                           "u": {"files": 3, "gate": "failed"},  # its gate let nothing through
                           "v": {"files": 0, "gate": "passed"}}.items():  # nothing taken
        report.publish(lake, "r1", {"table": table, "layer": "bronze", "batch_id": "r1", **summary})
    report.publish(lake, "r0", {"table": "v", "layer": "bronze", "batch_id": "r0", "files": 1, "gate": "passed"})
    report.publish(lake, "r1", {"table": "t", "layer": "silver", "batch_id": "r1", "gate": "passed"})
    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    write = f'echo "{failure_line}" > "$CDC_FAILURE_FILE"; ' if failure_line else ""
    fake.write_text(f"#!/bin/sh\n{write}exit {exit_code}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    for name, value in subprocess_env(PATH=f"{fake.parent}:{os.environ['PATH']}",
                                      AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}').items():
        monkeypatch.setenv(name, value)
    alias = AssetAlias(name="cdc.bronze.advanced")
    assets = {t: Asset(name=f"cdc.bronze.{t}", uri=f"file://{lake.bronze(t)}") for t in "tuvw"}
    landing = {t: [Asset(name=f"cdc.landing.{t}", uri=f"file:///landing/topics/{t}")] for t in "tuvw"}
    job = CdcSparkJob(task_id="bronze_ingest", landing=str(tmp_path / "landing"), files_from="landing_sense",
                      cli_args=["--layers", "bronze"], announces=[PassOutlets("bronze", lake.root, alias, assets, landing)])
    sensed = {t: [f"topics/{t}/partition=0/{t}+0+0.json"] for t in "tuvw"}
    outlets = OutletEventAccessors()
    ti = SimpleNamespace(xcom_pull=lambda task_ids: sensed)
    handed_on = job.execute({"ti": ti, "run_id": "r1", "outlet_events": outlets})
    assert handed_on == failure_line
    events = outlets[alias].asset_alias_events
    assert [(e.dest_asset_key.name, e.extra) for e in events] == [
        ("cdc.bronze.t", {"run_id": "r1", "table": "t", "gate": "passed", "files": 2, "events": 7}),
        ("cdc.bronze.w", {"run_id": "r1", "table": "w", "gate": "passed-with-warnings", "files": 1, "events": 0})]
    lineage = job.get_openlineage_facets_on_complete(None)  # OpenLineage: what those tables read and wrote
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("file", "/landing/topics/t"), ("file", "/landing/topics/w")]
    assert [d.name for d in lineage.outputs] == [lake.bronze("t"), lake.bronze("w")]

    verdicts = TableVerdicts(task_id="bronze_verdicts", of="bronze_ingest")
    handed = SimpleNamespace(xcom_pull=lambda task_ids: handed_on if task_ids == "bronze_ingest" else None)
    if failure_line:
        with pytest.raises(AirflowFailException, match="table=u layer=bronze"):
            verdicts.execute({"ti": handed})
    else:
        verdicts.execute({"ti": handed})

    # a replay announces both layers it rewrote, each through its own alias
    silver_alias = AssetAlias(name="cdc.silver.advanced")
    silver_assets = {t: Asset(name=f"cdc.silver.{t}", uri=f"file://{lake.silver(t)}") for t in "tuvw"}
    replay = CdcSparkJob(task_id="replay", landing=str(tmp_path / "landing"), cli_args=["--layers", "bronze,silver"],
                         announces=[PassOutlets("bronze", lake.root, alias, assets, landing),
                                    PassOutlets("silver", lake.root, silver_alias, silver_assets, {})])
    replayed = OutletEventAccessors()
    assert replay.execute({"ti": ti, "run_id": "r1", "outlet_events": replayed}) == failure_line
    assert [e.dest_asset_key.name for e in replayed[alias].asset_alias_events] == ["cdc.bronze.t", "cdc.bronze.w"]
    assert [e.dest_asset_key.name for e in replayed[silver_alias].asset_alias_events] == ["cdc.silver.t"]

    # a transient failure is the task's, retried (no events: Airflow emits none for a failed try); the retry runs under
    # the same run id, its job finds nothing left to do, and it announces from the run's report what the first try did
    fake.write_text("#!/bin/sh\nexit 75\n")
    with pytest.raises(AirflowException):
        job.execute({"ti": ti, "run_id": "r1", "outlet_events": OutletEventAccessors()})
    fake.write_text("#!/bin/sh\nexit 0\n")
    retried = OutletEventAccessors()
    assert job.execute({"ti": ti, "run_id": "r1", "outlet_events": retried}) is None
    assert [e.dest_asset_key.name for e in retried[alias].asset_alias_events] == ["cdc.bronze.t", "cdc.bronze.w"]


def test_a_gold_task_announces_its_model_only_for_a_refresh_that_published(tmp_path, monkeypatch):
    """A DAG scheduled on a gold model's asset runs for new gold only: the model's task adds the asset's event (with
    its lineage) when the run's refresh published a version, or when an earlier try of the run did (its retry finds
    the sources unchanged); a refresh that published nothing adds none, so Airflow emits none for the alias. A
    failed refresh fails its task (no verdicts task follows a model's)."""
    from airflow.sdk import Asset, AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from cdc_airflow.operators import PassOutlets
    from spark_jobs import report
    from spark_jobs.lake import Lake

    lake = Lake(str(tmp_path / "lake"))
    for run_id, summary in {"published": {"gate": "passed", "refresh": "incremental", "published": True, "rows": 3},
                            "retried": {"gate": "skipped (sources unchanged)", "published": True},
                            "unchanged": {"gate": "skipped (sources unchanged)"},
                            "held": {"gate": "passed", "refresh": "unchanged (the rows at its watermark are those "
                                                                  "published)"},
                            "failed": {"gate": "failed"}}.items():
        report.publish(lake, run_id, {"table": "m", "layer": "gold", "batch_id": run_id, "lineage": {"n": ["s.n"]},
                                      **summary})
    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    for name, value in subprocess_env(PATH=f"{fake.parent}:{os.environ['PATH']}",
                                      AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}').items():
        monkeypatch.setenv(name, value)
    alias, source = AssetAlias(name="cdc.gold.advanced"), Asset(name="cdc.silver.s", uri=f"file://{lake.silver('s')}")
    job = CdcSparkJob(task_id="gold_refresh_m", landing=str(tmp_path / "landing"), cli_args=["--layers", "gold"],
                      announces=[PassOutlets("gold", lake.root, alias, {"m": Asset(name="cdc.gold.m",
                                                                                   uri=f"file://{lake.gold('m')}")},
                                             {"m": [source]})])
    announced, lineage = {}, {}
    for run_id in ("published", "retried", "unchanged", "held"):
        outlets = OutletEventAccessors()
        assert job.execute({"ti": SimpleNamespace(), "run_id": run_id, "outlet_events": outlets}) is None
        announced[run_id] = [(e.dest_asset_key.name, e.extra.get("gate")) for e in outlets[alias].asset_alias_events]
        facets = job.get_openlineage_facets_on_complete(None)  # what the refresh read and wrote, if it published
        lineage[run_id] = ([d.name for d in facets.inputs], [d.name for d in facets.outputs])
    assert announced == {"published": [("cdc.gold.m", "passed")], "retried": [("cdc.gold.m", "skipped (sources unchanged)")],
                         "unchanged": [], "held": []}
    wrote = ([lake.silver("s")], [lake.gold("m")])
    assert lineage == {"published": wrote, "retried": wrote, "unchanged": ([], []), "held": ([], [])}
    fake.write_text('#!/bin/sh\necho "table=m layer=gold failed: gate" > "$CDC_FAILURE_FILE"; exit 1\n')
    outlets = OutletEventAccessors()
    with pytest.raises(AirflowFailException, match="table=m layer=gold failed"):
        job.execute({"ti": SimpleNamespace(), "run_id": "failed", "outlet_events": outlets})
    assert outlets[alias].asset_alias_events == []


class FakeService:
    """The pipeline service as the operator's hook sees it: a job that runs for `runs_for` polls, its log a line longer
    at each poll; the offsets the polls asked from are in `asked`."""

    runs_for, asked = 0, []

    def __init__(self, conn_id: str):
        self.url = "http://127.0.0.1:1"

    def get_conn(self) -> None:
        pass

    def submit(self, request) -> str:  # noqa: ANN001
        FakeService.asked = []
        return "job-1"

    def poll(self, job_id: str, offset: int):  # noqa: ANN201
        from spark_jobs.service_client import JobStatus

        self.asked.append(offset)
        text = "".join(f"line {n}\n" for n in range(len(self.asked)))
        if len(self.asked) > self.runs_for:
            return JobStatus(job_id, "succeeded", 0, None, text[offset:], len(text), 1.5)
        return JobStatus(job_id, "running", None, None, text[offset:], len(text))


def test_a_service_job_that_ends_within_the_wait_ends_its_task_on_the_worker_and_a_longer_one_defers(monkeypatch):
    """CDC_TASK_WAIT: a job that ends while its task still polls it from the worker needs no deferral and resume (each
    a scheduler round trip and a task process); one that outlasts the wait defers, its trigger going on from the log
    the task has copied already."""
    from airflow.sdk.exceptions import TaskDeferred

    import cdc_airflow.service_hook

    monkeypatch.setattr(cdc_airflow.service_hook, "PipelineServiceHook", FakeService)
    monkeypatch.setenv("CDC_SERVICE_CONN_ID", "cdc_service")
    ti = SimpleNamespace(dag_id="cdc_silver", task_id="silver_merge", run_id="r1", map_index=-1, try_number=1)
    job = CdcSparkJob(task_id="silver_merge", landing="data/landing", cli_args=["--layers", "silver"])
    job.application_args = ["run", "--layers", "silver", "--run-id", "r1"]  # as Airflow renders them
    line = len("line 0\n")
    FakeService.runs_for = 3
    assert job.execute({"ti": ti, "params": {}}) is None  # ended on the worker: no deferral
    assert FakeService.asked == [0, line, 2 * line, 3 * line]  # each poll from where the last one's log ended

    monkeypatch.setenv("CDC_TASK_WAIT", "0.5")
    FakeService.runs_for = 10**6
    with pytest.raises(TaskDeferred) as deferred:
        job.execute({"ti": ti, "params": {}})
    assert len(FakeService.asked) >= 2
    assert (deferred.value.trigger.job_id, deferred.value.trigger.offset) == ("job-1", len(FakeService.asked) * line)

    monkeypatch.setenv("CDC_TASK_WAIT", "0")  # defers at once, from the start of the log
    with pytest.raises(TaskDeferred) as deferred:
        job.execute({"ti": ti, "params": {}})
    assert (FakeService.asked, deferred.value.trigger.offset) == ([], 0)


CALLED: list[dict] = []


def record_failure(context: dict) -> None:  # the hook CDC_ON_FAILURE_CALLBACK names in the test below
    CALLED.append(context)


def test_the_failure_callback_logs_the_cause_in_one_line_and_calls_the_configured_hook(monkeypatch, capsys):
    from cdc_airflow.callbacks import on_failure

    context = {"ti": SimpleNamespace(dag_id="cdc_silver_orders", task_id="silver_merge_orders"), "run_id": "r1",
               "exception": AirflowFailException("gate failed: table=orders layer=silver expectation=key_unique\ndetail")}
    on_failure(context)
    assert CALLED == []  # no hook configured: only the line
    monkeypatch.setenv("CDC_ON_FAILURE_CALLBACK", "tests.airflow.test_orchestration:record_failure")
    on_failure(context)
    assert CALLED == [context]
    assert capsys.readouterr().out.splitlines() == [
        "cdc task failed: dag=cdc_silver_orders task=silver_merge_orders run=r1 "
        "cause=gate failed: table=orders layer=silver expectation=key_unique"] * 2


def test_the_freshness_check_fails_naming_the_table_when_its_newest_change_is_too_old(tmp_path):
    """Whether or not anything ran: the last success's lag, aged since it was published."""
    from cdc_airflow.checks import FreshnessCheck
    from spark_jobs import event_log, report
    from spark_jobs.delta.delta_rs import DeltaRsEngine
    from spark_jobs.lake import Lake

    def published(run_id: str, summary: dict) -> None:  # a run's step, recorded as the run ends
        report.publish(lake, run_id, {"table": "orders", "layer": "silver", "batch_id": run_id, **summary})
        event_log.record_run(DeltaRsEngine(), lake, run_id, lambda: report.load_run(lake, run_id))

    lake = Lake(str(tmp_path / "lake"))
    check = FreshnessCheck(task_id="fresh_silver_orders", name="orders", layer="silver", freshness_s=3600,
                           lake=lake.root)
    with pytest.raises(AirflowFailException, match="table=orders layer=silver: no successful run holds a source"):
        check.execute({})
    published("run-1", {"gate": "passed", "lag_s": 600.0})
    assert 600 <= check.execute({}) < 660  # ten minutes old, within the hour
    published("run-2", {"gate": "failed"})
    stale = FreshnessCheck(task_id="fresh_silver_orders", name="orders", layer="silver", freshness_s=300,
                           lake=lake.root)
    with pytest.raises(AirflowFailException, match=r"table=orders layer=silver: newest source change 1\d\.\d min "
                                                   r"old, over its freshness of 5\.0 min .*newest verdict failed"):
        stale.execute({})


def test_the_landing_queue_watcher_takes_created_landing_files_from_s3_notifications_and_nothing_else():
    import json

    from cdc_airflow.triggers import landed_keys, landed_topic

    def notification(event: str, bucket: str, key: str) -> str:
        return json.dumps({"Records": [{"eventName": event, "s3": {"bucket": {"name": bucket}, "object": {"key": key}}}]})

    landing = "s3://landing/cdc"
    # keys come URL-encoded, as S3 sends them ('+' for a space)
    assert landed_keys(notification("ObjectCreated:Put", "landing", "cdc/topics/shop.orders/partition%3D0/"
                                    "shop.orders%2B0%2B0000000000.json"), landing) == [
        "cdc/topics/shop.orders/partition=0/shop.orders+0+0000000000.json"]
    assert landed_keys(notification("ObjectCreated:CompleteMultipartUpload", "landing", "cdc/topics/a/b+c.json"),
                       landing) == ["cdc/topics/a/b c.json"]
    # the event names each key's topic: the run's pass lists only those tables
    assert landed_topic("cdc/topics/shop.orders/partition=0/shop.orders+0+0000000000.json", landing) == "shop.orders"
    assert landed_topic("topics/shop.orders/year=2026/x.json", "s3://landing") == "shop.orders"
    for ignored in (notification("ObjectRemoved:Delete", "landing", "cdc/topics/a/x.json"),
                    notification("ObjectCreated:Put", "other", "cdc/topics/a/x.json"),
                    notification("ObjectCreated:Put", "landing", "elsewhere/topics/a/x.json"),
                    json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "landing"}),
                    "not json", "[1, 2]", json.dumps({"Records": [None, {"s3": None}]})):
        assert landed_keys(ignored, landing) == []


def test_the_landing_queue_watcher_gathers_a_burst_of_notifications_into_one_event():
    """A flush lands a file per table within moments: the notifications that keep coming after the first are one
    event (one cdc_bronze run), and each received message is deleted once."""
    import json

    from cdc_airflow.triggers import LandingQueueTrigger

    def notification(n: int) -> dict:
        body = {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "landing"},
                                                                      "object": {"key": f"cdc/topics/t/f{n}.json"}}}]}
        return {"Body": json.dumps(body), "ReceiptHandle": f"h{n}"}

    class Queue:
        def __init__(self, batches: list[list[dict]]):
            self.batches, self.waits, self.deleted = batches, [], []

        def receive_message(self, QueueUrl: str, MaxNumberOfMessages: int, WaitTimeSeconds: int) -> dict:  # noqa: N803
            self.waits.append(WaitTimeSeconds)
            return {"Messages": self.batches.pop(0)} if self.batches else {}

        def delete_message_batch(self, QueueUrl: str, Entries: list[dict]) -> None:  # noqa: N803
            self.deleted += [e["ReceiptHandle"] for e in Entries]

    trigger = LandingQueueTrigger(queue_url="https://sqs/q", landing="s3://landing/cdc", aws_conn_id="aws_default")
    queue = Queue([[notification(0)], [notification(1), notification(2)], [], [notification(3)]])
    assert trigger._receive(queue) == [f"cdc/topics/t/f{n}.json" for n in range(3)]
    assert (queue.waits, queue.deleted) == ([20, 0, 0], ["h0", "h1", "h2"])  # long poll, then short ones until quiet
    assert trigger._receive(queue) == ["cdc/topics/t/f3.json"]  # the next burst: the next event

