"""The Debezium envelope, as pure transforms (DataFrame -> DataFrame; nothing here reads or writes):
landing lines (`line_fields`) -> envelope fields (`parse_envelope`) -> change events, tombstone
lines or quarantine rows with a reason (`classify`); Kafka tombstones matched to the deletes they follow
(`match_tombstones`); key images and TOAST placeholders."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_jobs.debezium import connectors
from spark_jobs.landing import EXCERPT_BYTES as EXCERPT_CHARS
from spark_jobs.landing import line_too_large
from spark_jobs.quality.expectations import row_checks, row_failure_sql
from spark_jobs.sql_text import ident, labels_where, literal, per_table, sql

OPS = ("c", "u", "d", "r", "t")

# Parsed with string leaves: Spark keeps nested objects as their JSON text, so every table shares one
# bronze schema and the images are typed later, in silver, from the schema or the data.
# `patch` (MongoDB 1.x) and `updateDescription` (MongoDB's change streams without the full document): an update
# that carries what changed, not the document
_RECORD_SCHEMA = ("schema STRING, payload STRING, before STRING, after STRING, source STRING, op STRING, ts_ms BIGINT, "
                  "patch STRING, updateDescription STRING")
_PAYLOAD_SCHEMA = "before STRING, after STRING, source STRING, op STRING, ts_ms BIGINT, patch STRING, updateDescription STRING"
PARTIAL_UPDATE = "partial_update: the event carries a patch, not the document"
OUT_OF_RANGE = "number_out_of_range: a number in the record is beyond a double's range (about 1.8e308)"


_TRAILING_CR = r"\r$"  # the regex of a CRLF line end's CR


def line_fields(lines: DataFrame, max_line_bytes: int = 16 * 2**20) -> DataFrame:
    """(_source_file, _line, _text): UTF-8 lines as Spark's reader split them at each LF -> (_source_file, _line, _raw,
    _line_problem): the line without the CR of a CRLF (the reader has dropped the byte-order mark opening a file), and why it is
    not parsed (line_too_large, when longer than `max_line_bytes`: the row keeps an excerpt). Blank lines stay
    (they are quarantined, never dropped). Lines that are not UTF-8 are kept byte for byte instead
    (landing.exact_line)."""
    too_large = f"octet_length(_clean) > {int(max_line_bytes)}"
    before, after = line_too_large("\0", max_line_bytes).split("\0")
    problem = f"concat({literal(before)}, CAST(octet_length(_clean) AS STRING), {literal(after)})"
    return lines.withColumn("_clean", sql(f"regexp_replace(_text, {literal(_TRAILING_CR)}, '')")).select(
        sql("_source_file"), sql("CAST(_line AS BIGINT) AS _line"),
        sql(f"CASE WHEN {too_large} THEN substring(_clean, 1, {int(EXCERPT_CHARS)}) ELSE _clean END AS _raw"),
        sql(f"CASE WHEN {too_large} THEN {problem} END AS _line_problem"))


# Debezium's ExtractNewRecordState puts source fields at the top level as `__<field>` (or
# `__source_<field>` when added as `source.<field>`); these are the ones ordering and lineage read.
FLAT_SOURCE_FIELDS = tuple(dict.fromkeys((*connectors.SOURCE_FIELDS, "name", "db", "schema", "table", "txId", "gtid",
                                          "server_id", "sequence", "ts_ms")))


def _flat_source_sql() -> str:
    # `__ts_ms` is the envelope's ts_ms, not the source's: only `__source_ts_ms` goes into the source block
    fields = ", ".join(f"'{name}', _flat['__source_{name}']" if name == "ts_ms"
                       else f"'{name}', coalesce(_flat['__source_{name}'], _flat['__{name}'])" for name in FLAT_SOURCE_FIELDS)
    return f"to_json(named_struct({fields}))"


def parse_envelope(lines: DataFrame, fmt: str = "auto") -> DataFrame:
    """Parse a Debezium JSON record, with or without the schema envelope, keeping the raw line.

    Flattened records (ExtractNewRecordState, `format: json-flat`, or with `auto` any record carrying
    `__op` or `__deleted`) are mapped onto the same columns: the record is the row image, `__op` (or
    `__deleted`, delete.handling.mode=rewrite) the op, and the `__` fields the source block.

    Adds op, ts_ms, source, before, after (JSON text), _schema (the envelope's schema, or null),
    _json_ok (false when the line is not valid JSON), _json_single (false when more follows the first
    JSON value), a flattened record's own `__op` and `__deleted` (null for other records), which an
    expectation compares (quality/expectations.py), and _partial_update (an update with a patch and no `after`)."""
    # written as SQL: one expression tree built in the JVM, not hundreds of Python-side calls
    if fmt == "json-flat":
        flat = "true"
    elif fmt == "auto":  # Debezium's own envelope never has `__op`/`__deleted` at its top level
        flat = "(_flat['__op'] IS NOT NULL OR _flat['__deleted'] IS NOT NULL)"
    else:
        flat = "false"
    # contains(), not LIKE: an escaped `_` in a pattern makes Spark run LIKE as a regex over the whole line
    maybe_flat = "true" if fmt == "json-flat" else """(contains(_text, '"__op"') OR contains(_text, '"__deleted"'))"""
    flat_op = ("coalesce(_flat['__op'], CASE lower(_flat['__deleted']) WHEN 'true' THEN 'd' WHEN 'false' THEN 'u' END)")
    # a line with a problem found when it was read (too large, not UTF-8) is not parsed
    text = "_raw" if "_line_problem" not in lines.columns else "CASE WHEN _line_problem IS NULL THEN _raw END"
    steps = {"_text": text, "_rec": f"from_json(_text, {literal(_RECORD_SCHEMA)})",
             "_env": "_rec.payload IS NOT NULL AND _rec.op IS NULL",
             "_payload": f"CASE WHEN _env THEN from_json(_rec.payload, {literal(_PAYLOAD_SCHEMA)}) END",
             "_body": "CASE WHEN _env THEN _rec.payload ELSE _text END",
             "_flat": "CAST(NULL AS MAP<STRING, STRING>)" if fmt == "json" else
                      f"CASE WHEN {maybe_flat} THEN from_json(_body, 'map<string,string>') END",
             "_is_flat": f"coalesce({flat}, false)", "_flat_derived_op": flat_op}
    parsed = lines
    for name, step in steps.items():
        parsed = parsed.withColumn(name, sql(step))

    def pick(name: str) -> str:
        return f"CASE WHEN _env THEN _payload.{name} ELSE _rec.{name} END"

    return parsed.select(*[sql(text) for text in (
        *map(ident, lines.columns),
        "try_parse_json(_text) IS NOT NULL AS _json_ok",
        # Spark's JSON readers stop after the first value: anything after it would vanish unseen. Inside an
        # array, `v,0` has two items and `0,v` two exactly when v is one JSON value with nothing after it
        "coalesce(json_array_length(concat('[', _text, ',0]')) = 2 AND json_array_length(concat('[0,', _text, ']')) = 2,"
        " false) AS _json_single",
        f"CASE WHEN _is_flat THEN _flat_derived_op ELSE {pick('op')} END AS op",
        f"CASE WHEN _is_flat THEN CAST(coalesce(_flat['__ts_ms'], _flat['__source_ts_ms']) AS BIGINT) ELSE {pick('ts_ms')} END"
        " AS ts_ms",
        f"CASE WHEN _is_flat THEN {_flat_source_sql()} ELSE {pick('source')} END AS source",
        f"CASE WHEN _is_flat THEN CASE WHEN _flat_derived_op = 'd' THEN _body END ELSE {pick('before')} END AS before",
        f"CASE WHEN _is_flat THEN CASE WHEN _flat_derived_op <> 'd' THEN _body END ELSE {pick('after')} END AS after",
        "CASE WHEN _env THEN _rec.schema END AS _schema",
        "CASE WHEN _is_flat THEN _flat['__op'] END AS _flat_op",
        "CASE WHEN _is_flat THEN _flat['__deleted'] END AS _flat_deleted",
        f"coalesce(NOT _is_flat AND {pick('op')} = 'u' AND {pick('after')} IS NULL AND "
        f"({pick('patch')} IS NOT NULL OR {pick('updateDescription')} IS NOT NULL), false) AS _partial_update",
    )])


ENVELOPE_FIELDS = ("before", "after", "source", "op", "ts_ms", "transaction")


def transaction_id() -> Column:
    """The id of the source transaction an event belongs to, from the envelope's `transaction` block (the connector's
    provide.transaction.metadata), with or without the schema envelope; null outside a transaction (a snapshot read)."""
    return F.coalesce(F.get_json_object("_raw", "$.payload.transaction.id"), F.get_json_object("_raw", "$.transaction.id"))


def parquet_image_type(schema: StructType) -> StructType:
    """The row image's columns in a Parquet landing file: the `after` struct of a Debezium envelope, or a
    flattened record's own columns (without the `__` metadata ones)."""
    names = set(schema.fieldNames())
    if "after" in names and isinstance(schema["after"].dataType, StructType):
        return schema["after"].dataType
    return StructType([f for f in schema.fields if not f.name.startswith("__") and not
                       ("op" in names and f.name in ENVELOPE_FIELDS)])


def _placeholder_forms(placeholder: str) -> tuple[str, str]:
    """The placeholder as text, and as bytes columns carry it (base64, the JSON converter's encoding)."""
    return placeholder, base64.b64encode(placeholder.encode()).decode()


def holds_placeholder(placeholder: str) -> str:
    """Does the event's `after` image hold an unavailable-value placeholder (checked before typing)? As SQL text."""
    quoted = [literal('"' + form + '"') for form in _placeholder_forms(placeholder)]
    return " OR ".join(f"coalesce(instr(after, {form}) > 0, false)" for form in quoted)


def unavailable_marks(placeholder: str) -> tuple[str, str]:
    """SQL text over an event: `_unavailable`, the columns whose value in `after` is the placeholder (text, bytes as
    base64, or an array holding only it), and `after` with those values replaced by null so they type like any
    column."""
    text, encoded = _placeholder_forms(placeholder)
    forms = ", ".join(map(literal, (text, encoded, f'["{text}"]')))
    columns = (f"coalesce(map_keys(map_filter(from_json(after, 'map<string,string>'), (k, v) -> v IN ({forms}))),"
               " CAST(array() AS ARRAY<STRING>))")
    pattern = rf'\[\s*"\Q{text}\E"\s*\]|"\Q{text}\E"|"\Q{encoded}\E"'
    return columns, f"regexp_replace(after, {literal(pattern)}, 'null')"


def mark_unavailable(changes: DataFrame, placeholder: str) -> DataFrame:
    """The events with `unavailable_marks`: `_unavailable`, and `after` without the placeholders."""
    columns, after = unavailable_marks(placeholder)
    return changes.withColumns({"_unavailable": sql(columns), "after": sql(after)})


KEY_IMAGE = "CASE WHEN op = 'd' THEN before ELSE after END"


def key_image() -> Column:
    """The image the key comes from: `before` for deletes, `after` for c/u/r (docs/architecture.md, "Apply rules")."""
    return sql(KEY_IMAGE)


def _missing_keys_sql(keys: tuple[str, ...]) -> str:
    return labels_where({k: f"get_json_object({KEY_IMAGE}, {literal(f'$.{k}')}) IS NULL" for k in keys}, ",")


def missing_keys(keys: tuple[str, ...]) -> Column:
    """Comma-separated key columns that are null or absent in the key image ('' when all present)."""
    return sql(_missing_keys_sql(keys))


MONGODB = "coalesce(lower(get_json_object(source, '$.connector')) = 'mongodb', false)"


def _nested_keys_sql(keys: tuple[str, ...]) -> str:
    """Comma-separated key columns whose value is a JSON object or array ('' when none): such a key would
    become its JSON text in silver, a key no source row has. A MongoDB `_id` in extended JSON ({"$oid": ...})
    is one value (types.py types it)."""
    def nested(k: str) -> str:
        path = literal(f"$.{k}")
        text = f"get_json_object({KEY_IMAGE}, {path})"
        extended = f"coalesce(size(json_object_keys({text})) = 1 AND startswith(json_object_keys({text})[0], '$'), false)"
        kind = f"split(schema_of_variant(try_variant_get(try_parse_json({KEY_IMAGE}), {path}, 'variant')), '<')[0]"
        return f"{kind} IN ('OBJECT', 'ARRAY') AND NOT ({MONGODB} AND {extended})"

    return labels_where({k: nested(k) for k in keys}, ",")


def keys_from_record_key(parsed: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Deletes whose row image lacks key columns take them from `_record_key`, the Kafka record key the S3 sink
    stored beside the value (tables.yaml `record_keys`): its field of the same name, or for MongoDB's `_id`, its
    `id`. A MongoDB delete carries no document at all; its connector's key holds the `_id` as extended JSON text,
    and ExtractNewDocumentState's key holds the value itself. The key line may have the schema envelope."""
    key = F.col("_record_key")
    body = F.when(F.get_json_object(key, "$.schema").isNotNull() & F.get_json_object(key, "$.payload").isNotNull(),
                  F.get_json_object(key, "$.payload")).otherwise(key)
    flat = F.col("_flat_op").isNotNull() | F.col("_flat_deleted").isNotNull()
    variant = F.expr("try_parse_json(_key_body)")

    def as_json(name: str) -> Column:  # the key field's value as JSON text
        return F.to_json(F.try_variant_get(variant, f"$['{name}']", "variant"))

    pairs = []
    for k in keys:
        value = as_json(k)
        if k == "_id":
            value = F.coalesce(value, F.when(F.expr(MONGODB) & ~flat, F.get_json_object("_key_body", "$.id"))
                               .otherwise(as_json("id")))
        pairs.append(F.when(F.get_json_object("before", f"$.{k}").isNull() & value.isNotNull(),
                            F.concat(F.lit(json.dumps(k) + ":"), value)))
    added = F.concat_ws(",", *pairs)
    empty = F.col("before").isNull() | F.col("before").rlike(r"^\s*\{\s*\}\s*$")
    before = (F.when((F.col("op") != "d") | (added == ""), F.col("before"))
              .when(empty, F.concat(F.lit("{"), added, F.lit("}")))
              .when(F.ltrim("before").startswith("{"),
                    F.concat(F.lit("{"), added, F.lit(","), F.expr("substring(ltrim(before), 2)")))
              .otherwise(F.col("before")))
    return parsed.withColumn("_key_body", body).withColumn("before", before).drop("_key_body")


# Row-level bronze expectations (quality/expectations.py): the first one a change event fails, with detail.
# Quarantine is the default action; under `warn` or `fail` the event stays in the batch.
def row_expectation_failure() -> Column:
    """`<expectation>: <detail>` for the first row-level expectation the event fails, else null."""
    return F.expr(row_failure_sql("bronze"))


def _overflowed() -> str:
    """Spark keeps `before`/`after` as JSON text it writes again, and writes a number beyond a double's range
    as the string "Infinity": more such strings in them than in the line itself means a number overflowed."""
    def infinities(text: str) -> str:
        return f"(size(split(coalesce({text}, ''), '\"-?Infinity\"')) - 1)"
    # the regex split over whole records is costly and classify refers to this more than once: counted only on
    # the rare images that hold the word at all
    rare = " OR ".join(f"contains(coalesce({image}, ''), 'Infinity')" for image in ("before", "after"))
    return f"(({rare}) AND {infinities('before')} + {infinities('after')} > {infinities('_raw')})"


def classify(parsed: DataFrame, keys: tuple[str, ...], quarantine: frozenset[str] = row_checks("bronze")) -> DataFrame:
    """Adds `_kind` (event | tombstone | quarantine), `reason` for quarantined lines, `_missing_key` (the key
    columns absent from the key image, comma-separated) and `_expectation`,
    the row-level expectation a kept event fails (reported, not quarantined: its action is not in
    `quarantine`). Lines that are no change event at all are always quarantined."""
    return classify_tables(parsed, {"": (keys, quarantine)})


# A table's key columns, and the row expectations whose failure quarantines an event of it
TableRules = tuple[tuple[str, ...], frozenset[str]]


_TOMBSTONE_ENVELOPE = r'^\{\s*"schema"\s*:\s*null\s*,\s*"payload"\s*:\s*null\s*\}$'


def classify_tables(parsed: DataFrame, rules: Mapping[str, TableRules]) -> DataFrame:
    """`classify` over the lines of many tables at once (`_table` names each line's), by each table's rules."""
    problem = "_line_problem" if "_line_problem" in parsed.columns else "CAST(NULL AS STRING)"
    unusable = (
        f"CASE WHEN {problem} IS NOT NULL THEN {problem}"
        " WHEN trim(_raw) = '' THEN 'empty_line'"
        " WHEN NOT _json_ok THEN 'malformed_json'"
        " WHEN NOT _json_single THEN 'malformed_json: content after the JSON record'"
        " WHEN op IS NULL THEN 'not_debezium: no op field'"
        f" WHEN NOT op IN ({', '.join(literal(op) for op in OPS)}) THEN concat('unknown_op: ', op)"
        f" WHEN _partial_update THEN {literal(PARTIAL_UPDATE)}"
        f" WHEN {_overflowed()} THEN {literal(OUT_OF_RANGE)}"
        " WHEN _nested_key <> '' THEN concat('invalid_key: ', _nested_key, ' (an object or array, not a value)') END")
    # a Kafka tombstone is `null`, or with the JSON converter's schemas.enable=true, an empty envelope
    tombstone = f"{problem} IS NULL AND (trim(_raw) = 'null' OR trim(_raw) RLIKE {literal(_TOMBSTONE_ENVELOPE)})"
    failed = f"CASE WHEN NOT _tombstone AND _unusable IS NULL THEN {row_failure_sql('bronze')} END"
    refusing = per_table({table: quarantine for table, (_, quarantine) in rules.items()},
                         lambda quarantine: f"split(_failed, ':')[0] IN ({', '.join(map(literal, sorted(quarantine)))})"
                         if quarantine else "false")
    keys_of = {table: keys for table, (keys, _) in rules.items()}
    # each step refers to the one before by column name: Spark evaluates every expression once per line (passed
    # as one expression, the parsing checks were copied into every later expression and ran up to nine times)
    steps = {"_missing_key": per_table(keys_of, _missing_keys_sql), "_nested_key": per_table(keys_of, _nested_keys_sql),
             "_unusable": unusable, "_tombstone": tombstone, "_failed": failed,
             "_kind": f"CASE WHEN _tombstone THEN 'tombstone' WHEN _unusable IS NOT NULL OR {refusing} THEN 'quarantine'"
                      " ELSE 'event' END",
             "reason": "CASE WHEN _kind = 'quarantine' THEN coalesce(_unusable, _failed) END",
             "_expectation": "CASE WHEN _kind = 'event' THEN _failed END"}
    for name, text in steps.items():
        parsed = parsed.withColumn(name, sql(text))
    return parsed.drop("_nested_key", "_unusable", "_tombstone", "_failed", "_partial_update")


_LANDING_OFFSET = r"([^/]+)\+([0-9]+)\+([0-9]+)\.[^/]*$"


def landing_offset(path: str) -> tuple[str, int] | None:
    """(topic+partition, first offset) from an S3 sink file name; None for other names."""
    match = re.search(_LANDING_OFFSET, path)
    return None if match is None else (f"{match.group(1)}+{match.group(2)}", int(match.group(3)))


def _kafka_position_sql() -> tuple[str, str]:
    """(topic-partition, offset) of a landing line (`_source_file`, `_line`), from the S3 sink's
    `<topic>+<partition>+<start>` file name; for other names, the file itself and the line number. As SQL text."""
    offset = literal(_LANDING_OFFSET)

    def group(n: int) -> str:
        return f"regexp_extract(_source_file, {offset}, {n})"

    named = f"{group(3)} <> ''"
    return (f"CASE WHEN {named} THEN concat_ws('+', {group(1)}, {group(2)}) ELSE _source_file END",
            f"CASE WHEN {named} THEN CAST({group(3)} AS BIGINT) + _line - 1 ELSE _line END")


def kafka_offset() -> Column:
    """The Kafka offset of a landing line (`_source_file`, `_line`): its file's first offset and its line; for files
    not named by the S3 sink, the line number."""
    return sql(_kafka_position_sql()[1])


def match_tombstones(lines: DataFrame, earlier: DataFrame | None) -> DataFrame:
    """Kafka tombstone lines of `lines` (classified) with `_follows_delete`: whether the record at the
    previous offset of the partition is a delete. Debezium writes each delete's tombstone right after it.
    The previous record is looked up in `lines` and then in `earlier` (bronze rows: _source_file, _line,
    op), for tombstones that open a file. Columns: _source_file, _line, _part and _offset (where the previous
    record is), _follows_delete, and _previous_unseen (that record is in neither: it may land later)."""
    # One aggregation over tombstones and records by the record's place, not a join: a join shuffles both sides
    # first, and a small batch's one partition needs no shuffle for an aggregation (layers/common.py, checkpoint).
    partition, offset = _kafka_position_sql()
    place = {True: [sql(f"{partition} AS _part"), sql(f"{offset} - 1 AS _offset"), sql("CAST(NULL AS STRING) AS op"),
                    sql("struct(_source_file, _line) AS _tomb")],
             False: [sql(f"{partition} AS _part"), sql(f"{offset} AS _offset"), sql("op"),
                     sql("CASE WHEN false THEN struct(_source_file, _line) END AS _tomb")]}

    def by_place(rows: DataFrame, tombstones: bool) -> DataFrame:  # a tombstone's place is the offset before its own
        return rows.select(*place[tombstones])

    places = by_place(lines.where("_kind = 'tombstone'"), True).unionByName(
        by_place(lines.where("_kind <> 'tombstone'"), False))
    if earlier is not None:
        places = places.unionByName(by_place(earlier, False))
    previous = places.groupBy(sql("_part"), sql("_offset")).agg(
        sql("max(CASE WHEN _tomb IS NULL THEN op = 'd' END) AS _is_delete"),
        sql("collect_list(_tomb) AS _tombs"))  # collect_list leaves the records' nulls out
    exploded = previous.select(sql("_part"), sql("_offset"), sql("_is_delete"), sql("explode(_tombs) AS _tomb"))
    return exploded.select(*[sql(text) for text in (
        "_tomb._source_file", "_tomb._line", "_part", "_offset", "coalesce(_is_delete, false) AS _follows_delete",
        "_is_delete IS NULL AS _previous_unseen")])


def resolve_pending_tombstones(pending: DataFrame, lines: DataFrame) -> DataFrame:
    """Earlier batches' tombstones whose previous record had not arrived (`_part`, `_offset` = its place),
    against the records of `lines` (classified): those whose previous record is here, with
    `_follows_delete`. Files land out of order, so a tombstone can arrive before its delete."""
    partition, offset = _kafka_position_sql()
    records = lines.where("_kind <> 'tombstone'").select(sql(f"{partition} AS _part"), sql(f"{offset} AS _offset"),
                                                         sql("op")) \
        .groupBy("_part", "_offset").agg(sql("max(op = 'd') AS _follows_delete"))
    return pending.join(records, ["_part", "_offset"]).select("_source_file", "_line", "_follows_delete")
