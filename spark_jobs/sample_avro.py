"""The generator's Avro output, as the S3 sink writes it with AvroFormat and Confluent's AvroConverter: an
object container file per flush, one Debezium envelope record per change event, no tombstones (Avro has
no null record; the sink drops them). Connect's Decimal becomes Avro's decimal logical type; Debezium's
semantic types (io.debezium.time.Date, MicroTimestamp, Enum, ...) stay their physical type, named by
`connect.name`, as the converter leaves them.

Pure Python (fastavro); deterministic."""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any

from spark_jobs.sample_sources import Column, SourceProfile

AVRO_TYPE = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float", "float64": "double",
             "boolean": "boolean", "string": "string", "bytes": "bytes"}
DECIMAL = "org.apache.kafka.connect.data.Decimal"
# the source block's fields per connector, with their Avro types (all optional, as Debezium declares most)
SOURCE_FIELDS = {
    "postgresql": (("version", "string"), ("connector", "string"), ("name", "string"), ("ts_ms", "long"),
                   ("snapshot", "string"), ("db", "string"), ("sequence", "string"), ("schema", "string"),
                   ("table", "string"), ("txId", "long"), ("lsn", "long"), ("xmin", "long")),
    "mysql": (("version", "string"), ("connector", "string"), ("name", "string"), ("ts_ms", "long"),
              ("snapshot", "string"), ("db", "string"), ("sequence", "string"), ("table", "string"),
              ("server_id", "long"), ("gtid", "string"), ("file", "string"), ("pos", "long"), ("row", "int"),
              ("thread", "long"), ("query", "string")),
}


def _column_type(column: Column) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": AVRO_TYPE[column.connect_type], "connect.type": column.connect_type}
    if column.logical == DECIMAL:
        params = column.parameters or {}
        spec.update(logicalType="decimal", scale=int(params["scale"]),
                    precision=int(params.get("connect.decimal.precision", 38)))
    if column.logical:
        spec["connect.name"] = column.logical
    if column.parameters:
        spec["connect.parameters"] = dict(column.parameters)
    return spec


def avro_schema(profile: SourceProfile) -> dict[str, Any]:
    value = {"type": "record", "name": "Value", "namespace": profile.topic,
             "fields": [{"name": c.name, "type": ["null", _column_type(c)], "default": None} for c in profile.columns]}
    source = {"type": "record", "name": "Source", "namespace": f"io.debezium.connector.{profile.connector}",
              "fields": [{"name": n, "type": ["null", t], "default": None} for n, t in SOURCE_FIELDS[profile.connector]]}
    return {"type": "record", "name": "Envelope", "namespace": profile.topic, "connect.name": f"{profile.topic}.Envelope",
            "fields": [{"name": "before", "type": ["null", value], "default": None},
                       {"name": "after", "type": ["null", f"{profile.topic}.Value"], "default": None},
                       {"name": "source", "type": source}, {"name": "op", "type": "string"},
                       {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def _avro_value(column: Column, value: Any) -> Any:
    """The JSON converter's value (what the generator's payloads hold) as the Avro converter writes it."""
    if value is None or column.logical != DECIMAL:
        return value
    unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
    return Decimal(unscaled).scaleb(-int((column.parameters or {})["scale"]))


def _record(profile: SourceProfile, payload: dict[str, Any]) -> dict[str, Any]:
    def image(row: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if row is None else {c.name: _avro_value(c, row.get(c.name)) for c in profile.columns}

    return {"before": image(payload["before"]), "after": image(payload["after"]), "source": payload["source"],
            "op": payload["op"], "ts_ms": payload["ts_ms"]}


def avro_file(profile: SourceProfile, payloads: list[dict[str, Any]], compress: bool) -> bytes:
    """An Avro object container file of the payloads, as the sink's AvroFormat writes one."""
    import io

    import fastavro

    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(avro_schema(profile)), [_record(profile, p) for p in payloads],
                    codec="deflate" if compress else "null")
    return out.getvalue()
