"""Every failure the pipeline reports, as typed exceptions. The CLI maps each to one line and an exit code
(spark_jobs.cli): ConfigError 2; LayerFailed 75 when `transient` (a retry can mend it), else 1."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_jobs.layers.summary import LayerSummary
    from spark_jobs.quality.gates import GateResult


class ConfigError(ValueError):
    """The registry, a gold model header, the arguments or the environment are invalid; the message names
    the table and field."""


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
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"table={table} layer={layer} failed: {type(exc).__name__}: {message}"


def is_transient(exc: BaseException) -> bool:
    """Failures a retry can mend: a table another run is writing, a store that did not answer."""
    if isinstance(exc, TableBusy | ConnectionError | TimeoutError):
        return True
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import ReadTimeoutError
    except ImportError:
        return False
    return isinstance(exc, BotoConnectionError | ReadTimeoutError)
