"""How a command's layer steps run over its tables: each under its table's writer lock, tables side by side
(`each_table`), a failed table alone (`Steps`), every summary published to the run's report and printed as one
line. Steps that each would pay a Spark job for the same question midway ask it instead, and a pass's steps are
answered together (`Steps.run_together`)."""

from __future__ import annotations

import inspect
import time
import traceback
from collections.abc import Callable, Generator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from spark_jobs.errors import ConfigError, GateFailed, LayerFailed, TableBusy, is_transient
from spark_jobs.logs import logger
from spark_jobs.settings import settings

log = logger(__name__)


def _flat(value: Any) -> Any:
    """Quarantine counts on one line by kind (`missing_key:2,malformed_json:1`), lists as one token; the JSON summary
    and the quarantine table keep the full reasons."""
    if isinstance(value, list):  # a step's changes (silver's widened columns), one token
        return ";".join(map(str, value))
    if not isinstance(value, dict):
        return value
    kinds: dict[str, int] = {}
    for reason, n in value.items():
        kind = str(reason).split(":", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + n
    return ",".join(f"{k}:{n}" for k, n in sorted(kinds.items()))


def format_summary(s: dict[str, Any]) -> str:
    skip = {"table", "layer", "batch_id", "docs", "sources", "checks", "deletes", "tables", "newest_change_ms", "lineage"}
    fields = " ".join(f"{k}={_flat(v)}" for k, v in s.items() if k not in skip and v not in (None, {}))
    return f"{s['layer']:<6} {s['table']:<22} {fields}"


def each_table(spark: Any, tables: Sequence[Any], work: Callable[[Any], Any], workers: int) -> None:
    """`work(table)` for every table, up to `workers` at once. Each worker thread runs in a copy of the caller's
    context (a service job's settings and output are context variables) and with its Spark job group (the
    service counts and cancels a job's Spark jobs by it). The first exception stops what has not started and
    is raised once the running tables are done."""
    if workers <= 1 or len(tables) <= 1:
        for table in tables:
            work(table)
        return
    import contextvars
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    from pyspark.util import inheritable_thread_target

    with ThreadPoolExecutor(min(workers, len(tables)), thread_name_prefix="cdc-table") as pool:
        # the job group (Spark's local properties) is captured as each target is made, in the caller's thread
        futures = [pool.submit(contextvars.copy_context().run, inheritable_thread_target(spark)(work), table)
                   for table in tables]
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
    for future in futures:
        if not future.cancelled() and future.exception() is not None:
            raise future.exception()  # type: ignore[misc]


def answered_alone(work: Any) -> Any:
    """A step's result (`work`: what its function returned), a question it asks on its way answered alone, as `Steps.run`
    answers it (without its lock or its report): for a caller running one step of one table itself."""
    if not inspect.isgenerator(work):
        return work
    try:
        question: Any = next(work)
        work.send(question.answer_alone())
    except StopIteration as done:
        return done.value
    raise AssertionError("a step asks one question")


class Steps:
    """Runs layer steps, each under its table's writer lock (tables side by side: each_table), and publishes each summary
    (a failed step's too, with its cause) to the run's report.

    A step failing on its table's data or settings (a gate, bad input, tables.yaml) or finding it busy (another
    writer's lock) fails that table only: the run goes on with the others, which publish as if alone, and ends
    failing with every failed table named (`raise_failures`). Any other transient failure (the JVM, the store)
    stops the run at once: it is not the table's, and the retry runs every table again (each step is idempotent)."""

    def __init__(self, spark: Any, engine: Any, lake: Any, batch_id: str):
        self.spark, self.engine, self.lake, self.batch_id = spark, engine, lake, batch_id
        self.failures: list[Exception] = []
        self.failed_tables: set[str] = set()
        self.published: list[str] = []  # tables (and models) whose summaries this run's report holds

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """The run's report into the event log, then its pages, once for the run (whether it ends well or not),
        over what it published. The log failing fails the run (a retry records the whole report again), unless
        the run is failing already: its own failure decides the exit code."""
        from spark_jobs import event_log, report

        if not self.published:
            return
        try:
            event_log.record_run(self.engine, self.lake, self.batch_id, lambda: report.load_run(self.lake, self.batch_id))
        except Exception as failed:
            if exc is not None:
                log.warning(f"event log: run {self.batch_id} not recorded: {failed}")
            else:
                raise LayerFailed("event_log", "report", failed, is_transient(failed)) from failed
        finally:
            report.render_pages(self.lake, self.batch_id, self.published)

    def _publish(self, summary: dict[str, Any]) -> None:
        """A step's summary to the run's report; a step that found nothing to do (`skipped`) only prints its line:
        a cycle over a whole database leaves nothing behind for its idle tables."""
        from spark_jobs import report

        if not str(summary.get("gate", "")).startswith("skipped"):
            report.publish(self.lake, self.batch_id, summary)
            self.published.append(summary["table"])

    def run(self, table: str, layer: str, lock: str, fn: Any, *fn_args: Any) -> bool:
        """Runs one step; False when it failed on its table's data or settings (recorded for raise_failures). A step
        that asks a question on its way (`run_together`) is answered alone (`question.answer_alone()`)."""
        opened = self._begin(table, layer, lock, fn, fn_args)
        return self._end(opened, opened.question.answer_alone) if isinstance(opened, _Open) else opened

    def run_together(self, runs: list[tuple[str, str, str, Any, tuple[Any, ...]]],
                     answer: Callable[[dict[str, Any]], dict[str, Any]], workers: int) -> None:
        """Runs steps (table, layer, lock, fn, fn_args) whose work may stop once to ask a question (a generator
        that yields it and is sent the answer; any other step just runs): each up to its question, under its lock,
        tables side by side; then `answer` once for every question asked, by table (what costs a Spark job each
        alone costs one for them all); then each to its end, its lock held throughout. A step failing in either part
        fails as in `run`. When `answer` fails, each step is answered alone, as `run` does: one table's input never
        fails the others. A run stopped midway (a transient failure) closes every open step unfinished, as a killed
        run leaves it."""
        opened: dict[str, _Open] = {}

        def begin(run: tuple[str, str, str, Any, tuple[Any, ...]]) -> None:
            got = self._begin(*run)
            if isinstance(got, _Open):
                opened[got.table] = got

        def end(o: _Open) -> None:
            joint = answers
            self._end(o, o.question.answer_alone if joint is None else lambda: joint[o.table])

        try:
            each_table(self.spark, runs, begin, workers)
            if not opened:
                return
            answers: dict[str, Any] | None = None
            try:
                answers = answer({name: o.question for name, o in opened.items()})
            except Exception as exc:  # not swallowed: each step is answered alone next, and fails on its own if it must
                log.warning(f"{len(opened)} steps answered together failed, each is answered alone: "
                            f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
            each_table(self.spark, list(opened.values()), end, workers)
        finally:
            for o in opened.values():
                o.close()

    def _begin(self, table: str, layer: str, lock: str, fn: Any, fn_args: tuple[Any, ...]) -> bool | _Open:
        """A step up to its question (its lock then held), or to its end: True, or False when it failed."""
        from spark_jobs.state import writer_lock

        locks = ExitStack()

        def first() -> Any:
            locks.enter_context(writer_lock(self.lake, lock, self.batch_id))
            started = time.monotonic()
            work = fn(self.spark, self.engine, *fn_args)
            if not inspect.isgenerator(work):
                return _Done(work, time.monotonic() - started)
            try:
                question = next(work)
            except StopIteration as done:
                return _Done(done.value, time.monotonic() - started)
            return _Open(table, layer, locks, work, question, time.monotonic() - started)

        got: Any = False
        try:
            got = self._attempt(table, layer, first)
        finally:
            if not isinstance(got, _Open):  # finished, failed or raised: the lock goes now
                locks.close()
        return got if isinstance(got, _Open) else self._done(got)

    def _end(self, opened: _Open, answer: Callable[[], Any]) -> bool:
        """An open step sent its answer, to its end; its lock released."""
        def rest() -> _Done:
            started = time.monotonic()
            try:
                opened.work.send(answer())
            except StopIteration as done:
                return _Done(done.value, opened.seconds + time.monotonic() - started)
            raise AssertionError(f"{opened.layer} {opened.table}: a step asks one question")

        try:
            got = self._attempt(opened.table, opened.layer, rest)
        finally:
            opened.close()
        return self._done(got)

    def _done(self, got: _Done | bool) -> bool:
        """A finished step's summary published and printed; False for a failed one (recorded already)."""
        if not isinstance(got, _Done):
            return got
        summary = got.summary
        summary.seconds = round(got.seconds, 3)  # the layer's work, without the lock wait (or another table's)
        self._publish(summary.as_dict())
        log.info(format_summary(summary.as_dict()))
        return True

    def _attempt(self, table: str, layer: str, body: Callable[[], Any]) -> Any:
        """`body()`; False when it failed on its table's data or settings (recorded for raise_failures, its summary
        published with the cause); any other failure is raised."""
        try:
            return body()
        except Exception as exc:
            if settings().debug:
                traceback.print_exc()
            from spark_jobs.layers.summary import LayerSummary
            from spark_jobs.session import ran_out_of_memory

            gate_failed = isinstance(exc, GateFailed)
            transient = is_transient(exc) and not ran_out_of_memory(exc)
            failed = LayerFailed(table, layer, exc, transient, exc.summary if isinstance(exc, GateFailed) else None)
            # the run's report shows the failure too, with the failed gate's findings and counts
            counts = failed.summary or LayerSummary(table=table, layer=layer, batch_id=self.batch_id)
            counts.gate = "failed" if gate_failed else "error"
            counts.error = str(failed)
            self._publish(counts.as_dict())
            if transient and not isinstance(exc, TableBusy):  # another writer holding this table is this table's
                raise failed from exc
            # tables.yaml names what the data does not have: exit 2, no retry
            recorded = ConfigError(f"{exc} (layer {layer})") if isinstance(exc, ConfigError) else failed
            recorded.__cause__ = exc
            self.failures.append(recorded)
            self.failed_tables.add(table)
            log.info(f"{layer:<6} {table:<22} FAILED: {failed}")
            return False

    def raise_failures(self) -> None:
        """Fail the run when a step failed: every other failure on its line, then the one deciding the exit code
        raised: a configuration error first (exit 2, the settings decide), then one the same input would repeat
        (1), then a busy table's (75: a retry takes it)."""
        if not self.failures:
            return
        deciding = min(self.failures, key=lambda f: (not isinstance(f, ConfigError), bool(getattr(f, "transient", False))))
        for failure in self.failures:
            if failure is not deciding:
                log.error(str(failure))
        raise deciding


@dataclass(frozen=True)
class _Done:
    summary: Any  # the step's LayerSummary
    seconds: float  # its work, without the lock wait


@dataclass
class _Open:
    """A step stopped at its question, its table's lock held."""

    table: str
    layer: str
    locks: ExitStack
    work: Generator[Any, Any, Any]
    question: Any
    seconds: float  # its work so far

    def close(self) -> None:
        """Unfinished: as a killed run leaves it (the step's own commits are a retry's to recover); its lock released."""
        self.work.close()
        self.locks.close()
