"""The Airflow side of the pipeline: the deferrable landing sensor and its trigger, the operator that runs
a layer job through spark-submit, replay params, and the failure hook. The DAG files only wire these.

Nothing heavy is imported here at module level: the DAG processor imports this while parsing."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, BaseSensorOperator, Param
from airflow.triggers.base import BaseTrigger, TriggerEvent

from spark_jobs.config import Registry, env_settings, load_registry, resolve, resolve_uri
from spark_jobs.landing import is_remote

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINT = str(ROOT / "spark_jobs" / "__main__.py")
AWS_CONN_ID = os.environ.get("CDC_AWS_CONN_ID", "aws_default")
REMOTE_ENV = "CDC_SPARK_REMOTE"  # as spark_jobs.session reads it (not imported here: it imports pyspark)


# ---- wiring shared by the DAG files ----------------------------------------------------------------


@dataclass(frozen=True)
class Wiring:
    """The CDC_* environment, resolved, and the table registry it names (DESIGN 3.4)."""

    config: str
    landing: str
    lake: str
    registry: Registry
    sensor_timeout_s: float
    sensor_poke_s: float

    def cli_args(self, *selection: str) -> list[str]:
        return ["--config", self.config, "--landing", self.landing, "--lake", self.lake, *selection]

    def asset(self, layer: str, name: str) -> Asset:
        """A table (or gold model) of a layer; its URI is the Delta table's location."""
        location = self.lake if "://" in self.lake else f"file://{self.lake}"
        return Asset(name=f"cdc.{layer}.{name}", uri=f"{location}/{layer}/{name}", group="cdc")


def wiring() -> Wiring:
    settings = env_settings()
    config = str(resolve(settings["config"]))
    return Wiring(config, resolve_uri(settings["landing"]), resolve_uri(settings["lake"]), load_registry(config),
                  float(settings["sensor_timeout"]), float(settings["sensor_poke_interval"]))


def default_args(**extra: Any) -> dict[str, Any]:
    """Retries with exponential backoff (CdcSparkJob retries only transient failures), a timeout per
    task, and the failure hook."""
    return {"owner": "data-engineering", "retries": 3, "retry_delay": dt.timedelta(seconds=30),
            "retry_exponential_backoff": True, "max_retry_delay": dt.timedelta(minutes=10),
            "execution_timeout": dt.timedelta(hours=1), "on_failure_callback": on_failure, **extra}


# ---- S3 credentials: from an Airflow connection to boto3 settings -----------------------------------


def s3_settings(conn_id: str) -> dict[str, str]:
    """boto3 client settings (endpoint, region, keys) from an Airflow AWS connection; an absent connection
    leaves boto3's own chain (environment, instance role)."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id=conn_id)
    credentials = hook.get_credentials()
    settings = {"endpoint_url": hook.conn_config.endpoint_url, "region_name": hook.conn_region_name,
                "aws_access_key_id": credentials.access_key, "aws_secret_access_key": credentials.secret_key,
                "aws_session_token": credentials.token}
    return {k: v for k, v in settings.items() if v}


def s3_environment(settings: dict[str, str]) -> dict[str, str]:
    """The same settings as the AWS_* variables boto3 reads in the Spark job's process."""
    names = {"endpoint_url": "AWS_ENDPOINT_URL_S3", "region_name": "AWS_DEFAULT_REGION",
             "aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
             "aws_session_token": "AWS_SESSION_TOKEN"}
    return {names[k]: v for k, v in settings.items()}


def _s3_client(settings: dict[str, str] | None) -> Any:
    if settings is None:
        return None
    import boto3

    return boto3.client("s3", **settings)


def pending_landing_files(landing: str, lake: str, table: str, topic: str, since_ms: int | None, until_ms: int | None,
                          s3_client: Any) -> list[str]:
    from spark_jobs.landing import LandingWindow
    from spark_jobs.state import Lake, pending_files

    files = pending_files(landing, Lake(lake), table, topic, LandingWindow(since_ms, until_ms), s3_client)
    return [f.path for f in files]


# ---- sensing: which landing files a run takes -------------------------------------------------------


def landing_window(context: Any) -> tuple[int | None, int | None]:
    """A backfill run takes the files that landed in its data interval; any run may name a window in its
    params (`since`, `until`); other runs take every file not yet in bronze."""
    from spark_jobs.landing import LandingWindow

    params = context["params"]
    if params.get("since") or params.get("until"):
        window = LandingWindow.parse(params.get("since"), params.get("until"))
        return window.since_ms, window.until_ms
    run = context["dag_run"]
    if str(getattr(run.run_type, "value", run.run_type)) == "backfill":
        start, end = context["data_interval_start"], context["data_interval_end"]
        return int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    return None, None


class LandingTrigger(BaseTrigger):
    """Runs on the triggerer: lists the landing until files of the table are there that bronze has not
    taken (or `wait_s` has passed), then hands their paths back to the sensor."""

    def __init__(self, *, landing: str, lake: str, table: str, topic: str, since_ms: int | None, until_ms: int | None,
                 wait_s: float, poke_s: float, aws_conn_id: str):
        super().__init__()
        self.landing, self.lake, self.table, self.topic = landing, lake, table, topic
        self.since_ms, self.until_ms, self.wait_s, self.poke_s, self.aws_conn_id = since_ms, until_ms, wait_s, poke_s, aws_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"landing": self.landing, "lake": self.lake, "table": self.table, "topic": self.topic,
                 "since_ms": self.since_ms, "until_ms": self.until_ms, "wait_s": self.wait_s, "poke_s": self.poke_s,
                 "aws_conn_id": self.aws_conn_id})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from asgiref.sync import sync_to_async

        deadline = time.monotonic() + self.wait_s
        try:
            # connections are read through Airflow's own (synchronous) channel, once
            settings = await sync_to_async(s3_settings)(self.aws_conn_id) if is_remote(self.landing) else None
            client = await asyncio.to_thread(_s3_client, settings)  # one client for every poll
            while True:
                files = await asyncio.to_thread(pending_landing_files, self.landing, self.lake, self.table, self.topic,
                                                self.since_ms, self.until_ms, client)
                if files or time.monotonic() >= deadline:
                    yield TriggerEvent({"files": files})
                    return
                await asyncio.sleep(self.poke_s)
        except Exception as exc:  # the sensor turns it into the task's failure, with the cause
            yield TriggerEvent({"error": f"{type(exc).__name__}: {exc}"})


class LandingSensor(BaseSensorOperator):
    """Waits, deferred (on the triggerer, holding no worker slot), for landing files of one table that
    bronze has not taken, and returns their paths (XCom) for the bronze task to ingest exactly those.
    Skips the table when none arrive in `timeout` seconds; a backfill run does not wait."""

    template_fields: Sequence[str] = ()

    def __init__(self, *, table: str, topic: str, landing: str, lake: str, aws_conn_id: str = AWS_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.table, self.topic, self.landing, self.lake, self.aws_conn_id = table, topic, landing, lake, aws_conn_id

    def execute(self, context: Any) -> list[str]:
        since_ms, until_ms = landing_window(context)
        settings = s3_settings(self.aws_conn_id) if is_remote(self.landing) else None
        files = pending_landing_files(self.landing, self.lake, self.table, self.topic, since_ms, until_ms,
                                      _s3_client(settings))
        if files or until_ms is not None:  # a closed window gets no new files by waiting
            return self._hand_over(files)
        self.defer(trigger=LandingTrigger(landing=self.landing, lake=self.lake, table=self.table, topic=self.topic,
                                          since_ms=since_ms, until_ms=until_ms, wait_s=float(self.timeout),
                                          poke_s=float(self.poke_interval), aws_conn_id=self.aws_conn_id),
                   method_name="execute_complete", timeout=dt.timedelta(seconds=float(self.timeout) + 300))
        raise AssertionError("defer() raises")  # pragma: no cover

    def execute_complete(self, context: Any, event: dict[str, Any]) -> list[str]:
        if "error" in event:
            raise AirflowException(f"table={self.table} layer=landing: cannot list {self.landing}: {event['error']}")
        return self._hand_over(event["files"])

    def _hand_over(self, files: list[str]) -> list[str]:
        if not files:
            raise AirflowSkipException(f"table={self.table}: no landing files to ingest")
        self.log.info("table=%s: %d landing file(s) for bronze, first %s", self.table, len(files), files[0])
        return files


# ---- layer jobs -------------------------------------------------------------------------------------


class CdcSparkJob(SparkSubmitOperator):
    """`python -m spark_jobs run ...` for one table (or gold model) and layer, through spark-submit, or,
    when CDC_SPARK_REMOTE names a Spark Connect server, as a plain process attached to it.

    S3 credentials go to the job as AWS_* variables from the Airflow connection (set at run time, never
    rendered in the UI). The bronze task takes the sensor's file list from XCom (`files_from`). A failing
    job fails the task with its one-line cause (table, layer, reason); only transient failures (a busy
    table, an unreachable store, a killed process) are retried."""

    def __init__(self, *, cli_args: list[str], landing: str, files_from: str | None = None,
                 aws_conn_id: str = AWS_CONN_ID, **kwargs: Any):
        kwargs.setdefault("conn_id", "spark_default")
        kwargs.setdefault("conf", {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
        kwargs.setdefault("env_vars", {"PYTHONPATH": str(ROOT), "GX_ANALYTICS_ENABLED": "false"})
        super().__init__(application=ENTRY_POINT, application_args=["run", *cli_args, "--run-id", "{{ run_id }}"],
                         name=f"cdc-{kwargs['task_id']}", **kwargs)
        self.landing, self.files_from, self.aws_conn_id = landing, files_from, aws_conn_id

    def execute(self, context: Any) -> None:
        if self.files_from:
            files = context["ti"].xcom_pull(task_ids=self.files_from)
            self.application_args = [*(self.application_args or []), "--files", json.dumps(sorted(files))]
        env = dict(self.env_vars or {})
        if is_remote(self.landing):
            env.update(s3_environment(s3_settings(self.aws_conn_id)))
        with tempfile.TemporaryDirectory(prefix="cdc-task-") as scratch:
            failure = Path(scratch) / "failure.txt"
            self.env_vars = {**env, "CDC_FAILURE_FILE": str(failure)}
            remote = os.environ.get(REMOTE_ENV)
            if remote:
                code = self._attached(remote)
                exited = f"the job exited {code}"
            else:
                try:
                    super().execute(context)
                    code = 0
                except AirflowException as exc:
                    code = getattr(getattr(self._hook, "_submit_sp", None), "returncode", None) or -1
                    exited = f"spark-submit exited {code}: {exc}"
            if code != 0:
                cause = failure.read_text().strip() if failure.exists() else exited
                if code in (1, 2):  # a gate failed, bad input or config: the same run would fail again
                    raise AirflowFailException(cause)
                raise AirflowException(cause)

    def _attached(self, remote: str) -> int:
        """The job as a plain Python process on the long-lived Spark Connect server (no spark-submit, no JVM
        of its own); its output goes to the task's log. Returns its exit code."""
        self._process = subprocess.Popen([sys.executable, ENTRY_POINT, *(self.application_args or [])],
                                         env={**os.environ, **(self.env_vars or {}), REMOTE_ENV: remote}, cwd=ROOT,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.log.info("%s", line.rstrip())
        return self._process.wait()

    def on_kill(self) -> None:
        process = getattr(self, "_process", None)
        if process is not None and process.poll() is None:
            process.terminate()
        else:
            super().on_kill()


# ---- replays ----------------------------------------------------------------------------------------

REPLAY_MODES = ("reprocess", "rebuild")


ISO_TIME = "^\\d{4}-\\d{2}-\\d{2}([T ]\\d{2}:\\d{2}(:\\d{2}(\\.\\d+)?)?)?(Z|[+-]\\d{2}:?\\d{2})?$"


def window_params(what: str) -> dict[str, Param]:
    """`since`, `until`: a landing-time window (ISO 8601, UTC when naive), validated with the run."""
    return {"since": Param(None, type=["null", "string"], pattern=ISO_TIME, title="Since",
                           description=f"landing time from which files are {what} (ISO 8601, UTC if naive)"),
            "until": Param(None, type=["null", "string"], pattern=ISO_TIME, title="Until",
                           description=f"landing time before which files are {what}")}


def replay_params(tables: list[str]) -> dict[str, Param]:
    """Validated when the run is created (the UI form, the API, `dags test -c`)."""
    return {
        "tables": Param(list(tables), type="array", items={"type": "string", "enum": list(tables)}, minItems=1,
                        uniqueItems=True, title="Tables", description="Tables to replay (default: all)"),
        "mode": Param("reprocess", type="string", enum=list(REPLAY_MODES), title="Mode",
                      description="reprocess: read the landing files in the window again (replacing their bronze "
                                  "rows) and apply them; rebuild: recompute silver, then gold, from all of bronze"),
        **window_params("reprocessed"),
    }


def check_replay(params: dict[str, Any], known: Sequence[str]) -> dict[str, Any]:
    """What JSON schema cannot say: the window's order, a window only with reprocess. Raises with the
    param's name; returns the replay's plan."""
    from spark_jobs.landing import LandingWindow

    unknown = [t for t in params["tables"] if t not in known]
    if unknown:
        raise AirflowFailException(f"param tables: unknown table(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if params["mode"] not in REPLAY_MODES:
        raise AirflowFailException(f"param mode: {params['mode']!r} is not one of {', '.join(REPLAY_MODES)}")
    try:
        window = LandingWindow.parse(params.get("since"), params.get("until"))
    except ValueError as exc:
        raise AirflowFailException(f"param {exc}") from None
    if params["mode"] == "rebuild" and (window.since_ms or window.until_ms):
        raise AirflowFailException("param since/until: a rebuild recomputes from all of bronze; a window is for reprocess")
    return {"tables": list(params["tables"]), "mode": params["mode"], "window": window.describe()}


# ---- failures ---------------------------------------------------------------------------------------


def on_failure(context: Any) -> None:
    """The DAGs' on_failure_callback: logs the failed task's cause in one line, then calls the hook named
    by CDC_ON_FAILURE_CALLBACK (`module:function`, given the context) to page or post where you want."""
    ti = context.get("ti") or context.get("task_instance")
    cause = str(context.get("exception") or "").strip().splitlines()
    print(f"cdc task failed: dag={getattr(ti, 'dag_id', '?')} task={getattr(ti, 'task_id', '?')} "
          f"run={context.get('run_id')} cause={cause[0] if cause else 'unknown'}", flush=True)
    target = os.environ.get("CDC_ON_FAILURE_CALLBACK")
    if target:
        import importlib

        module, _, name = target.partition(":")
        hook: Callable[[Any], None] = getattr(importlib.import_module(module), name)
        hook(context)
