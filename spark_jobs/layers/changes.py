"""Pure transforms from a batch's ordered events to the changes silver applies: the newest event per key,
and those newer than the key's current state. DataFrame -> DataFrame; nothing here reads or writes."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.sql_text import ident, literal, named_struct, sql

# What an event says (op and both images): two events at one position with different content tie
EVENT_CONTENT = "concat_ws('\\u0001', op, coalesce(before, ''), coalesce(after, ''))"



def latest_per_key(events: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Keep the newest event per key: highest `_seq`, ties broken by landing file and line.

    Adds `_events` (how many events the key had in the batch) and `_tie` (true when another event with
    different content shares the winner's sequence)."""
    # One aggregation instead of ranking windows: it combines map-side before the shuffle (W4 in
    # tests/benchmarks/RESULTS.md). A struct's max orders field by field with nulls lowest, as
    # `_seq DESC NULLS LAST` does.
    position = ("_seq", "_source_file", "_line")
    rest = [c for c in events.columns if c not in keys and c not in position]
    carried = [c for c in rest if _orderable(events.schema[c].dataType)]
    other = [c for c in rest if c not in carried]  # maps and variants: taken from the newest event one by one
    at = f"struct({', '.join(position)})"
    # a tie: the largest and the smallest content hash at the top position differ (bitwise NOT reverses a
    # long's order). Only a 64-bit hash collision could hide one, and the gate's audit (`event_audit`)
    # compares the contents themselves. at_top: the value of the newest-positioned event with the largest value
    content = "xxhash64(op, coalesce(before, ''), coalesce(after, ''))"

    def at_top(value: str) -> str:
        return f"max({named_struct({'_seq': '_seq', 'v': value})}).v"

    picked = events.groupBy(*[sql(ident(k)) for k in keys]).agg(
        sql(f"max(struct({', '.join(ident(c) for c in (*position, *carried))})) AS _newest"),
        *[sql(f"max_by({ident(c)}, {at}) AS {ident(c)}") for c in other],
        sql("count(1) AS _events"),
        sql(f"{at_top(content)} <> ~({at_top(f'~{content}')}) AS _tie"))
    return picked.select(*[sql(ident(c) if c in keys or c in other else f"_newest.{ident(c)} AS {ident(c)}")
                           for c in events.columns], sql("_events"), sql("_tie"))


def _orderable(data_type: T.DataType) -> bool:
    """Whether Spark can compare values of the type (maps and variants it cannot)."""
    if isinstance(data_type, T.StructType):
        return all(_orderable(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return _orderable(data_type.elementType)
    return not isinstance(data_type, (T.MapType, T.VariantType))


def newer(seq: str, state_seq: str) -> str:
    """SQL text: is the event at position `seq` newer than its key's state at `state_seq` (null: the key has none)?
    The one statement of "apply only if newer": the plan's, the merges' and the delete counts', in Spark and in the
    silver pass's Arrow finish (sql_text.holds evaluates this text there)."""
    return f"({state_seq} IS NULL OR {seq} > {state_seq})"


# a latest event against its key's state position (`_state_seq`, null: the key has none, `against_state`): newer ones
# are applied; one at the very position silver holds is a redelivery of the event applied; older ones are stale
NEWER = newer("_seq", "_state_seq")
REDELIVERED = "_seq = _state_seq"
# a key's ledger entry older than its live row (`_ledger_behind`: a run killed between silver's merge and the ledger's
# left both), which the batch's merge does not replace with a newer event: the ledger clears it on its own, at the row's
# position (`_state_seq`)
LEDGER_CLEARED = f"coalesce(_ledger_behind, false) AND NOT {NEWER}"

# the tombstone ledger's merge source beside a key's columns (`ledger_rows`): each row silver's merge writes, at its
# position (its deletes enter the ledger, dated by their source's time, else their ingestion's; its upserts clear the
# key's entry), and each key LEDGER_CLEARED picks, as an upsert at its live row's position (`_state_seq`), which the
# ledger's merge clears like any newer one
LEDGER_ENTRY = {"_seq": "_seq", "_op": "_op", "_deleted_at_ms": "coalesce(_source_ts_ms, unix_millis(_ingested_at))"}
LEDGER_CATCH_UP = {"_seq": "_state_seq", "_op": "'u'", "_deleted_at_ms": "CAST(NULL AS BIGINT)"}

# SQL text: is a merged silver row one the post-merge audit checks, of a key the batch touched (`_touched`, null: not)
# or written by the batch (`_audited_batch`, its id bound as a column, so the text is one for every batch and parsed
# once)? Its checks scale with the batch, not the table.
AUDITED_ROWS = "coalesce(_touched, false) OR _batch_id = _audited_batch"


def after_truncate(truncated_at: str | None) -> str:
    """SQL text: is the event at `_seq` after the truncate in force at `truncated_at` (None: none is)? A truncate
    empties the table as of its position: events at or before it apply to nothing."""
    return f"_seq > {literal(truncated_at)}" if truncated_at else "true"


def kept_by_truncate(new_truncate: str) -> str:
    """SQL text: does a key's state entry at `_seq` outlive the batch's new truncate (at `new_truncate`)? The truncate
    removes older entries before the merge, so they are no key's state."""
    return f"_seq >= {literal(new_truncate)}"


def delete_outcomes(truncated_at: str | None) -> dict[str, str]:
    """SQL text of where a delete the batch received (`_seq`, once per key and position) goes, beside its key's
    newest event in the batch (`_winner_seq`: null unless that is a delete) and its key's state (`_state_seq`,
    `_live`): before the truncate in force, superseded by a later event of its key, stale (the state is newer),
    or applied to a key that is not live (`absent`: the ledger records it). The rest remove live rows, as many as the
    merge must report (the silver gate's check)."""
    before, winner = f"NOT {after_truncate(truncated_at)}", "coalesce(_winner_seq = _seq, false)"
    return {"before_truncate": before, "superseded": f"NOT ({before}) AND NOT {winner}",
            "stale": f"{winner} AND NOT {NEWER}", "absent": f"{winner} AND {NEWER} AND NOT coalesce(_live, false)"}


def against_state(latest: DataFrame, state: DataFrame, keys: tuple[str, ...], small: bool = False) -> DataFrame:
    """Latest events with their key's current state (silver_plan.current_state): its position as `_state_seq`, whether
    it is live (`_live`) and whether a ledger entry lags its live row (`_ledger_behind`). `small`: a one-partition
    batch's, its state broadcast (a join of two one-partition frames is otherwise shuffled, a Spark job per exchange
    for each action over it)."""
    state = state.select(*keys, F.col("_seq").alias("_state_seq"), "_live", "_ledger_behind")
    return latest.join(F.broadcast(state) if small else state, list(keys), "left")


def effective_changes(placed: DataFrame) -> DataFrame:
    """Of the latest events placed against their keys' state (`against_state`), those newer than it (`NEWER`). Older
    events are stale: they never overwrite, and a late event older than a delete never brings the row back."""
    return placed.where(NEWER).drop("_state_seq", "_live", "_ledger_behind")


def ledger_rows(rows: DataFrame, placed: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """The tombstone ledger's merge source (LEDGER_ENTRY of silver's merged `rows`, LEDGER_CATCH_UP of the latest events
    `placed` against their keys' state), under the key columns."""
    def columns(texts: dict[str, str]) -> list[Column]:
        return [*[sql(ident(k)) for k in keys], *[sql(f"{text} AS {ident(name)}") for name, text in texts.items()]]

    return rows.select(*columns(LEDGER_ENTRY)).unionByName(placed.where(sql(LEDGER_CLEARED)).select(*columns(LEDGER_CATCH_UP)))
