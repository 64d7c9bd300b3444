"""The table registry (include/tables.yaml) and gold model headers, loaded and validated in one place.

Pure Python (yaml + dataclasses): the DAG files read it at parse time.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from spark_jobs.errors import ConfigError
from spark_jobs.quality.config import parse_expectations, parse_quality
from spark_jobs.quality.expectations import Quality, UserExpectation
from spark_jobs.settings import resolve

FORMATS = ("auto", "json", "json-flat", "parquet", "avro")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Kafka's own rule for a topic's name; the landing folder is named after it, so nothing else may pass
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TABLE_FIELDS = {"topic", "keys", "format", "sequence_by", "partition_by", "columns", "history", "tombstone_retention",
                 "quality", "unavailable_value_placeholder", "expectations", "maintenance", "freshness", "record_keys",
                 "transactions", "data_collection"}
# what Debezium's PostgreSQL connector sends for an unchanged TOASTed column (unavailable.value.placeholder)
UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
# Spark SQL types a column override may name (checked here, without importing pyspark)
_OVERRIDE_TYPE = re.compile(
    r"^(string|boolean|tinyint|smallint|int|bigint|float|double|date|timestamp|timestamp_ntz|binary"
    r"|decimal\(\s*\d{1,2}\s*,\s*\d{1,2}\s*\))$", re.IGNORECASE)
_RETENTION = re.compile(r"^(\d+)\s*(s|m|h|d)$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Reference:
    """Gold referential check: the model's `columns` must exist as `to` columns of a silver table."""

    columns: tuple[str, ...]
    table: str
    to: tuple[str, ...]

    def label(self) -> str:
        return f"{','.join(self.columns)} -> {self.table}.{','.join(self.to)}"


# a run may read a table's snapshot for up to its task's execution_timeout (an hour, cdc_airflow.wiring): VACUUM
# never removes files a version younger than this still needs
MIN_RETAIN_VERSIONS_S = 3600


@dataclass(frozen=True)
class Maintenance:
    """What `maintain` does to a table's Delta tables (bronze, silver, its state, quarantine) or a gold model's
    (tables.yaml `maintenance:`, top level and per table or model; docs/operations.md, "Operating for months")."""

    target_file_mb: int = 128  # compaction writes files of about this size
    min_small_files: int = 8  # compact when a table holds at least this many files under the target size
    cluster_by_key: bool = True  # silver and gold compact by Z-order on their keys: a merge reads fewer files
    retain_versions_s: int = 7 * 86400  # time travel window: VACUUM keeps every file a version this young needs
    report_retention_s: int = 90 * 86400  # run reports, GX validation results and their Data Docs pages


_MAINTENANCE_FIELDS = {"target_file_mb", "min_small_files", "cluster_by_key", "retain_versions", "report_retention"}


def parse_maintenance(spec: Any, where: str, base: Maintenance = Maintenance()) -> Maintenance:
    """`maintenance: {target_file_mb: 128, min_small_files: 8, cluster_by_key: true, retain_versions: 7d,
    report_retention: 90d}` over `base` (the top-level block's)."""
    if spec is None:
        return base
    if not isinstance(spec, dict) or set(spec) - _MAINTENANCE_FIELDS:
        raise ConfigError(f"{where}: field 'maintenance' takes {', '.join(sorted(_MAINTENANCE_FIELDS))}, got {spec!r}")
    for field in ("target_file_mb", "min_small_files"):
        if field in spec and (not isinstance(spec[field], int) or isinstance(spec[field], bool) or spec[field] < 1):
            raise ConfigError(f"{where}: 'maintenance.{field}' must be a whole number of at least 1, got {spec[field]!r}")
    retain = _duration(spec["retain_versions"], where, "maintenance.retain_versions") if "retain_versions" in spec \
        else base.retain_versions_s
    if retain < MIN_RETAIN_VERSIONS_S:
        raise ConfigError(f"{where}: 'maintenance.retain_versions' must be at least 1h: a run may read a snapshot "
                          f"for up to an hour, and VACUUM would remove its files; got {spec['retain_versions']!r}")
    cluster = spec.get("cluster_by_key", base.cluster_by_key)
    if not isinstance(cluster, bool):
        raise ConfigError(f"{where}: 'maintenance.cluster_by_key' must be true or false, got {cluster!r}")
    return Maintenance(
        target_file_mb=spec.get("target_file_mb", base.target_file_mb),
        min_small_files=spec.get("min_small_files", base.min_small_files),
        cluster_by_key=cluster,
        retain_versions_s=retain,
        report_retention_s=_duration(spec["report_retention"], where, "maintenance.report_retention")
        if "report_retention" in spec else base.report_retention_s)


@dataclass(frozen=True)
class TableConfig:
    name: str
    topic: str
    keys: tuple[str, ...]
    format: str = "auto"
    sequence_by: tuple[str, ...] | None = None  # None = connector-aware ("auto")
    partition_by: tuple[str, ...] = ()
    # type overrides for events without the schema envelope: column -> Spark SQL type
    columns: tuple[tuple[str, str], ...] = ()
    history: bool = False  # keep silver/<table>_history (SCD type 2)
    tombstone_retention_s: int | None = None  # None = keep tombstones forever
    quality: Quality = Quality()
    unavailable_value_placeholder: str = UNAVAILABLE_PLACEHOLDER
    expectations: tuple[UserExpectation, ...] = ()  # the user's own, on silver's typed rows or bronze's events
    maintenance: Maintenance = Maintenance()
    freshness_s: int | None = None  # silver's newest source change at most this old (cdc_freshness); None: unwatched
    # the S3 sink stores each record's Kafka key beside it (store.kafka.keys=true, JSON key files): a landing file
    # is taken with its key file, whose keys fill in a delete's missing key columns (a MongoDB delete has no image)
    record_keys: bool = False
    # the connector's transaction topic (provide.transaction.metadata=true): gold models over several tables of it
    # read them at one transaction watermark (layers/transactions.py); history is kept, which that reads
    transactions: str | None = None
    # how the transaction topic's END events name this table; None: a dotted tail of the topic (`<schema>.<table>`)
    data_collection: str | None = None

    def data_collections(self) -> tuple[str, ...]:
        """The names the transaction topic's END events may give this table: `data_collection`, or the topic and its
        dotted tails of two parts or more (`server.inventory.orders`: that, and `inventory.orders`)."""
        if self.data_collection:
            return (self.data_collection,)
        parts = self.topic.split(".")
        return tuple(".".join(parts[i:]) for i in range(max(len(parts) - 1, 1)))

    def layer_expectations(self, layer: str) -> tuple[UserExpectation, ...]:
        return tuple(e for e in self.expectations if e.layer == layer)


@dataclass(frozen=True)
class GoldModel:
    name: str
    sql: str
    keys: tuple[str, ...]
    sources: tuple[str, ...]
    path: Path
    quality: Quality = Quality()
    row_count: tuple[int, int | None] = (1, None)  # (min, max); max None = unbounded
    freshness_s: int | None = None  # newest source change at most this old; None = not checked
    references: tuple[Reference, ...] = ()
    expectations: tuple[UserExpectation, ...] = ()  # the user's own, on the model's rows
    maintenance: Maintenance = Maintenance()
    # the transaction topic its sources share, and those sources: read at one transaction watermark
    # (layers/transactions.py); the others as silver stands
    transactions: str | None = None
    at_watermark: tuple[TableConfig, ...] = ()


@dataclass(frozen=True)
class Registry:
    tables: dict[str, TableConfig]
    gold: dict[str, GoldModel]
    maintenance: Maintenance = Maintenance()  # the top-level block's: what the lake-wide steps (reports) use

    def select(self, names: list[str] | None) -> list[TableConfig]:
        if not names:
            return list(self.tables.values())
        unknown = [n for n in names if n not in self.tables]
        if unknown:
            raise ConfigError(f"unknown table(s) {', '.join(unknown)}; known: {', '.join(self.tables)}")
        return [self.tables[n] for n in names]

    def models_reading(self, tables: list[str]) -> list[GoldModel]:
        return [m for m in self.gold.values() if set(m.sources) & set(tables)]


def _names(value: Any, table: str, field: str, *, required: bool) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or (required and not value) or not all(
        isinstance(v, str) and _NAME.match(v) for v in value
    ):
        need = "a non-empty list" if required else "a list"
        raise ConfigError(f"table {table!r}: field {field!r} must be {need} of column names, got {value!r}")
    return _distinct(tuple(value), table, field)


def _distinct(names: tuple[str, ...], table: str, field: str) -> tuple[str, ...]:
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"table {table!r}: field {field!r} names {', '.join(twice)} more than once")
    return names


def _sequence_by(value: Any, table: str) -> tuple[str, ...]:
    """Row columns, or `source.<field>` for a field of the event's source block."""
    parts = [value] if isinstance(value, str) else value
    if not isinstance(parts, list) or not parts or not all(
            isinstance(v, str) and _NAME.match(v.removeprefix("source.")) for v in parts):
        raise ConfigError(f"table {table!r}: field 'sequence_by' must be 'auto' or a non-empty list of column names "
                          f"or source.<field> names, got {value!r}")
    return _distinct(tuple(parts), table, "sequence_by")


def _placeholder(value: Any, table: str) -> str:
    if not isinstance(value, str) or not value or '"' in value or "\\" in value:
        raise ConfigError(f"table {table!r}: field 'unavailable_value_placeholder' must be the connector's "
                          f"unavailable.value.placeholder text (no quotes or backslashes), got {value!r}")
    return value


def _column_types(value: Any, table: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and _NAME.match(k) for k in value):
        raise ConfigError(f"table {table!r}: field 'columns' must map column names to types, got {value!r}")
    bad = [f"{k}: {v!r}" for k, v in value.items() if not (isinstance(v, str) and _OVERRIDE_TYPE.match(v.strip()))]
    if bad:
        raise ConfigError(f"table {table!r}: field 'columns' has unsupported type(s) {', '.join(bad)}; use string, "
                          "boolean, tinyint, smallint, int, bigint, float, double, decimal(p,s), date, timestamp, "
                          "timestamp_ntz or binary")
    return tuple((k, v.strip().lower()) for k, v in value.items())


def _flag(value: Any, table: str, field: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"table {table!r}: field {field!r} must be true or false, got {value!r}")
    return value


def _duration(value: Any, where: str, field: str, alternative: str = "") -> int:
    match = _RETENTION.match(str(value).strip())
    if not match:
        raise ConfigError(f"{where}: field {field!r} must be {alternative}a duration like 30d, 12h, 90m, 3600s; "
                          f"got {value!r}")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def _retention(value: Any, table: str) -> int | None:
    """`forever` (the default) or a duration such as 30d, 12h, 90m, 3600s."""
    return None if value == "forever" else _duration(value, f"table {table!r}", "tombstone_retention", "'forever' or ")


def parse_table(name: str, spec: Any, defaults: Quality = Quality(), upkeep: Maintenance = Maintenance()) -> TableConfig:
    if not _NAME.match(name):
        raise ConfigError(f"table {name!r}: name must be a valid identifier")
    if not isinstance(spec, dict):
        raise ConfigError(f"table {name!r}: expected a mapping, got {type(spec).__name__}")
    unknown = sorted(set(spec) - _TABLE_FIELDS)
    if unknown:
        raise ConfigError(f"table {name!r}: unknown field(s) {', '.join(unknown)}")
    topic = spec.get("topic")
    if not isinstance(topic, str) or not topic:
        raise ConfigError(f"table {name!r}: field 'topic' is required")
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise ConfigError(f"table {name!r}: field 'topic' must be a Kafka topic name (letters, digits, '.', '_' and "
                          f"'-', at most 249), got {topic!r}")
    fmt = spec.get("format", "auto")
    if fmt not in FORMATS:
        raise ConfigError(f"table {name!r}: field 'format' must be one of {', '.join(FORMATS)}, got {fmt!r}")
    seq = spec.get("sequence_by", "auto")
    sequence_by = None if seq == "auto" else _sequence_by(seq, name)
    transactions, data_collection = spec.get("transactions"), spec.get("data_collection")
    if transactions is not None and (not isinstance(transactions, str) or not _TOPIC.match(transactions)
                                     or transactions in (".", "..")):
        raise ConfigError(f"table {name!r}: field 'transactions' must be the connector's transaction topic (a Kafka "
                          f"topic name), got {transactions!r}")
    if data_collection is not None and (transactions is None or not isinstance(data_collection, str) or not data_collection):
        raise ConfigError(f"table {name!r}: field 'data_collection' names the table as its transaction topic's END "
                          f"events do, and takes 'transactions'; got {data_collection!r}")
    history = _flag(spec.get("history", transactions is not None), name, "history")
    if transactions is not None and not history:
        raise ConfigError(f"table {name!r}: 'transactions' needs its history (gold reads the table as of a transaction "
                          "from it); remove 'history: false'")
    return TableConfig(
        columns=_column_types(spec.get("columns", {}), name),
        history=history,
        transactions=transactions,
        data_collection=data_collection,
        record_keys=_flag(spec.get("record_keys", False), name, "record_keys"),
        tombstone_retention_s=_retention(spec.get("tombstone_retention", "forever"), name),
        quality=parse_quality(spec.get("quality"), f"table {name!r}", ("bronze", "silver"), defaults),
        expectations=parse_expectations(spec.get("expectations"), f"table {name!r}", ("silver", "bronze")),
        maintenance=parse_maintenance(spec.get("maintenance"), f"table {name!r}", upkeep),
        freshness_s=None if spec.get("freshness") is None else _duration(spec["freshness"], f"table {name!r}", "freshness"),
        unavailable_value_placeholder=_placeholder(spec.get("unavailable_value_placeholder", UNAVAILABLE_PLACEHOLDER), name),
        name=name,
        topic=topic,
        keys=_names(spec.get("keys"), name, "keys", required=True),
        format=fmt,
        sequence_by=sequence_by,
        partition_by=_names(spec.get("partition_by", []), name, "partition_by", required=False),
    )


_HEADER = re.compile(r"^--\s*(keys|sources)\s*:\s*(.*)$", re.IGNORECASE)


def parse_gold_model(path: Path, tables: dict[str, TableConfig]) -> GoldModel:
    """A gold model is `include/gold/<name>.sql` with `-- keys: a, b` and `-- sources: t1, t2` headers."""
    sql = path.read_text()
    header: dict[str, tuple[str, ...]] = {}
    for line in sql.splitlines():
        match = _HEADER.match(line.strip())
        if match:
            header[match.group(1).lower()] = tuple(v.strip() for v in match.group(2).split(",") if v.strip())
    name = path.stem
    for field in ("keys", "sources"):
        if not header.get(field):
            raise ConfigError(f"gold model {name!r}: missing '-- {field}: ...' header in {path}")
    missing = [s for s in header["sources"] if s not in tables]
    if missing:
        raise ConfigError(f"gold model {name!r}: sources not in the registry: {', '.join(missing)}")
    topics = sorted({t for t in (tables[s].transactions for s in header["sources"]) if t})
    if len(topics) > 1:
        raise ConfigError(f"gold model {name!r}: its sources publish transactions on different topics "
                          f"({', '.join(topics)}); one watermark can only order one connector's transactions")
    return GoldModel(name=name, sql=sql, keys=header["keys"], sources=header["sources"], path=path,
                     transactions=topics[0] if topics else None,
                     at_watermark=tuple(tables[s] for s in header["sources"] if tables[s].transactions))


def load_registry(config_path: str | os.PathLike[str], gold_dir: str | os.PathLike[str] | None = None) -> Registry:
    """Load tables.yaml; gold models default to the `gold/` folder beside it."""
    path = resolve(config_path)
    try:
        # libyaml's loader where PyYAML has it: the pure-Python one took about 0.3 s a DAG file at 500 tables
        doc = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except FileNotFoundError:
        raise ConfigError(f"table registry not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"table registry {path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tables"), dict) or not doc["tables"]:
        raise ConfigError(f"table registry {path}: expected a non-empty 'tables:' mapping")
    extra = sorted(set(doc) - {"tables", "quality", "gold", "maintenance"})
    if extra:
        raise ConfigError(f"table registry {path}: unknown top-level field(s) {', '.join(extra)}")
    defaults = parse_quality(doc.get("quality"), "top-level quality", ("bronze", "silver", "gold"))
    upkeep = parse_maintenance(doc.get("maintenance"), "top-level maintenance")
    tables = {name: parse_table(name, spec, defaults, upkeep) for name, spec in doc["tables"].items()}
    gold_path = Path(gold_dir) if gold_dir else path.parent / "gold"
    models = [parse_gold_model(p, tables) for p in sorted(gold_path.glob("*.sql"))] if gold_path.is_dir() else []
    gold_specs = doc.get("gold") or {}
    if not isinstance(gold_specs, dict):
        raise ConfigError(f"table registry {path}: 'gold:' must map model names to their checks")
    unknown = sorted(set(gold_specs) - {m.name for m in models})
    if unknown:
        raise ConfigError(f"table registry {path}: 'gold:' names unknown model(s) {', '.join(unknown)}; "
                          f"known: {', '.join(m.name for m in models)}")
    models = [parse_gold_settings(m, gold_specs.get(m.name), tables, defaults, upkeep) for m in models]
    return Registry(tables=tables, gold={m.name: m for m in models}, maintenance=upkeep)


_GOLD_FIELDS = {"quality", "row_count", "freshness", "references", "expectations", "maintenance"}


def parse_gold_settings(model: GoldModel, spec: Any, tables: dict[str, TableConfig], defaults: Quality,
                        upkeep: Maintenance = Maintenance()) -> GoldModel:
    """A model's entry under `gold:` in tables.yaml: row count bounds, freshness, references, actions."""
    where = f"gold model {model.name!r}"
    spec = spec or {}
    if not isinstance(spec, dict) or set(spec) - _GOLD_FIELDS:
        raise ConfigError(f"{where}: takes {', '.join(sorted(_GOLD_FIELDS))}, got {spec!r}")
    bounds = spec.get("row_count", {"min": 1})
    if not isinstance(bounds, dict) or set(bounds) - {"min", "max"} or not all(
            isinstance(v, int) and v >= 0 for v in bounds.values()):
        raise ConfigError(f"{where}: field 'row_count' must be {{min: n, max: n}} with counts, got {bounds!r}")
    references = []
    for ref in spec.get("references") or []:
        if not isinstance(ref, dict) or set(ref) != {"columns", "table", "to"} or ref["table"] not in tables:
            raise ConfigError(f"{where}: each reference is {{columns: [..], table: <silver table>, to: [..]}} "
                              f"naming a registry table, got {ref!r}")
        cols, to = _names(ref["columns"], model.name, "references.columns", required=True), \
            _names(ref["to"], model.name, "references.to", required=True)
        if len(cols) != len(to):
            raise ConfigError(f"{where}: reference {ref!r} pairs {len(cols)} column(s) with {len(to)}")
        references.append(Reference(cols, ref["table"], to))
    freshness = spec.get("freshness")
    return replace(model, quality=parse_quality(spec.get("quality"), where, ("gold",), defaults),
                   row_count=(bounds.get("min", 0), bounds.get("max")),
                   freshness_s=None if freshness is None else _duration(freshness, where, "freshness"),
                   references=tuple(references), expectations=parse_expectations(spec.get("expectations"), where,
                                                                                 ("gold",)),
                   maintenance=parse_maintenance(spec.get("maintenance"), where, upkeep))
