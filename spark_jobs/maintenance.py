"""Table maintenance over months (`python -m spark_jobs maintain`, the `cdc_maintenance` DAG): every Delta
table of a source table (bronze, silver, its history, the pipeline's state, quarantine) or of a gold model is
compacted when small files have piled up (silver and gold Z-ordered by their keys, so a merge touches
fewer files), checkpointed, and vacuumed with a retention that keeps every version of the time-travel window
readable; GX validation results, their Data Docs pages and run reports older than their retention go.

Delta's own commands do the work (delta-rs' or delta-spark's OPTIMIZE, VACUUM and checkpoint, through the
engine); this module decides what to run on which table and counts what it changed, under the table's
writer lock so no run writes while it compacts."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from spark_jobs.delta.reads import snapshot_files
from spark_jobs.lake import Lake
from spark_jobs.layers.gold_plan import group_columns
from spark_jobs.layers.summary import LayerSummary
from spark_jobs.logs import logger
from spark_jobs.registry import GoldModel, Maintenance, Registry, TableConfig
from spark_jobs.state import transactions_name

log = logger(__name__)

# GX names a validation result's folder (and its Data Docs page's) after the run's time
_RUN_TIME = re.compile(r"/(\d{8}T\d{6}\.\d{6}Z)/")


@dataclass(frozen=True)
class DeltaUpkeep:
    """What maintenance did to one Delta table: its snapshot's files and bytes, the files on storage
    (the snapshot's plus those older versions still need), and its version, before and after."""

    name: str  # bronze, silver, history, quarantine, ingest_log, ... or gold
    path: str
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    stored_before: int
    stored_after: int
    version_before: int
    version_after: int
    compacted: bool

    def line(self) -> str:
        return (f"{self.name}: files {self.files_before} -> {self.files_after}, bytes {self.bytes_before:,} -> "
                f"{self.bytes_after:,}, stored files {self.stored_before} -> {self.stored_after}, version "
                f"{self.version_before} -> {self.version_after}{' (compacted)' if self.compacted else ''}")


@dataclass(kw_only=True)
class MaintenanceSummary(LayerSummary):
    """One source table's (or gold model's) maintenance, as its run report shows it."""

    layer: str = "maintenance"
    gate: str | None = "done"  # no gate: maintenance changes no row
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    stored_files_before: int = 0
    stored_files_after: int = 0
    results_removed: int = 0  # GX validation results and Data Docs pages past the report retention
    late_files: int | None = None  # landing files found under a name before their folder's mark (now listed)
    tables: list[dict[str, Any]] = field(default_factory=list)

    def add(self, upkeep: DeltaUpkeep) -> None:
        self.files_before += upkeep.files_before
        self.files_after += upkeep.files_after
        self.bytes_before += upkeep.bytes_before
        self.bytes_after += upkeep.bytes_after
        self.stored_files_before += upkeep.stored_before
        self.stored_files_after += upkeep.stored_after
        self.tables.append(upkeep.__dict__.copy())


def table_paths(lake: Lake, table: TableConfig) -> list[tuple[str, str, tuple[str, ...]]]:
    """Every Delta table a source table owns: (name, path, columns to cluster by when compacting)."""
    keys = table.keys
    return [("bronze", lake.bronze(table.name), ()), ("silver", lake.silver(table.name), keys),
            ("history", lake.history(table.name), ()), ("quarantine", lake.quarantine(table.name), ()),
            ("ingest_log", lake.ingest_log(table.name), ()), ("tombstones", lake.tombstones(table.name), ()),
            ("truncates", lake.truncates(table.name), ()), ("progress", lake.progress(table.name), ()),
            ("pending_tombstones", lake.pending_tombstones(table.name), ())]


def maintain_table(engine: Any, lake: Lake, table: TableConfig, batch_id: str,
                   landing: str | None = None) -> MaintenanceSummary:
    """With `landing`, also recomputes the table's landing marks from a full listing (state.repair_marks)."""
    summary = MaintenanceSummary(table=table.name, batch_id=batch_id)
    if landing is not None:
        from spark_jobs.state import repair_marks

        late = repair_marks(landing, lake, table.name, table.topic)
        summary.late_files = len(late)
        if late:
            log.info(f"maintain {table.name}: {len(late)} landing file(s) landed late under names before their "
                     f"folder's mark, listed again from now on: {', '.join(late[:5])}")
    for name, path, cluster in table_paths(lake, table):
        upkeep = maintain_delta(engine, name, path, table.maintenance, cluster)
        if upkeep is not None:
            summary.add(upkeep)
    summary.results_removed = expire_gx_results(lake, table.name, table.maintenance.report_retention_s)
    return summary


def maintain_model(engine: Any, lake: Lake, model: GoldModel, batch_id: str) -> MaintenanceSummary:
    summary = MaintenanceSummary(table=model.name, batch_id=batch_id)
    # a model kept incrementally has its per-group state beside it (layers/gold_state.py), keyed by its groups
    state_keys = tuple(group_columns(len(model.keys)))
    for name, path, keys in (("gold", lake.gold(model.name), model.keys),
                             ("gold_state", lake.gold_state(model.name), state_keys)):
        upkeep = maintain_delta(engine, name, path, model.maintenance, keys)
        if upkeep is not None:
            summary.add(upkeep)
    summary.results_removed = expire_gx_results(lake, model.name, model.maintenance.report_retention_s)
    return summary


def maintain_transactions(engine: Any, lake: Lake, topic: str, policy: Maintenance, batch_id: str) -> MaintenanceSummary:
    """A transaction topic's log of END events, its ingest log and its quarantine (layers/transactions.py), under the
    topic's own writer lock, which the gold refreshes taking its files hold."""
    name = transactions_name(topic)
    summary = MaintenanceSummary(table=name, batch_id=batch_id)
    for kind, path in (("transactions", lake.transactions(topic)), ("ingest_log", lake.ingest_log(name)),
                       ("quarantine", lake.quarantine(name))):
        upkeep = maintain_delta(engine, kind, path, policy, ())
        if upkeep is not None:
            summary.add(upkeep)
    return summary


def maintain_delta(engine: Any, name: str, path: str, policy: Maintenance, cluster: tuple[str, ...]) -> DeltaUpkeep | None:
    """Compact (when at least `min_small_files` files are under the target size), checkpoint, vacuum. None
    when the table does not exist (a table without history, a model never published)."""
    before = snapshot_files(path)
    if before is None:
        return None
    stored_before = _stored_files(path)
    target = policy.target_file_mb * 2**20
    small = sum(1 for size in before[1] if size < target)
    compacted = small >= policy.min_small_files
    if compacted:
        engine.compact(path, target, cluster if policy.cluster_by_key else ())
    engine.checkpoint(path, policy.retain_versions_s)
    engine.vacuum(path, policy.retain_versions_s)
    after = snapshot_files(path)
    assert after is not None
    return DeltaUpkeep(name=name, path=path, files_before=len(before[1]), files_after=len(after[1]),
                       bytes_before=sum(before[1]), bytes_after=sum(after[1]), stored_before=stored_before,
                       stored_after=_stored_files(path), version_before=before[0], version_after=after[0],
                       compacted=compacted)


def _stored_files(path: str) -> int:
    """Data files on storage, the log's own files left out: what VACUUM removes from."""
    from spark_jobs.storage import lake_files

    return sum(1 for p in lake_files(path).list(path) if "/_delta_log/" not in p and p.endswith(".parquet"))


def _older_than(retention_s: int) -> str:
    """GX's run-time folder name of the moment `retention_s` ago: names sort as times."""
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=retention_s)
    return cutoff.strftime("%Y%m%dT%H%M%S.%fZ")


def expire_gx_results(lake: Lake, table: str, retention_s: int) -> int:
    """Removes the table's (or a pass site's) GX validation results and their Data Docs pages older than `retention_s`, then
    rebuilds its Data Docs so that their index lists only what is left. Returns the files removed."""
    cutoff = _older_than(retention_s)
    files = lake.files
    stores = [f"{lake.gx_stores(table)}/uncommitted/validations", f"{lake.data_docs(table)}/validations"]
    expired = [p for store in stores for p in files.list(store)
               if (m := _RUN_TIME.search(p)) and m.group(1) < cutoff]
    for path in expired:
        files.remove(path)
    if expired:
        from spark_jobs.quality.gates import rebuild_data_docs

        rebuild_data_docs(lake, table)
    return len(expired)


def expire_reports(engine: Any, lake: Lake, registry: Registry) -> list[str]:
    """Removes run reports whose newest summary is older than the top-level report retention and the event log's
    rows of steps as old; records the run reports the log lacks (a lake from before the log, a run that could not
    write it); keeps the log's Delta table compact; then renders the history page and every table's trend page
    again. Returns the runs removed."""
    from spark_jobs import event_log, report
    from spark_jobs.state import writer_lock

    policy = registry.maintenance
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=policy.report_retention_s)
    runs = report.load_runs(lake, newest=None)
    expired = [run_id for run_id, summaries in runs if max(str(s.get("published_at", "")) for s in summaries)
               < cutoff.isoformat()]
    for run_id in expired:
        lake.files.delete_tree(lake.run_reports(run_id))
    removed = event_log.expire(engine, lake, cutoff)
    logged = event_log.logged_runs(lake)
    unlogged = [(run_id, summaries) for run_id, summaries in runs if run_id not in logged and run_id not in expired]
    for run_id, summaries in unlogged:
        event_log.record_run(engine, lake, run_id, partial(list, summaries))  # the summaries read above
    if unlogged:
        log.info(f"maintain event_log: {len(unlogged)} run report(s) it lacked recorded")
    with writer_lock(lake, event_log.LOCK, "maintenance"):
        upkeep = maintain_delta(engine, "event_log", lake.event_log, policy, ())
    if upkeep is not None:
        log.info(f"maintain event_log: {removed} row(s) of steps past the retention removed; {upkeep.line()}")
    if expired or removed or unlogged:
        report.render_history(lake, [*registry.tables, *registry.gold])
    from spark_jobs.quality.gates import PASS_LAYERS, pass_site

    for layer in PASS_LAYERS:  # the passes' validations, under the top-level retention like the runs they gated
        expire_gx_results(lake, pass_site(layer), policy.report_retention_s)
    return expired
