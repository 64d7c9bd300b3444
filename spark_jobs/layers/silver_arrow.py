"""A small table's batch after the silver pass (layers/silver_pass.py), planned on the driver in Arrow: the rows
silver's merge writes, the tombstone ledger's rows and where each delete goes. These are silver_plan's rules
(effective_changes, silver_rows, delete_outcome_counts) and silver's (_merge_ledger), written again for the driver: as
Spark queries they cost a small table more to build and plan than the work itself (tests/benchmarks/RESULTS.md, issue
32). The keys' state and the audit's read-back are every small batch's, its own plan's too (layers/keyed_reads.py).
"Newer than its key's state", "redelivered", where each delete goes and which ledger entries a live row clears are not
written again: their one SQL text (layers/changes.py) is evaluated here over Arrow (sql_text.holds).
tests/layers/test_silver_pass.py holds every table's outcome equal to its own plan's."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.delta import DeltaEngine, all_nullable
from spark_jobs.lake import Lake
from spark_jobs.layers import changes, keyed_reads
from spark_jobs.layers.silver_pass import TableBatch
from spark_jobs.layers.silver_plan import SILVER_META, PlanCounts
from spark_jobs.registry import TableConfig
from spark_jobs.sql_text import holds


@dataclass(frozen=True)
class ArrowPlan:
    """What the batch changes: the merges' source rows, and the counts its summary and gate report."""

    rows: pa.Table  # silver's merge source: the newest events newer than their key's state
    ledger: pa.Table | None  # the tombstone ledger's merge source; None: nothing for it
    delete_counts: dict[str, int]
    counts: PlanCounts


def plan(engine: DeltaEngine, lake: Lake, table: TableConfig, batch: TableBatch) -> ArrowPlan:
    latest = batch.latest
    state = _aligned_state(engine, lake, table, latest)
    placed = pa.table({"_seq": latest.column("_seq"), "_state_seq": state.column("_state_seq"),  # changes.against_state
                       "_ledger_behind": state.column("_ledger_behind")})
    newer = holds(placed, changes.NEWER)
    effective = latest.filter(newer)
    row = effective.column("_row").combine_chunks()
    rows = pa.Table.from_arrays(
        [*row.flatten(), *[effective.column(c if c != "_op" else "op") for c in SILVER_META]],
        names=[*[f.name for f in row.type], *SILVER_META])
    rows = rows.cast(all_nullable(rows.schema))
    behind = holds(placed, changes.LEDGER_CLEARED)
    ledger = _ledger_rows(table, effective, latest.filter(behind), state.filter(behind))
    figures = batch.figures
    redelivered = pc.sum(holds(placed, changes.REDELIVERED)).as_py()
    counts = PlanCounts(batch.overview["rows"], batch.overview["newest_ts_ms"], 0, figures.events, figures.positions,
                        figures.positions_after_truncate, figures.keys, figures.ties, rows.num_rows, int(redelivered or 0))
    return ArrowPlan(rows, ledger if rows.num_rows or ledger.num_rows else None,
                     _delete_counts(batch, latest, state), counts)


def _key_columns(rows: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The key columns of rows holding `_row` (silver's source columns)."""
    return pa.table({k: pc.struct_field(rows.column("_row"), k) for k in keys})


def _aligned_state(engine: DeltaEngine, lake: Lake, table: TableConfig, latest: pa.Table) -> pa.Table:
    """`key_state` of each of `latest`'s keys, in its order, as changes.against_state places them: `_state_seq` and
    `_live` (null: the key has no state), `_ledger_behind` (false then)."""
    wanted = _key_columns(latest, table.keys)
    state = keyed_reads.key_state(engine, lake, table, wanted, latest.schema.field("_seq").type).rename_columns(
        [*table.keys, "_state_seq", "_live", "_ledger_behind"])
    aligned = wanted.append_column("_at", pa.array(range(latest.num_rows), pa.int64())).join(
        state, list(table.keys), join_type="left outer").sort_by("_at")
    return aligned.set_column(aligned.schema.get_field_index("_ledger_behind"), "_ledger_behind",
                              pc.fill_null(aligned.column("_ledger_behind"), False))


def _ledger_rows(table: TableConfig, effective: pa.Table, behind: pa.Table, behind_state: pa.Table) -> pa.Table:
    """silver._merge_ledger's source: the merged events (deletes enter, newer upserts clear), and a live key's ledger
    entry older than its row (a run killed between the two merges), cleared at the row's position."""
    ingested_ms = pc.divide(effective.column("_ingested_at").cast(pa.timestamp("us", "UTC")).cast(pa.int64()), 1000)
    merged = _key_columns(effective, table.keys)
    for name, values in (("_seq", effective.column("_seq")), ("_op", effective.column("op")),
                         ("_deleted_at_ms", pc.coalesce(effective.column("_source_ts_ms"), ingested_ms))):
        merged = merged.append_column(name, values)
    cleared = _key_columns(behind, table.keys)
    n = cleared.num_rows
    for name, values in (("_seq", behind_state.column("_state_seq")),
                         ("_op", pa.array(["u"] * n, merged.schema.field("_op").type)),
                         ("_deleted_at_ms", pa.array([None] * n, pa.int64()))):
        cleared = cleared.append_column(name, values)
    ledger = pa.concat_tables([merged, cleared.cast(merged.schema)])
    return ledger.cast(all_nullable(ledger.schema))


def _delete_counts(batch: TableBatch, latest: pa.Table, state: pa.Table) -> dict[str, int]:
    """silver_plan.delete_outcome_counts: where each delete received goes (changes.delete_outcomes' texts)."""
    is_delete = pc.equal(latest.column("op"), "d")
    winners = pa.table({"_key": latest.column("_key"), "_winner_seq": latest.column("_seq"),
                        "_state_seq": state.column("_state_seq"), "_live": state.column("_live")}).filter(is_delete)
    outcome = batch.deletes.select(["_key", "_seq"]).join(winners, "_key", join_type="left outer")
    return {"received": outcome.num_rows, **{
        place: int(pc.sum(pc.cast(holds(outcome, text), pa.int64())).as_py() or 0)
        for place, text in changes.delete_outcomes(batch.truncated_at).items()}}


def pass_audit(engine: DeltaEngine, lake: Lake, table: TableConfig, batch: TableBatch, batch_id: str
               ) -> tuple[pa.Table, pa.Table]:
    """`merged_audit` of a batch the silver pass planned (its keys in `_row`)."""
    received = _key_columns(batch.deletes, table.keys).append_column("_seq", batch.deletes.column("_seq"))
    return keyed_reads.merged_audit(engine, lake.silver(table.name), _key_columns(batch.latest, table.keys), received, batch_id)
