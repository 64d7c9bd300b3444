"""Silver: the current state per primary key, from the bronze rows it has not applied (docs/architecture.md,
"Silver"). Each batch is planned (layers/silver_plan.py), audited, published (silver, the tombstone
ledger, history, the truncate log) and audited again: a failed gate leaves every table as it was."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, replace
from functools import partial

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.debezium import types
from spark_jobs.delta import DeltaEngine, MergeSpec, NewFiles, driver_rows, spark_frame, upkeep_only
from spark_jobs.delta.reads import read_columns
from spark_jobs.errors import ConfigError, GateFailed, PipelineError
from spark_jobs.lake import Lake
from spark_jobs.layers import changes, keyed_reads, silver_pass, transactions
from spark_jobs.layers.common import (
    PASS_BYTES,
    PASS_ROWS,
    Gate,
    in_passes,
    lag_seconds,
    now,
    read_shared,
    settle,
    share,
    write_quarantine,
)
from spark_jobs.layers.common import gate as run_gate
from spark_jobs.layers.history import TRUNCATE_LOG_MERGE, apply_history
from spark_jobs.layers.silver_pass import TableBatch
from spark_jobs.layers.silver_plan import BatchPlan, PlanCounts, merged_audit, plan_batch
from spark_jobs.layers.summary import SilverSummary
from spark_jobs.lineage import silver_lineage
from spark_jobs.logs import logger
from spark_jobs.quality.audit import Audit, Figures, Tally, tally, tally_tables
from spark_jobs.quality.expectations import flagged
from spark_jobs.quality.findings import GateResult
from spark_jobs.quality.gates import AuditGate, Check, answer_gates, may_refuse, refuses, silver_checks
from spark_jobs.registry import TableConfig

log = logger(__name__)

# Silver: apply the newest event per key when it is newer than the row (docs/architecture.md, "Silver").
_NEWER_THAN_ROW = changes.newer("s._seq", "t._seq")
SILVER_MERGE = MergeSpec(keys=(), delete_when=f"s._op = 'd' AND {_NEWER_THAN_ROW}",
                         update_when=f"s._op <> 'd' AND {_NEWER_THAN_ROW}", insert_when="s._op <> 'd'")
# Tombstone ledger: the mirror image. A delete records (key, seq); a newer insert or update clears it.
LEDGER_MERGE = MergeSpec(keys=(), delete_when=f"s._op <> 'd' AND {_NEWER_THAN_ROW}",
                         update_when=f"s._op = 'd' AND {_NEWER_THAN_ROW}", insert_when="s._op = 'd'")


PROGRESS_SCHEMA = ("layer STRING, bronze_version BIGINT, truncated_at STRING, _batch_id STRING, updated_at TIMESTAMP, "
                   "silver_version BIGINT")


@dataclass(frozen=True)
class SilverProgress:
    bronze_version: int = -1  # the bronze version silver has applied; -1 when none
    truncated_at: str | None = None  # the position of the latest truncate applied
    # silver's version when progress was last recorded: later commits are an interrupted run's (None: not known)
    silver_version: int | None = None


def silver_progress(lake: Lake, table: str) -> SilverProgress:
    """Read without Spark (its one row): a cycle asks this of every table, most of which have nothing new."""
    progress = read_columns(lake.progress(table)) or {}
    rows = [dict(zip(progress, values, strict=True)) for values in zip(*progress.values(), strict=True)]
    row = next((r for r in rows if r["layer"] == "silver"), None)
    if row is None:
        return SilverProgress()
    return SilverProgress(int(row["bronze_version"]), row["truncated_at"], row.get("silver_version"))


def read_pass(spark: SparkSession, engine: DeltaEngine, tables: list[TableConfig], lake: Lake
              ) -> dict[str, TableBatch | ConfigError]:
    """Small tables' new bronze rows planned together (layers/silver_pass.py; one table's too, a pass of one), for their
    own steps to take (silver_merge), in passes of at most PASS_ROWS rows and PASS_BYTES bytes, with either engine (a
    table's new files listed from bronze's log: DeltaEngine.new_files). A pass that fails leaves each table to plan its
    own batch, which then fails or not on its own input."""
    groups: dict[str, list[silver_pass.Candidate]] = {}  # by bronze's schema: a scan reads one
    for table in tables:
        progress = silver_progress(lake, table.name)
        files = engine.new_files(lake.bronze(table.name), progress.bronze_version)
        if files is None or not files.files or not _fits_a_pass([files]):
            continue  # no new rows (a commit that added no file: its own step finds none), or more than a small batch
        version, target = engine.current(lake.silver(table.name)) or (None, None)
        recorded = progress.silver_version
        if recorded is not None and version != recorded and not (
                version is not None and upkeep_only(engine, lake.silver(table.name), recorded, version)):
            continue  # an interrupted run's commits: its own step recovers them (maintenance's and settings' change no row)
        groups.setdefault(files.schema, []).append(silver_pass.Candidate(
            table, progress.bronze_version, files, progress.truncated_at, version, target))
    passes = [p for group in groups.values() for p in in_passes(group, lambda p: _fits_a_pass([c.files for c in p]))]
    return read_shared("silver", "plans its own batch", passes, partial(silver_pass.read_together, spark, engine, lake),
                       lambda together, planned: f"{sum(isinstance(p, TableBatch) for p in planned.values())} of "
                                                 f"{len(together)} tables' new bronze rows planned")


def _fits_a_pass(files: list[NewFiles]) -> bool:
    """Do the new files hold at most a pass's rows and bytes (what it plans in one partition and collects)? Rows
    not counted in a file's statistics count as too many."""
    return (sum(f.size for f in files) <= PASS_BYTES
            and sum(PASS_ROWS + 1 if f.rows is None else f.rows for f in files) <= PASS_ROWS)


# operation metrics as delta-rs and delta-spark name them
_METRICS = {"inserted": ("num_target_rows_inserted", "numTargetRowsInserted"),
            "updated": ("num_target_rows_updated", "numTargetRowsUpdated"),
            "deleted": ("num_target_rows_deleted", "numTargetRowsDeleted", "num_deleted_rows", "numDeletedRows")}


def interrupted_work(engine: DeltaEngine, path: str, since_version: int | None, current: int | None
                     ) -> dict[str, int]:
    """What silver commits after `since_version` (the last recorded progress) up to `current` (its version now)
    applied: a run killed before recording its progress. Its retry finds those events already applied and would
    report nothing of them."""
    if since_version is None or current is None or current <= since_version:
        return {}
    totals = {"recovered_commits": 0, "inserted": 0, "updated": 0, "deleted": 0}
    for commit in engine.history(path, current - since_version):
        if int(commit["version"]) <= since_version or commit.get("operation") not in ("MERGE", "DELETE"):
            continue
        metrics = commit.get("operationMetrics") or {}
        totals["recovered_commits"] += 1
        for figure, names in _METRICS.items():
            totals[figure] += sum(int(metrics.get(name) or 0) for name in names)
    return totals


@dataclass(frozen=True)
class MergedAudit:
    """What a batch the silver pass read asks once merged: the tallies of silver's checks on its merged rows
    (`frames`, on the driver, keyed by the table's `keys`), and its gate's verdict on them (`gate`, its tallies
    still to come; None: the step runs its own). A pass's tables are answered together (`answer_merged`,
    steps.Steps.run_together): their tallies counted on the driver, and one GX validation for them all, where each
    alone costs one."""

    frames: dict[str, pa.Table]
    keys: tuple[str, ...]
    gate: AuditGate | None = None

    def answer_alone(self) -> Merged:
        return Merged(tally_tables({"": (self.frames, self.keys)}, flagged("silver"))[""], None)


@dataclass(frozen=True)
class Merged:
    """A merged batch's tallies, and its gate's verdict when run with the pass's (None: its step runs its own)."""

    tallies: dict[str, Tally]
    verdict: GateResult | None


def answer_merged(asked: dict[str, MergedAudit], batch_id: str) -> dict[str, Merged]:
    """Every asking table's tallies, then their gates in one GX validation (by table)."""
    tallies = tally_tables({name: (a.frames, a.keys) for name, a in asked.items()}, flagged("silver"))
    verdicts = answer_gates({name: replace(a.gate, audit=a.gate.audit.with_tallies(tallies[name]))
                             for name, a in asked.items() if a.gate}, batch_id)
    return {name: Merged(tallies[name], verdicts.get(name)) for name in asked}


def silver_merge(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, batch_id: str,
                 read: TableBatch | ConfigError | None = None, gate: Gate | None = None
                 ) -> Generator[MergedAudit, Merged, SilverSummary]:
    """Apply the bronze rows silver has not seen (gated inside), then record the progress. `read`: the batch as a
    silver pass planned it (read_pass), taken when silver and bronze are still as the pass found them; that batch
    asks for its merged rows' tallies (and its gate's verdict) once merged (MergedAudit); a ConfigError the pass found
    (settings naming columns the events lack) is raised as its own plan raises it. `gate` as apply_changes."""
    progress = silver_progress(lake, table.name)
    bronze_version = engine.version(lake.bronze(table.name))
    if bronze_version is None or bronze_version <= progress.bronze_version:
        return SilverSummary(table=table.name, batch_id=batch_id, events=0, gate="skipped (no new bronze rows)")
    transactions.check_transaction_ids(engine, [table], lake)
    if isinstance(read, ConfigError):  # the pass found its settings naming columns its events lack
        raise read
    silver_version = engine.version(lake.silver(table.name))
    recovered = interrupted_work(engine, lake.silver(table.name), progress.silver_version, silver_version)
    planned = None
    if read is not None and read.holds(progress.bronze_version, progress.truncated_at, silver_version, bronze_version):
        try:
            planned = silver_pass.plan_table(engine, lake, table, read)
        except pa.ArrowException as exc:  # not swallowed: nothing is written yet, and the table's own plan takes it
            log.warning(f"silver: {table.name}'s batch from the shared pass could not be planned on the driver, it plans "
                        f"its own: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
        else:
            if planned is None:
                log.info(f"silver: {table.name}'s batch widens a type only a stale event claims, it plans its own")
    try:
        if read is not None and planned is not None:
            summary = yield from apply_planned(spark, engine, table, lake, read, planned, batch_id, gate)
            truncated_at = read.truncated_after
        else:
            bronze = engine.read(spark, lake.bronze(table.name), version=bronze_version)
            assert bronze is not None
            summary, truncated_at = apply_changes(spark, engine, table, lake,
                                                  bronze.where(F.col("_bronze_version") > progress.bronze_version),
                                                  progress.truncated_at, batch_id, gate)
    except GateFailed as failure:
        if isinstance(failure.summary, SilverSummary):
            failure.summary.bronze_version = bronze_version
        # the failed batch's commits were undone: what silver holds now is what progress says
        _save_progress(spark, engine, lake, table.name, progress.bronze_version, progress.truncated_at, batch_id)
        raise
    summary.add_recovered(recovered)
    _save_progress(spark, engine, lake, table.name, bronze_version, truncated_at, batch_id)
    spark.catalog.clearCache()
    summary.bronze_version, summary.version = bronze_version, engine.version(lake.silver(table.name))
    return summary


def silver_rebuild(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake,
                   batch_id: str) -> SilverSummary:
    """Recompute silver (and its ledger, history, truncate log) from all of bronze, in a staging area of
    the lake; when the gate passes, publish each table in one commit. A failed or killed rebuild leaves
    silver as it was, or already rebuilt: the retry starts over from bronze and ends the same."""
    bronze_version = engine.version(lake.bronze(table.name))
    if bronze_version is None:
        raise PipelineError(table.name, "silver", "no bronze table to rebuild from")
    staged = lake.staged(table.name)
    lake.files.delete_tree(str(staged.staging))  # what a killed rebuild left
    bronze = engine.read(spark, lake.bronze(table.name), version=bronze_version)
    assert bronze is not None
    try:
        summary, truncated_at = apply_changes(spark, engine, table, staged, bronze, None, batch_id)
    except GateFailed as failure:
        if isinstance(failure.summary, SilverSummary):
            failure.summary.mode, failure.summary.bronze_version = "rebuild", bronze_version
        raise
    built = staged.silver_tables(table.name)
    for name, path in lake.silver_tables(table.name).items():
        rebuilt = engine.read(spark, built[name])
        partition_by = table.partition_by if name in ("silver", "history") else ()  # history keeps silver's layout
        if rebuilt is not None:
            engine.overwrite(rebuilt, path, partition_by)
        elif engine.version(path) is not None:
            engine.delete(path, "true")
    _save_progress(spark, engine, lake, table.name, bronze_version, truncated_at, batch_id)
    lake.files.delete_tree(str(staged.staging))
    spark.catalog.clearCache()
    summary.mode, summary.bronze_version = "rebuild", bronze_version
    summary.version = engine.version(lake.silver(table.name))
    return summary


def apply_changes(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, batch: DataFrame,
                  truncated_at: str | None, batch_id: str, gate: Gate | None = None) -> tuple[SilverSummary, str | None]:
    """Apply a batch of bronze rows to silver, the tombstone ledger, history and quarantine
    (docs/architecture.md, "Silver"), gated write-audit-publish: the batch is audited before any table is
    written (too much quarantined, or a `fail` expectation on its events: nothing but the quarantine is
    written), and the merged result after (keys, deletes): when that fails, every table is restored to
    its version before the batch.

    `truncated_at` is the position of the latest truncate already applied; returns the batch's counts
    (with the gate's verdict and findings) and the truncate position in force afterwards. `gate` runs the
    checks (default: Great Expectations, publishing Data Docs) and raises GateFailed when they fail."""
    check = gate or partial(run_gate, actions=table.quality.actions)
    published = {path: engine.version(path) for path in lake.silver_tables(table.name).values()}
    plan = plan_batch(spark, engine, table, lake, batch, truncated_at)
    summary = _counts(plan.counts, write_quarantine(engine, lake, table.name, plan.quarantine, "silver", batch_id,
                                                    plan.quarantine_counts, small=plan.small), table, batch_id)
    quarantined = sum((summary.quarantined or {}).values())
    audit = Audit(Figures(quarantined, summary.quarantined_share or 0.0))
    checks = silver_checks(table)
    # audit before publishing: a batch the table refuses leaves every table as it was. The events are tallied
    # here only when that can refuse the batch; otherwise with the merged rows after, in the same Spark job
    trips = table.quality.breaker_trips(quarantined, summary.quarantined_share or 0)
    before = trips or may_refuse(checks, set(plan.audited))
    if before:
        audit = audit.with_tallies(tally(plan.audited, flagged("silver"), table.keys))
    gates = _Gates(check, plan.frames, table, lake, summary, checks)
    gates.before(audit, trips)
    _publish(spark, engine, table, lake, plan, batch_id, summary)

    pending = {} if before else dict(plan.audited)
    if plan.latest is not None and plan.deletes is not None:
        pending["rows"], pending["deletes"] = _merged_audit(spark, engine, table, lake, plan, batch_id)
    gates.after(audit.with_tallies(tally(pending, flagged("silver"), table.keys)), engine, published)
    return summary, plan.truncated_at


def apply_planned(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, read: TableBatch,
                  plan: silver_pass.PassPlan, batch_id: str, gate: Gate | None = None
                  ) -> Generator[MergedAudit, Merged, SilverSummary]:
    """`apply_changes` for a batch the silver pass read (`read`), the rest of its plan made on the driver (`plan`,
    silver_pass.plan_table): the same gates, merges and restore; the merged rows' tallies
    asked for (MergedAudit), with the gate's verdict on them (GX's, unless a `gate` is given)."""
    check = gate or partial(run_gate, actions=table.quality.actions)
    published = {path: engine.version(path) for path in lake.silver_tables(table.name).values()}
    summary = _counts(plan.counts, write_quarantine(engine, lake, table.name, read.quarantine, "silver", batch_id),
                      table, batch_id)
    quarantined = sum((summary.quarantined or {}).values())
    audit = Audit(Figures(quarantined, summary.quarantined_share or 0.0)).with_tallies(read.audit)
    checks = silver_checks(table)
    frames = read.judged(spark)
    gates = _Gates(check, frames, table, lake, summary, checks)
    gates.before(audit, table.quality.breaker_trips(quarantined, summary.quarantined_share or 0))

    _widen(spark, engine, table, lake, read.widened, summary)
    new_truncates = 0 if read.truncates is None else _log_truncates(engine, table, lake, read.truncates.append_column(
        "_batch_id", pa.array([batch_id] * read.truncates.num_rows, pa.string())))
    removed = _truncate(engine, table, lake, read.new_truncate)
    _merge(engine, table, lake, plan.rows if plan.rows.num_rows else None, plan.ledger, True, plan.delete_counts,
           summary, removed)
    if table.history:
        _history(spark, engine, table, lake, read.history_events(spark), list(read.typing.fields), new_truncates,
                 summary)
    if read.overview["changes"]:  # as its own plan's: a batch of truncates alone writes no row
        summary.lineage = silver_lineage(table.name, plan.rows.column_names, table.sequence_by)

    merged = dict(zip(("rows", "deletes"), silver_pass.pass_audit(engine, lake, table, read, batch_id), strict=True))
    after = gates.reconciled(audit)
    # a gate with frames of the user's expectations validates them too: the table's own, after the joint tallies
    joint = AuditGate(table.name, "silver", after, checks, lake, batch_id, table.quality.actions) if (
        gate is None and not frames) else None
    answer = yield MergedAudit(merged, table.keys, joint)
    gates.after(after.with_tallies(answer.tallies), engine, published, answer.verdict)
    return summary


def _merged_audit(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, plan: BatchPlan,
                  batch_id: str) -> tuple[DataFrame, DataFrame]:
    """silver_plan.merged_audit's frames. A small batch's are read back on the driver by the keys its plan collected
    (`plan.keys_here`), as a pass's batch's are (keyed_reads.merged_audit), where the joins with silver's scan cost a
    Spark job per exchange."""
    assert plan.latest is not None and plan.deletes is not None
    path = lake.silver(table.name)
    if plan.keys_here is None:
        return merged_audit(spark, engine, path, plan.latest, plan.deletes, table.keys, batch_id)
    rows, received_live = keyed_reads.merged_audit(engine, path, plan.keys_here.touched, plan.keys_here.received,
                                                   batch_id)
    return spark_frame(spark, rows).coalesce(1), spark_frame(spark, received_live).coalesce(1)


@dataclass(frozen=True)
class _Gates:
    """A batch's two silver gates: before publishing, and on the published result."""

    check: Gate
    frames: dict[str, DataFrame]  # what a user's expectations read
    table: TableConfig
    lake: Lake
    summary: SilverSummary  # records the findings
    checks: list[Check]

    def run(self, audit: Audit) -> None:
        self.check(audit, self.frames, self.table.name, "silver", self.checks, self.lake, self.summary)

    def before(self, audit: Audit, trips: bool) -> None:
        """The quarantine breaker tripped, or a `fail` check on the events failed: the batch is refused, nothing but
        its quarantine written."""
        if trips or refuses(audit, self.checks):
            self.run(audit)

    def reconciled(self, audit: Audit) -> Audit:
        """The published result's audit with the deletes received accounted for."""
        counts = self.summary.deletes
        assert counts is not None, "a published batch has counted its deletes"
        audit.figures.deletes_received = received = counts["received"]
        audit.figures.deletes_unaccounted = received - sum(v for k, v in counts.items() if k != "received")
        return audit

    def after(self, audit: Audit, engine: DeltaEngine, published: dict[str, int | None],
              verdict: GateResult | None = None) -> None:
        """The gate on the published result (its `verdict` when run with the pass's); on failure every table is put
        back to its version before the batch (`published`)."""
        try:
            if verdict is None:
                self.run(self.reconciled(audit))
            else:
                settle(verdict, self.summary)
        except GateFailed:
            _restore(engine, published)
            raise


def _counts(plan: PlanCounts, quarantined: dict[str, int], table: TableConfig, batch_id: str) -> SilverSummary:
    """The batch's figures before anything is published."""
    quarantined_n = sum(quarantined.values())
    return SilverSummary(
        table=table.name, batch_id=batch_id, events=plan.events + plan.truncates + quarantined_n,
        # a duplicate: an event at a position the batch holds already, or at the one silver holds for its key
        duplicates_dropped=plan.events - plan.positions + plan.redelivered,
        superseded_in_batch=plan.positions_after_truncate - plan.keys,
        stale_ignored=(plan.positions - plan.positions_after_truncate) + (plan.keys - plan.effective - plan.redelivered),
        ties=plan.ties, truncates=plan.truncates, quarantined=quarantined,
        quarantined_share=share(quarantined_n, plan.rows_in), lag_s=lag_seconds(plan.newest_ts_ms),
        newest_change_ms=plan.newest_ts_ms)


def _publish(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, plan: BatchPlan, batch_id: str,
             summary: SilverSummary) -> None:
    """Write the plan: the truncate log and what a new truncate removes, then silver, the ledger, history;
    expire old ledger entries."""
    _widen(spark, engine, table, lake, plan.widened, summary)
    new_truncates = 0
    if plan.truncate_count:
        logged = ["_seq", *(["_transaction_id"] if table.transactions else [])]  # gold places a truncate by it
        new_truncates = _log_truncates(engine, table, lake, plan.truncates.where("reason IS NULL").select(
            *logged, F.lit(batch_id).alias("_batch_id")).distinct())
    deleted_by_truncate = _truncate(engine, table, lake, plan.new_truncate)
    ledger = None
    if plan.rows is not None and plan.placed is not None and (plan.effective or plan.ledger_cleared):
        ledger = changes.ledger_rows(plan.rows, plan.placed, table.keys)
    _merge(engine, table, lake, plan.rows if plan.effective else None, ledger, plan.small, plan.delete_counts, summary,
           deleted_by_truncate)
    if table.history:
        _history(spark, engine, table, lake, plan.typed.where("reason IS NULL") if plan.typed is not None else None,
                 plan.fields, new_truncates, summary)
    if plan.rows is not None:
        summary.lineage = silver_lineage(table.name, plan.rows.columns, table.sequence_by)


def _log_truncates(engine: DeltaEngine, table: TableConfig, lake: Lake, logged: DataFrame | pa.Table) -> int:
    """The batch's truncates (`logged`: their positions, once each) in the truncate log of a table with history;
    returns how many history has not seen: they close versions of every key."""
    if not table.history:
        return 0
    return engine.merge(logged, lake.truncates(table.name), TRUNCATE_LOG_MERGE).inserted


def _history(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, events: DataFrame | None,
             fields: list[types.ImageField], new_truncates: int, summary: SilverSummary) -> None:
    """History from the batch's typed row events that typing did not quarantine (None: it had none), recomputed for
    every key after a truncate it has not seen."""
    summary.history_rows = apply_history(spark, engine, table, lake, events, fields, recompute_all=new_truncates > 0) \
        if events is not None or new_truncates else 0


def _truncate(engine: DeltaEngine, table: TableConfig, lake: Lake, new_truncate: str | None) -> int:
    """A batch's new truncate empties silver and its ledger as of its position, before the batch's rows are merged;
    returns the silver rows it removed."""
    if not new_truncate:
        return 0
    predicate = f"_seq < {engine.literal(new_truncate)}"
    removed = engine.delete(lake.silver(table.name), predicate) if engine.version(lake.silver(table.name)) is not None else 0
    if engine.version(lake.tombstones(table.name)) is not None:
        engine.delete(lake.tombstones(table.name), predicate)
    return removed


def _merge(engine: DeltaEngine, table: TableConfig, lake: Lake, rows: DataFrame | pa.Table | None,
           ledger: DataFrame | pa.Table | None, small: bool, delete_counts: dict[str, int], summary: SilverSummary,
           deleted_by_truncate: int = 0) -> None:
    """Silver's merge of a batch's `rows` and the tombstone ledger's of its entries (None: nothing to merge), either
    plan's; expire old ledger entries, and count what the merges did. Into no table, delta-rs creates it empty and
    merges (two commits), where a Spark DataFrame's insert clause would be a Spark job of its own (DeltaEngine.merge):
    a whole database's initial load paid it twice a table."""
    result = None if rows is None else engine.merge(rows, lake.silver(table.name), replace(SILVER_MERGE, keys=table.keys),
                                                    table.partition_by, small=small)
    if ledger is not None:
        engine.merge(ledger, lake.tombstones(table.name), replace(LEDGER_MERGE, keys=table.keys), small=small)
    removed = result.deleted if result else 0
    summary.inserted, summary.updated = (result.inserted, result.updated) if result else (0, 0)
    summary.deleted = removed + deleted_by_truncate
    summary.tombstones_expired = _expire_tombstones(engine, lake, table)
    summary.deletes = {**delete_counts, "removed": removed}


def _widen(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, widened: tuple[types.Widening, ...],
           summary: SilverSummary) -> None:
    """Silver's tables (silver, its ledger, history) take the batch's wider column types before its rows are written,
    in one commit each: the table rewritten with the columns cast (every old value fits, types.widens). Not Delta's
    type-widening feature: delta-rs, the project's reader outside Spark and one of its engines, can neither read nor
    write a table that has it (deltalake 1.6: "Unsupported table features required: [TypeWidening]"). A failed gate
    restores each table to its version before the batch, the narrower type with it."""
    if not widened:
        return
    summary.widened = [str(w) for w in widened]
    for name, path in lake.silver_tables(table.name).items():
        schema = engine.schema(path)
        casts = {w.column: F.col(w.column).cast(w.new) for w in widened
                 if schema is not None and w.column in schema.fieldNames() and schema[w.column].dataType != w.new}
        current = engine.read(spark, path) if casts else None
        if current is not None:
            engine.overwrite(current.withColumns(casts), path, table.partition_by if name in ("silver", "history") else ())
            log.info(f"silver: {table.name}'s {name} widened: {', '.join(str(w) for w in widened if w.column in casts)}")


def _restore(engine: DeltaEngine, published: dict[str, int | None]) -> None:
    """Every table back to its version before the batch (a table the batch created: emptied)."""
    for path, before in published.items():
        if before is None and engine.version(path) is not None:
            engine.delete(path, "true")
        elif before is not None and engine.version(path) != before:
            engine.restore(path, before)


def _expire_tombstones(engine: DeltaEngine, lake: Lake, table: TableConfig) -> int:
    """Drop ledger entries older than the table's tombstone retention (by the delete's source time).
    After that, a change older than the delete arriving even later can bring the row back: the
    retention is the lateness the table promises to absorb. Default: keep them forever."""
    if table.tombstone_retention_s is None or engine.version(lake.tombstones(table.name)) is None:
        return 0
    cutoff_ms = int(now().timestamp() * 1000) - table.tombstone_retention_s * 1000
    return engine.delete(lake.tombstones(table.name), f"_deleted_at_ms < {cutoff_ms}")


def _save_progress(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, bronze_version: int,
                   truncated_at: str | None, batch_id: str) -> None:
    row = driver_rows([("silver", bronze_version, truncated_at, batch_id, now(), engine.version(lake.silver(table)))],
                      PROGRESS_SCHEMA)
    engine.merge(row, lake.progress(table), MergeSpec(("layer",), update_when="true", insert_when="true"))
