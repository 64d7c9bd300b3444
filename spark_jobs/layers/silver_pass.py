"""Silver's Spark work over many small tables' new bronze rows in one pass (work in progress, not wired in): one
plan types every table's events, each by its own fields, where a plan per table costs a small table most of its
silver step (tests/benchmarks/RESULTS.md, workload D).

Each table's typing is one branch of a CASE over `_table`, its typed row carried as a VARIANT so that every table's
rows share one column. A branch is built once per table shape and kept: building its columns over py4j costs more
than Spark's analysis of the whole plan (about 65 ms a table against 5 ms)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.debezium import envelope, types
from spark_jobs.layers.silver_plan import MISSING_TRANSACTION, missing_sequence, outside_transactions
from spark_jobs.registry import TableConfig


@dataclass(frozen=True)
class TableTyping:
    """How the pass types one table's events: the fields of its batch's images, aligned to silver's schema."""

    table: TableConfig
    fields: tuple[types.ImageField, ...]
    target: str | None  # silver's schema as JSON (hashable); None before its first commit

    @property
    def decoded_type(self) -> T.StructType:
        """The image's type as decoded, before alignment."""
        return T.StructType([T.StructField(f.name, T.DataType.fromDDL(f.spark_type)) for f in self.fields])

    @property
    def row_type(self) -> T.StructType:
        """The typed image's type, aligned (what `_row` holds once cast back from VARIANT)."""
        target = self.target_schema
        if target is None:
            return self.decoded_type
        existing = {f.name: f.dataType for f in target.fields}
        return T.StructType([T.StructField(f.name, existing.get(f.name, f.dataType)) for f in self.decoded_type.fields])

    @property
    def target_schema(self) -> T.StructType | None:
        return None if self.target is None else T.StructType.fromJson(json.loads(self.target))


@dataclass(frozen=True)
class Branch:
    """One table's typing, as columns over the shared scan's events."""

    row: Column  # the typed, aligned image as VARIANT
    key: Column  # the typed key as JSON text: one text per key value, whatever its events' encodings
    reason: Column  # why the event is quarantined, else null


@cache
def branch(typing: TableTyping) -> Branch:
    """The table's typing as `types.parse_image`, `types.align` and `silver_plan.typed_changes` do it, in columns."""
    table, fields = typing.table, list(typing.fields)
    image = envelope.key_image()
    decoded = types.decoded_fields(types.parsed_image(image, fields), fields)
    decode_problems = types.decode_problems(types.image_text(image), decoded, fields)
    row = F.struct(*[c.alias(n) for n, c in decoded.items()])
    target = typing.target_schema
    type_problems: Column = F.lit("")
    if target is not None:
        row, type_problems = types.aligned_row(row, typing.decoded_type, target)
    key = [row[k] for k in table.keys]
    missing = F.concat_ws(",", *[F.when(value.isNull(), F.lit(k)) for k, value in zip(table.keys, key, strict=True)])
    reason = (F.when(F.col("_seq").isNull(), missing_sequence(table))
              .when(decode_problems != "", F.concat(F.lit("incompatible_type: "), decode_problems))
              .when(type_problems != "", F.concat(F.lit("incompatible_type: "), type_problems))
              .when(missing != "", F.concat(F.lit("missing_key: "), missing))
              .when(outside_transactions(table), MISSING_TRANSACTION))
    return Branch(F.to_variant_object(row), F.to_json(F.struct(*[v.alias(k) for k, v in zip(table.keys, key, strict=True)])),
                  reason)


def typed_events(events: DataFrame, typings: list[TableTyping]) -> DataFrame:
    """The row events of many tables (`_table`, `_seq`, op <> 't') with `_row` (VARIANT), `_key` and `reason`."""
    def case(part: str) -> Column:
        whens = [(F.col("_table") == t.table.name, getattr(branch(t), part)) for t in typings]
        return reduce(lambda acc, w: acc.when(*w), whens[1:], F.when(*whens[0]))
    return events.withColumns({"_row": case("row"), "_key": case("key"), "reason": case("reason")})
