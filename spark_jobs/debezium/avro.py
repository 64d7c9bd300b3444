"""Avro landing files: the S3 sink's AvroFormat, one Debezium envelope per record (docs/architecture.md,
"Landing formats").

Spark reads the records (spark-avro); this module reads what Spark does not expose: each file's writer
schema and record count from its header and block headers (fastavro), and turns the schema into the
typed envelope bronze keeps beside each record. With Confluent's AvroConverter a column's logical type is
either an Avro logical type (decimal, date, timestamp-millis/micros), which spark-avro decodes itself, or
only a Connect/Debezium name (`connect.name`: io.debezium.time.MicroTimestamp on a long, ...), which the
same decoders as JSON's schema envelope decode (spark_jobs/debezium/types.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from spark_jobs.debezium.types import DECIMAL_LOGICAL, TEXT_LOGICAL, TIME_OF_DAY, VARIABLE_DECIMAL, json_safe_type

# Avro logical types spark-avro turns into Spark types (the value is then carried as that type)
SPARK_DECODED = ("decimal", "date", "timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                 "local-timestamp-micros")
# Connect physical types of Avro primitives, for columns decoded by their Connect/Debezium name
CONNECT_TYPE = {"int": "int32", "long": "int64", "float": "float32", "double": "float64", "boolean": "boolean",
                "string": "string", "bytes": "bytes"}
NAMED = {"io.debezium.time.Date", "org.apache.kafka.connect.data.Date", "io.debezium.time.Timestamp",
         "org.apache.kafka.connect.data.Timestamp", "io.debezium.time.MicroTimestamp", "io.debezium.time.NanoTimestamp",
         "io.debezium.time.ZonedTimestamp", DECIMAL_LOGICAL, VARIABLE_DECIMAL, *TIME_OF_DAY, *TEXT_LOGICAL}


@dataclass(frozen=True)
class AvroFile:
    schema: str  # the writer schema, as JSON
    records: int


def read_header(path: str) -> AvroFile | None:
    """The file's writer schema and record count (block headers only, no record decoded); None when it is
    not a whole Avro object container file."""
    import fastavro

    from spark_jobs.storage import open_input

    try:
        with open_input(path) as f:
            reader = fastavro.block_reader(f)
            return AvroFile(json.dumps(reader.writer_schema, sort_keys=True), sum(b.num_records for b in reader))
    except (ValueError, EOFError, OSError, TypeError, KeyError) as exc:  # fastavro's errors for bad bytes
        if isinstance(exc, FileNotFoundError):
            raise
        return None


def _non_null(avro_type: Any) -> Any:
    if isinstance(avro_type, list):
        rest = [t for t in avro_type if t != "null"]
        return rest[0] if len(rest) == 1 else avro_type
    return avro_type


def image_record(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The row image's Avro record: `after`'s (else `before`'s) of an envelope, else the record itself
    (a flattened record)."""
    fields = {f["name"]: _non_null(f["type"]) for f in schema.get("fields", [])}
    for name in ("after", "before"):
        if isinstance(fields.get(name), dict) and fields[name].get("type") == "record":
            return fields[name]
    return schema if schema.get("type") == "record" else None


def typed_envelope(schema_json: str, image: T.StructType) -> str:
    """The schema envelope bronze keeps for records of this writer schema (`_schema`): a column decoded by
    Spark keeps its Spark type; a column known only by its Connect/Debezium name is decoded by that name."""
    record = image_record(json.loads(schema_json)) or {"fields": []}
    avro_fields = {f["name"]: _non_null(f["type"]) for f in record["fields"]}
    fields = []
    for spark_field in image.fields:
        avro_type = avro_fields.get(spark_field.name)
        spec = avro_type if isinstance(avro_type, dict) else {"type": avro_type}
        name = spec.get("connect.name")
        if name in NAMED and spec.get("logicalType") not in SPARK_DECODED:
            connect_type = "struct" if spec.get("type") == "record" else CONNECT_TYPE.get(str(spec.get("type")), "string")
            fields.append({"field": spark_field.name, "type": connect_type, "name": name,
                           "parameters": spec.get("connect.parameters") or {}})
        else:
            fields.append({"field": spark_field.name, "spark_type": json_safe_type(spark_field.dataType)})
    return json.dumps({"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": fields}]})
