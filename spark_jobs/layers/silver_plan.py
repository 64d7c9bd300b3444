"""Silver's plan for one batch, computed before anything is written: the events ordered and typed, the
newest per key, the keys' current state, the rows the merge will write, where each delete goes, and the
audit frames the gate checks. Pure reads of the lake; nothing here writes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.debezium import envelope, ordering, types
from spark_jobs.delta import DeltaEngine, spark_frame
from spark_jobs.errors import ConfigError
from spark_jobs.lake import Lake
from spark_jobs.layers import changes, keyed_reads
from spark_jobs.layers.common import (
    ONE_TASK_BYTES,
    ONE_TASK_ROWS,
    QUARANTINED_COLUMNS,
    checkpoint,
    join_side,
    observed_checkpoint,
    one_row,
    reason_counts,
    single_rows,
)
from spark_jobs.quality.user_expectations import check_columns, named_columns, violations
from spark_jobs.registry import TableConfig
from spark_jobs.sql_text import ident, labels_where, literal, sql

NO_SEQUENCE = "missing_sequence: no log position for this connector; set sequence_by"


def missing_sequence(table: TableConfig) -> str:
    """The quarantine reason of an event without a position in the log."""
    if table.sequence_by:
        return f"missing_sequence: sequence_by ({', '.join(table.sequence_by)}) is null or absent in this event"
    return NO_SEQUENCE


MISSING_TRANSACTION = ("missing_transaction: a change without its transaction block, on a table with 'transactions' "
                       "(is the connector's provide.transaction.metadata on?)")


def outside_transactions(table: TableConfig) -> str:
    """A change (not a snapshot read) of a table whose connector publishes its transactions, without the
    transaction it belongs to: no watermark could place it, so it is quarantined rather than shown at once."""
    return "op <> 'r' AND _transaction_id IS NULL" if table.transactions else "false"


def missing_key_parts(keys: tuple[str, ...], row: str | None = None) -> str:
    """Comma-separated key columns that are null in the typed event ('' when none): in the struct `row`, else
    top-level columns (a key that did not parse to its type is missing)."""
    return labels_where({k: f"{f'({row}).' if row else ''}{ident(k)} IS NULL" for k in keys}, ",")


def quarantine_reason(table: TableConfig, missing: str) -> str:
    """Why a typed row event is quarantined, else null: the first of no position, a value its type or silver's column
    cannot hold, a key part missing (`missing`: `missing_key_parts`), a change outside the transactions its table
    publishes."""
    return (f"CASE WHEN _seq IS NULL THEN {literal(missing_sequence(table))}"
            " WHEN _decode_problems <> '' THEN concat('incompatible_type: ', _decode_problems)"
            " WHEN _type_problems <> '' THEN concat('incompatible_type: ', _type_problems)"
            f" WHEN {missing} <> '' THEN concat('missing_key: ', {missing})"
            f" WHEN {outside_transactions(table)} THEN {literal(MISSING_TRANSACTION)} END")




@dataclass(frozen=True)
class PlanCounts:
    """A batch's counts before anything is written: what its summary reports (silver._counts)."""

    rows_in: int  # bronze rows in the batch
    newest_ts_ms: int | None
    truncates: int
    events: int  # row events without a quarantine reason
    positions: int  # distinct (key, position) among them
    positions_after_truncate: int
    keys: int  # keys with an event after the truncate in force
    ties: int
    effective: int  # rows the merge writes
    redelivered: int  # keys whose newest event is the one silver already holds (changes.REDELIVERED)


@dataclass(frozen=True)
class KeysHere:
    """A small batch's keys on the driver, collected once for its keys' state and its merged rows' read-back."""

    touched: pa.Table  # the key columns of the batch's newest events
    received: pa.Table  # the key columns and `_seq` of each delete received


@dataclass
class BatchPlan:
    """What one batch will change, and the rows the gate audits before anything is written."""

    truncates: DataFrame  # the batch's truncate events, `reason` set where one cannot be applied
    truncate_count: int
    new_truncate: str | None  # the batch's newest truncate position, when newer than the one in force
    truncated_at: str | None  # the truncate position in force after the batch
    rows_in: int  # bronze rows in the batch
    bytes_in: int  # their change events' bytes as they landed
    newest_ts_ms: int | None
    quarantine: DataFrame  # (_source_file, _line, _raw, reason)
    target_schema: T.StructType | None  # silver's schema (with the batch's widenings), None before its first commit
    typed: DataFrame | None = None  # row events, typed (`_row`, key columns), with a quarantine `reason`
    fields: list[types.ImageField] = field(default_factory=list)
    widened: tuple[types.Widening, ...] = ()  # silver's columns the batch's types widen (silver takes them first)
    audited: dict[str, DataFrame] = field(default_factory=dict)  # the rows the expectations' flags read, by name
    frames: dict[str, DataFrame] = field(default_factory=dict)  # the rows a user's expectations read, by name
    events: int = 0  # row events without a quarantine reason
    positions: int = 0  # distinct (key, position) among them
    positions_after_truncate: int = 0
    keys: int = 0
    ties: int = 0
    latest: DataFrame | None = None  # the newest event per key
    state: DataFrame | None = None  # the keys' current state (current_state)
    placed: DataFrame | None = None  # the latest events beside their keys' state (changes.against_state)
    rows: DataFrame | None = None  # what the merge writes: latest events newer than the state
    effective: int = 0
    redelivered: int = 0
    ledger_cleared: int = 0  # ledger entries behind their live row the batch clears (changes.LEDGER_CLEARED)
    deletes: DataFrame | None = None  # (key, _seq) of each delete received
    keys_here: KeysHere | None = None  # a batch read by key on the driver (keyed_reads.by_key): its keys and deletes
    quarantine_counts: dict[str, int] | None = None  # the quarantine's rows by reason (None: not counted yet)
    delete_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("received", "before_truncate", "superseded", "stale", "absent"), 0))

    @property
    def counts(self) -> PlanCounts:
        return PlanCounts(self.rows_in, self.newest_ts_ms, self.truncate_count, self.events, self.positions,
                          self.positions_after_truncate, self.keys, self.ties, self.effective, self.redelivered)

    @property
    def one_task(self) -> bool:
        """A batch small enough to plan in one partition (common.checkpoint)."""
        return self.rows_in <= ONE_TASK_ROWS

    @property
    def small(self) -> bool:
        """A batch whose rows fit in the driver's memory: written from there (DeltaEngine, `small`). Its events'
        bytes bound the rows it writes, which are made of them."""
        return self.one_task and self.bytes_in <= ONE_TASK_BYTES


def plan_batch(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, batch: DataFrame,
               truncated_at: str | None) -> BatchPlan:
    """One pass over the batch; every later step (and each count) starts from these rows."""
    ordered = ordering.order_key(batch, table.sequence_by)
    if table.transactions:
        ordered = ordering.with_transaction_key(ordered)
    ordered, overview = observed_checkpoint(
        ordered, *overview_columns(envelope.holds_placeholder(table.unavailable_value_placeholder),
                                   truncate_reason(table)),
        *[sql(text) for text in FIELD_SOURCES])
    # truncate (op=t): the table is empty as of its position; every older event is stale
    truncates = ordered.where("op = 't'").withColumn("reason", sql(truncate_reason(table)))
    new_truncate = newer_truncate(overview["truncated_at"], truncated_at)
    plan = BatchPlan(truncates, overview["truncates"], new_truncate, new_truncate or truncated_at, overview["rows"],
                     overview["bytes"] or 0, overview["newest_ts_ms"],
                     truncates.where("reason IS NOT NULL").select(*QUARANTINED_COLUMNS), engine.schema(lake.silver(table.name)))
    if plan.one_task:  # materialised already: the planner is only told it is one partition (common.checkpoint)
        ordered = ordered.coalesce(1)
    if overview["changes"]:
        # the overview's fields, unless unavailable values are marked first (image_fields reads them marked)
        fields = None if overview["unavailable"] else overview_fields(
            table, overview["_schemas"], overview["_inferred"], overview["_documents"], overview["plain"])
        _plan_changes(spark, engine, table, lake, ordered.where("op <> 't'"), overview["plain"] > 0,
                      overview["unavailable"] > 0, plan, fields)
    return plan


def truncate_reason(table: TableConfig) -> str:
    """SQL text: why a truncate is quarantined (no position, or outside the transactions its table's connector
    publishes), else null. A quarantined truncate is not logged."""
    return (f"CASE WHEN _seq IS NULL THEN {literal(missing_sequence(table))}"
            f" WHEN {outside_transactions(table)} THEN {literal(MISSING_TRANSACTION)} END")


def newer_truncate(batch_truncate: str | None, truncated_at: str | None) -> str | None:
    """The batch's newest truncate position (its overview's `truncated_at`), when newer than the one in force."""
    return batch_truncate if batch_truncate and batch_truncate > (truncated_at or "") else None


def overview_columns(holds_placeholder: str, truncate_refused: str) -> list[Column]:
    """A batch's overview, as aggregates of its ordered bronze rows: what the rest of its plan depends on
    (`holds_placeholder`, and `truncate_refused`: `truncate_reason`, SQL texts). A truncate it quarantines is no
    truncate in force: silver would lose rows that history, which never logs it, keeps."""
    logged = f"op = 't' AND ({truncate_refused}) IS NULL"
    return [sql(text) for text in (
        f"count(CASE WHEN {logged} THEN 1 END) AS truncates",
        f"max(CASE WHEN {logged} THEN _seq END) AS truncated_at",
        "count(CASE WHEN op <> 't' THEN 1 END) AS changes",
        "count(CASE WHEN op <> 't' AND _schema IS NULL THEN 1 END) AS plain",
        "max(CAST(get_json_object(source, '$.ts_ms') AS BIGINT)) AS newest_ts_ms",
        "count(1) AS rows", "sum(octet_length(_raw)) AS bytes",
        f"count(CASE WHEN {holds_placeholder} THEN 1 END) AS unavailable")]


def _plan_changes(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, changes_in: DataFrame,
                  has_plain: bool, unavailable: bool, plan: BatchPlan, fields: list[types.ImageField] | None) -> None:
    """The row events' part of the plan: typed, the newest per key, the merge's rows, the deletes (`fields`: the
    images' columns from the batch's overview; None: image_fields finds them). Silver takes a
    wider type only from an event it applies: when no event the merge writes has a schema that claims the widening
    (a stale event's, which changes no row), the batch is planned again at silver's own types, and the values that
    do not fit them are quarantined naming both types."""
    if unavailable:
        changes_in = envelope.mark_unavailable(changes_in, table.unavailable_value_placeholder)
    if fields is None:
        fields = image_fields(spark, table, changes_in, has_plain)
    plan.fields = resolve_mixed(fields, plan.target_schema, changes_in)
    silver_types, before = plan.target_schema, replace(plan)
    plan.target_schema, plan.widened = types.widened(plan.target_schema, types.fields_type(plan.fields))
    effective = _plan_typed(spark, engine, table, lake, changes_in, unavailable, plan)
    if plan.widened and effective.where(types.claiming(plan.widened, plan.fields)).isEmpty():  # one job, when widening
        unwidened = replace(before, fields=plan.fields, target_schema=silver_types, widened=())
        _plan_typed(spark, engine, table, lake, changes_in, unavailable, unwidened)
        vars(plan).update(vars(unwidened))


def _plan_typed(spark: SparkSession, engine: DeltaEngine, table: TableConfig, lake: Lake, changes_in: DataFrame,
                unavailable: bool, plan: BatchPlan) -> DataFrame:
    """The typed events at the plan's types (`plan.target_schema`): the newest per key, the merge's rows, the deletes;
    returns the events the merge applies (with their `_schema`)."""
    typed = typed_changes(table, changes_in, plan.fields, plan.target_schema)
    if unavailable:
        typed = checkpoint(typed, plan.one_task)
        typed = fill_unavailable(typed, table.keys, unavailable_columns(typed), engine.read(spark, lake.silver(table.name)))
    plan.typed = typed = _quarantine_by_expectations(table, checkpoint(typed.withColumn(
        EVENT_ID, F.monotonically_increasing_id()), plan.one_task), plan)
    plan.quarantine = plan.quarantine.unionByName(typed.where("reason IS NOT NULL").select(*QUARANTINED_COLUMNS))
    events = typed.where("reason IS NULL")
    plan.audited["events"] = event_audit(typed, table.keys)
    after_truncate = sql(changes.after_truncate(plan.truncated_at))
    position = F.struct(*table.keys, "_seq")
    counts = events.agg(F.count(F.lit(1)).alias("events"), F.countDistinct(position).alias("positions"),
                        F.countDistinct(F.when(after_truncate, position)).alias("positions_after_truncate"))
    plan.latest = checkpoint(changes.latest_per_key(events.where(after_truncate), table.keys), plan.one_task)
    plan.deletes = checkpoint(events.where("op = 'd'").select(*table.keys, "_seq").distinct(), plan.one_task)
    plan.state = _state_of_keys(spark, engine, lake, table, plan)
    plan.placed = placed = changes.against_state(plan.latest, plan.state, table.keys, plan.one_task)  # a row per key
    effective = changes.effective_changes(placed)
    plan.rows = checkpoint(silver_rows(effective, plan.fields, plan.target_schema), plan.one_task)
    placements = placed.agg(F.count(F.lit(1)), F.sum(F.col("_tie").cast("int")), *[
        F.count(F.when(sql(text), 1)) for text in (changes.NEWER, changes.REDELIVERED, changes.LEDGER_CLEARED)])
    outcomes = delete_outcome_counts(plan.deletes, placed, table.keys, plan.truncated_at, plan.one_task)
    quarantined = plan.quarantine.coalesce(1) if plan.one_task else plan.quarantine  # one_task: grouped in place
    counted, placed_counts, delete_counts, reasons = single_rows(  # one Spark job
        counts, placements, outcomes, reason_counts(quarantined))
    plan.quarantine_counts = reasons["reasons"]
    plan.events, plan.positions, plan.positions_after_truncate = counted
    plan.keys, ties, plan.effective, plan.redelivered, plan.ledger_cleared = placed_counts
    plan.ties = int(ties or 0)
    plan.delete_counts = delete_counts.asDict()
    return effective


def _state_of_keys(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: TableConfig, plan: BatchPlan
                   ) -> DataFrame:
    """current_state of the keys of the batch's newest events: a small batch's read on the driver by key, as a silver
    pass's are (keyed_reads.key_state), a larger one's by Spark. A small batch's keys and deletes are collected once,
    in one Spark job, for this and for its merged rows' read-back (`plan.keys_here`), where Spark's joins with silver's
    and the ledger's scans cost a job per exchange."""
    assert plan.latest is not None and plan.deletes is not None
    if keyed_reads.by_key(plan.small, plan.latest.schema, table.keys):
        keys, seq = list(table.keys), plan.deletes.schema["_seq"].dataType
        both = plan.latest.select(*keys, F.lit(None).cast(seq).alias("_seq"), F.lit(True).alias("_touched")).unionByName(
            plan.deletes.select(*keys, "_seq", F.lit(False).alias("_touched"))).toArrow()
        plan.keys_here = KeysHere(both.filter(both.column("_touched")).select(keys),
                                  both.filter(pc.invert(both.column("_touched"))).select([*keys, "_seq"]))
        state = keyed_reads.key_state(engine, lake, table, plan.keys_here.touched, both.schema.field("_seq").type,
                                      plan.new_truncate)
        return spark_frame(spark, state).coalesce(1)
    return checkpoint(current_state(spark, engine, lake, table, plan.latest, plan.new_truncate, plan.one_task),
                      plan.one_task)


EVENT_ID = "_cdc_event_id"  # the typed event's id while it is checked against the user's expectations


def _quarantine_by_expectations(table: TableConfig, typed: DataFrame, plan: BatchPlan) -> DataFrame:
    """The user's expectations (tables.yaml) judge the typed row of each insert, update and snapshot read
    not quarantined already (`upserts`, the gate's frame for them); those failing a `quarantine` one get it
    as their reason, so they never reach silver and the key keeps the state its other events give it.
    Deletes are not judged: the row leaves, whatever its values were."""
    expectations = table.layer_expectations("silver")
    if not expectations:
        return typed.drop(EVENT_ID)
    upserts = typed.where(JUDGED).select(EVENT_ID, "_row.*")
    check_columns(upserts, expectations, "silver's columns")
    plan.frames["upserts"] = upserts
    failing = violations(upserts, expectations, EVENT_ID)
    if failing is not None:
        typed = checkpoint(failing_expectations(typed, failing), plan.one_task)
    return typed.drop(EVENT_ID)


# SQL text over typed events: those a table's expectations on silver's rows judge (`upserts`, by EVENT_ID)
JUDGED = "reason IS NULL AND op <> 'd'"


def failing_expectations(typed: DataFrame, failing: DataFrame) -> DataFrame:
    """`typed` with the reason of each event that fails a `quarantine` expectation (`failing`: EVENT_ID and reason,
    user_expectations.violations)."""
    return typed.join(failing.withColumnRenamed("reason", "_failed"), EVENT_ID, "left").withColumn(
        "reason", F.coalesce("reason", "_failed")).drop("_failed")


# What a batch's columns are made from, as aggregates of its bronze rows (beside overview_columns; both taken by the
# job that reads them): the row events' envelope schemas, the variant schema of their plain images and how many of
# those are MongoDB documents (typed by image_fields' own reading)
_PLAIN = "op <> 't' AND _schema IS NULL"
FIELD_SOURCES = (
    "collect_set(CASE WHEN op <> 't' THEN _schema END) AS _schemas",
    f"schema_of_variant_agg(CASE WHEN {_PLAIN} AND NOT {envelope.MONGODB} THEN try_parse_json({envelope.KEY_IMAGE}) END)"
    " AS _inferred",
    f"count(CASE WHEN {_PLAIN} AND {envelope.MONGODB} THEN 1 END) AS _documents")


def overview_fields(table: TableConfig, schemas: Iterable[str], inferred: str | None, documents: int, plain: int
                    ) -> list[types.ImageField] | None:
    """The batch's columns as `image_fields` finds them, from its FIELD_SOURCES (and `plain`, overview_columns' count
    of plain images); None when they are not made from these alone (MongoDB documents, undescribed envelopes)."""
    schemas = sorted(schemas)
    if documents or undescribed_schemas(schemas):
        return None
    return combined_fields(table, schemas, types.fields_from_variant_schema(inferred) if plain else None)


def image_fields(spark: SparkSession, table: TableConfig, events: DataFrame, has_plain: bool) -> list[types.ImageField]:
    """Columns of the batch's row images: from the envelope schemas, else inferred from plain JSON (with
    the table's `columns:` overrides). `__` fields are flattened records' metadata, not columns."""
    envelope_schemas = [r["_schema"] for r in events.where("_schema IS NOT NULL").select("_schema").distinct().collect()]
    undescribed = undescribed_schemas(envelope_schemas)
    inferred = None
    if has_plain or undescribed:
        plain = events.where(F.col("_schema").isNull() | F.col("_schema").isin(undescribed)).select(
            envelope.key_image().alias("_image"), F.expr(envelope.MONGODB).alias("_bson"))
        inferred = types.infer_fields(plain, "_image", "_bson")
    return combined_fields(table, envelope_schemas, inferred)


def undescribed_schemas(envelope_schemas: list[str]) -> list[str]:
    """Envelope schemas that do not describe the image's columns (MongoDB's: the document is JSON text)."""
    return sorted(s for s in envelope_schemas if not types.fields_from_envelope(s))


def combined_fields(table: TableConfig, envelope_schemas: list[str], inferred: list[types.ImageField] | None
                    ) -> list[types.ImageField]:
    """The batch's columns from its envelope schemas and the fields `inferred` from its plain images (None: it has
    none), with the table's `columns:` overrides. A plain field null in every event has no type yet: it is left out
    (silver fills a column it has with null), so the first value that has one types it, never text for good;
    unless tables.yaml names it (keys, partition_by, sequence_by, silver's expectations), which needs it in every
    batch."""
    described = {s: types.fields_from_envelope(s) for s in envelope_schemas}
    lists = [described[s] for s in sorted(described) if described[s]]
    if inferred is not None:
        lists.insert(0, types.with_overrides(inferred, table.columns))
    named = {c for _, columns in _row_columns(table) for c in columns} | judged_columns(table)
    merged = types.by_schema(types.merge_fields(lists), described)
    return [f for f in merged if not f.name.startswith("__") and (not f.untyped or f.name in named)]


def typed_changes(table: TableConfig, changes: DataFrame, fields: list[types.ImageField], target: T.StructType | None
                  ) -> DataFrame:
    """Row events (with `_seq`) plus the typed image (`fields`) in `_row`, aligned to silver's columns (`target`), typed
    key columns and a quarantine `reason`. Placeholders of unchanged TOASTed values (envelope.mark_unavailable) are
    typed as null, to be filled in by `fill_unavailable`."""
    error = absent_columns_error(table, {f.name for f in fields})
    if error is not None:
        raise error
    typed = types.parse_image(changes, envelope.KEY_IMAGE, fields, "_row")
    typed = types.align(typed, "_row", target)
    for k in table.keys:
        typed = typed.withColumn(k, F.col("_row")[k])
    return typed.withColumn("reason", sql(quarantine_reason(table, missing_key_parts(table.keys))))


def resolve_mixed(fields: list[types.ImageField], target: T.StructType | None, events: DataFrame
                  ) -> list[types.ImageField]:
    """A plain JSON field whose values in the batch are of more than one JSON type takes silver's column's type, or
    for a column new to silver the type of its first value (by `_seq`; one Spark job, only for such batches): values
    of another JSON type are quarantined as `incompatible_type`, not kept as text (types.decode_problems)."""
    fields = types.mixed_typed_by_silver(fields, target)
    new = [f.name for f in fields if f.mixed and not f.kinds]
    if not new:
        return fields
    image = f"try_parse_json({envelope.KEY_IMAGE})"
    kinds = [sql(types.field_kind(image, name)) for name in new]
    first = one_row(events.select(*[F.min_by(kind, F.when(kind != "VOID", F.col("_seq"))).alias(f"k{i}")
                                    for i, kind in enumerate(kinds)]))
    chosen = {name: types.json_type(first[f"k{i}"] or "VOID") for i, name in enumerate(new)}
    return [replace(f, parse_type=chosen[f.name], kinds=types.JSON_KINDS[chosen[f.name]]) if f.name in chosen else f
            for f in fields]


def judged_columns(table: TableConfig) -> set[str]:
    """The columns the table's expectations on silver's rows name."""
    return {c for user in table.layer_expectations("silver") for c in named_columns(user)}


def absent_columns_error(table: TableConfig, names: set[str]) -> ConfigError | None:
    """A field of tables.yaml naming a column the events (`names`: the batch's) do not have: the configuration is
    wrong, not the batch. None when every named column is there."""
    for field_name, columns in _row_columns(table):
        absent = [c for c in columns if c not in names]
        if absent:
            return ConfigError(f"table {table.name!r}: field {field_name!r} names {', '.join(absent)}, not a column of "
                               f"the change events ({', '.join(sorted(names))})")
    return None


def _row_columns(table: TableConfig) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The fields of tables.yaml that name columns of the row image, with those columns."""
    return (("keys", table.keys), ("partition_by", table.partition_by),
            ("sequence_by", tuple(c for c in table.sequence_by or () if not c.startswith("source."))))


def unavailable_columns(typed: DataFrame) -> list[str]:
    """The columns some of the typed events hold as unavailable (`_unavailable`), in order: one Spark job."""
    return sorted({r[0] for r in typed.select(F.explode("_unavailable")).distinct().collect()})


def fill_unavailable(typed: DataFrame, keys: tuple[str, ...], columns: list[str], live: DataFrame | None
                     ) -> DataFrame:
    """An unchanged TOASTed column (PostgreSQL, REPLICA IDENTITY DEFAULT) keeps the key's previous value:
    the value of the key's last earlier event in the batch that carried it, else of its live silver row (`live`:
    silver's rows, at least those of the keys, or None before its first commit). With neither, the value is unknown
    here: the event is quarantined (`unavailable_value`), never applied with a placeholder or a null in place of the
    value. `columns`: those unavailable in some event (unavailable_columns); the typed events carry their keys."""
    earlier = Window.partitionBy(*keys).orderBy("_seq", "_source_file", "_line").rowsBetween(Window.unboundedPreceding, -1)
    in_silver = [c for c in columns if live is not None and c in live.columns]
    if in_silver and live is not None:
        typed = typed.join(live.select(*keys, F.struct(*[F.struct(F.col(c).alias("v")).alias(c) for c in in_silver])
                                       .alias("_live")), list(keys), "left")
    unresolved = []
    for c in columns:
        missing = F.array_contains("_unavailable", c)
        previous = F.last(F.when(~missing, F.struct(F.col("_row")[c].alias("v"))), ignorenulls=True).over(earlier)
        kept = F.col("_live")[c] if c in in_silver else F.lit(None)
        known = F.coalesce(previous, kept)
        typed = typed.withColumn("_row", F.col("_row").withField(c, F.when(missing, known["v"]).otherwise(F.col("_row")[c])))
        unresolved.append(F.when(missing & known.isNull(), F.lit(c)))
    lost = F.concat_ws(", ", *unresolved)
    reason = F.coalesce("reason", F.when(lost != "", F.concat(
        F.lit("unavailable_value: "), lost, F.lit(" (an unchanged TOASTed value, and no earlier value of the key here)"))))
    return typed.withColumn("reason", reason).drop("_unavailable", *(["_live"] if in_silver else []))


def event_audit(typed: DataFrame, keys: tuple[str, ...], *carried: str) -> DataFrame:
    """Per row event: (the `carried` columns,) `op`, `_seq` and `_variants`, the distinct contents among the events
    sharing its key and position (null where the event has no key or position)."""
    variants = (f"size(collect_set({changes.EVENT_CONTENT}) OVER (PARTITION BY {', '.join(map(ident, (*keys, '_seq')))}))")
    usable = " AND ".join(f"{ident(c)} IS NOT NULL" for c in ("_seq", *keys))
    return typed.select(*[sql(ident(c)) for c in (*carried, "op", "_seq")],
                        sql(f"CASE WHEN {usable} THEN {variants} END AS _variants"))


def delete_outcome_counts(deletes: DataFrame, placed: DataFrame, keys: tuple[str, ...], truncated_at: str | None,
                          small: bool = False) -> DataFrame:
    """The aggregate of where each delete the batch received (one per key and position) goes, beside its key's newest
    event placed against the key's state (changes.against_state): before the truncate in force, superseded by a later
    event of its key in the batch, stale (the key's state is newer), or applied to a key that is not live (`absent`:
    the ledger records it). Applied deletes of live keys are the rows the merge removes: the gate checks that the merge
    reports exactly that many. `small`: one-partition frames (common.join_side)."""
    winners = placed.where("op = 'd'").select(*keys, F.col("_seq").alias("_winner_seq"), "_state_seq", "_live")
    outcome = deletes.join(join_side(winners, small), list(keys), "left")
    return outcome.agg(F.count(F.lit(1)).alias("received"), *[
        F.count(F.when(sql(text), 1)).alias(place) for place, text in changes.delete_outcomes(truncated_at).items()])


def merged_audit(spark: SparkSession, engine: DeltaEngine, target_path: str, latest: DataFrame, deletes: DataFrame,
                  keys: tuple[str, ...], batch_id: str) -> tuple[DataFrame, DataFrame]:
    """Read back from the merged silver table: the rows of the batch's keys and the rows this batch
    wrote (key checks, scaled to the batch rather than the table), and each delete of the batch (`_seq`) with
    `_live_seq`, its key's live position afterwards (null: not live)."""
    silver = engine.read(spark, target_path)
    if silver is None:
        silver = latest.select(*keys, "_seq", F.lit(batch_id).alias("_batch_id")).limit(0)
    touched = latest.select(*keys).withColumn("_touched", F.lit(True))
    rows = silver.join(touched, list(keys), "left").withColumn("_audited_batch", F.lit(batch_id)).where(
        sql(changes.AUDITED_ROWS)).select(*keys, "_seq")
    live = silver.select(*keys, F.col("_seq").alias("_live_seq")).join(deletes.select(*keys), list(keys), "left_semi")
    return rows, deletes.join(live, list(keys), "left").select("_seq", "_live_seq")


def current_state(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: TableConfig, latest: DataFrame,
                   new_truncate: str | None, together: bool = False) -> DataFrame:
    """(key, _seq, _live, _ledger_behind) of the batch's keys: the newest of the key's live silver row and
    its tombstone-ledger entry. The two are written by separate commits, so a run killed between them
    leaves a key in both; the newer one is the key's state, and `_ledger_behind` marks a ledger entry older
    than the live row, for the ledger merge to drop. Entries older than a new truncate are left out: it
    removes them before the merge. `together`: the entries (a small batch's keys) are grouped in one task."""
    keys = latest.select(*table.keys)
    parts = []
    for path, live in ((lake.silver(table.name), True), (lake.tombstones(table.name), False)):
        current = engine.read(spark, path)
        if current is not None:
            if new_truncate:
                current = current.where(sql(changes.kept_by_truncate(new_truncate)))
            parts.append(current.select(*[F.col(k).cast(keys.schema[k].dataType).alias(k) for k in table.keys], "_seq",
                                        F.lit(live).alias("_live")).join(keys, list(table.keys), "left_semi"))
    if not parts:
        return spark.createDataFrame([], T.StructType([*keys.schema.fields, T.StructField("_seq", T.StringType()),
                                                       T.StructField("_live", T.BooleanType()),
                                                       T.StructField("_ledger_behind", T.BooleanType())]))
    entries = reduce(DataFrame.unionByName, parts)
    if together:
        entries = entries.coalesce(1)
    newest = F.max(F.struct("_seq", "_live"))
    return entries.groupBy(*table.keys).agg(newest["_seq"].alias("_seq"), newest["_live"].alias("_live"),
                                            (F.count(F.lit(1)) > 1).alias("_both")).select(
        *table.keys, "_seq", "_live", (F.col("_both") & F.col("_live")).alias("_ledger_behind"))


# the pipeline's `_` columns of a silver row (besides a table with `transactions`' _transaction_id)
SILVER_META = ("_op", "_seq", "_source_ts_ms", "_ingested_at", "_batch_id")


def meta_columns() -> dict[str, Column]:
    """SILVER_META's values, from the row's event, under their names."""
    values = ("op", "_seq", "CAST(get_json_object(source, '$.ts_ms') AS BIGINT)", "_ingested_at", "_batch_id")
    return {name: sql(f"{value} AS {name}") for name, value in zip(SILVER_META, values, strict=True)}


def silver_rows(effective: DataFrame, fields: list[types.ImageField], target: T.StructType | None) -> DataFrame:
    """Source columns under their own names, then the pipeline's `_` columns; columns the table has but
    the batch lacks are null (docs/configuration.md, "Lake layout"; docs/architecture.md, "Types and schema")."""
    columns = [sql(f"_row.{ident(f.name)} AS {ident(f.name)}") for f in fields]
    present = {f.name for f in fields}
    meta = meta_columns()
    if "_transaction_id" in effective.columns:  # a table with `transactions`: gold reads its history by transaction
        meta["_transaction_id"] = sql("_transaction_id")
    if target is not None:
        columns += [F.lit(None).cast(f.dataType).alias(f.name) for f in target.fields
                    if f.name not in present and f.name not in meta]
    return effective.select(*columns, *meta.values())
