"""Typing row images: from the Debezium schema envelope (logical types decoded), or inferred from plain
JSON (JSON types kept), then aligned with the silver table's existing columns without lossy casts."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import cache
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.sql_text import ident, labels_where, literal, named_struct, sql, sql_type

PHYSICAL = {"int8": "TINYINT", "int16": "SMALLINT", "int32": "INT", "int64": "BIGINT", "float32": "FLOAT",
            "float64": "DOUBLE", "boolean": "BOOLEAN", "string": "STRING", "bytes": "STRING"}
DECIMAL_LOGICAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
VARIABLE_DECIMAL_TYPE = "DECIMAL(38,18)"  # values that need more scale or digits are quarantined, not rounded
# time of day has no Spark type (before 4.1): kept as 'HH:MM:SS.fraction' text, which sorts correctly
TIME_OF_DAY = {"io.debezium.time.Time": (1_000, 3), "org.apache.kafka.connect.data.Time": (1_000, 3),
               "io.debezium.time.MicroTime": (1_000_000, 6), "io.debezium.time.NanoTime": (1_000_000_000, 9)}
# semantic types whose JSON value is already the value: kept as text
TEXT_LOGICAL = ("io.debezium.data.Json", "io.debezium.data.Enum", "io.debezium.data.EnumSet", "io.debezium.data.Uuid",
                "io.debezium.data.Xml", "io.debezium.time.ZonedTime")
OVERRIDE = "override"  # a type from tables.yaml `columns:`, parsed from the JSON text
SPARK_TYPED = "spark"  # a type the file already carried (Parquet), round-tripped through JSON exactly
# MongoDB's extended JSON (its connector writes each document as that text): a value wrapped in an object of
# one `$` field is typed by the wrapper. Numbers may come wrapped (canonical mode) or plain (relaxed mode)
OBJECT_ID, BSON_DATE, BSON_INT64, BSON_DOUBLE, BSON_DECIMAL = (
    "bson.objectid", "bson.date", "bson.int64", "bson.double", "bson.decimal128")
BSON_TYPES = {OBJECT_ID: "STRING", BSON_DATE: "TIMESTAMP", BSON_INT64: "BIGINT", BSON_DOUBLE: "DOUBLE",
              BSON_DECIMAL: VARIABLE_DECIMAL_TYPE}
# to_json/from_json options that keep timestamps to the microsecond (the default writes milliseconds)
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}


@dataclass(frozen=True)
class ImageField:
    """One column of a row image: how to parse it from JSON and how to decode it to its Spark type."""

    name: str
    parse_type: str  # DDL type for from_json (the connector's physical type)
    logical: str | None = None
    scale: int = 0
    precision: int = 38
    target: str = ""  # the Spark type of an override or of a typed (Parquet) column
    # plain JSON null in every event of the batch: no type yet (silver_plan.combined_fields leaves it out, so the
    # first value that has one types the column)
    untyped: bool = False
    # plain JSON values of more than one JSON type in the batch (a number and a string, say): typed by silver's
    # column, or else by its first value (silver_plan.resolve_mixed); `kinds` then names the JSON types that fit
    mixed: bool = False
    kinds: tuple[str, ...] = ()
    # the batch's envelope schemas disagree on how to decode the field (a DDL between its events: a decimal's scale, a
    # date become a timestamp): each schema's own field, by the md5 of the schema's text; the field's type holds all
    by_schema: tuple[tuple[str, ImageField], ...] = ()
    # why the envelope's description of the field decodes nothing (a decimal's scale that is not a whole number): every
    # value present is a decode problem, named with this
    undecodable: str = ""

    @property
    def problem(self) -> str:
        """How a value of the field that did not decode is named in its quarantine reason."""
        return f"{self.name} ({self.undecodable or f'not {self.spark_type.lower()}'})"

    @property
    def spark_type(self) -> str:
        return {
            "io.debezium.time.Date": "DATE",
            "org.apache.kafka.connect.data.Date": "DATE",
            "io.debezium.time.Timestamp": "TIMESTAMP",
            "org.apache.kafka.connect.data.Timestamp": "TIMESTAMP",
            "io.debezium.time.MicroTimestamp": "TIMESTAMP",
            "io.debezium.time.NanoTimestamp": "TIMESTAMP",
            "io.debezium.time.ZonedTimestamp": "TIMESTAMP",
            DECIMAL_LOGICAL: f"DECIMAL({self.precision},{self.scale})",
            VARIABLE_DECIMAL: VARIABLE_DECIMAL_TYPE,
            OVERRIDE: self.target,
            SPARK_TYPED: self.target,
            **BSON_TYPES,
        }.get(self.logical or "", "STRING" if self.logical in TIME_OF_DAY or self.logical in TEXT_LOGICAL
              else self.parse_type)

    def decode(self, value: str) -> str:
        """The field's parsed value (`value`: SQL text, of its physical type) decoded to its Spark type, as SQL text."""
        if self.undecodable:
            return f"CAST(NULL AS {self.spark_type})"
        logical = self.logical or ""
        if logical in ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date"):
            return f"date_add(CAST('1970-01-01' AS DATE), {value})"
        if logical in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
            return f"timestamp_millis({value})"
        if logical == "io.debezium.time.MicroTimestamp":
            return f"timestamp_micros({value})"
        if logical == "io.debezium.time.NanoTimestamp":
            return f"timestamp_micros(CAST(floor(CAST({value} AS DECIMAL(20,0)) / 1000) AS BIGINT))"
        if logical == "io.debezium.time.ZonedTimestamp":
            return f"CAST({value} AS TIMESTAMP)"
        if logical == DECIMAL_LOGICAL:
            return decode_decimal(value, self.precision, self.scale)
        if logical == VARIABLE_DECIMAL:
            return f"try_cast(cdc_variable_decimal(({value}).value, ({value}).scale) AS {VARIABLE_DECIMAL_TYPE})"
        if logical in TIME_OF_DAY:
            return time_of_day(value, *TIME_OF_DAY[logical])
        if logical == OVERRIDE:
            return _exact_cast(value, self.target)
        if logical in BSON_TYPES:
            return _bson_value(value, logical)
        return value

    @property
    def in_python(self) -> bool:
        """Decoded by a Python function (`register_decoders`): Spark's SQL has no exact decode of its encoding."""
        return self.logical == VARIABLE_DECIMAL or (self.logical == DECIMAL_LOGICAL and self.precision > 18)


def _unwrap(value: str, wrapper: str) -> str:
    """The text inside an extended JSON value ({"$numberLong": "5"} -> 5); null when `value` is not that wrapper."""
    return f"from_json({value}, {literal(f'struct<{ident(wrapper)}: string>')}).{ident(wrapper)}"


def _bson_value(value: str, logical: str) -> str:
    """A field's JSON text (wrapped or plain) -> its value; null, a decode problem, when it is not of the type."""
    numbers = f"{_unwrap(value, '$numberLong')}, {_unwrap(value, '$numberInt')}"
    if logical == OBJECT_ID:
        return f"coalesce({_unwrap(value, '$oid')}, {value})"
    if logical == BSON_INT64:
        return _exact_cast(f"coalesce({numbers}, {value})", "bigint")
    if logical == BSON_DOUBLE:  # "NaN", "Infinity" and "-Infinity" are doubles too
        return f"try_cast(coalesce({_unwrap(value, '$numberDouble')}, {numbers}, {value}) AS DOUBLE)"
    if logical == BSON_DECIMAL:  # Decimal128 holds 34 digits: values beyond DECIMAL(38,18) are problems, not rounded
        return _exact_cast(f"coalesce({_unwrap(value, '$numberDecimal')}, {_unwrap(value, '$numberDouble')}, {numbers}, "
                           f"{value})", VARIABLE_DECIMAL_TYPE.lower())
    # $date: milliseconds since the epoch ({"$numberLong": ...} or, in the legacy form, a number), or ISO-8601 text
    # (relaxed mode, for years 1970-9999)
    date = _unwrap(value, "$date")
    return (f"CASE WHEN {date} RLIKE '^-?[0-9]+$' THEN timestamp_millis(try_cast({date} AS BIGINT))"
            f" WHEN startswith({date}, '{{') THEN timestamp_millis(try_cast({_unwrap(date, '$numberLong')} AS BIGINT))"
            f" ELSE try_cast({date} AS TIMESTAMP) END")


def decode_decimal(value: str, precision: int, scale: int) -> str:
    """Kafka Connect Decimal: base64 of the unscaled value, big-endian two's complement (SQL text)."""
    if precision > 18:
        return f"try_cast(cdc_connect_decimal({value}, {scale}) AS DECIMAL({precision},{scale}))"
    # base64 as Connect writes it, or nothing: Spark's unbase64 decodes any text to some bytes (a value that is not
    # base64 came out as 0); NULL here makes it a decode problem, quarantined
    hexed = f"CASE WHEN {value} RLIKE {literal(BASE64)} THEN hex(unbase64({value})) END"
    negative = f"CAST(conv(substring({hexed}, 1, 2), 16, 10) AS INT) >= 128"
    # sign-extend to 8 bytes, then conv with a negative base reads it as signed 64-bit
    unscaled = f"CAST(conv(lpad({hexed}, 16, CASE WHEN {negative} THEN 'F' ELSE '0' END), 16, -10) AS DECIMAL(19,0))"
    # dividing two DECIMAL(19,0) keeps scale 19 here, so this is exact for scale <= 18
    return f"try_cast({unscaled} / CAST({10**scale} AS DECIMAL(19,0)) AS DECIMAL({precision},{scale}))"


def time_of_day(value: str, units_per_second: int, digits: int) -> str:
    """Units since midnight -> 'HH:MM:SS.fraction' (null when outside one day), as SQL text."""
    seconds, fraction = f"floor(({value}) / {units_per_second})", f"(({value}) % {units_per_second})"
    hms = [f"lpad(CAST({part} AS STRING), 2, '0')"
           for part in (f"floor({seconds} / 3600)", f"floor(({seconds} % 3600) / 60)", f"({seconds} % 60)")]
    text = f"concat({hms[0]}, ':', {hms[1]}, ':', {hms[2]}, '.', lpad(CAST({fraction} AS STRING), {digits}, '0'))"
    return f"CASE WHEN ({value}) >= 0 AND ({value}) <= {86_400 * units_per_second} THEN {text} END"


def _exact_cast(text: str, target: str) -> str:
    """A JSON value's text to an overridden type; null (a decode problem) when it would lose digits. SQL text."""
    cast = f"try_cast({text} AS {target})"
    if target.startswith("decimal") or target in ("tinyint", "smallint", "int", "bigint"):
        return f"CASE WHEN try_cast({cast} AS DECIMAL(38,18)) = try_cast({text} AS DECIMAL(38,18)) THEN {cast} END"
    return cast


BASE64 = "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # whole groups, padded: as Connect writes


def _unscaled(text: str) -> int | None:
    """Base64 of a big-endian two's-complement unscaled value (Kafka Connect's Decimal encoding); None when the text is
    not base64 (a decode problem: the event is quarantined, its batch goes on)."""
    try:
        unscaled = base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error
        return None
    return int.from_bytes(unscaled, "big", signed=True) if unscaled else None


def _exact_text(unscaled: int, scale: int) -> str:
    """unscaled * 10^-scale as plain decimal text, exactly: built from its digits, as no arithmetic under a decimal
    context is (its precision, 28 by default, rounds a 38-digit value)."""
    sign, digits, _ = Decimal(unscaled).as_tuple()
    return format(Decimal((sign, digits, -scale)), "f")


def _connect_decimal_text(text: str | None, scale: int | None) -> str | None:
    """cdc_connect_decimal: a Connect Decimal of more than 18 digits as its exact text, which SQL casts to its type
    (DECIMAL(p,scale), p <= 38: a value of more digits or another scale is none of its values)."""
    if text is None or scale is None or not 0 <= scale <= 38:
        return None
    unscaled = _unscaled(text)
    return None if unscaled is None or abs(unscaled) >= 10 ** 38 else _exact_text(unscaled, scale)


def _variable_decimal_text(text: str | None, scale: int | None) -> str | None:
    """cdc_variable_decimal: Debezium's VariableScaleDecimal ({scale, value: base64 unscaled}; each value has its own
    scale) as exact text, when DECIMAL(38,18) holds it exactly (a whole number of 10^-18 below 10^20); the rest
    become decode problems (quarantined). In integers: a hostile scale costs no more than the value's own digits."""
    unscaled = None if text is None else _unscaled(text)
    if unscaled is None or scale is None:
        return None
    shift = 18 - scale  # the value in units of 10^-18 is unscaled * 10^shift
    # at most bit_length * log10(2) + 1 digits (never str(): Python refuses an int of more than 4,300 digits as text)
    if unscaled and not -(abs(unscaled).bit_length() * 0.30103 + 1) <= shift <= 38:
        return None  # not whole units, or at least 10^20
    units = unscaled * 10 ** shift if shift >= 0 else unscaled // 10 ** -shift
    if shift < 0 and units * 10 ** -shift != unscaled or abs(units) >= 10 ** 38:
        return None
    return _exact_text(units, 18)


def register_decoders(spark: SparkSession) -> None:
    """The decoders written in Python, by the names the fields' SQL text calls them (`ImageField.in_python`)."""
    for name, decode in (("cdc_connect_decimal", _connect_decimal_text), ("cdc_variable_decimal", _variable_decimal_text)):
        spark.udf.register(name, decode, T.StringType())


def fields_from_envelope(schema_json: str) -> list[ImageField]:
    """The row image's columns from a Debezium envelope schema (the `after` struct, else `before`), or
    from a flattened record's schema (its own fields, without the `__` metadata ones)."""
    schema = json.loads(schema_json)
    images = {f.get("field"): f for f in schema.get("fields", [])}
    image = images.get("after") or images.get("before")
    if image and image.get("type") == "string":  # MongoDB's document, extended JSON text: typed from the data
        return []
    if not image:
        if "__op" not in images and "__deleted" not in images:
            raise ValueError("envelope schema has no before/after struct and no __op/__deleted field")
        image = {"fields": [f for f in schema["fields"] if not f.get("field", "").startswith("__")]}
    fields = []
    for f in image.get("fields", []):
        params = f.get("parameters") or {}
        if "spark_type" in f:
            fields.append(ImageField(name=f["field"], parse_type=f["spark_type"], logical=SPARK_TYPED, target=f["spark_type"]))
            continue
        logical = f.get("name")
        scale, precision = _whole(params.get("scale", 0)), _whole(params.get("connect.decimal.precision", 38))
        undecodable = ""
        if logical == DECIMAL_LOGICAL and (scale is None or precision is None or not 0 <= scale <= precision <= 38):
            undecodable = (f"undecodable: the schema's decimal scale {params.get('scale')!r} and precision "
                           f"{params.get('connect.decimal.precision', 38)!r}")
            scale, precision = 18, 38  # the column's type, when it is new: the widest decimal Spark holds exactly
        fields.append(ImageField(
            name=f["field"],
            parse_type=("STRUCT<scale: INT, value: STRING>" if logical == VARIABLE_DECIMAL
                        else PHYSICAL.get(f.get("type", "string"), "STRING")),
            logical=logical,
            scale=scale or 0,
            precision=38 if precision is None else precision,
            undecodable=undecodable,
        ))
    return fields


def _whole(value: Any) -> int | None:
    """A schema parameter's whole number (Connect writes them as text), None when it is not one."""
    text = str(value).strip()
    return int(text) if text.lstrip("-").isdecimal() and text.isascii() else None


def envelope_from_spark(image: T.StructType) -> str:
    """A schema envelope for rows of a typed file (Parquet): each column keeps the Spark type it was
    written with, so decimals, dates and timestamps survive the trip through bronze's JSON text."""
    fields = [{"field": f.name, "spark_type": json_safe_type(f.dataType)} for f in image.fields]
    return json.dumps({"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": fields}]})


def json_safe_type(data_type: T.DataType) -> str:
    """Types to_json/from_json carry exactly; anything nested or binary is kept as JSON text."""
    if isinstance(data_type, (T.StructType, T.ArrayType, T.MapType, T.BinaryType)):
        return "STRING"
    return data_type.simpleString().upper()


def with_overrides(fields: list[ImageField], overrides: tuple[tuple[str, str], ...]) -> list[ImageField]:
    """tables.yaml `columns:` types for columns of plain JSON (no envelope): parsed from the text exactly."""
    types = dict(overrides)
    return [ImageField(f.name, "STRING", logical=OVERRIDE, target=types[f.name]) if f.name in types else f
            for f in fields]


def _split_top_level(body: str) -> list[str]:
    """A type list's parts (`a: BIGINT, b: OBJECT<x: STRING>`), split at its top-level commas: none inside <>, () or a
    name in backticks (Spark quotes a field name that is not a plain identifier, a backtick in it doubled)."""
    parts, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(body):
        if ch == "`":
            quoted = not quoted  # a doubled backtick closes and opens again: still inside
        elif not quoted:
            depth += ch in "<("
            depth -= ch in ">)"
            if ch == "," and depth == 0:
                parts.append(body[start:i].strip())
                start = i + 1
    if body[start:].strip():
        parts.append(body[start:].strip())
    return parts


def _named_type(part: str) -> tuple[str, str]:
    """`name: TYPE` of a type list, the name unquoted: `a`, or `` `c:d` `` / `` `a``b` `` as Spark quotes names."""
    if part.startswith("`"):
        end = 1
        while True:
            end = part.index("`", end)
            if part[end + 1:end + 2] != "`":
                break
            end += 2
        return part[1:end].replace("``", "`"), part[end + 1:].lstrip().removeprefix(":").strip()
    name, _, vtype = part.partition(":")
    return name.strip(), vtype.strip()


def json_type(variant_type: str) -> str:
    """Spark's variant type name for a JSON value -> the column type we keep (JSON types; docs/architecture.md,
    "Types and schema")."""
    if variant_type in ("BIGINT", "INT", "SMALLINT", "TINYINT"):
        return "BIGINT"
    if variant_type.startswith("DECIMAL") or variant_type in ("DOUBLE", "FLOAT"):
        return "DOUBLE"
    if variant_type == "BOOLEAN":
        return "BOOLEAN"
    return "STRING"  # strings, nulls (VOID), nested objects and arrays (kept as JSON text)


# the JSON types (schema_of_variant's names, before any `<` or `(`) whose values a plain JSON column of each type holds
# exactly: text holds strings, and objects and arrays as their JSON text, never a number or a boolean as text
JSON_KINDS = {"BIGINT": ("BIGINT", "INT", "SMALLINT", "TINYINT"),
              "DOUBLE": ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT", "DECIMAL"),
              "BOOLEAN": ("BOOLEAN",), "STRING": ("STRING", "OBJECT", "ARRAY")}


def json_kind(value: str) -> str:
    """The JSON type of a VARIANT value (SQL text), as JSON_KINDS names them ('VOID' for null)."""
    return f"regexp_extract(coalesce(schema_of_variant({value}), 'VOID'), '^[A-Z]+', 0)"


def plain_type(data_type: T.DataType) -> str:
    """The plain JSON column type (a key of JSON_KINDS) whose values a silver column of `data_type` takes: STRING for
    a type plain JSON never infers (its values are checked against it as text, `align`)."""
    if isinstance(data_type, T.BooleanType):
        return "BOOLEAN"
    if isinstance(data_type, T.IntegralType):
        return "BIGINT"
    if isinstance(data_type, T.NumericType):
        return "DOUBLE"
    return "STRING"


def mixed_typed_by_silver(fields: list[ImageField], target: T.StructType | None) -> list[ImageField]:
    """Mixed fields (`ImageField.mixed`) of columns silver has take the column's type: values of a JSON type it does
    not hold exactly are then problems (`decode_problems`). Mixed fields new to silver are left as they are.
    A MongoDB field typed by its wrappers ($date, $numberLong ...) whose silver column is text (its values were of
    mixed BSON types before) is kept as its extended JSON text too, as in the batch that made the column text: a
    date there never becomes a timestamp's display form."""
    existing = {f.name: f.dataType for f in target.fields} if target is not None else {}
    typed = {f.name: plain_type(existing[f.name]) for f in fields if f.mixed and f.name in existing}
    as_text = {f.name for f in fields if f.logical in BSON_TYPES and BSON_TYPES[f.logical] != "STRING"
               and isinstance(existing.get(f.name), T.StringType)}
    return [replace(f, parse_type=typed[f.name], kinds=JSON_KINDS[typed[f.name]]) if f.name in typed else
            ImageField(f.name, "STRING") if f.name in as_text else f for f in fields]


def fields_from_variant_schema(schema: str | None) -> list[ImageField]:
    """Parse `schema_of_variant_agg` output, e.g. OBJECT<a: BIGINT, b: OBJECT<x: STRING>>."""
    if not schema or not schema.startswith("OBJECT<"):
        return []
    fields = []
    for part in _split_top_level(schema[len("OBJECT<"):-1]):
        name, vtype = _named_type(part)
        fields.append(ImageField(name=name, parse_type=json_type(vtype), untyped=vtype == "VOID", mixed=vtype == "VARIANT"))
    return fields


def infer_fields(images: DataFrame, column: str, bson: str | None = None) -> list[ImageField]:
    """Columns and JSON types of plain-JSON images, merged over every row of the batch; rows flagged in the
    boolean column `bson` are MongoDB documents in extended JSON (`infer_bson_fields`)."""
    if bson is None:
        row = images.select(F.expr(f"schema_of_variant_agg(try_parse_json({column}))").alias("s")).first()
        return fields_from_variant_schema(row["s"] if row else None)
    row = images.select(F.expr(f"schema_of_variant_agg(CASE WHEN NOT {bson} THEN try_parse_json({column}) END)").alias("s"),
                        F.count(F.when(F.col(bson), 1)).alias("documents")).first()
    plain = fields_from_variant_schema(row["s"] if row else None)
    if not row or not row["documents"]:
        return plain
    return merge_fields([plain, infer_bson_fields(images.where(F.col(bson)), column)])


def infer_bson_fields(images: DataFrame, column: str) -> list[ImageField]:
    """Columns and types of MongoDB documents in extended JSON, merged over every row of the batch: a field whose
    values are all one wrapper ($oid, $date, $numberLong ...), or plain numbers with numeric wrappers, gets that
    type; anything else (text, nested documents and arrays, other BSON types, mixed types) is kept as its text."""
    kinds = images.select(F.explode(F.from_json(column, "map<string,variant>")).alias("k", "v")).groupBy("k").agg(
        F.collect_set(F.schema_of_variant("v")).alias("kinds")).collect()
    return [_bson_field(r["k"], {_bson_kind(t) for t in r["kinds"]} - {"VOID"}) for r in sorted(kinds, key=lambda r: r["k"])]


def _bson_kind(variant_type: str) -> str:
    """`$oid` for OBJECT<`$oid`: STRING> (an extended JSON wrapper: one `$` field), else the JSON type kept."""
    if variant_type.startswith("OBJECT<`$"):
        parts = _split_top_level(variant_type[len("OBJECT<"):-1])
        if len(parts) == 1:
            return _named_type(parts[0])[0]
    return "VOID" if variant_type == "VOID" else json_type(variant_type)


def _bson_field(name: str, kinds: set[str]) -> ImageField:
    integers = {"$numberLong", "$numberInt", "BIGINT"}
    doubles = integers | {"$numberDouble", "DOUBLE"}
    logical = (OBJECT_ID if kinds == {"$oid"} else BSON_DATE if kinds == {"$date"} else
               BSON_INT64 if kinds and kinds <= integers else BSON_DOUBLE if kinds and kinds <= doubles else
               BSON_DECIMAL if "$numberDecimal" in kinds and kinds <= doubles | {"$numberDecimal"} else None)
    if logical is None:
        return ImageField(name, "BOOLEAN" if kinds == {"BOOLEAN"} else "STRING", untyped=not kinds)
    return ImageField(name, "STRING", logical=logical)


def merge_fields(field_lists: list[list[ImageField]]) -> list[ImageField]:
    """Union by name in first-seen order; a later schema of the same column wins, unless the earlier one's type is
    wider (`widens`): a batch across a widening DDL holds its values of both types in the wider."""
    merged: dict[str, ImageField] = {}
    for fields in field_lists:
        for f in fields:
            seen = merged.get(f.name)
            if seen is not None and f.undecodable and not seen.undecodable:
                continue  # a schema that decodes nothing (ImageField.undecodable) chooses no type
            if seen is None or seen.undecodable or not widens(parsed_type(f.spark_type), parsed_type(seen.spark_type)):
                merged[f.name] = f
    return list(merged.values())


_DECODES_ALIKE = ("parse_type", "logical", "scale", "precision", "target", "undecodable")
_INTEGER_DDL = ("TINYINT", "SMALLINT", "INT", "BIGINT")


def by_schema(merged: list[ImageField], described: dict[str, list[ImageField]]) -> list[ImageField]:
    """`merged` (merge_fields over the envelope schemas `described`, by their text) with each field the schemas
    decode differently (a DDL between the batch's events) decoded by each event's own schema (`ImageField.by_schema`):
    decoded by one, a Connect decimal's unscaled value takes the wrong scale, a date's days read as a timestamp's
    milliseconds, silently. Its type is one that holds every schema's values (a decimal: the most integer and fraction
    digits), parsed as BIGINT when the schemas' integers differ in size. Fields the schemas parse as different JSON
    types are left as merged: the other schemas' values do not parse and are quarantined, not misread."""
    out = []
    for f in merged:
        own = {hashlib.md5(text.encode()).hexdigest(): g for text, fields in described.items() for g in fields
               if g.name == f.name}
        if len({tuple(getattr(g, a) for a in _DECODES_ALIKE) for g in own.values()}) < 2:
            out.append(f)
            continue
        parse_types = {g.parse_type for g in own.values()}
        if len(parse_types) > 1 and not parse_types <= set(_INTEGER_DDL):
            out.append(f)
            continue
        decimals = [g for g in own.values() if g.logical == DECIMAL_LOGICAL]
        if len(decimals) == len(own):
            sized = [g for g in decimals if not g.undecodable] or decimals  # an undecodable schema's size is none
            scale = max(g.scale for g in sized)
            wide: ImageField | None = replace(f, scale=scale, precision=min(
                38, max(g.precision - g.scale for g in sized) + scale))
        else:  # the schema whose type holds every other's values exactly (a date's in a timestamp), if one does
            typed = [parsed_type(g.spark_type) for g in own.values()]
            wide = next((g for g, held in zip(own.values(), typed, strict=True) if all(
                t == held or widens(t, held) or (isinstance(t, T.DateType) and isinstance(held, T.TimestampType))
                for t in typed)), None)
        if wide is None:
            out.append(f)
            continue
        out.append(replace(wide, parse_type="BIGINT" if len(parse_types) > 1 else wide.parse_type,
                           by_schema=tuple(sorted(own.items()))))
    return out


def parsed_image(image: str, fields: list[ImageField]) -> str:
    """The image's JSON (SQL text) parsed to its fields' physical types (what `decoded_fields` reads), as SQL text."""
    ddl = ", ".join(f"{ident(f.name)} {f.parse_type}" for f in fields)
    options = ", ".join(f"{literal(k)}, {literal(v)}" for k, v in JSON_OPTIONS.items())
    return f"from_json({image}, {literal(ddl)}, map({options}))"


def image_text(image: str) -> str:
    """The image's fields as their JSON text (what `decode_problems` reads: was a value there at all?), as SQL text."""
    return f"from_json({image}, 'map<string,string>')"


def decoded_fields(parsed: str, fields: list[ImageField]) -> dict[str, str]:
    """Each field of a `parsed_image` (SQL text) decoded to its Spark type, as SQL text; null where the value does not
    fit it. A field whose decoding differs between the batch's schemas (`ImageField.by_schema`) is decoded by each
    event's own schema (`_schema`, the envelope's text)."""
    def decoded(f: ImageField) -> str:
        value = f"({parsed}).{ident(f.name)}"
        if not f.by_schema:
            return f.decode(value)
        branches = " ".join(f"WHEN {literal(digest)} THEN try_cast({own.decode(value)} AS {type_sql(f.spark_type)})"
                            for digest, own in f.by_schema)
        return f"CASE md5(_schema) {branches} ELSE {f.decode(value)} END"

    return {f.name: f"try_cast({decoded(f)} AS {type_sql(f.spark_type)})" for f in fields}


@cache
def parsed_type(ddl: str) -> T.DataType:
    """A Spark type from its DDL (parsed by the JVM, one call over py4j: a few types recur in every table)."""
    return T.DataType.fromDDL(ddl)


def type_sql(ddl: str) -> str:
    """A type's DDL as SQL text, parsed by Spark first (a Parquet file's envelope names its columns' types): text that
    is not one type fails here, never reaching a query's text."""
    return sql_type(parsed_type(ddl))


def decode_problems(text: str, decoded: str, fields: list[ImageField], variant: str | None = None) -> str:
    """The fields whose value is present (`text`: `image_text`'s map) but did not decode to the declared type (in the
    struct `decoded`) ('' when none); with `variant` (the image as VARIANT), also a mixed field's values of a JSON type
    its type does not hold exactly (a number read as text would decode). SQL text, of SQL text."""
    def wrong(f: ImageField) -> str:
        unfit = f"{text}[{literal(f.name)}] IS NOT NULL AND ({decoded}).{ident(f.name)} IS NULL"
        if f.kinds and variant is not None:
            kind = field_kind(variant, f.name)
            unfit = f"{unfit} OR ({kind} <> 'VOID' AND NOT {kind} IN ({', '.join(map(literal, f.kinds))}))"
        return unfit

    labels: dict[str, str] = {}
    for f in fields:
        # a schema of the batch that decodes nothing of the field names its own reason for its events' values
        odd = [(digest, g) for digest, g in f.by_schema if g.undecodable]
        for digest, g in odd:
            labels[g.problem] = f"{labels[g.problem]} OR " if g.problem in labels else ""
            labels[g.problem] += f"(md5(_schema) = {literal(digest)} AND ({wrong(f)}))"
        own = f"md5(_schema) NOT IN ({', '.join(literal(d) for d, _ in odd)}) AND ({wrong(f)})" if odd else wrong(f)
        labels[f.problem] = f"{labels[f.problem]} OR ({own})" if f.problem in labels else own
    return labels_where(labels)


def field_kind(image: str, name: str) -> str:
    """The JSON type of the top-level field `name` of `image` (VARIANT, SQL text), as `json_kind`; 'VOID' for a name
    holding both quotes, which no variant path can name (they take no escapes)."""
    path = f'$["{name}"]' if '"' not in name else f"$['{name}']" if "'" not in name else None
    return json_kind(f"try_variant_get({image}, {literal(path)}, 'variant')") if path else "'VOID'"


def parse_image(df: DataFrame, image: str, fields: list[ImageField], alias: str) -> DataFrame:
    """Adds struct column `alias` with every field of the image (SQL text) decoded to its Spark type, and
    `_decode_problems` naming the fields whose value is present but does not fit the declared type ('' when none)."""
    if any(f.in_python for f in fields):
        register_decoders(df.sparkSession)
    # the image is parsed once into a column each way and the fields read from those columns: as Column objects
    # the parses were copied into every field's expression, two per field (a check inside a CASE is not shared)
    mixed = any(f.kinds for f in fields)  # their values' JSON types are read from the image as VARIANT, once
    return (df.withColumn("_image_parsed", sql(parsed_image(image, fields)))
            .withColumn("_image_text", sql(image_text(image)))
            .withColumns({"_image_variant": sql(f"try_parse_json({image})")} if mixed else {})
            .withColumn(alias, sql(named_struct(decoded_fields("_image_parsed", fields))))
            .withColumn("_decode_problems", sql(decode_problems("_image_text", ident(alias), fields,
                                                                "_image_variant" if mixed else None)))
            .drop("_image_parsed", "_image_text", "_image_variant"))


# Delta's type widening (PROTOCOL.md, "Type Widening"): the changes of a column's type that every old value survives
_INTEGRAL_RANK: dict[type[T.DataType], int] = {T.ByteType: 0, T.ShortType: 1, T.IntegerType: 2, T.LongType: 3}
# the integer digits a decimal needs to hold every value of an integer type
_INTEGRAL_DIGITS: dict[type[T.DataType], int] = {T.ByteType: 10, T.ShortType: 10, T.IntegerType: 10, T.LongType: 20}


def widens(old: T.DataType, new: T.DataType) -> bool:
    """Is `old` -> `new` one of Delta's type widenings: byte -> short -> int -> long, float or a smaller integer ->
    double, a decimal with at least as many integer and fraction digits (from a decimal or an integer). Not Delta's date
    -> timestamp without time zone: a timestamp_ntz column needs the timestampNtz table feature, which neither engine
    adds to a table in a merge (the merge failed, every batch of the table after it); its values are quarantined
    naming both types."""
    old_rank, new_rank = _INTEGRAL_RANK.get(type(old)), _INTEGRAL_RANK.get(type(new))
    if old_rank is not None and new_rank is not None:
        return new_rank > old_rank
    if isinstance(new, T.DoubleType):
        return isinstance(old, T.FloatType) or old_rank is not None and old_rank < _INTEGRAL_RANK[T.LongType]
    if isinstance(new, T.DecimalType):
        if isinstance(old, T.DecimalType):
            return (new.precision, new.scale) != (old.precision, old.scale) and \
                new.precision - old.precision >= new.scale - old.scale >= 0
        return old_rank is not None and new.precision - new.scale >= _INTEGRAL_DIGITS[type(old)]
    return False


def widening_to(old: T.DataType, new: T.DataType) -> T.DataType | None:
    """The type a column of `old` widens to (`widens`) to hold the values of `new` too: `new` itself, or for decimals
    (from a decimal or an integer) the decimal with the most integer and fraction digits of the two (DECIMAL(10,2)
    meeting DECIMAL(10,4): DECIMAL(12,4)); None when there is none."""
    if widens(old, new):
        return new
    if isinstance(new, T.DecimalType) and (isinstance(old, T.DecimalType) or type(old) in _INTEGRAL_DIGITS):
        digits, scale = ((old.precision - old.scale, old.scale) if isinstance(old, T.DecimalType)
                         else (_INTEGRAL_DIGITS[type(old)], 0))
        scale = max(scale, new.scale)
        both = T.DecimalType(max(digits, new.precision - new.scale) + scale, scale)
        if both.precision <= 38 and widens(old, both):
            return both
    return None


@dataclass(frozen=True)
class Widening:
    """A silver column whose source type became wider (`widens`): silver takes the new type."""

    column: str
    old: T.DataType
    new: T.DataType

    def __str__(self) -> str:
        return f"{self.column}:{self.old.simpleString()}->{self.new.simpleString()}"


def widened(target: T.StructType | None, row_type: T.StructType) -> tuple[T.StructType | None, tuple[Widening, ...]]:
    """Silver's schema (`target`; None before its first commit) with each column whose values in the batch's typed image
    (`row_type`) need a wider type (`widening_to`) taken at that type, and those changes. Any other difference is left
    to `align`: values that fit are cast, the rest quarantined naming both types."""
    if target is None:
        return None, ()
    batch = {f.name: f.dataType for f in row_type.fields}
    changes = tuple(Widening(f.name, f.dataType, wider) for f in target.fields
                    if f.name in batch and (wider := widening_to(f.dataType, batch[f.name])) is not None)
    new_types = {w.column: w.new for w in changes}
    return T.StructType([T.StructField(f.name, new_types.get(f.name, f.dataType), f.nullable, f.metadata)
                         for f in target.fields]), changes


def claiming(widened: tuple[Widening, ...], fields: list[ImageField]) -> str:
    """SQL text over a typed event (`_schema`): does the event's own schema claim one of the widenings? An event
    described by no schema (plain JSON, typed over its batch) or by the one schema of its batch claims what the batch
    does. A type change comes from the events a batch applies, never from a stale one's claim (silver_plan)."""
    own = {f.name: f for f in fields}
    schemas: set[str] = set()
    for w in widened:
        field = own.get(w.column)
        if field is None or not field.by_schema:
            return "true"
        schemas |= {md5 for md5, g in field.by_schema if widening_to(w.old, parsed_type(g.spark_type)) is not None}
    return f"md5(_schema) IN ({', '.join(map(literal, sorted(schemas)))})" if schemas else "false"


def fields_type(fields: list[ImageField]) -> T.StructType:
    """The typed image's type: each field at its decoded type."""
    return T.StructType([T.StructField(f.name, parsed_type(f.spark_type)) for f in fields])


def align(df: DataFrame, struct_col: str, target: T.StructType | None) -> DataFrame:
    """Cast the image's columns that already exist in the target to the target's types.

    Adds `_type_problems`, naming the columns whose values would not fit ('' when all fit): those rows
    are quarantined, never silently cast (docs/architecture.md, "Types and schema")."""
    if target is None:
        return df.withColumn("_type_problems", sql("''"))
    image_type = df.schema[struct_col].dataType
    assert isinstance(image_type, T.StructType)
    row, problems = aligned_row(ident(struct_col), image_type, target)
    # the check must read the uncast image, so it is materialised before the struct is replaced
    return df.withColumn("_type_problems", sql(problems)).withColumn(struct_col, sql(row))


def aligned_row(row: str, row_type: T.StructType, target: T.StructType) -> tuple[str, str]:
    """`align` as SQL text: the row (SQL text, of `row_type`) with its fields cast to the target's types, and the
    fields whose values would not fit ('' when all fit). A cast loses nothing when its value casts back equal."""
    existing = {f.name: f.dataType for f in target.fields}
    parts, problems = {}, {}
    for f in row_type.fields:
        value = f"({row}).{ident(f.name)}"
        target_type = existing.get(f.name)
        if target_type is None or target_type == f.dataType:
            parts[f.name] = value
            continue
        cast = f"try_cast({value} AS {sql_type(target_type)})"
        lost = f"{value} IS NOT NULL AND ({cast} IS NULL OR try_cast({cast} AS {sql_type(f.dataType)}) <> {value})"
        if isinstance(target_type, T.StringType) and isinstance(f.dataType, (T.NumericType, T.BooleanType)):
            lost = f"{value} IS NOT NULL"  # a number or a boolean is never kept as its text (unless `columns:` says text)
        parts[f.name] = cast
        problems[f"{f.name} ({f.dataType.simpleString()} -> {target_type.simpleString()})"] = lost
    return named_struct(parts), labels_where(problems)
