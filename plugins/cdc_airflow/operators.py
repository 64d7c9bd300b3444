"""The operator that runs a layer job (`python -m spark_jobs run ...`) on the pipeline service (the default), or
through spark-submit, a Spark of its own per job (docs/architecture.md, "One execution model")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, AssetAlias, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

import spark_jobs
from cdc_airflow.hooks import s3_environment, s3_settings
from cdc_airflow.params import landing_window_args
from cdc_airflow.triggers import ServiceJobTrigger, job_ended
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
    them through (a failed gate writes nothing). Gold: its refresh published a new version (one that found its
    sources unchanged, or the rows it would publish those already published, publishes none: GoldSummary.published)."""
    if layer == "gold":  # a failed gate publishes nothing; a retry of the run that published says it did
        return bool(summary.get("published"))
    if summary.get("gate") not in PASSED:
        return False
    if layer == "bronze":
        return bool(summary.get("files") or summary.get("recovered_files"))
    return True


class CdcSparkJob(BaseOperator):
    """`python -m spark_jobs run ...` (or `maintain ...`) for one table (or gold model) and layer, or for a layer's
    pass over many tables:
    - with CDC_SERVICE_CONN_ID (the embedded default, `make demo`), submitted to the long-lived pipeline service
      that connection names; the task then waits for it on its worker for up to CDC_TASK_WAIT seconds, and after
      that deferred, holding no worker slot, while the job's log comes into its own (the service reads and writes
      its own deployment: only the table, layer, window, files and run id go);
    - otherwise through spark-submit, a Spark of its own (a deployment with no long-lived driver, or one that wants
      a JVM per job), by the Spark provider's hook with the `conn_id` connection, in client mode. The hook, imported
      when the task runs, and not the provider's operator as a base class: its module's imports (OpenLineage's
      listener, Airflow's ORM) cost 0.3 s of every task start's DAG parse, on the path from a landing to gold (W5).

    S3 credentials go to the job as AWS_* variables from the Airflow connection (set at run time, never
    rendered in the UI). The bronze task takes every table the sensor found files for, with exactly those files
    (`files_from`: the sensor's task id; its XCom maps each table to its paths); with no sensor (`topic_tables`:
    landings notified), the tables of the topics the notifications named (every table in a run no notification
    started), the job listing the files bronze has not taken in the run's window itself. A
    failing job fails the task with its one-line cause (table, layer, reason); only transient failures (a busy table,
    an unreachable store, a killed process) are retried.

    A pass task (`announces`) runs one job for many tables: once the job has run, it emits an asset event for each
    table the run advanced, whether or not another table failed (Airflow emits a task's events only when it
    succeeds, and one table's bad batch must not hold back the others'). It then returns the job's failure line,
    which its `TableVerdicts` task turns into the run's failure; a transient failure is retried as above, and the
    retry (same run id, same report) emits the events the first try owed."""

    template_fields: Sequence[str] = ("application_args",)

    def __init__(self, *, cli_args: list[str], landing: str, files_from: str | None = None,
                 topic_tables: Mapping[str, str] | None = None,
                 tables_from: Mapping[str, str] | None = None, announces: Sequence[PassOutlets] = (),
                 aws_conn_id: str | None = None, command: str = "run",
                 conn_id: str = "spark_default",
                 conf: dict[str, str] | None = None, env_vars: dict[str, str] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.application_args = [command, *cli_args, "--run-id", "{{ run_id }}"]
        # spark-submit's: the Spark UI while the job runs only when CDC_SPARK_UI asks (its URL in the task log's first
        # line, `spark_ui=`): it has no login of its own
        self.conn_id = conn_id
        ui = str(settings().spark_ui).lower()
        self.conf = {"spark.ui.enabled": ui, "spark.ui.killEnabled": "false", "spark.ui.showConsoleProgress": "false"} \
            if conf is None else conf
        self.env_vars = {"GX_ANALYTICS_ENABLED": "false", Settings.variable("spark_ui"): ui} if env_vars is None \
            else env_vars
        self.landing, self.files_from, self.aws_conn_id = landing, files_from, aws_conn_id or settings().aws_conn_id
        self.tables_from, self.announces, self.topic_tables = tables_from, tuple(announces), topic_tables
        self._lineage: tuple[list[Asset], list[Asset]] = ([], [])  # what the tables a pass advanced read, and wrote
        # each output's column lineage, as its step's summary traced it (`table.field`s), and what the step read
        self._columns: dict[str, tuple[dict[str, list[str]], Sequence[Asset]]] = {}
        self._process: subprocess.Popen[str] | None = None
        self._spark: Any = None  # the Spark provider's SparkSubmitHook, while spark-submit runs

    def execute(self, context: Any) -> str | None:  # a pass task hands on its failure line
        if settings().service_conn_id:
            return self._submit(context)  # waits, or defers
        env = dict(self.env_vars)
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
                code, exited = self._spark_submit()
            return self._ended(context, code, (failure.read_text().strip() if failure.exists() else exited) if code else "")

    def _selection(self, context: Any) -> tuple[list[str], list[str] | None]:
        """The job's arguments with the tables it takes, and the landing files it takes (None: those it finds):
        the tables the sensor found files for, with those files (`files_from`); the notified tables (or every
        table), in the run's landing window (`topic_tables`); or the tables whose assets started the run
        (`tables_from`: asset name -> table), and in a run no asset event started (by hand, a test) the `tables`
        param's, else every table."""
        args = list(self.application_args)
        if self.files_from:
            found: dict[str, list[str]] = context["ti"].xcom_pull(task_ids=self.files_from)
            return [*args, "--tables", ",".join(sorted(found))], sorted(p for paths in found.values() for p in paths)
        if self.topic_tables is not None:
            return [*args, *self._notified_tables(context), *landing_window_args(context)], None
        if self.tables_from is not None:
            triggered = {self.tables_from[a.name] for a in context.get("triggering_asset_events") or {}
                         if isinstance(a, Asset) and a.name in self.tables_from}
            tables = sorted(triggered) or list((context.get("params") or {}).get("tables") or [])
            if tables:
                return [*args, "--tables", ",".join(tables)], None
        return args, None

    def _notified_tables(self, context: Any) -> list[str]:
        """`--tables` of a run the landing queue started: the registered tables of the topics its notifications name
        (`topic_tables`: topic -> table), so that its pass lists only those; [] (every table) for any other run, or
        when an event does not name its topics."""
        assert self.topic_tables is not None
        topics: set[str] = set()
        for events in (context.get("triggering_asset_events") or {}).values():
            for event in events:
                named = ((event.extra or {}).get("payload") or {}).get("topics")
                if not isinstance(named, list):
                    return []
                topics.update(str(t) for t in named)
        tables = sorted({self.topic_tables[t] for t in topics if t in self.topic_tables})
        return ["--tables", ",".join(tables)] if tables else []

    def _ended(self, context: Any, code: int, cause: str) -> str | None:
        """The job has run: the task announces what it advanced (`PassOutlets`). A pass over tables (bronze, silver)
        hands a table's failure on to its verdicts task; a gold model's task is its model's, so its failure is the
        task's; a failed job otherwise fails its task, a transient failure (of any task) to be retried."""
        hands_on = any(a.layer != "gold" for a in self.announces) and code in PERMANENT
        if code != 0 and not hands_on:
            _fail(code, cause)
        if not self.announces:
            return None
        self._announce(context)
        return cause or None

    def _submit(self, context: Any) -> str | None:
        """The job goes to the pipeline service: the task's selection (tables, layers, window, run id), the sensor's
        list and the settings a job may bring; the task waits for it up to CDC_TASK_WAIT seconds, then defers until
        it ends. A retry is a new job (the key names the try); a resubmitted try gets its first job back."""
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
        self.log.info("job %s submitted to the pipeline service %s (connection %s): %s%s; its log follows", job_id,
                      service.url, conn_id, " ".join(args), f" and {len(files)} landing file(s)" if files else "")
        ended, offset = self._wait(service, job_id)
        if ended is not None:
            return self.execute_complete(context, ended)
        self.defer(trigger=ServiceJobTrigger(conn_id=conn_id, job_id=job_id, offset=offset),
                   method_name="execute_complete", timeout=self.execution_timeout)
        raise AssertionError("defer() raises")  # pragma: no cover

    def _wait(self, service: Any, job_id: str) -> tuple[dict[str, Any] | None, int]:
        """Polls the job from the worker for up to CDC_TASK_WAIT seconds, its log copied into the task's: how it
        ended (the trigger's event), or None and the log offset reached, for the trigger to go on from. The
        service unreachable: the trigger waits that out."""
        from spark_jobs.service_client import ServiceError

        deadline, offset = time.monotonic() + settings().task_wait, 0
        while time.monotonic() < deadline:
            try:
                status = service.poll(job_id, offset)
            except ServiceError:
                break
            for line in status.log.splitlines():
                self.log.info("%s", line)
            offset = status.offset
            if status.done:
                return job_ended(status), offset
            time.sleep(0.1)
        return None, offset

    def execute_complete(self, context: Any, event: dict[str, Any]) -> str | None:
        if "error" in event:
            raise AirflowException(event["error"])
        self.log.info("the job exited %s after %ss", event["exit_code"], event["seconds"])
        code = event["exit_code"]
        return self._ended(context, code, (event["cause"] or f"the job exited {code}") if code else "")

    def _announce(self, context: Any) -> None:
        """An asset event (with the run's figures) and lineage for each table of the pass the run advanced, in each
        layer it announces, from the run's report in the lake: every try of the run writes there, so a retry also
        announces what an earlier try did."""
        run_id, summaries = context["run_id"], self._summaries(context)
        self._lineage, self._columns = ([], []), {}  # this try's: what its run advanced
        for announces in self.announces:
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
                if summary.get("lineage"):
                    self._columns[asset.name] = (summary["lineage"], announces.reads.get(table, ()))
                self.log.info("table=%s layer=%s: advanced (gate %s); asset event %s", table, announces.layer,
                              summary["gate"], asset.name)

    def _summaries(self, context: Any) -> list[dict[str, Any]]:
        """The run's report (every step's summary) from the lake the task announces tables of."""
        from spark_jobs import report
        from spark_jobs.lake import Lake

        lake = self.announces[0].lake
        remote = s3_environment(s3_settings(self.aws_conn_id)) if is_s3(lake) else {}
        with job_environment(remote):
            return report.load_run(Lake(lake), context["run_id"])

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage's operator protocol (its provider calls it as the task ends): a pass task's inputs and outputs
        are those of the tables it advanced, a gold task's its model's sources and table; each output with its
        column-lineage facet (the columns its step traced to the fields it read). Nothing here (another task, or a
        pass that advanced none): the provider takes the task's inlets and outlets."""
        from airflow.providers.openlineage.extractors import OperatorLineage
        from airflow.providers.openlineage.utils.utils import translate_airflow_asset

        inputs = [d for a in self._lineage[0] if (d := translate_airflow_asset(a, None)) is not None]
        outputs = []
        for asset in self._lineage[1]:
            dataset = translate_airflow_asset(asset, None)
            if dataset is not None and asset.name in self._columns:
                dataset.facets = {**(dataset.facets or {}), "columnLineage": _column_facet(*self._columns[asset.name])}
            if dataset is not None:
                outputs.append(dataset)
        return OperatorLineage(inputs=inputs, outputs=outputs)

    def _spark_submit(self) -> tuple[int, str]:
        """The job through spark-submit (the provider's hook): its exit code, and what to say when it failed. It gets
        the pinned jars (on the class path of a local master, else shipped to the executors) and Delta's SQL
        extension: the job's JVM is started by spark-submit, not by the job (spark_jobs/session.py)."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from spark_jobs.session import jvm_conf

        # the connection's master as the hook resolves it: a local one gets the jars on its class path (jar_conf)
        master = SparkSubmitHook(conn_id=self.conn_id)._connection["master"]
        conf = jvm_conf(master)
        jars, class_path = conf.pop("spark.jars", None), conf.pop("spark.driver.extraClassPath", None)
        self._spark = SparkSubmitHook(conf={**conf, **self.conf}, conn_id=self.conn_id, jars=jars,
                                      driver_class_path=class_path, name=f"cdc-{self.task_id}",
                                      application_args=self.application_args, env_vars=self.env_vars)
        try:
            self._spark.submit(ENTRY_POINT)
        except AirflowException as exc:
            code = getattr(getattr(self._spark, "_submit_sp", None), "returncode", None) or -1
            return code, f"spark-submit exited {code}: {exc}"
        return 0, ""

    def _needs_no_spark(self) -> bool:
        """Maintenance with delta-rs is Delta's own commands in-process: no JVM to start."""
        return self.application_args[0] == "maintain" and settings().delta_engine == "delta-rs"

    def _plain_process(self) -> int:
        """The job as a plain Python process, for a job that needs no Spark (no spark-submit, no JVM); its output
        goes to the task's log. Returns its exit code."""
        self._process = subprocess.Popen([sys.executable, ENTRY_POINT, *self.application_args],
                                         env={**os.environ, **self.env_vars}, cwd=PROJECT_ROOT,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.log.info("%s", line.rstrip())
        return self._process.wait()

    def on_kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
        elif self._spark is not None:
            self._spark.on_kill()


def _column_facet(traced: Mapping[str, list[str]], reads: Sequence[Asset]) -> Any:
    """OpenLineage's column-lineage facet of an output: each column and the fields it is made from (`traced`:
    `table.field`s), each named in the dataset of that table among what the step read (`reads`: assets named
    `cdc.<layer>.<table>`)."""
    from airflow.providers.openlineage.utils.utils import translate_airflow_asset
    from openlineage.client.facet_v2 import column_lineage_dataset as facet

    datasets = {a.name.split(".", 2)[-1]: d for a in reads if (d := translate_airflow_asset(a, None)) is not None}
    return facet.ColumnLineageDatasetFacet(fields={column: facet.Fields(inputFields=[
        facet.InputField(datasets[table].namespace, datasets[table].name, field)
        for table, _, field in (source.partition(".") for source in sources) if table in datasets])
        for column, sources in traced.items()})


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
