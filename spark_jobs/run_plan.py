"""One `run`'s schedule: which steps run, in which order, over which tables, as a typed plan made from the run's
arguments before any work starts. The command line executes it (cli.run), and so does every job on the pipeline
service, which runs the command line's main (spark_jobs/service.py)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from spark_jobs.lake import Lake
from spark_jobs.layers import bronze, gold, silver
from spark_jobs.logs import logger
from spark_jobs.quality.gates import answer_gates
from spark_jobs.registry import GoldModel, TableConfig
from spark_jobs.settings import settings
from spark_jobs.steps import Steps, each_table

log = logger(__name__)


@dataclass(frozen=True)
class RunPlan:
    """What a run does (arguments: spark_jobs.arguments)."""

    tables: tuple[TableConfig, ...]
    models: tuple[GoldModel, ...]  # the gold models refreshed after the tables (with "gold" in `layers`)
    layers: tuple[str, ...]
    mode: str  # incremental | reprocess | rebuild | skip
    landing: str
    lake: Lake
    batch_id: str
    selection: bronze.Selection  # the landing files bronze takes
    skip_reason: str | None = None  # mode skip: why the files are set aside

    @property
    def in_passes(self) -> bool:
        """Are the tables' small batches read together? (One table too: its small batch is a pass of one.)"""
        return self.mode == "incremental"


@dataclass
class _Progress:
    """What the plan's steps hand on to each other within the run."""

    reads: dict[str, Any] = field(default_factory=dict)  # bronze's shared passes' reads, by table
    planned: dict[str, Any] = field(default_factory=dict)  # silver's
    bronze_done: set[str] = field(default_factory=set)  # tables whose bronze did not fail this run
    took_files: set[str] = field(default_factory=set)  # tables whose bronze took files: what silver's pass looks at


def execute(plan: RunPlan, steps: Steps) -> None:
    """Runs the plan's steps: bronze and silver table by table (or in rounds of shared passes), then gold; a failed
    step fails its table only, and the run at the end (Steps.raise_failures)."""
    progress = _Progress()
    if "bronze" in plan.layers and plan.in_passes:
        # many small tables' new files are read in shared passes, a round at a time; each table's step takes its own
        for members, reads in bronze.read_rounds(steps.spark, steps.engine, list(plan.tables), plan.landing, plan.lake,
                                                 plan.batch_id, plan.selection):
            progress.reads.update(reads)
            _round(plan, steps, progress, members)
    elif plan.in_passes:
        _round(plan, steps, progress, list(plan.tables))
    else:
        each_table(steps.spark, list(plan.tables), lambda table: _table_steps(plan, steps, progress, table),
                   settings().table_workers)
    if "gold" in plan.layers:
        _gold(plan, steps)
    steps.raise_failures()


def _gold(plan: RunPlan, steps: Steps) -> None:
    """The models whose sources did not fail this run, one after another (models of one transaction topic take its
    new files in turn), their gates answered together."""
    refreshed = []
    for model in plan.models:
        failed = sorted(set(model.sources) & steps.failed_tables)
        if failed:  # its SQL would join a failed table's silver with the others' newer state
            log.warning(f"gold   {model.name:<22} skipped: source(s) {', '.join(failed)} failed in this run")
        else:
            refreshed.append((model.name, "gold", f"gold.{model.name}", gold.gold_step,
                              (model, plan.lake, plan.batch_id, plan.landing)))
    steps.run_together(refreshed, lambda asked: answer_gates(asked, plan.batch_id), workers=1)


def _ingest(progress: _Progress, spark: Any, engine: Any, table: TableConfig, *rest: Any) -> Generator[Any, Any, Any]:
    summary = yield from bronze.bronze_ingest(spark, engine, table, *rest)  # its gate's question passed on
    if summary.files or summary.recovered_files:
        progress.took_files.add(table.name)
    return summary


def _ingest_args(plan: RunPlan, progress: _Progress, table: TableConfig) -> tuple[Any, ...]:
    return table, plan.landing, plan.lake, plan.batch_id, plan.selection, progress.reads.pop(table.name, None)


def _table_steps(plan: RunPlan, steps: Steps, progress: _Progress, table: TableConfig) -> None:
    """One table's bronze, then its silver unless its bronze failed (a failed gate or bad input fails this table
    only)."""
    ok = True
    if plan.mode == "skip":
        ok = steps.run(table.name, "bronze", table.name, bronze.skip_files, table, plan.landing, plan.lake,
                       plan.batch_id, plan.selection, plan.skip_reason)
    elif "bronze" in plan.layers and plan.mode != "rebuild":
        ok = steps.run(table.name, "bronze", table.name, partial(_ingest, progress), *_ingest_args(plan, progress, table))
    if not ok:
        return
    progress.bronze_done.add(table.name)
    if "silver" not in plan.layers:
        return
    if plan.mode == "rebuild":
        steps.run(table.name, "silver", table.name, silver.silver_rebuild, table, plan.lake, plan.batch_id)
    else:
        steps.run(table.name, "silver", table.name, silver.silver_merge, table, plan.lake, plan.batch_id,
                  progress.planned.pop(table.name, None))


def _round(plan: RunPlan, steps: Steps, progress: _Progress, members: list[TableConfig]) -> None:
    """Bronze for every table of the round (the tables a shared pass read gated together before they commit), then
    silver's shared pass over those it left to apply, then silver."""
    if "bronze" in plan.layers:
        steps.run_together([(t.name, "bronze", t.name, partial(_ingest, progress), _ingest_args(plan, progress, t))
                            for t in members],
                           lambda asked: answer_gates(asked, plan.batch_id), settings().table_workers)
    # a table whose bronze failed this run goes no further in it
    progress.bronze_done.update(t.name for t in members if t.name not in steps.failed_tables)
    if "silver" not in plan.layers:
        return
    ready = [t for t in members if t.name in progress.bronze_done]
    # an idle table costs no more than its own step's reads: after bronze, only tables it gave rows are looked at
    changed = [t for t in ready if t.name in progress.took_files or "bronze" not in plan.layers]
    progress.planned.update(silver.read_pass(steps.spark, steps.engine, changed, plan.lake))
    # the pass's tables merge side by side, then their merged rows are tallied and gated together, then each ends
    steps.run_together([(t.name, "silver", t.name, silver.silver_merge,
                         (t, plan.lake, plan.batch_id, progress.planned.pop(t.name, None))) for t in ready],
                       lambda asked: silver.answer_merged(asked, plan.batch_id), settings().table_workers)
