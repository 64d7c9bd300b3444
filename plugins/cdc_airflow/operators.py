"""The operator that runs a layer job (`python -m spark_jobs run ...`) on the pipeline service (the default), or
through spark-submit, a Spark of its own per job (docs/architecture.md, "One execution model")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

import spark_jobs
from cdc_airflow.hooks import s3_environment, s3_settings
from cdc_airflow.triggers import ServiceJobTrigger
from spark_jobs.event_log import PASSED
from spark_jobs.landing import is_remote
from spark_jobs.settings import PROJECT_ROOT, Settings, job_environment, settings
from spark_jobs.storage import is_s3

# spark-submit runs the package's entry point as a script
ENTRY_POINT = str(Path(spark_jobs.__file__).parent / "__main__.py")


PERMANENT = (1, 2)  # a gate failed, bad input or config: the same run would fail again
FIGURES = ("files", "events", "inserted", "updated", "deleted", "version")  # of a table's step, in its asset event


def _fail(code: int, cause: str) -> None:
    if code in PERMANENT:
        raise AirflowFailException(cause)
    raise AirflowException(cause)


@dataclass(frozen=True)
class PassOutlets:
    """What a pass task (one job for every table it is handed) tells Airflow once its job has run: an asset event of
    `layer` for each table the run advanced, added to `alias` (Airflow resolves an alias at run time: the task declares
    no asset per table, and a table it did not advance gets no event), with that table's lineage."""

    layer: str
    lake: str
    alias: AssetAlias
    assets: Mapping[str, Asset]  # each table's asset of the layer
    reads: Mapping[str, Sequence[Asset]]  # what each table's step reads: its lineage inputs


def advanced(layer: str, summary: Mapping[str, Any]) -> bool:
    """Did the run's step (its report's summary) advance the table's layer? Bronze: it took files and its gate let
    them through (a failed gate writes nothing)."""
    if summary.get("gate") not in PASSED:
        return False
    if layer == "bronze":
        return bool(summary.get("files") or summary.get("recovered_files"))
    return True


class CdcSparkJob(SparkSubmitOperator):
    """`python -m spark_jobs run ...` (or `maintain ...`) for one table (or gold model) and layer, or for a layer's
    pass over many tables:
    - with CDC_SERVICE_CONN_ID (the embedded default, `make demo`), submitted to the long-lived pipeline service
      that connection names; the task then waits deferred, holding no worker slot, while the job's log comes into
      its own (the service reads and writes its own deployment: only the table, layer, window, files and run id go);
    - otherwise through spark-submit, a Spark of its own (a deployment with no long-lived driver, or one that wants
      a JVM per job).

    S3 credentials go to the job as AWS_* variables from the Airflow connection (set at run time, never
    rendered in the UI). The bronze task takes every table the sensor found files for, with exactly those files
    (`files_from`: the sensor's task id; its XCom maps each table to its paths). A failing job fails the task with
    its one-line cause (table, layer, reason); only transient failures (a busy table, an unreachable store, a
    killed process) are retried.

    A pass task (`announces`) runs one job for many tables: once the job has run, it emits an asset event for each
    table the run advanced, whether or not another table failed (Airflow emits a task's events only when it
    succeeds, and one table's bad batch must not hold back the others'). It then returns the job's failure line,
    which its `TableVerdicts` task turns into the run's failure; a transient failure is retried as above, and the
    retry (same run id, same report) emits the events the first try owed."""

    def __init__(self, *, cli_args: list[str], landing: str, files_from: str | None = None,
                 tables_from: Mapping[str, str] | None = None, announces: PassOutlets | None = None,
                 aws_conn_id: str | None = None, command: str = "run", **kwargs: Any):
        kwargs.setdefault("conn_id", "spark_default")
        # the Spark UI while the job runs: its URL is in the task log's first line (`spark_ui=`)
        kwargs.setdefault("conf", {"spark.ui.enabled": "true", "spark.ui.showConsoleProgress": "false"})
        kwargs.setdefault("env_vars", {"GX_ANALYTICS_ENABLED": "false", Settings.variable("spark_ui"): "true"})
        super().__init__(application=ENTRY_POINT, application_args=[command, *cli_args, "--run-id", "{{ run_id }}"],
                         name=f"cdc-{kwargs['task_id']}", **kwargs)
        self.landing, self.files_from, self.aws_conn_id = landing, files_from, aws_conn_id or settings().aws_conn_id
        self.tables_from, self.announces = tables_from, announces
        self._lineage: tuple[list[Asset], list[Asset]] = ([], [])  # what the tables a pass advanced read, and wrote

    def execute(self, context: Any) -> str | None:  # type: ignore[override]  # a pass task hands on its failure line
        if settings().service_conn_id:
            self._submit(context)  # defers
            return None
        env = dict(self.env_vars or {})
        if is_remote(self.landing) or is_s3(settings().lake_uri):
            env.update(s3_environment(s3_settings(self.aws_conn_id)))
        with tempfile.TemporaryDirectory(prefix="cdc-task-") as scratch:
            self.application_args, files = self._selection(context)
            if files is not None:
                # the sensor's list travels as a file (`--files @path`, read by the driver, which runs here in
                # client mode): as one argument, a backlog of a few thousand files exceeds Linux's 128 KiB
                # limit per argument and the job could not even start (E2BIG)
                listed = Path(scratch) / "files.json"
                listed.write_text(json.dumps(files))
                self.application_args = [*self.application_args, "--files", f"@{listed}"]
            failure = Path(scratch) / "failure.txt"
            self.env_vars = {**env, Settings.variable("failure_file"): str(failure)}
            if self._needs_no_spark():
                code = self._plain_process()
                exited = f"the job exited {code}"
            else:
                self._with_jvm_dependencies()
                try:
                    super().execute(context)
                    code = 0
                except AirflowException as exc:
                    code = getattr(getattr(self._hook, "_submit_sp", None), "returncode", None) or -1
                    exited = f"spark-submit exited {code}: {exc}"
            return self._ended(context, code, (failure.read_text().strip() if failure.exists() else exited) if code else "")

    def _selection(self, context: Any) -> tuple[list[str], list[str] | None]:
        """The job's arguments with the tables it takes, and the landing files it takes (None: those it finds):
        the tables the sensor found files for, with those files (`files_from`); or the tables whose assets
        started the run (`tables_from`: asset name -> table), and in a run no asset event started (by hand, a
        test) the `tables` param's, else every table."""
        args = list(self.application_args or [])
        if self.files_from:
            found: dict[str, list[str]] = context["ti"].xcom_pull(task_ids=self.files_from)
            return [*args, "--tables", ",".join(sorted(found))], sorted(p for paths in found.values() for p in paths)
        if self.tables_from is not None:
            triggered = {self.tables_from[a.name] for a in context.get("triggering_asset_events") or {}
                         if isinstance(a, Asset) and a.name in self.tables_from}
            tables = sorted(triggered) or list((context.get("params") or {}).get("tables") or [])
            if tables:
                return [*args, "--tables", ",".join(tables)], None
        return args, None

    def _ended(self, context: Any, code: int, cause: str) -> str | None:
        """The job has run: a pass task announces what it advanced and hands its failure on (`PassOutlets`); a
        failed job fails its task, a transient failure (of any task) to be retried."""
        if self.announces is None or code not in (0, *PERMANENT):
            if code != 0:
                _fail(code, cause)
            return None
        self._announce(context)
        return cause or None

    def _submit(self, context: Any) -> None:
        """The job goes to the pipeline service: the task's selection (tables, layers, window, run id), the sensor's
        list and the settings a job may bring; the task defers until the job ends. A retry is a new job (the key
        names the try); a resubmitted try gets its first job back."""
        from cdc_airflow.service_hook import PipelineServiceHook
        from spark_jobs.service_client import JOB_SETTINGS, JobRequest, ServiceError

        conn_id = settings().service_conn_id
        own = {name: value for name in JOB_SETTINGS if (value := os.environ.get(Settings.variable(name)))}
        ti = context["ti"]
        args, files = self._selection(context)
        key = f"{ti.dag_id}/{ti.task_id}/{ti.run_id}/{ti.map_index}/{ti.try_number}"
        service = PipelineServiceHook(conn_id)
        try:
            request = JobRequest.from_argv(args, files, own, key)
            service.get_conn()
        except ValueError as exc:
            raise AirflowFailException(f"pipeline service job: {exc}") from None
        try:
            job_id = service.submit(request)
        except ServiceError as exc:
            raise (AirflowFailException if exc.permanent else AirflowException)(str(exc)) from None
        self.log.info("job %s submitted to the pipeline service %s (connection %s); its log follows", job_id,
                      service.url, conn_id)
        self.defer(trigger=ServiceJobTrigger(conn_id=conn_id, job_id=job_id), method_name="execute_complete",
                   timeout=self.execution_timeout)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> str | None:
        if "error" in event:
            raise AirflowException(event["error"])
        self.log.info("the job exited %s after %ss", event["exit_code"], event["seconds"])
        code = event["exit_code"]
        return self._ended(context, code, (event["cause"] or f"the job exited {code}") if code else "")

    def _announce(self, context: Any) -> None:
        """An asset event (with the run's figures) and lineage for each table of the pass the run advanced, from
        the run's report in the lake: every try of the run writes there, so a retry also announces what an
        earlier try did."""
        from spark_jobs import report
        from spark_jobs.lake import Lake

        announces = self.announces
        assert announces is not None
        run_id = context["run_id"]
        remote = s3_environment(s3_settings(self.aws_conn_id)) if is_s3(announces.lake) else {}
        with job_environment(remote):
            summaries = report.load_run(Lake(announces.lake), run_id)
        outlet = context["outlet_events"][announces.alias]
        for summary in summaries:
            table = summary.get("table", "")
            if summary.get("layer") != announces.layer or table not in announces.assets or \
                    not advanced(announces.layer, summary):
                continue
            asset = announces.assets[table]
            extra: dict[str, Any] = {"run_id": run_id, "table": table, "gate": summary["gate"]}
            extra.update({k: summary[k] for k in FIGURES if k in summary})
            outlet.add(asset, extra=extra)
            self._lineage[0].extend(announces.reads.get(table, ()))
            self._lineage[1].append(asset)
            self.log.info("table=%s layer=%s: advanced (gate %s); asset event %s", table, announces.layer,
                          summary["gate"], asset.name)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage's operator protocol (its provider calls it as the task ends): a pass task's inputs and outputs
        are those of the tables it advanced. Nothing here (another task, or a pass that advanced none): the provider
        takes the task's inlets and outlets."""
        from airflow.providers.openlineage.extractors import OperatorLineage
        from airflow.providers.openlineage.utils.utils import translate_airflow_asset

        inputs, outputs = ([d for a in assets if (d := translate_airflow_asset(a, None)) is not None]
                           for assets in self._lineage)
        return OperatorLineage(inputs=inputs, outputs=outputs)

    def _with_jvm_dependencies(self) -> None:
        """spark-submit gets the pinned jars (the provider's `jars`, shipped to the executors) and Delta's SQL
        extension: the job's JVM is started by spark-submit, not by the job (spark_jobs/session.py)."""
        from spark_jobs.session import jvm_conf

        conf = jvm_conf()
        self.jars = conf.pop("spark.jars")
        self.conf = {**conf, **(self.conf or {})}

    def _needs_no_spark(self) -> bool:
        """Maintenance with delta-rs is Delta's own commands in-process: no JVM to start."""
        return (self.application_args or [None])[0] == "maintain" and settings().delta_engine == "delta-rs"

    def _plain_process(self) -> int:
        """The job as a plain Python process, for a job that needs no Spark (no spark-submit, no JVM); its output
        goes to the task's log. Returns its exit code."""
        self._process = subprocess.Popen([sys.executable, ENTRY_POINT, *(self.application_args or [])],
                                         env={**os.environ, **(self.env_vars or {})}, cwd=PROJECT_ROOT,
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


class TableVerdicts(BaseOperator):
    """Fails the run with the failure line its pass task (`of`) handed on: the tables the pass advanced have had their
    asset events (a pass task succeeds once its job has run), the others' failure still fails the run, alerts, and
    names each table and reason. Nothing to hand on: it succeeds."""

    def __init__(self, *, of: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.of = of

    def execute(self, context: Any) -> None:
        failure = context["ti"].xcom_pull(task_ids=self.of)
        if failure:
            raise AirflowFailException(failure)
