"""Every CDC_* environment variable the project reads, in one frozen dataclass (docs/architecture.md,
"Environment"). Read with `settings()` each time it is needed, so a changed environment (a test, an
Airflow task's env_vars) takes effect without re-importing anything.

Pure Python: the DAG files and the Airflow plugin import this while parsing."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    """Each field is read from `CDC_<FIELD NAME IN CAPITALS>`; the defaults are the embedded setup's."""

    config: str = "include/tables.yaml"  # CDC_CONFIG: the table registry (gold models in gold/ beside it)
    landing_uri: str = "data/landing"  # CDC_LANDING_URI: where the S3 sink writes (a path or s3://bucket/prefix)
    lake_uri: str = "data/lake"  # CDC_LAKE_URI: the lake root (a path on a filesystem every process sees)
    sensor_timeout: float = 600.0  # CDC_SENSOR_TIMEOUT: seconds a run's sensor waits for landing files
    sensor_poke_interval: float = 60.0  # CDC_SENSOR_POKE_INTERVAL: seconds between its listings
    # CDC_BRONZE_INTERVAL_MINUTES: cdc_bronze's schedule, and the data interval a backfill run covers (transaction-
    # consistent gold models look for new ENDs as often)
    bronze_interval_minutes: int = 15
    # CDC_RETRY_DELAY: seconds before a failed task's first retry (doubling at each next, up to 10 minutes)
    retry_delay: float = 30.0
    aws_conn_id: str = "aws_default"  # CDC_AWS_CONN_ID: the Airflow connection holding the S3 credentials
    # CDC_LANDING_QUEUE: an SQS queue's URL that receives the landing bucket's object-created notifications; set, a
    # landed file starts cdc_bronze at once (the 15-minute schedule and its sensor stay, as the fallback)
    landing_queue: str = ""
    # CDC_SERVICE_CONN_ID: the Airflow connection (address and secret) of the pipeline service (`python -m spark_jobs
    # serve`) the Airflow tasks submit their jobs to; empty: each task starts its own Spark through spark-submit
    service_conn_id: str = ""
    # CDC_TASK_WAIT: seconds a task waits on its worker for its service job before it defers: a job that ends by then
    # (a change batch's usually does) spares the task a deferral and a resume, each a scheduler round trip and a task
    # process (about 3 s of a 5 s task: tests/benchmarks/RESULTS.md, W5); 0: defer at once
    task_wait: float = 30.0
    # CDC_SERVICE_TOKEN: the service's secret, required of every request; unset, the service makes one at each start
    service_token: str = ""
    # CDC_SERVICE_CONNECTION_FILE: where the service writes its Airflow connection (address and secret, mode 600)
    service_connection_file: str = ".service-connection.json"
    # CDC_SERVICE_WARM_UP: the service runs a small sample load through its pipeline before it takes jobs (a local
    # master only), so that its first job pays no JVM warm-up (spark_jobs/warm_up.py)
    service_warm_up: bool = True
    spark_master: str = "local[*]"  # CDC_SPARK_MASTER: the master of a session of its own (the service's, a CLI run's)
    spark_ui: bool = False  # CDC_SPARK_UI: a run that starts its own Spark serves its UI (the URL in its first line)
    spark_log_level: str = "ERROR"  # CDC_SPARK_LOG_LEVEL: Spark's log level in a session of its own
    # CDC_DRIVER_MEMORY: the driver's heap (local mode: its executors' too); landing files are read line by line,
    # so it bounds the longest line, not the largest file (one 50 MB line ran out of 1 GB)
    driver_memory: str = "2g"
    # CDC_MAX_GZIP_BYTES: a .json.gz landing file larger than this is quarantined whole (file_too_large): gzip
    # cannot be split, so one task reads it all
    max_gzip_bytes: int = 256 * 2**20
    shuffle_partitions: int = 8  # CDC_SHUFFLE_PARTITIONS: spark.sql.shuffle.partitions
    delta_engine: str = "delta-rs"  # CDC_DELTA_ENGINE: delta-rs | delta-spark (docs/architecture.md, "Delta engines")
    jars_dir: str = ".jars"  # CDC_JARS_DIR: where `make jars` put the pinned JVM jars (spark_jobs/jvm.py)
    # CDC_JARS_ON_WORKERS: a cluster's workers hold the pinned jars at CDC_JARS_DIR's path too (the compose image does):
    # each application puts them on its executors' class path instead of shipping them a 672 MB copy
    jars_on_workers: bool = False
    spill_dir: str = ""  # CDC_SPILL_DIR: delta-rs merge sources too big for memory (default: the temp folder)
    merge_source_mb: int = 256  # CDC_MERGE_SOURCE_MB: merge sources up to this size stay in memory (delta-rs)
    max_line_bytes: int = 16 * 2**20  # CDC_MAX_LINE_BYTES: a longer landing line is quarantined, never parsed
    # CDC_BRONZE_BATCH_FILES: a bronze run takes its landing files in batches of this many, each its own commit
    bronze_batch_files: int = 1000
    # CDC_TABLE_WORKERS: a run over several tables works on this many at once (each table's steps in order): a
    # small table's steps are mostly waits on Spark's scheduling and the stores, which overlap
    table_workers: int = 2
    # CDC_GOLD_MAX_CHANGES: a gold model kept incrementally (layers/gold_plan.py) is rewritten whole when its sources
    # changed more rows than this since its last refresh (a backfill, a rebuild): then one scan costs less
    gold_max_changes: int = 200_000
    lock_timeout: float = 900.0  # CDC_LOCK_TIMEOUT: seconds a run waits for another writer of its table
    failure_file: str = ""  # CDC_FAILURE_FILE: where a failed run writes its one-line cause (for the task)
    on_failure_callback: str = ""  # CDC_ON_FAILURE_CALLBACK: module:function the DAGs' failure hook calls
    alert_smtp_conn_id: str = ""  # CDC_ALERT_SMTP_CONN_ID: an Airflow SMTP connection failures and deadlines are mailed by
    alert_to: str = ""  # CDC_ALERT_TO: the addresses to mail, comma-separated
    run_deadline: int = 7200  # CDC_RUN_DEADLINE: seconds after a run is queued by which it should be done (0: no alert)
    debug: bool = False  # CDC_DEBUG: a failed run prints its traceback too
    log_level: str = "INFO"  # CDC_LOG_LEVEL: DEBUG | INFO | WARNING | ERROR, the least a run's lines say (spark_jobs.logs)

    @staticmethod
    def variable(name: str) -> str:
        return f"CDC_{name.upper()}"


# the least value of a number setting (a count or a time); none is ever NaN or infinite
_LEAST: dict[str, float] = {
    "sensor_timeout": 0, "sensor_poke_interval": 0.1, "task_wait": 0, "max_gzip_bytes": 1, "shuffle_partitions": 1,
    "merge_source_mb": 0, "max_line_bytes": 1, "bronze_batch_files": 1, "table_workers": 1, "lock_timeout": 0,
    "gold_max_changes": 0,
    "run_deadline": 0}
_CHOICES = {"delta_engine": ("delta-rs", "delta-spark"), "log_level": ("DEBUG", "INFO", "WARNING", "ERROR")}
_FIELDS = {f.name: f for f in fields(Settings)}


def setting_value(name: str, raw: str) -> object:
    """A setting's value from its text, or ValueError naming its variable and what it must be."""
    variable, kind = Settings.variable(name), type(_FIELDS[name].default)  # every field has a plain default
    assert kind in (bool, int, float, str), kind
    if kind is bool:
        return raw.lower() not in ("0", "false", "no")
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{variable}={raw!r} is not a valid {kind.__name__}") from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{variable}={raw!r} is not a finite number")
    if name in _LEAST and value < _LEAST[name]:
        raise ValueError(f"{variable}={raw!r}: it must be {_LEAST[name]:g} or more")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise ValueError(f"{variable}={raw!r}: choose from {', '.join(_CHOICES[name])}")
    return value


def settings() -> Settings:
    """The settings from the current environment; an unset or empty variable keeps its default."""
    values: dict[str, object] = {}
    for name in _FIELDS:
        raw = environ.get(Settings.variable(name), "")
        if raw != "":
            values[name] = setting_value(name, raw)
    return Settings(**values)  # type: ignore[arg-type]


# A job the pipeline service runs (spark_jobs/service.py) brings its task's variables; jobs share the process,
# so they are laid over os.environ for the job's thread only instead of being written into it
_job_variables: ContextVar[Mapping[str, str] | None] = ContextVar("cdc_job_variables", default=None)


class _Environment(Mapping[str, str]):
    """os.environ as the current job sees it: the job's own variables first (none outside the service)."""

    def __getitem__(self, name: str) -> str:
        overlay = _job_variables.get()
        if overlay is not None and name in overlay:
            return overlay[name]
        return os.environ[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**os.environ, **(_job_variables.get() or {})})

    def __len__(self) -> int:
        return len({**os.environ, **(_job_variables.get() or {})})


environ: Mapping[str, str] = _Environment()  # read CDC_* and AWS_* through this, never os.environ


@contextmanager
def job_environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Within this block (in this thread), `environ` and `settings()` see `variables` over the process's own."""
    token = _job_variables.set(dict(variables))
    try:
        yield
    finally:
        _job_variables.reset(token)


def resolve(path: str | os.PathLike[str]) -> Path:
    """Relative paths are relative to the project root, not to the caller's working folder."""
    p = Path(path)
    return p if p.is_absolute() else PROJECT_ROOT / p


def resolve_uri(uri: str) -> str:
    """Local paths become absolute (project-root relative); s3:// URIs pass through."""
    return uri if "://" in uri else str(resolve(uri))
