"""Which failures are retried (exit 75) and which are not (1, 2): docs/architecture.md, "Failures and retries"."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from py4j.protocol import Py4JNetworkError

from spark_jobs.errors import ConfigError, GateFailed, InfrastructureDown, OutOfMemory, PipelineError, TableBusy, is_transient


def s3_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")


def raised_from(cause: BaseException) -> RuntimeError:
    try:
        raise cause
    except BaseException as exc:
        try:
            raise RuntimeError("the layer's own words") from exc
        except RuntimeError as wrapped:
            return wrapped


class Result:  # enough of a GateResult for GateFailed's message
    def failure_line(self) -> str:
        return "table=t layer=silver: gate failed"


TRANSIENT = [
    InfrastructureDown("the Spark master spark://m:7077 does not answer"),
    TableBusy("another run writes t"),
    ConnectionResetError("reset"),
    TimeoutError("timed out"),
    Py4JNetworkError("Answer from Java side is empty"),
    EndpointConnectionError(endpoint_url="http://s3:9000"),
    s3_error("SlowDown"),
    s3_error("503"),
    RuntimeError("Job aborted due to stage failure: ExecutorLostFailure (executor 1 exited caused by one of the "
                 "running tasks) Reason: Remote RPC client disassociated"),
    RuntimeError("Job 3 cancelled because SparkContext was shut down"),
    RuntimeError("org.apache.hadoop.fs.s3a.AWSServiceThrottledException: PUT 0-byte object: 503 Slow Down"),
    raised_from(s3_error("SlowDown")),
]

PERMANENT = [
    ConfigError("table 'orders': keys column 'id' is not in the change events"),
    GateFailed(Result()),  # type: ignore[arg-type]
    OutOfMemory("t", "bronze", "the driver ran out of memory reading s3://landing/big.json"),
    PipelineError("t", "silver", "column id is missing"),
    s3_error("AccessDenied"),
    s3_error("NoSuchBucket"),
    ValueError("cannot parse '2026-13-01' as a date"),
    RuntimeError("[UNRESOLVED_COLUMN] A column `x` cannot be resolved"),
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__)
def test_failures_of_the_machinery_are_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize("exc", PERMANENT, ids=lambda e: type(e).__name__)
def test_failures_of_the_data_or_settings_are_not(exc):
    assert not is_transient(exc)


def test_a_gate_failing_while_a_connection_error_is_handled_stays_permanent():
    try:
        raise ConnectionResetError("reset")
    except ConnectionResetError:
        gate = GateFailed(Result())  # type: ignore[arg-type]
        gate.__context__ = ConnectionResetError("reset")
    assert not is_transient(gate)


def test_a_jvm_lost_under_a_shared_session_is_not_blamed_on_every_job_in_it(monkeypatch):
    """In a JVM of its own, a job that lost it to Spark's out-of-memory exit ran it out of memory (permanent); on the
    pipeline service's shared JVM only the job whose own error says so did: the others retry."""
    from pyspark import SparkContext

    from spark_jobs import session

    class Gone:  # the JVM process, exited with Spark's code for an OutOfMemoryError
        def wait(self, timeout: float) -> int:
            return session.SPARK_EXIT_OOM

    monkeypatch.setattr(SparkContext, "_gateway", type("Gateway", (), {"proc": Gone()})())
    lost = Py4JNetworkError("Answer from Java side is empty")
    assert session.ran_out_of_memory(lost)
    monkeypatch.setattr(session, "SHARED_JVM", True)
    assert not session.ran_out_of_memory(lost) and is_transient(lost)
    assert session.ran_out_of_memory(RuntimeError("java.lang.OutOfMemoryError: Java heap space"))


def test_the_storage_refusing_writes_is_retryable_and_says_what_it_refused():
    """A full disk, an exceeded quota, a read-only or unwritable lake (in Python's words or, within Spark's or
    delta-rs' errors, the system's): a retry mends them once the storage does; the line says which."""
    import errno

    from spark_jobs.errors import LandingChanged, failure_line, storage_failure

    full = OSError(errno.ENOSPC, "No space left on device", "/lake/bronze/t/part-0.parquet")
    read_only = RuntimeError("Failed to write: Generic LocalFileSystem error: Read-only file system (os error 30)")
    assert storage_failure(full) == "the storage is full: [Errno 28] No space left on device: '/lake/bronze/t/part-0.parquet'"
    assert storage_failure(raised_from(read_only)).startswith("the storage is read-only: Failed to write")
    assert storage_failure(OSError(errno.EDQUOT, "Disk quota exceeded")).startswith("the storage is over its quota")
    assert storage_failure(ValueError("no such column")) is None
    for exc in (full, read_only, raised_from(full), LandingChanged("changed since it was listed")):
        assert is_transient(exc), exc
    assert failure_line("t", "bronze", full) == (
        "table=t layer=bronze failed: the storage is full: [Errno 28] No space left on device: "
        "'/lake/bronze/t/part-0.parquet'")
