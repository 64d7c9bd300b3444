"""The jobs' progress and report lines, through `logging` under the `cdc` logger: a line a run reports (a table's
summary, a pass, a wait for a lock) is INFO and goes to standard output; one that says something went wrong but the
run goes on, or why it failed, is WARNING or ERROR and goes to standard error. CDC_LOG_LEVEL keeps only the lines
at or above its level. A command's own output (`status`, `generate`'s listing, a file's path) is printed, not
logged: it is the answer, not a report. The pipeline service routes each job's lines to that job's log with a
handler of its own (spark_jobs/service.py)."""

from __future__ import annotations

import logging
import sys

ROOT = "cdc"


def logger(module: str) -> logging.Logger:
    """The logger of a module of the project (`__name__`): cdc.<its name under spark_jobs>. Until the process says
    otherwise (use_handler, set_level), the lines at INFO and above go to the standard streams: a report line is
    never dropped for want of a handler (Python's last resort keeps WARNING and above only)."""
    root = logging.getLogger(ROOT)
    if not root.handlers:
        use_handler(StandardStreams())
    if root.level == logging.NOTSET:  # not the root logger's (WARNING): CDC_LOG_LEVEL's default
        root.setLevel(logging.INFO)
    return logging.getLogger(f"{ROOT}.{module.removeprefix('spark_jobs.')}")


class StandardStreams(logging.Handler):
    """INFO and below to standard output, WARNING and above to standard error, as the lines were printed before:
    each looked up when a line is written, so that whoever holds the streams then (a test capturing them) gets it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def use_handler(handler: logging.Handler) -> None:
    """The `cdc` logger's one handler from now on, the line being the message alone (each line carries its own
    layer, table and figures)."""
    root = logging.getLogger(ROOT)
    for old in list(root.handlers):
        root.removeHandler(old)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.propagate = False  # Airflow's or Spark's root handlers would print each line a second time


def set_level(level: str) -> None:
    """CDC_LOG_LEVEL: the lines below it are not written."""
    logging.getLogger(ROOT).setLevel(level)
