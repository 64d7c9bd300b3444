"""The one place a SparkSession is built (jobs run it; tests build their own local[1] fixture)."""

from __future__ import annotations

import os
import socket

from pyspark.sql import SparkSession

from spark_jobs.errors import ConfigError, InfrastructureDown
from spark_jobs.settings import settings

# Settings every job relies on: UTC so Debezium's epoch-based times decode to the same instants
# everywhere; small shuffles because CDC batches are small next to the table; no progress bars, and the UI
# only when asked (CDC_SPARK_UI: a run logs its URL).
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": str(settings().shuffle_partitions),
    # delta-spark rebuilds a table's snapshot (and filters its files for a query) in this many tasks; Delta's
    # default, 50, made 52-task jobs of 2.5 s for each read of a small table on two cores, three quarters of a
    # 1k-event W2 batch's Spark time (25 s -> 7 s at 2-8)
    "spark.databricks.delta.snapshotPartitions": str(settings().shuffle_partitions),
    "spark.ui.enabled": str(settings().spark_ui).lower(),
    "spark.ui.showConsoleProgress": "false",
    # the UI's kill links are GETs a web page could send (an <img> cancelled the service's running job): none
    "spark.ui.killEnabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # Parquet written for delta-rs (the engine's scratch files) keeps microsecond timestamps, as Delta does
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # a read of more paths than this lists them in a Spark job of its own. A whole database's pass reads a file or
    # a few of each table's (landing lines, bronze's new files): at Spark's default, 32, reading 100 small files took
    # 0.6-2.4 s, listed on the driver 0.08 s (tests/benchmarks/RESULTS.md, workload D)
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
    # Spark substitutes ${env:...}, ${system:...}, ${spark:...} and ${hivevar:...} anywhere in SQL text, inside quoted
    # names and literals too. The project writes file names, column names and values into SQL text (quoted:
    # sql_text.ident, sql_text.literal); with substitution on, a landing file named ${env:AWS_SECRET_ACCESS_KEY} put
    # the job's secret into bronze, and a column named ${...} read as NULL. Off for every session built here,
    # spark-submit's and a cluster's included (a runtime setting: build_session sets it on a session it is given)
    "spark.sql.variable.substitute": "false",
}




# Generated classes Spark keeps compiled, for every job of the JVM (a static setting: read when the JVM's first query
# compiles). Spark's default, 100, is less than one small table's batch needs: a 50-event change cycle compiled about
# 210 classes per table, 95 of them distinct, and compiling was 38% of the JVM's time. At 1000 a table's cycle
# compiles each class once, and tables of one shape (shards, one schema per tenant) share them. The heap after a full
# GC grew by up to about 200 MB in-process over 10 tables at two workers, well inside the 2 GB driver
# (tests/benchmarks/RESULTS.md, issue 32).
CODEGEN_CACHE_ENTRIES = 1000


# The share of Spark's memory pool that cached blocks keep from execution (Spark's default: half). What the jobs cache
# are local checkpoints kept on disk too (a read reused two or three times), so evicting one costs a disk read, while
# an aggregate or a sort denied memory fails its task: at 512 MB of driver heap (a pool of about 127 MB) bronze's
# tally of a 50 MB file beside another job failed with UNABLE_TO_ACQUIRE_MEMORY (got 0) while checkpoints of the
# same file held their protected half (tests/airflow/test_service_process.py).
STORAGE_FRACTION = "0.2"


def jvm_conf(master: str) -> dict[str, str]:
    """What a JVM on `master` must start with: the pinned jars (`jar_conf`), Delta's SQL extension and catalog, and
    the driver's heap, and S3A's settings for s3:// and s3a:// paths (spark_jobs/storage.py).
    New Delta tables get deletion vectors, so delta-spark's merges and deletes mark rows instead of rewriting
    whole files (readers of either engine honour them: spark_jobs/delta). Compiled classes are kept for reuse
    (CODEGEN_CACHE_ENTRIES), and cached blocks give way to execution (STORAGE_FRACTION)."""
    from spark_jobs.jvm import DELTA_CONF
    from spark_jobs.storage import hadoop_s3a_conf

    return {**jar_conf(master), **DELTA_CONF, "spark.driver.memory": settings().driver_memory,
            "spark.databricks.delta.properties.defaults.enableDeletionVectors": "true",
            "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
            "spark.memory.storageFraction": STORAGE_FRACTION,
            **{f"spark.hadoop.{k}": v for k, v in hadoop_s3a_conf(with_keys=False).items()}}


def jar_conf(master: str) -> dict[str, str]:
    """The pinned jars (spark_jobs/jvm.py): on a local master, on the JVM's class path, where its in-process executor
    finds them; on a cluster, shipped to the executors (`spark.jars`), or on their class path where each worker
    holds them (CDC_JARS_ON_WORKERS). Spark copies every jar of `spark.jars` into each JVM's scratch folder, even a
    local one: 672 MB a process (the AWS SDK bundle is 654 MB of it), left behind by a JVM killed before its shutdown
    hook."""
    from spark_jobs.jvm import jars

    if master.startswith("local"):
        return {"spark.driver.extraClassPath": os.pathsep.join(jars())}
    if settings().jars_on_workers:  # on each class path where they are (a `local:` jar is still copied per executor)
        class_path = os.pathsep.join(jars())
        return {"spark.driver.extraClassPath": class_path, "spark.executor.extraClassPath": class_path}
    return {"spark.jars": ",".join(jars())}


# addresses that mean every interface: where Spark binds is then left to it (or to SPARK_LOCAL_IP)
_ANY_ADDRESS = ("", "0.0.0.0", "::")


def bind_spark(host: str) -> None:
    """Spark's driver ports and UI (which shows every job and the JVM's environment) on `host`, the address this
    process serves on, unless SPARK_LOCAL_IP already says where. Left alone, Spark binds its UI to every interface and
    its driver to the host's network address. Read when the JVM starts."""
    if host not in _ANY_ADDRESS:
        os.environ.setdefault("SPARK_LOCAL_IP", host)


def build_session(app_name: str, extra: dict[str, str] | None = None) -> SparkSession:
    """The job's session (`extra`: settings of the caller's, e.g. the service's UI filter)."""
    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit (the DAG tasks) the JVM is already up with --master; only bare CLI runs choose one.
    # (spark-submit was given jvm_conf() too: cdc_airflow.operators)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = settings().spark_master
        builder = builder.master(master)
        for key, value in jvm_conf(master).items():
            builder = builder.config(key, value)
        if master.startswith("local"):
            bind_spark("127.0.0.1")  # a local driver has no executor elsewhere to be reached by
            # local mode runs the tasks in the driver: a task's OutOfMemoryError would end the JVM (Spark 4.2 hands
            # fatal task errors to its exit handler), and with it every other job of the pipeline service; failing
            # the task instead names the job's own file (errors.OutOfMemory). On a cluster an executor still exits.
            builder = builder.config("spark.executor.killOnFatalError.depth", "0")
    else:  # the master spark-submit was given is a system property of its JVM, which SparkConf loads
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        master = SparkConf().get("spark.master", "")
    check_master(master)
    for key, value in {**SESSION_CONF, **(extra or {})}.items():
        builder = builder.config(key, value)
    if secret := os.environ.get(SPARK_SECRET_VARIABLE):
        builder = builder.config("spark.authenticate.secret", secret)
    try:
        spark = builder.getOrCreate()
    except ConfigError:
        raise
    except Exception as exc:  # the JVM did not start or a master refused the application: a retry may find it up
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InfrastructureDown(f"the Spark session ({master or 'spark-submit'}) could not start: {first}") from exc
    use_s3_settings(spark)
    spark.sparkContext.setLogLevel(settings().spark_log_level)
    return spark


# Spark's RPC secret where the deployment authenticates it (spark.authenticate: docker-compose.yaml): the standalone
# master and worker, and the executors the worker starts, read it from this variable; a driver only from the setting
# spark.authenticate.secret (Spark refuses to start one on a standalone master without it), set from the same variable,
# so the secret stays out of every file and command line. Spark's UI and logs redact it.
SPARK_SECRET_VARIABLE = "_SPARK_AUTH_SECRET"

MASTER_ANSWER_S = 10


def check_master(master: str) -> None:
    """A standalone master (spark://host:port, or several for high availability) must answer on its port, or the run
    stops at once as transient, before anything is written: Spark itself would keep trying to register for a
    minute, then stop the context under the run's first job."""
    if not master.startswith("spark://"):
        return
    reasons = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=MASTER_ANSWER_S).close()
            return
        except (OSError, ValueError) as exc:
            reasons.append(f"{address}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}")
    raise InfrastructureDown(f"the Spark master {master} does not answer ({'; '.join(reasons)})")


def use_s3_settings(spark: SparkSession) -> None:
    """S3A's settings with the keys, from this process's AWS_* environment (under spark-submit, the task's,
    not the submitter's), set on the session: Spark
    copies a session's settings into the Hadoop configuration of every file read and Delta commit (by
    their Hadoop names: the `spark.hadoop.` prefix is stripped only at start-up), ships it to the
    executors with each job, and redacts the keys in its UI and logs."""
    from spark_jobs.storage import hadoop_s3a_conf

    for key, value in hadoop_s3a_conf().items():
        spark.conf.set(key, value)


SPARK_EXIT_OOM = 52  # Spark's exit code when a task's OutOfMemoryError ends the JVM (SparkExitCode.OOM)
# Set by the pipeline service, whose jobs share one JVM: its death by running out of memory is then the doing of
# whichever job's task raised the error (its exception says so), not of every job that lost the JVM with it
SHARED_JVM = False


def ran_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` comes from this job running the driver's JVM out of memory: an OutOfMemoryError in its message,
    or, in a JVM of its own, the JVM gone with Spark's exit code for it (local mode runs the tasks in the driver,
    so a task's OOM ends it)."""
    if "java.lang.OutOfMemoryError" in str(exc):
        return True
    if SHARED_JVM:
        return False
    from py4j.protocol import Py4JNetworkError
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is None or not isinstance(exc, Py4JNetworkError | ConnectionError):  # the JVM is not gone
        return False
    try:
        return bool(process.wait(timeout=10) == SPARK_EXIT_OOM)  # the connection drops just before the exit
    except Exception:  # still running (a network fault, not a death), or not a process of ours
        return False


# Spark's own filter for its UI (org.apache.spark.ui.JWSFilter, Spark 4): every request must carry a bearer JWS signed
# with the key it is given. The pipeline service derives the key from its secret (service_client.spark_ui_key), so
# whoever holds the secret, and nobody else, reaches its UI (`python -m spark_jobs spark-ui-token` makes one)
UI_FILTER = "org.apache.spark.ui.JWSFilter"


def ui_filter(key: str) -> dict[str, str]:
    """The settings that put the UI behind the JWS filter with `key` (base64url; Spark redacts it as a secret)."""
    return {"spark.ui.filters": UI_FILTER, f"spark.{UI_FILTER}.param.secretKey": key}
