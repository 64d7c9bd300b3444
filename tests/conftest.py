"""Shared fixtures: one local[1] Spark session for the whole run (docs/architecture.md, "Tests"), UTC everywhere."""

from __future__ import annotations

import os
import sys
import tempfile
import time

import pytest

from tests.support import ROOT, SERIAL_GC, SHORT_LIVED_JVM, postgres, s3_server

ARTIFACTS = ROOT / "test-artifacts"
os.environ["TZ"] = "UTC"
time.tzset()
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ["CDC_SHUFFLE_PARTITIONS"] = "1"
os.environ["CDC_DELTA_ENGINE"] = "delta-rs"
# tests importing Airflow in this process get a throwaway home, never the project's or the user's
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="cdc-tests-airflow-")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def spark(soak):
    from pyspark.sql import SparkSession

    from spark_jobs.session import SESSION_CONF, jvm_conf

    builder = SparkSession.builder.master("local[1]").appName("cdc-tests")
    # this JVM lives for the whole run, hundreds of pipeline runs: C2's code pays off here, so it starts with the
    # JVM's default compilers (on C1 alone the two workers' sessions spent 35 CPU-minutes in a run's first 34 minutes,
    # against 28 for a whole run with C2); its collector is the serial one, as every test JVM's (pytest_configure)
    short_lived = os.environ.pop("SPARK_SUBMIT_OPTS", None)
    # one JVM serves the whole suite: let it drop unreferenced checkpoints often, not every 30 minutes
    test_conf = {"spark.sql.shuffle.partitions": "1", "spark.cleaner.periodicGC.interval": "1min",
                 # a JVM that dies leaves its reason where pytest_terminal_summary prints it
                 "spark.driver.extraJavaOptions": f"-XX:ErrorFile={ARTIFACTS}/hs_err_pid%p.log"
                                                  + ("" if soak else f" {SERIAL_GC}"),
                 # tests start an S3 server per test on a new port: Hadoop's cached S3A filesystems (one per
                 # bucket) would keep talking to the first one
                 "spark.hadoop.fs.s3a.impl.disable.cache": "true", "spark.hadoop.fs.s3.impl.disable.cache": "true"}
    # the pinned jars and Delta's extension, as every job's session has them (a missing jar fails here)
    for key, value in {**SESSION_CONF, **jvm_conf("local[1]"), **test_conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if short_lived is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = short_lived
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# The JVMs' collector is the serial one (tests/support.SERIAL_GC): the tests' heaps are small and two workers share two
# cores, where G1's concurrent threads (the JVM's default here) cost CPU the other worker needs. Measured on
# tests/layers/test_pipeline.py alone: 191-216 CPU-s against 241-244 with G1.


def pytest_configure(config):
    """The JVMs `make test`'s tests start live for seconds to minutes: C1 alone compiles what they run in much less
    CPU than C2 would (a third less for a JVM's start and first runs, measured), which on two cores is time taken from
    the other worker. Every JVM a test starts inherits it: SPARK_SUBMIT_OPTS reaches the drivers spark-submit and
    pyspark start (the pipeline service, CLI runs, the tasks'), SPARK_DAEMON_JAVA_OPTS the cluster's master and
    worker; not the worker's own long-lived session (`spark`). `make soak` runs long jobs, as deployments do: with
    the JVM's default compilers and collector."""
    if not config.getoption("--soak"):
        for variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
            os.environ[variable] = f"{os.environ.get(variable, '')} {SHORT_LIVED_JVM}".strip()


# The test files that take longest (worker-seconds from `make test`'s junit.xml, heaviest first). `make test` runs them
# first, each file on one worker (--dist loadfile --no-loadscope-reorder), so the two workers end together instead of
# one running a long file alone at the end (xdist's own order, by number of tests, put the single-test end-to-end
# files last). A file not listed keeps its place after these. xdist hands a worker its next file while it still has
# two tests to run, so the first worker takes the 1st and 3rd files here, the second the 2nd and 4th. Each worker's
# Spark session starts and warms up during the first file that uses it (a minute and a half under load, measured):
# the 2nd and 3rd are short files for that. Airflow's two stacks (1st and 4th) overlap for a minute instead of
# starting together, when each took 230 s instead of about 190.
HEAVIEST_FIRST = (
    "airflow/test_scheduler.py", "layers/test_transaction_topic.py", "quality/test_quality.py",
    "cluster/test_cluster_airflow.py", "layers/test_silver_pass.py", "layers/test_transactions.py",
    "airflow/test_service_process.py", "unit/test_delta_engines.py", "layers/test_crash_safety.py",
    "properties/test_incremental_gold.py", "properties/test_properties.py", "airflow/test_demo.py",
    "airflow/test_compose.py", "airflow/test_landing_queue.py", "layers/test_recorded.py", "layers/test_pipeline.py",
    "cluster/test_cluster.py", "airflow/test_service.py", "layers/test_bronze_pass.py", "layers/test_hostile_input.py",
    "layers/test_faults.py", "airflow/test_backlog.py", "layers/test_silver_pass_typing.py", "layers/test_operations.py",
    "layers/test_type_widening.py", "layers/test_incremental_gold.py", "layers/test_batch_sizes.py",
    "layers/test_cli_process.py", "layers/test_maintenance.py", "quality/test_user_expectations.py",
)


UNORDERED_S = 40  # a file this heavy belongs in HEAVIEST_FIRST: the cost summary names one that is not


def pytest_collection_modifyitems(session, config, items):
    def weight(item) -> int:
        relative = item.path.relative_to(ROOT / "tests").as_posix()
        return HEAVIEST_FIRST.index(relative) if relative in HEAVIEST_FIRST else len(HEAVIEST_FIRST)

    items.sort(key=weight)  # stable: tests keep their order within a file


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true",
                     help="the size claims (tests marked `scale`) at full size, as `make soak` runs them")


@pytest.fixture(scope="session")
def soak(request) -> bool:
    """A test marked `scale` proves a claim about size relative to a small limit in `make test` (the limit set small
    for that test, the input several times it); with --soak (`make soak`) the same test runs at the full size, with
    the default limits."""
    return bool(request.config.getoption("--soak"))


def pytest_terminal_summary(terminalreporter):
    """A test JVM that crashed (rather than failed a test) says why here, in CI's output; then what the run cost."""
    for report in sorted(ARTIFACTS.glob("hs_err_pid*.log")):
        terminalreporter.write_line(f"JVM crash report {report}:\n" + "\n".join(report.read_text().splitlines()[:40]))
    _cost_by_directory(terminalreporter)


def _cost_by_directory(terminalreporter) -> None:
    """Worker-seconds (setup, call and teardown of each test, as junit.xml counts them) by directory of tests/ and
    for the heaviest files, so the landing that makes the suite dearer shows it in its own CI output."""
    seconds: dict[str, float] = {}
    files: dict[str, float] = {}
    tests: dict[str, set[str]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) not in ("setup", "call", "teardown"):
                continue
            path = report.nodeid.split("::", 1)[0].removeprefix("tests/")
            folder = path.split("/", 1)[0] if "/" in path else "."
            seconds[folder] = seconds.get(folder, 0.0) + report.duration
            files[path] = files.get(path, 0.0) + report.duration
            tests.setdefault(folder, set()).add(report.nodeid)
    if not seconds:
        return
    write = terminalreporter.write_line
    write(f"worker-seconds by directory: {sum(seconds.values()):.0f} s in {sum(map(len, tests.values()))} tests")
    for folder, spent in sorted(seconds.items(), key=lambda item: -item[1]):
        write(f"  {folder:<12} {spent:7.0f} s  {len(tests[folder]):4d} tests")
    write("heaviest files: " + ", ".join(f"{path} {spent:.0f} s" for path, spent in
                                         sorted(files.items(), key=lambda item: -item[1])[:8]))
    unordered = sorted(p for p, spent in files.items() if spent >= UNORDERED_S and p not in HEAVIEST_FIRST)
    if unordered:  # started after every listed file, such a file may run alone at the end
        write(f"files over {UNORDERED_S} s not in tests/conftest.py's HEAVIEST_FIRST: {', '.join(unordered)}")


@pytest.fixture()
def engine(spark):
    from spark_jobs.delta.delta_rs import DeltaRsEngine

    return DeltaRsEngine()


@pytest.fixture()
def s3_endpoint(tmp_path_factory):
    """A local S3 endpoint (tests/support.py's moto server) with a `landing` and a `lake` bucket."""
    with s3_server(tmp_path_factory.mktemp("moto") / "server.log") as url:
        yield url


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL cluster per test worker (tests/support.Postgres): each test's Airflow gets a database of its own,
    copied from one migrated once."""
    with postgres() as server:
        yield server
