"""Every failure the pipeline reports, as typed exceptions. The CLI maps each to one line and an exit code
(spark_jobs.cli): ConfigError 2; InfrastructureDown and the storage refusing writes (full, read-only) 75; LayerFailed
75 when `transient` (a retry can mend it), else 1. docs/architecture.md, "Failures and retries", tables which is which."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

EXIT_TRANSIENT = 75  # EX_TEMPFAIL: worth a retry (a busy table, an unreachable store); 1 and 2 are not

if TYPE_CHECKING:
    from spark_jobs.layers.summary import LayerSummary
    from spark_jobs.quality.findings import GateResult


class ConfigError(ValueError):
    """The registry, a gold model header, the arguments or the environment are invalid; the message names
    the table and field."""


class InfrastructureDown(RuntimeError):
    """What a run needs could not be reached or went away before any work (a Spark master that does not answer,
    a session that cannot start): transient, the retry comes with backoff; nothing was written."""


class TableBusy(RuntimeError):
    """Another run writes the table: transient, the retry waits its turn."""


class PipelineError(RuntimeError):
    """A layer step cannot go on with this input (a missing file, a column the keys need, a concurrent
    writer); the line names the table and the layer."""

    def __init__(self, table: str, layer: str, message: str):
        super().__init__(f"table={table} layer={layer}: {message}")
        self.table, self.layer, self.message = table, layer, message


class OutOfMemory(PipelineError):
    """The driver ran out of memory on this input: a retry of the same input would too, so it is not transient."""


class ConcurrentWrite(PipelineError):
    """Another writer committed to the table during the run: runs of one table must be serialized."""


class LandingChanged(RuntimeError):
    """A local landing file became something the listing would have refused (a link out of the landing root, not a
    file) between its listing and its read: nothing of it is read, and the run is retried (transient): the next one
    lists it again, and quarantines it."""


class UnsupportedTable(RuntimeError):
    """A Delta table uses a protocol feature the engine cannot honour (e.g. deletion vectors for delta-rs):
    nothing is read or written, the message names the table and the feature."""

    def __init__(self, path: str, features: list[str], doing: str, remedy: str):
        super().__init__(f"the Delta table at {path} uses {', '.join(features)}, which {doing}; {remedy}")
        self.path, self.features = path, features


class GateFailed(RuntimeError):
    """A gate failed (spark_jobs.quality.gates): `result` holds the findings, `summary` the step's counts so
    far, for the failed run's report."""

    def __init__(self, result: GateResult, summary: LayerSummary | None = None):
        super().__init__(result.failure_line())
        self.result, self.summary = result, summary


class LayerFailed(RuntimeError):
    """A layer step of one table (or gold model) failed: `cause` is the exception, `summary` what the step
    had counted (a failed gate's findings included), `transient` whether a retry can mend it."""

    def __init__(self, table: str, layer: str, cause: BaseException, transient: bool,
                 summary: LayerSummary | None = None):
        super().__init__(failure_line(table, layer, cause))
        self.table, self.layer, self.cause, self.transient, self.summary = table, layer, cause, transient, summary


def failure_line(table: str, layer: str, exc: BaseException) -> str:
    """One line naming the table, the layer and the reason."""
    if isinstance(exc, PipelineError | GateFailed):
        return str(exc)
    if (storage := storage_failure(exc)) is not None:
        return f"table={table} layer={layer} failed: {storage}"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"table={table} layer={layer} failed: {type(exc).__name__}: {message}"


# Spark's and the stores' own words for work lost with the machinery under it, not with the data: an executor or
# worker gone, the context stopped under a job, a master gone, a store refusing or throttling requests (S3A and
# the AWS SDK wrap these in Java exceptions whose text is all Python sees)
LOST_MACHINERY = ("ExecutorLostFailure", "Lost executor", "SparkContext was shut down", "SparkContext has been shutdown",
                  "All masters are unresponsive", "Master removed our application", "Connection refused",
                  "AWSServiceThrottledException", "503 Slow Down", "SlowDown", "ServiceUnavailable")
# the storage under the lake or the landing refusing writes: full, over quota, read-only, not permitted. A retry mends
# them once an operator has (more room, the mount back read-write), as Airflow's retries with backoff leave time for;
# the same words as Java's and delta-rs' errors carry them
STORAGE_ERRNOS = {errno.ENOSPC: "full", errno.EDQUOT: "over its quota", errno.EROFS: "read-only",
                  errno.EACCES: "not writable here", errno.EPERM: "not writable here"}
STORAGE_WORDS = {"No space left on device": "full", "Disk quota exceeded": "over its quota",
                 "Read-only file system": "read-only", "Permission denied": "not writable here"}


def storage_failure(exc: BaseException) -> str | None:
    """What the storage refused, when `exc` (or what it was raised from) is the storage refusing a read or a write:
    one line, e.g. "the storage is full: [Errno 28] No space left on device: '/lake/...'"; else None."""
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in STORAGE_ERRNOS:
            return f"the storage is {STORAGE_ERRNOS[link.errno]}: {link}"
        text = str(link)
        for words, state in STORAGE_WORDS.items():
            if words in text:
                line = next((part for part in text.splitlines() if words in part), words).strip()
                return f"the storage is {state}: {line[:300]}"
    return None


# S3 error codes a retry mends (botocore's ClientError)
RETRYABLE_S3_CODES = {"SlowDown", "ServiceUnavailable", "Throttling", "ThrottlingException", "RequestTimeout",
                      "RequestTimeTooSkewed", "InternalError", "500", "503"}


def is_transient(exc: BaseException) -> bool:
    """Failures a retry can mend: a table another run is writing, a Spark or a store that did not answer or went
    away (a JVM gone with its connection: the caller rules out a death by running out of memory, which the same
    input would repeat). Anything the data or the settings cause is not."""
    if isinstance(exc, ConfigError | GateFailed | OutOfMemory):  # whatever happened while they were raised
        return False
    # boto3's errors (a pinned dependency), imported only once a failure is judged: every job imports this module
    from botocore.exceptions import ClientError, ReadTimeoutError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if storage_failure(exc) is not None:
        return True
    for link in _chain(exc):
        if isinstance(link, InfrastructureDown | TableBusy | ConnectionError | TimeoutError | LandingChanged):
            return True
        if type(link).__name__ == "Py4JNetworkError":  # the driver's JVM is gone (py4j is not imported here)
            return True
        if any(words in str(link) for words in LOST_MACHINERY):
            return True
        if isinstance(link, BotoConnectionError | ReadTimeoutError):
            return True
        if isinstance(link, ClientError) and link.response.get("Error", {}).get("Code") in RETRYABLE_S3_CODES:
            return True
    return False


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or during (a layer wraps Spark's errors in its own)."""
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in seen:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen
