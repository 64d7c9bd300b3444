"""The operator that runs a layer job (`python -m spark_jobs run ...`) on the pipeline service (the default), or
through spark-submit, a Spark of its own per job (docs/architecture.md, "One execution model")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

import spark_jobs
from cdc_airflow.hooks import s3_environment, s3_settings
from cdc_airflow.triggers import ServiceJobTrigger
from spark_jobs.landing import is_remote
from spark_jobs.settings import PROJECT_ROOT, Settings, settings
from spark_jobs.storage import is_s3

# spark-submit runs the package's entry point as a script
ENTRY_POINT = str(Path(spark_jobs.__file__).parent / "__main__.py")


def _fail(code: int, cause: str) -> None:
    if code in (1, 2):  # a gate failed, bad input or config: the same run would fail again
        raise AirflowFailException(cause)
    raise AirflowException(cause)


class CdcSparkJob(SparkSubmitOperator):
    """`python -m spark_jobs run ...` (or `maintain ...`) for one table (or gold model) and layer:
    - with CDC_SERVICE_CONN_ID (the embedded default, `make demo`), submitted to the long-lived pipeline service
      that connection names; the task then waits deferred, holding no worker slot, while the job's log comes into
      its own (the service reads and writes its own deployment: only the table, layer, window, files and run id go);
    - otherwise through spark-submit, a Spark of its own (a deployment with no long-lived driver, or one that wants
      a JVM per job).

    S3 credentials go to the job as AWS_* variables from the Airflow connection (set at run time, never
    rendered in the UI). The bronze task takes its table's file list from the sensor's XCom (`files_from`: the
    sensor's task id and the table). A failing
    job fails the task with its one-line cause (table, layer, reason); only transient failures (a busy
    table, an unreachable store, a killed process) are retried."""

    def __init__(self, *, cli_args: list[str], landing: str, files_from: tuple[str, str] | None = None,
                 aws_conn_id: str | None = None, command: str = "run", **kwargs: Any):
        kwargs.setdefault("conn_id", "spark_default")
        # the Spark UI while the job runs: its URL is in the task log's first line (`spark_ui=`)
        kwargs.setdefault("conf", {"spark.ui.enabled": "true", "spark.ui.showConsoleProgress": "false"})
        kwargs.setdefault("env_vars", {"GX_ANALYTICS_ENABLED": "false", Settings.variable("spark_ui"): "true"})
        super().__init__(application=ENTRY_POINT, application_args=[command, *cli_args, "--run-id", "{{ run_id }}"],
                         name=f"cdc-{kwargs['task_id']}", **kwargs)
        self.landing, self.files_from, self.aws_conn_id = landing, files_from, aws_conn_id or settings().aws_conn_id

    def execute(self, context: Any) -> None:
        if settings().service_conn_id:
            self._submit(context)  # defers
            return
        env = dict(self.env_vars or {})
        if is_remote(self.landing) or is_s3(settings().lake_uri):
            env.update(s3_environment(s3_settings(self.aws_conn_id)))
        with tempfile.TemporaryDirectory(prefix="cdc-task-") as scratch:
            if self.files_from:
                # the sensor's list travels as a file (`--files @path`, read by the driver, which runs here in
                # client mode): as one argument, a backlog of a few thousand files exceeds Linux's 128 KiB
                # limit per argument and the job could not even start (E2BIG)
                listed = Path(scratch) / "files.json"
                listed.write_text(json.dumps(self._sensed(context["ti"])))
                self.application_args = [*(self.application_args or []), "--files", f"@{listed}"]
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
            if code != 0:
                _fail(code, failure.read_text().strip() if failure.exists() else exited)

    def _sensed(self, ti: Any) -> list[str]:
        """The table's landing files, as the sensor found them."""
        assert self.files_from is not None
        sensor, table = self.files_from
        return sorted(ti.xcom_pull(task_ids=sensor)[table])

    def _submit(self, context: Any) -> None:
        """The job goes to the pipeline service: the task's selection (tables, layers, window, run id), the sensor's
        list and the settings a job may bring; the task defers until the job ends. A retry is a new job (the key
        names the try); a resubmitted try gets its first job back."""
        from cdc_airflow.service_hook import PipelineServiceHook
        from spark_jobs.service_client import JOB_SETTINGS, JobRequest, ServiceError

        conn_id = settings().service_conn_id
        own = {name: value for name in JOB_SETTINGS if (value := os.environ.get(Settings.variable(name)))}
        ti = context["ti"]
        files = self._sensed(ti) if self.files_from else None
        key = f"{ti.dag_id}/{ti.task_id}/{ti.run_id}/{ti.map_index}/{ti.try_number}"
        service = PipelineServiceHook(conn_id)
        try:
            request = JobRequest.from_argv(list(self.application_args or []), files, own, key)
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

    def execute_complete(self, context: Any, event: dict[str, Any]) -> None:
        if "error" in event:
            raise AirflowException(event["error"])
        self.log.info("the job exited %s after %ss", event["exit_code"], event["seconds"])
        if event["exit_code"] != 0:
            _fail(event["exit_code"], event["cause"] or f"the job exited {event['exit_code']}")

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
