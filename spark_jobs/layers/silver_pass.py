"""Silver's Spark work over many small tables' new bronze rows in one pass: one scan, one overview, one plan that types
every table's events, each by its own fields, the newest event per key and the counts of all of them, and one Arrow
collect, split by table on the driver, where each table's plan is finished (`plan_table`) by the rules' SQL text
(layers/changes.py), which sql_text.evaluated reads over Arrow. A plan per table in Spark costs a small table most of
its silver step (tests/benchmarks/RESULTS.md, workload D).

Each table's typing is one branch of a CASE over `_table`, its typed row carried as a VARIANT so that every table's
rows share one column. The branches are SQL text, and the CASE of a pass's tables is parsed once and kept: built
through pyspark's Column API, a table's first typing cost about 250 py4j round trips (tests/benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache, reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.debezium import envelope, ordering, types
from spark_jobs.delta import DeltaEngine, NewFiles, all_nullable, spark_frame
from spark_jobs.errors import ConfigError
from spark_jobs.lake import Lake
from spark_jobs.layers import changes, keyed_reads, silver_plan
from spark_jobs.layers.common import PASS_BYTES, PASS_ROWS, QUARANTINED_COLUMNS, checkpoint, lookup
from spark_jobs.quality.audit import GroupedTally, Tallied, Tally, collect_with, grouped_tally
from spark_jobs.quality.expectations import flagged
from spark_jobs.quality.user_expectations import columns_error, violations
from spark_jobs.registry import TableConfig
from spark_jobs.sql_text import evaluated, holds, ident, named_struct, per_table, sql, sql_type


@dataclass(frozen=True)
class TableTyping:
    """How the pass types one table's events: the fields of its batch's images, aligned to silver's schema."""

    table: TableConfig
    fields: tuple[types.ImageField, ...]
    target: str | None  # silver's schema as JSON (hashable), as the pass found it; None before its first commit

    # each type made once: a field's type is parsed by the JVM, and a table's branch reads them many times
    @cached_property
    def decoded_type(self) -> T.StructType:
        """The image's type as decoded, before alignment."""
        return types.fields_type(list(self.fields))

    @cached_property
    def widening(self) -> tuple[T.StructType | None, tuple[types.Widening, ...]]:
        """Silver's schema with the columns the batch widens at their new types, and those changes."""
        return types.widened(_schema(self.target), self.decoded_type)

    @cached_property
    def row_type(self) -> T.StructType:
        """The typed image's type, aligned (what `_row` holds once cast back from VARIANT)."""
        target = self.target_schema
        if target is None:
            return self.decoded_type
        existing = {f.name: f.dataType for f in target.fields}
        return T.StructType([T.StructField(f.name, existing.get(f.name, f.dataType)) for f in self.decoded_type.fields])

    @property
    def target_schema(self) -> T.StructType | None:
        """Silver's schema as the batch leaves it (its widenings taken)."""
        return self.widening[0]

    @cached_property
    def silver_type(self) -> T.StructType:
        """Silver's source columns for the batch (silver_plan.silver_rows): the typed image's, then the columns silver
        has and the batch lacks (null)."""
        row, target = self.row_type, self.target_schema
        present = {f.name for f in row.fields} | set(silver_plan.SILVER_META) | (
            {"_transaction_id"} if self.table.transactions else set())  # the event's, beside SILVER_META
        return T.StructType([*row.fields, *[f for f in (target.fields if target else []) if f.name not in present]])


@dataclass(frozen=True)
class Branch:
    """One table's typing, as SQL text over the shared scan's events, in three steps. Each step reads what the one
    before it made, as VARIANT, by a cast: a step's columns never copy the whole decoding into themselves, which
    made a CASE over 100 tables too big to compile (and a plan of minutes)."""

    decoded: str  # 1. the image decoded to its fields' types, as VARIANT
    decode_problems: str  # 2. (from `_decoded`, `_text`) the fields present that did not decode
    row: str  # 2. the decoded row aligned to silver's columns, as VARIANT
    type_problems: str  # 2. the fields whose values silver's columns cannot hold
    key: str  # 3. (from `_row`) the typed key as JSON text, one per key value whatever its encoding; null if a part is
    reason: str  # 3. why the event is quarantined, else null


@cache
def branch(typing: TableTyping) -> Branch:
    """The table's typing as `types.parse_image`, `types.align` and `silver_plan.typed_changes` do it."""
    table, fields = typing.table, list(typing.fields)
    decoded_fields = types.decoded_fields(types.parsed_image(envelope.KEY_IMAGE, fields), fields)
    decoded = f"CAST(_decoded AS {sql_type(typing.decoded_type)})"
    decode_problems = types.decode_problems("_text", decoded, fields,
                                            "_variant" if any(f.kinds for f in fields) else None)
    target = typing.target_schema
    row, type_problems = (types.aligned_row(decoded, typing.decoded_type, target) if target is not None
                          else (decoded, "''"))
    typed = f"CAST(_row AS {sql_type(typing.row_type)})"
    missing = silver_plan.missing_key_parts(table.keys, typed)
    key = f"CASE WHEN {missing} = '' THEN to_json({named_struct({k: f'({typed}).{ident(k)}' for k in table.keys})}) END"
    return Branch(f"to_variant_object({named_struct(decoded_fields)})", decode_problems, f"to_variant_object({row})",
                  type_problems, key, silver_plan.quarantine_reason(table, missing))


@lru_cache(maxsize=1024)
def _branches_case(part: str, typings: tuple[TableTyping, ...]) -> Column:
    """One part of each table's Branch, in one CASE over the tables (tables whose part reads the same share a
    branch); kept, as the branches are, for the next pass over the same tables."""
    return sql(per_table({t.table.name: getattr(branch(t), part) for t in typings}, lambda text: text))


def typed_events(events: DataFrame, typings: list[TableTyping]) -> DataFrame:
    """The row events of many tables (`_table`, `_seq`, op <> 't'; together a small batch) with `_row` (VARIANT),
    `_key` and `reason`, materialised (`typings`: the tables with row events; none: the pass's are truncates alone)."""
    if not typings:
        return events.where("false").select("*", *[sql(f"CAST(NULL AS {kind}) AS {name}") for name, kind in (
            ("_row", "VARIANT"), ("_key", "STRING"), ("reason", "STRING"))])
    def case(part: str) -> Column:
        return _branches_case(part, tuple(typings))

    # mixed fields' values are checked by their JSON type (types.decode_problems): the image as VARIANT, when any has
    mixed = {"_variant": sql(f"try_parse_json({envelope.KEY_IMAGE})")} if any(
        f.kinds for t in typings for f in t.fields) else {}
    if any(f.in_python for t in typings for f in t.fields):  # as types.parse_image
        types.register_decoders(events.sparkSession)
    # the three steps materialised once, at the end, which the aggregates over them read (inlined into an aggregate,
    # every table's branches were copied into each of its columns: out of memory). Between the steps no cut is
    # needed: a step reads the CASE before it in each of its branches, which Spark's optimizer does not inline. A lazy
    # checkpoint after each step too cost a 1k-event batch 0.2 s and a pass of 100 tables 10 % (measured)
    decoded = events.withColumns({"_decoded": case("decoded"), "_text": sql(types.image_text(envelope.KEY_IMAGE)),
                                  **mixed})
    aligned = decoded.withColumns({"_decode_problems": case("decode_problems"), "_row": case("row"),
                                   "_type_problems": case("type_problems")}).drop("_decoded", "_text", *mixed)
    judged = {silver_plan.EVENT_ID: F.monotonically_increasing_id()} if any(
        t.table.layer_expectations("silver") for t in typings) else {}  # what their violations name
    return checkpoint(aligned.withColumns({"_key": case("key"), "reason": case("reason"), **judged}), True).drop(
        "_decode_problems", "_type_problems")


def by_expectations(typed: DataFrame, typings: list[TableTyping]) -> DataFrame:
    """`typed_events` with each event that fails a `quarantine` expectation on its table's silver rows given it as its
    reason (silver_plan.failing_expectations: GX's conditions over each table's `upserts`, at its row type)."""
    failing = [found for t in typings if (expectations := t.table.layer_expectations("silver")) and (
        found := violations(_upserts(typed, t), expectations, silver_plan.EVENT_ID)) is not None]
    if not failing:
        return typed
    return checkpoint(silver_plan.failing_expectations(typed, reduce(DataFrame.unionByName, failing)), True)


def _upserts(typed: DataFrame, typing: TableTyping) -> DataFrame:
    """The table's `upserts` frame (silver_plan.JUDGED) from the pass's typed events."""
    return typed.where(F.col("_table") == typing.table.name).where(silver_plan.JUDGED).select(
        silver_plan.EVENT_ID, sql(f"CAST(_row AS {sql_type(typing.row_type)}) AS _typed")).select(
        silver_plan.EVENT_ID, "_typed.*")

@dataclass(frozen=True)
class Candidate:
    """A table's new bronze rows for the pass: the files that hold them, and bronze's schema there; and silver as the
    pass found it."""

    table: TableConfig
    applied: int  # the bronze version silver has applied (its progress); -1 when none
    files: NewFiles
    truncated_at: str | None = None  # the truncate in force (its progress)
    silver_version: int | None = None
    target: str | None = None  # silver's schema as JSON; None before its first commit


def scan(spark: SparkSession, candidates: list[Candidate]) -> DataFrame:
    """Every candidate's new bronze rows in one read (they share bronze's schema), with `_table` and `_seq`."""
    schemas = {c.files.schema for c in candidates}
    assert len(schemas) == 1, "tables read together share bronze's schema"
    # Spark names a file by its URI, the Delta log by its path: the file's own name (a UUID) identifies it
    table_of = {f.rsplit("/", 1)[-1]: c.table.name for c in candidates for f in c.files.files}
    applied = {c.table.name: c.applied for c in candidates}
    files = [f for c in candidates for f in c.files.files]
    rows = (spark.read.schema(T.StructType.fromJson(json.loads(schemas.pop()))).parquet(*files)
            .withColumn("_table", lookup(table_of, "regexp_extract(_metadata.file_path, '[^/]+$', 0)")))
    # a compaction since `applied` rewrote older rows into new files: only later versions are new
    rows = rows.where(F.col("_bronze_version") > lookup(applied, "_table"))
    by_sequence: dict[tuple[str, ...] | None, list[str]] = {}
    for c in candidates:
        by_sequence.setdefault(c.table.sequence_by or None, []).append(c.table.name)
    # one branch per way of sequencing (most tables: their connector's), not per table
    groups = [(ordering.sequence(by), F.col("_table").isin(names)) for by, names in by_sequence.items()]
    sequence = groups[0][0] if len(groups) == 1 else reduce(
        lambda acc, group: acc.when(group[1], group[0]), groups[1:], F.when(groups[0][1], groups[0][0]))
    rows = rows.withColumn("_src", ordering.source_position()).withColumn("_seq", sequence).drop("_src")
    # every table's, when one has transactions: the others never read it (silver_plan.outside_transactions)
    return ordering.with_transaction_key(rows) if any(c.table.transactions for c in candidates) else rows


def _schema(target: str | None) -> T.StructType | None:
    """Silver's schema from its JSON (None before its first commit)."""
    return None if target is None else T.StructType.fromJson(json.loads(target))


@dataclass(frozen=True)
class Overview:
    """A table's batch as the pass's one overview job counted it: plan_batch's overview, and what its images'
    fields are made from."""

    figures: dict[str, Any]  # silver_plan.overview_columns
    schemas: tuple[str, ...]  # the row events' envelope schemas
    inferred: str | None  # schema_of_variant_agg over its plain images
    documents: int  # MongoDB documents among them: their fields read from the events (types.infer_bson_fields)

    def fields(self, table: TableConfig) -> list[types.ImageField] | None:
        """The batch's columns as `silver_plan.image_fields` finds them; None when that must read the events
        (MongoDB documents, undescribed envelopes)."""
        return silver_plan.overview_fields(table, self.schemas, self.inferred, self.documents, self.figures["plain"])

    @property
    def refused_truncates(self) -> int:
        """The batch's truncates quarantined (silver_plan.truncate_reason): the overview counts only the others."""
        return self.figures["rows"] - self.figures["changes"] - self.figures["truncates"]


def overviews(events: DataFrame, tables: list[TableConfig]) -> dict[str, Overview]:
    """Every table's overview, in one Spark job (`events`: `scan`'s rows)."""
    placeholders = per_table({t.name: t.unavailable_value_placeholder for t in tables}, envelope.holds_placeholder)
    refused = per_table({t.name: silver_plan.truncate_reason(t) for t in tables}, lambda text: text)
    rows = events.groupBy(sql("_table")).agg(*silver_plan.overview_columns(placeholders, refused),
                                             *[sql(text) for text in silver_plan.FIELD_SOURCES]).collect()
    return {r["_table"]: Overview({k: v for k, v in r.asDict().items() if not k.startswith("_")},
                                  tuple(sorted(r["_schemas"])), r["_inferred"], r["_documents"]) for r in rows}


def newest_per_key(typed: DataFrame, truncated_at: dict[str, str | None]) -> DataFrame:
    """Every table's newest event per key after the truncate in force (`truncated_at`, by table), among the events
    typing did not quarantine: `changes.latest_per_key` by (`_table`, `_key`)."""
    return changes.latest_per_key(typed.where("reason IS NULL").where(_after_truncate(truncated_at)), ("_table", "_key"))


@dataclass(frozen=True)
class Figures:
    """A table's counts of its typed batch, as silver_plan's BatchPlan holds them."""

    events: int  # row events without a quarantine reason
    positions: int  # distinct (key, position) among them
    positions_after_truncate: int
    keys: int  # keys with an event after the truncate in force
    ties: int


@dataclass(frozen=True)
class EventCounts:
    """A table's typed row events counted in the pass's one aggregate: the first three of its Figures (keys and
    ties are the newest events', counted where they are collected) and silver's checks on them."""

    events: int
    positions: int
    positions_after_truncate: int
    audit: dict[str, Tally]

    def figures(self, latest: pa.Table) -> Figures:
        ties = pc.sum(pc.cast(latest.column("_tie"), pa.int64())).as_py() if latest.num_rows else 0
        return Figures(self.events, self.positions, self.positions_after_truncate, latest.num_rows, int(ties or 0))


def _after_truncate(truncated_at: dict[str, str | None]) -> Column:
    """Is the event after its table's truncate in force?"""
    return sql(per_table(truncated_at, changes.after_truncate))


def event_counts(typed: DataFrame, truncated_at: dict[str, str | None]) -> GroupedTally:
    """Every table's EventCounts' aggregate over `typed` (one partition: `typed_events`), collected with the newest
    events (`_collect`; `counted` reads it): silver's checks (`silver_plan.event_audit` by (`_table`, `_key`)) and the
    counts beside them. A position is counted at its first event (a window over the partition the audit's window
    uses), not by a distinct count: Spark plans distinct counts with an exchange, a Spark job more."""
    usable = F.col("reason").isNull()
    position = Window.partitionBy("_table", "_key", "_seq", usable).orderBy("_source_file", "_line")
    marked = typed.withColumns({"_first": F.row_number().over(position) == 1, "_after": _after_truncate(truncated_at)})
    audit = silver_plan.event_audit(marked, ("_table", "_key"), "_table", "reason", "_first", "_after")
    first = usable & F.col("_first")
    grouped = grouped_tally({"events": audit}, flagged("silver", "events"), "_table", {
        "events": F.count(F.when(usable, 1)), "positions": F.count(F.when(first, 1)),
        "positions_after_truncate": F.count(F.when(first & F.col("_after"), 1))})
    assert grouped is not None  # measures are always counted
    return grouped


def counted(tallied: dict[str, Tallied]) -> dict[str, EventCounts]:
    """The tables' EventCounts from `event_counts`' tallies."""
    return {name: EventCounts(c.measures["events"], c.measures["positions"], c.measures["positions_after_truncate"],
                              c.tallies) for name, c in tallied.items()}


def _typing(candidate: Candidate, overview: Overview, events: DataFrame) -> TableTyping | ConfigError | None:
    """How the pass types the table's batch (`events`: the scan's rows, `_marked`); the ConfigError its own plan raises when its
    settings or its expectations on silver's rows name columns its events lack; None when its own plan must
    (layers/silver_plan.py): more than a pass's rows, truncates alone before silver's first commit or with such
    expectations, or keys whose joins on the driver are not Spark's. Its fields are the overview's, or,
    for MongoDB documents, undescribed envelopes and images holding unavailable values (marked first), found as its own
    plan finds them (silver_plan.image_fields: a Spark job over the table's events, only for such a batch). A column of
    more than one JSON type takes silver's type, or the type of its first value (silver_plan.resolve_mixed: a Spark job,
    only for a batch with such a column new)."""
    figures, table = overview.figures, candidate.table
    if figures["rows"] > PASS_ROWS or (figures["bytes"] or 0) > PASS_BYTES:
        return None
    if not figures["changes"]:  # truncates alone: no row to type, silver's columns to carry (and none before it has)
        alone = TableTyping(table, (), candidate.target)
        return alone if candidate.target is not None and not table.layer_expectations("silver") and \
            keyed_reads.keys_join_on_driver(alone.silver_type, table.keys) else None
    own = events.where((F.col("_table") == table.name) & (F.col("op") != "t"))  # marked already (`_marked`)
    fields = None if figures["unavailable"] else overview.fields(table)
    if fields is None:
        fields = silver_plan.image_fields(events.sparkSession, table, own, figures["plain"] > 0)
    fields = silver_plan.resolve_mixed(fields, _schema(candidate.target), own)
    error = silver_plan.absent_columns_error(table, {f.name for f in fields})
    if error is not None:
        return error
    typing = TableTyping(table, tuple(fields), candidate.target)
    row = typing.row_type
    # its own plan's check of the typed rows its expectations judge (silver_plan._quarantine_by_expectations)
    error = columns_error(row.fieldNames(), table.layer_expectations("silver"), "silver's columns")
    if error is not None:
        return error
    return typing if keyed_reads.keys_join_on_driver(row, table.keys) else None


def _marked(rows: DataFrame, tables: list[TableConfig], found: dict[str, Overview]) -> DataFrame:
    """The scan's `rows` with envelope.unavailable_marks in the tables whose batches hold unavailable values
    (`_unavailable` empty in the others'), or as they are when none does: marked once, for the fields found from
    them (`_typing`) and for their typing."""
    placeholders = {t.name: t.unavailable_value_placeholder if found[t.name].figures["unavailable"] else None
                    for t in tables}
    if not any(placeholders.values()):
        return rows
    marks = {name: envelope.unavailable_marks(p) if p else ("CAST(array() AS ARRAY<STRING>)", "after")
             for name, p in placeholders.items()}
    return rows.withColumns({"_unavailable": sql(per_table(marks, lambda m: m[0])),
                             "after": sql(per_table(marks, lambda m: m[1]))})


def _filled(engine: DeltaEngine, lake: Lake, typed: DataFrame, typings: list[TableTyping]) -> DataFrame:
    """`typed_events` with silver_plan.fill_unavailable over the events of each of `typings` (tables whose batches
    hold unavailable values), at the table's row type: its live rows read by the keys of those events on the driver
    (a key-filtered read of silver, where its own plan joins silver's scan), in one Spark job a table."""
    filled = [typed.where(~F.col("_table").isin([t.table.name for t in typings])).drop("_unavailable")]
    for typing in typings:
        table, keys = typing.table, list(typing.table.keys)
        own = typed.where(F.col("_table") == table.name).withColumn(
            "_row", sql(f"CAST(_row AS {sql_type(typing.row_type)})"))
        own = own.select("*", *[sql(f"_row.{ident(k)} AS {ident(k)}") for k in keys])
        wanting = own.where("size(_unavailable) > 0").select(*keys, "_unavailable").toArrow()
        columns = sorted(set(pc.list_flatten(wanting.column("_unavailable")).to_pylist()))
        in_silver = [c for c in columns if typing.target_schema is not None and c in typing.target_schema.fieldNames()]
        found = engine.read_where(lake.silver(table.name), [*keys, *in_silver], keyed_reads.among(wanting.select(keys))
                                  ) if in_silver else None
        live = None if found is None or not found.num_rows else spark_frame(typed.sparkSession,
                                                                            found.select([*keys, *in_silver]))
        own = silver_plan.fill_unavailable(own, table.keys, columns, live)
        filled.append(own.withColumn("_row", sql("to_variant_object(_row)")).drop(*keys))
    return checkpoint(reduce(DataFrame.unionByName, filled), True)


@dataclass(frozen=True)
class TableBatch:
    """One table's batch as the pass planned it, on the driver: all its silver step takes (`plan_table`)."""

    applied: int  # the bronze version silver had applied, the truncate in force and silver's version: as read
    truncated_at: str | None
    silver_version: int | None
    bronze_version: int  # the bronze version the batch ends at
    overview: dict[str, Any]  # silver_plan.overview_columns
    figures: Figures
    audit: dict[str, Tally]  # silver's checks on the row events
    quarantine: list[tuple[str, int, str, str]]  # (_source_file, _line, _raw, reason)
    # the newest event per key: `_key`, `_seq`, `op`, `_events`, `_tie`, the rest of silver_plan.SILVER_META, and `_row`,
    # silver's source columns (TableTyping.silver_type)
    latest: pa.Table
    deletes: pa.Table  # each delete received, once per key and position: `_key`, `_seq`, `_row`
    typing: TableTyping  # how the pass typed the batch
    new_truncate: str | None = None  # the batch's newest truncate, when newer than the one in force (plan_batch's)
    # a table with history: its truncates for the truncate log (`_seq`, `_transaction_id` with transactions; once
    # each), and its row events typing did not quarantine (HISTORY_COLUMNS and `_row`, silver's source columns),
    # which history.apply_history takes as its own plan's typed events
    truncates: pa.Table | None = None
    history: pa.Table | None = None
    upserts: pa.Table | None = None  # a table with expectations on silver's rows: the rows they judge (EVENT_ID, `_row`)

    def judged(self, spark: SparkSession) -> dict[str, DataFrame]:
        """The frames the table's expectations on silver's rows read (silver_plan's `upserts`: EVENT_ID and the typed
        row's columns), or none."""
        if self.upserts is None:
            return {}
        return {"upserts": spark_frame(spark, self.upserts).select(
            silver_plan.EVENT_ID, *[sql(f"_row.{ident(f)}") for f in self.typing.row_type.fieldNames()])}

    @property
    def widened(self) -> tuple[types.Widening, ...]:
        """Silver's columns the batch widens (silver takes them first)."""
        return self.typing.widening[1]

    def history_events(self, spark: SparkSession) -> DataFrame | None:
        """`history` as the typed events history.apply_history reads: `_row` at silver's types, the keys beside it."""
        if self.history is None:
            return None
        table = self.typing.table
        events = self.history  # the pass's scan takes transaction ids for all its tables when one has transactions
        if not table.transactions and "_transaction_id" in events.column_names:
            events = events.drop_columns(["_transaction_id"])
        return spark_frame(spark, events).withColumn("_row", F.col("_row").cast(self.typing.silver_type)).select(
            "*", *[sql(f"_row.{ident(k)} AS {ident(k)}") for k in table.keys])

    @property
    def truncated_after(self) -> str | None:
        """The truncate in force after the batch."""
        return self.new_truncate or self.truncated_at

    def holds(self, applied: int, truncated_at: str | None, silver_version: int | None, bronze_version: int) -> bool:
        """Is silver as the pass found it, and bronze where it read to? (Another run of the table may have applied
        or added rows since: then the table plans its own batch.)"""
        return (self.applied, self.truncated_at, self.silver_version, self.bronze_version) == (
            applied, truncated_at, silver_version, bronze_version)


def read_together(spark: SparkSession, engine: DeltaEngine, lake: Lake, candidates: list[Candidate]
                  ) -> dict[str, TableBatch | ConfigError]:
    """The candidates' new bronze rows scanned, overviewed, typed, reduced to the newest event per key, counted and
    audited in one pass, and collected to the driver by table; a table whose settings name columns its events lack,
    the ConfigError its step raises. A table the pass cannot type (`_typing`) is left out. Silver is read only for
    unavailable values' earlier values (`_filled`)."""
    # a pass holds at most PASS_ROWS rows (silver.read_pass): in one partition its aggregates need no exchange, each a job
    events = scan(spark, candidates).coalesce(1)
    found = overviews(events, [c.table for c in candidates])
    events = _marked(events, [c.table for c in candidates], found)
    by_name = {c.table.name: c for c in candidates}
    typed_as = {name: _typing(by_name[name], overview, events) for name, overview in found.items()}
    refused: dict[str, TableBatch | ConfigError] = {n: e for n, e in typed_as.items() if isinstance(e, ConfigError)}
    typings = {name: typing for name, typing in typed_as.items() if isinstance(typing, TableTyping)}
    if not typings:
        return refused
    # a truncate is no row event: it moves the truncate in force, which every event of the table's batch is placed by
    rows = events.where(F.col("_table").isin(list(typings)))
    # the truncates collected: those the truncate logs of tables with history take, and those quarantined
    collected_from = [name for name, typing in typings.items() if found[name].refused_truncates or (
        typing.table.history and found[name].figures["truncates"])]
    truncates = _truncates(rows, [by_name[name].table for name in collected_from]) if collected_from else None
    if any(found[name].figures["rows"] > found[name].figures["changes"] for name in typings):
        rows = rows.where("op <> 't'")
    typed = typed_events(rows, [t for n, t in typings.items() if found[n].figures["changes"]])
    toasted = [t for name, t in typings.items() if found[name].figures["unavailable"]]
    # (the marks of a table left out, which no typed row holds, are dropped with the fill's)
    typed = _filled(engine, lake, typed, toasted) if toasted else typed.drop("_unavailable")
    new_truncate = {name: silver_plan.newer_truncate(found[name].figures["truncated_at"], by_name[name].truncated_at)
                    for name in typings}
    truncated_at = {name: new_truncate[name] or by_name[name].truncated_at for name in typings}
    judged = typed if silver_plan.EVENT_ID in typed.columns else None
    if judged is not None:
        typed = by_expectations(judged, list(typings.values()))
    counts = event_counts(typed, truncated_at)
    # the newest events are read once, by the collect: not materialised; the counts and the row events typing
    # quarantined are collected with them, in the same Spark job
    collected = _collect(typed, newest_per_key(typed, truncated_at), typings, counts, truncates, judged)
    latest, received, history = collected.latest, collected.deletes, collected.history
    counts_of = collected.counts
    none = EventCounts(0, 0, 0, {e.name: Tally(0, 0) for e in flagged("silver", "events")})
    quarantine: dict[str, list[tuple[str, int, str, str]]] = {name: [] for name in typings}
    for r in collected.quarantine.to_pylist():
        quarantine[r["_table"]].append((r["_source_file"], r["_line"], r["_raw"], r["reason"]))
    return refused | {name: TableBatch(
        by_name[name].applied, by_name[name].truncated_at, by_name[name].silver_version, by_name[name].files.version,
        found[name].figures, counts_of.get(name, none).figures(latest[name]), counts_of.get(name, none).audit,
        quarantine[name], latest[name], received[name], typings[name], new_truncate[name],
        collected.truncates.get(name), history.get(name) if found[name].figures["changes"] else None,
        collected.upserts.get(name)) for name in typings}


@dataclass(frozen=True)
class _Collected:
    latest: dict[str, pa.Table]  # by table: the newest events
    deletes: dict[str, pa.Table]  # by table: the deletes received
    quarantine: pa.Table  # the row events typing quarantined: `_table` and QUARANTINED_COLUMNS
    counts: dict[str, EventCounts]  # by table
    history: dict[str, pa.Table]  # by table with history: its row events typing did not quarantine
    truncates: dict[str, pa.Table]  # by table with history and truncates: those the truncate log takes
    upserts: dict[str, pa.Table]  # by table with expectations on silver's rows: the rows they judge


def _truncates(rows: DataFrame, tables: list[TableConfig]) -> DataFrame:
    """The truncates of `tables` with their quarantine reason (silver_plan.truncate_reason)."""
    reason = per_table({t.name: silver_plan.truncate_reason(t) for t in tables}, lambda text: text)
    return rows.where(F.col("op") == "t").where(F.col("_table").isin([t.name for t in tables])).select(
        "_table", "_seq", *(["_transaction_id"] if "_transaction_id" in rows.columns else []),
        *QUARANTINED_COLUMNS[:-1], sql(f"{reason} AS reason"))


# what history.apply_history reads of a typed event besides `_row` and the keys (silver_plan.meta_columns' sources)
HISTORY_COLUMNS = ("_seq", "_source_file", "_line", "op", "source", "_ingested_at", "_batch_id")


def _collect(typed: DataFrame, newest: DataFrame, typings: dict[str, TableTyping], counts: GroupedTally,
             truncates: DataFrame | None, judged: DataFrame | None) -> _Collected:
    """Every table's newest events and deletes, typed as silver's columns, with the row events typing quarantined
    and the `truncates` quarantined, history's events and truncates, the upserts its expectations judge (from `judged`,
    the typed events before their verdicts) and the tables' counts, in one Arrow collect: one column per shape of silver
    row (null in other tables' rows), split by table on the driver."""
    shapes: dict[str, list[str]] = {}
    for name, typing in typings.items():
        shapes.setdefault(typing.silver_type.json(), []).append(name)
    rows = {f"_r{i}": _shape_column(shape, tuple(names), f"_r{i}") for i, (shape, names) in enumerate(shapes.items())}
    meta = silver_plan.meta_columns()
    transaction = ["_transaction_id"] if "_transaction_id" in typed.columns else []  # scan's, with transactions
    # a batch that widens silver's types: does each newest event's own schema claim a widening (plan_table)?
    widening = {name: types.claiming(t.widening[1], list(t.fields)) for name, t in typings.items() if t.widening[1]}
    claims = [sql(f"{per_table(widening, lambda text: text)} AS _claims")] if widening else []
    latest = newest.select(*[sql(text) for text in ("_table", "_key", "_seq", "op", "_events", "_tie")],
                           *[meta[c] for c in silver_plan.SILVER_META if c not in ("_op", "_seq")], *transaction,
                           *claims, *rows.values())
    # each kind of row by table: its columns besides `_row`, and the tables it is collected for
    carried = {"latest": ([c for c in latest.columns if c not in rows and c != "_table"], list(typings)),
               "delete": (["_key", "_seq"], list(typings)),
               "history": ([*HISTORY_COLUMNS, *transaction], [n for n, t in typings.items() if t.table.history]),
               "upserts": ([silver_plan.EVENT_ID], [n for n, t in typings.items() if t.table.layer_expectations("silver")])}
    parts = {"latest": latest, "delete": deletes_received(typed).select(sql("_table"), "_key", "_seq", *rows.values()),
             "quarantine": typed.where("reason IS NOT NULL").select("_table", *QUARANTINED_COLUMNS)}
    if truncates is not None:
        parts["truncate"] = truncates
    if carried["history"][1]:
        parts["history"] = typed.where(F.col("reason").isNull() & F.col("_table").isin(carried["history"][1]))
    if judged is not None:
        parts["upserts"] = judged.where(silver_plan.JUDGED).where(F.col("_table").isin(carried["upserts"][1]))
    for kind in ("history", "upserts"):
        if kind in parts:
            parts[kind] = parts[kind].select("_table", *carried[kind][0], *rows.values())
    found, tallied = collect_with(parts, counts)
    split: dict[str, dict[str, pa.Table]] = {kind: {} for kind in carried}
    for i, names in enumerate(shapes.values()):
        for kind, (columns, tables) in carried.items():
            for name in (n for n in names if n in tables):
                own = found[kind].filter(pc.equal(found[kind].column("_table"), name))
                split[kind][name] = own.select([*columns, f"_r{i}"]).rename_columns([*columns, "_row"])
    quarantine, logged = found["quarantine"], {}
    if truncates is not None:
        refused = pc.is_valid(found["truncate"].column("reason"))
        quarantine = pa.concat_tables([quarantine, found["truncate"].filter(refused).select(quarantine.column_names)])
        logged = _logged(found["truncate"].filter(pc.invert(refused)), typings)
    return _Collected(split["latest"], split["delete"], quarantine, counted(tallied), split["history"], logged,
                      split["upserts"])


def _logged(truncates: pa.Table, typings: dict[str, TableTyping]) -> dict[str, pa.Table]:
    """Each table's truncates (not quarantined) as its truncate log takes them: once each, with their transaction's id
    when the table has transactions."""
    logged = {}
    for name in set(truncates.column("_table").to_pylist()):
        columns = ["_seq", *(["_transaction_id"] if typings[name].table.transactions else [])]
        own = truncates.filter(pc.equal(truncates.column("_table"), name)).select(columns)
        logged[name] = own.group_by(columns).aggregate([]).select(columns)
    return logged


@lru_cache(maxsize=1024)
def _shape_column(shape: str, tables: tuple[str, ...], name: str) -> Column:
    """`_row` as the silver row of `shape` (a StructType's JSON) in the rows of `tables`, null in others' (kept: a
    shape's type is parsed by the JVM)."""
    return F.when(F.col("_table").isin(*tables), F.col("_row").cast(T.StructType.fromJson(json.loads(shape)))).alias(name)


def deletes_received(typed: DataFrame) -> DataFrame:
    """(`_table`, `_key`, `_seq`, `_row`) of each delete the tables' batches received, once per key and position."""
    return typed.where("reason IS NULL AND op = 'd'").groupBy(sql("_table"), sql("_key"), sql("_seq")).agg(
        sql("any_value(_row) AS _row"))


@dataclass(frozen=True)
class PassPlan:
    """What a table's batch from the pass changes: the merges' source rows, and the counts its summary and gate report."""

    rows: pa.Table  # silver's merge source: the newest events newer than their key's state
    ledger: pa.Table | None  # the tombstone ledger's merge source (changes.ledger_rows); None: nothing for it
    delete_counts: dict[str, int]  # silver_plan.delete_outcome_counts
    counts: silver_plan.PlanCounts


def plan_table(engine: DeltaEngine, lake: Lake, table: TableConfig, batch: TableBatch) -> PassPlan | None:
    """silver_plan's plan of a batch the pass read, made on the driver: as Spark queries its steps cost a small table
    more to build and plan than the work itself (tests/benchmarks/RESULTS.md, issue 32). Each rule is its SQL text in
    layers/changes.py, evaluated over Arrow; only the data is carried here. tests/layers/test_silver_pass.py holds every
    table's outcome equal to its own plan's. None when the batch widens a type of silver's that no event the merge
    applies claims (types.claiming): silver takes no type from a stale event, and its own plan types the batch again
    at silver's types (silver_plan._plan_changes)."""
    placed = _placed(engine, lake, table, batch.latest, batch.new_truncate)
    effective = batch.latest.filter(holds(placed, changes.NEWER))
    if batch.widened and not pc.any(pc.fill_null(effective.column("_claims"), False)).as_py():
        return None
    row = effective.column("_row").combine_chunks()
    meta = [*silver_plan.SILVER_META, *(["_transaction_id"] if table.transactions else [])]  # silver_plan.silver_rows'
    rows = pa.Table.from_arrays([*row.flatten(), *[effective.column(c if c != "_op" else "op") for c in meta]],
                                names=[*[f.name for f in row.type], *meta])
    rows = rows.cast(all_nullable(rows.schema))
    keys = list(table.keys)
    entries = _with(rows.select(keys), evaluated(rows, changes.LEDGER_ENTRY))
    caught_up = placed.filter(holds(placed, changes.LEDGER_CLEARED))
    ledger = pa.concat_tables([entries, _with(caught_up.select(keys), evaluated(caught_up, changes.LEDGER_CATCH_UP)
                                              ).cast(entries.schema)])
    figures = batch.figures
    redelivered = pc.sum(pc.cast(holds(placed, changes.REDELIVERED), pa.int64())).as_py()
    counts = silver_plan.PlanCounts(
        batch.overview["rows"], batch.overview["newest_ts_ms"], batch.overview["truncates"], figures.events, figures.positions,
        figures.positions_after_truncate, figures.keys, figures.ties, rows.num_rows, int(redelivered or 0))
    return PassPlan(rows, ledger.cast(all_nullable(ledger.schema)) if ledger.num_rows else None,
                    _delete_counts(batch, placed), counts)


def _with(table: pa.Table, columns: pa.Table) -> pa.Table:
    for name in columns.column_names:
        table = table.append_column(name, columns.column(name))
    return table


def _key_columns(rows: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The key columns of rows holding `_row` (silver's source columns)."""
    return pa.table({k: pc.struct_field(rows.column("_row"), k) for k in keys})


def _placed(engine: DeltaEngine, lake: Lake, table: TableConfig, latest: pa.Table, new_truncate: str | None
            ) -> pa.Table:
    """changes.against_state over Arrow: each of `latest`'s events (its key columns, `_key`, `_seq`, `op`), in its order,
    beside its key's state (keyed_reads.key_state, after the batch's `new_truncate`): `_state_seq` and `_live` (null:
    the key has none), `_ledger_behind` (false then)."""
    wanted = _key_columns(latest, table.keys)
    state = keyed_reads.key_state(engine, lake, table, wanted, latest.schema.field("_seq").type, new_truncate
                                  ).rename_columns(
        [*table.keys, "_state_seq", "_live", "_ledger_behind"])
    events = _with(wanted, latest.select(["_key", "_seq", "op"])).append_column(
        "_at", pa.array(range(latest.num_rows), pa.int64()))
    placed = events.join(state, list(table.keys), join_type="left outer").sort_by("_at")
    return placed.set_column(placed.schema.get_field_index("_ledger_behind"), "_ledger_behind",
                             pc.fill_null(placed.column("_ledger_behind"), False))


def _delete_counts(batch: TableBatch, placed: pa.Table) -> dict[str, int]:
    """silver_plan.delete_outcome_counts: where each delete received goes (changes.delete_outcomes' texts)."""
    winners = placed.filter(pc.equal(placed.column("op"), "d")).select(["_key", "_seq", "_state_seq", "_live"])
    winners = winners.rename_columns(["_key", "_winner_seq", "_state_seq", "_live"])
    outcome = batch.deletes.select(["_key", "_seq"]).join(winners, "_key", join_type="left outer")
    return {"received": outcome.num_rows, **{
        place: int(pc.sum(pc.cast(holds(outcome, text), pa.int64())).as_py() or 0)
        for place, text in changes.delete_outcomes(batch.truncated_after).items()}}


def pass_audit(engine: DeltaEngine, lake: Lake, table: TableConfig, batch: TableBatch, batch_id: str
               ) -> tuple[pa.Table, pa.Table]:
    """keyed_reads.merged_audit of a batch the pass planned (its keys in `_row`)."""
    received = _with(_key_columns(batch.deletes, table.keys), batch.deletes.select(["_seq"]))
    return keyed_reads.merged_audit(engine, lake.silver(table.name), _key_columns(batch.latest, table.keys), received,
                                    batch_id)
