"""A small table's batch after the silver pass (layers/silver_pass.py), planned on the driver in Arrow: its keys'
state, the rows silver's merge writes, the tombstone ledger's rows, where each delete goes, and the rows the gate
audits after the merge. These are silver_plan's rules (current_state, effective_changes, silver_rows,
delete_outcome_counts, merged_audit) and silver's (_merge_ledger), written again for the driver: as Spark queries they
cost a small table more to build and plan than the work itself (tests/benchmarks/RESULTS.md, issue 32). "Newer than
its key's state", "redelivered", where each delete goes and the rows the audit checks are not written again: their
one SQL text (layers/changes.py, silver_plan.AUDITED_ROWS) is evaluated here over Arrow (sql_text.holds).
tests/layers/test_silver_pass.py holds every table's outcome equal to its own plan's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.delta import DeltaEngine, all_nullable
from spark_jobs.lake import Lake
from spark_jobs.layers import changes
from spark_jobs.layers.silver_pass import TableBatch
from spark_jobs.layers.silver_plan import AUDITED_ROWS, SILVER_META, PlanCounts
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


def _among(keys: pa.Table, or_equal: tuple[str, str] | None = None) -> Callable[[pa.Schema], pc.Expression]:
    """`DeltaEngine.read_where`'s filter: rows whose every key column holds one of `keys`' values in it (a superset of the
    rows of `keys`, which a join then takes), or whose column `or_equal[0]` is `or_equal[1]`. Values are cast to the
    table's types (Spark's keys may be narrower)."""
    def where(schema: pa.Schema) -> pc.Expression:
        among = reduce(lambda a, b: a & b, [
            # unsafe: a value the table's type cannot hold (its column narrower than the batch's) is in none of its rows
            pc.field(k).isin(pc.unique(keys.column(k)).cast(schema.field(k).type, safe=False)) for k in keys.column_names])
        if or_equal is None:
            return among
        column, value = or_equal
        return among | (pc.field(column) == pa.scalar(value, schema.field(column).type))
    return where


def _aligned_state(engine: DeltaEngine, lake: Lake, table: TableConfig, latest: pa.Table) -> pa.Table:
    """silver_plan.current_state of each of `latest`'s keys, in its order: `_state_seq` and `_live` (null: the key has
    no state), `_ledger_behind` (false then)."""
    keys = list(table.keys)
    wanted = _key_columns(latest, table.keys).append_column("_at", pa.array(range(latest.num_rows), pa.int64()))
    entries = []
    for path, live in ((lake.silver(table.name), True), (lake.tombstones(table.name), False)):
        current = engine.read_where(path, [*keys, "_seq"], _among(wanted.select(keys)))
        if current is not None and current.num_rows:
            current = current.select([*keys, "_seq"]).cast(pa.schema([*wanted.select(keys).schema, pa.field(
                "_seq", latest.schema.field("_seq").type)]))
            entries.append(current.append_column("_live", pa.array([live] * current.num_rows, pa.bool_())).join(
                wanted.select(keys), keys, join_type="left semi"))
    if entries:
        # a key's newest entry (live first at one position, as max(struct(_seq, _live)) orders), and how many it has
        newest = pa.concat_tables(entries).sort_by([("_seq", "descending"), ("_live", "descending")]).group_by(
            keys, use_threads=False).aggregate([("_seq", "first"), ("_live", "first"), ("_seq", "count")])
        state = pa.table({**{k: newest.column(k) for k in keys}, "_state_seq": newest.column("_seq_first"),
                          "_live": newest.column("_live_first"),
                          "_ledger_behind": pc.and_(pc.greater(newest.column("_seq_count"), 1), newest.column("_live_first"))})
    else:
        state = pa.table({**{k: pa.array([], wanted.schema.field(k).type) for k in keys},
                          "_state_seq": pa.array([], latest.schema.field("_seq").type), "_live": pa.array([], pa.bool_()),
                          "_ledger_behind": pa.array([], pa.bool_())})
    aligned = wanted.join(state, keys, join_type="left outer").sort_by("_at")
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


def merged_audit(engine: DeltaEngine, lake: Lake, table: TableConfig, batch: TableBatch, batch_id: str
                 ) -> tuple[pa.Table, pa.Table]:
    """silver_plan.merged_audit, read back from the merged silver table: its rows of the batch's keys and those this
    batch wrote (key, `_seq`), and each delete received (`_seq`) with `_live_seq`, its key's live position now."""
    keys = list(table.keys)
    touched = _key_columns(batch.latest, table.keys)
    received = _key_columns(batch.deletes, table.keys).append_column("_seq", batch.deletes.column("_seq"))
    silver = engine.read_where(lake.silver(table.name), [*keys, "_seq", "_batch_id"], _among(
        pa.concat_tables([touched, received.select(keys)]), ("_batch_id", batch_id)))
    if silver is None:
        rows = touched.slice(0, 0).append_column("_seq", batch.latest.column("_seq").slice(0, 0))
        live_seq = pa.array([None] * received.num_rows, batch.deletes.schema.field("_seq").type)
        return rows, pa.table({"_seq": received.column("_seq"), "_live_seq": live_seq})
    silver = silver.select([*keys, "_seq", "_batch_id"]).cast(pa.schema(
        [*touched.schema, pa.field("_seq", batch.latest.schema.field("_seq").type), pa.field("_batch_id", pa.string())]))
    marked = silver.join(touched.append_column("_touched", pa.array([True] * touched.num_rows, pa.bool_())), keys,
                         join_type="left outer")
    marked = marked.append_column("_audited_batch", pa.array([batch_id] * marked.num_rows, pa.string()))
    rows = marked.filter(holds(marked, AUDITED_ROWS)).select([*keys, "_seq"])
    live = silver.select([*keys, "_seq"]).rename_columns([*keys, "_live_seq"])
    deletes = received.join(live, keys, join_type="left outer")
    return rows, deletes.select(["_seq", "_live_seq"])
