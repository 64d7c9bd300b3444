"""The table registry (include/tables.yaml) and gold model headers, loaded and validated in one place.

Pure Python (yaml + dataclasses): the DAG files read it at parse time.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("auto", "json", "json-flat", "parquet")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TABLE_FIELDS = {"topic", "keys", "format", "sequence_by", "partition_by", "columns", "history", "tombstone_retention"}
# Spark SQL types a column override may name (checked here, without importing pyspark)
_OVERRIDE_TYPE = re.compile(
    r"^(string|boolean|tinyint|smallint|int|bigint|float|double|date|timestamp|timestamp_ntz|binary"
    r"|decimal\(\s*\d{1,2}\s*,\s*\d{1,2}\s*\))$", re.IGNORECASE)
_RETENTION = re.compile(r"^(\d+)\s*(s|m|h|d)$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class ConfigError(ValueError):
    """The registry or a gold model header is invalid; the message names the table and field."""


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


@dataclass(frozen=True)
class GoldModel:
    name: str
    sql: str
    keys: tuple[str, ...]
    sources: tuple[str, ...]
    path: Path


@dataclass(frozen=True)
class Registry:
    tables: dict[str, TableConfig]
    gold: dict[str, GoldModel]

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
    return tuple(value)


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


def _retention(value: Any, table: str) -> int | None:
    """`forever` (the default) or a duration such as 30d, 12h, 90m, 3600s."""
    if value == "forever":
        return None
    match = _RETENTION.match(str(value).strip())
    if not match:
        raise ConfigError(f"table {table!r}: field 'tombstone_retention' must be 'forever' or a duration like "
                          f"30d, 12h, 90m, 3600s; got {value!r}")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def parse_table(name: str, spec: Any) -> TableConfig:
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
    fmt = spec.get("format", "auto")
    if fmt not in FORMATS:
        raise ConfigError(f"table {name!r}: field 'format' must be one of {', '.join(FORMATS)}, got {fmt!r}")
    seq = spec.get("sequence_by", "auto")
    sequence_by = None if seq == "auto" else _names(seq, name, "sequence_by", required=True)
    return TableConfig(
        columns=_column_types(spec.get("columns", {}), name),
        history=_flag(spec.get("history", False), name, "history"),
        tombstone_retention_s=_retention(spec.get("tombstone_retention", "forever"), name),
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
    return GoldModel(name=name, sql=sql, keys=header["keys"], sources=header["sources"], path=path)


def load_registry(config_path: str | os.PathLike[str], gold_dir: str | os.PathLike[str] | None = None) -> Registry:
    """Load tables.yaml; gold models default to the `gold/` folder beside it."""
    path = resolve(config_path)
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"table registry not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"table registry {path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tables"), dict) or not doc["tables"]:
        raise ConfigError(f"table registry {path}: expected a non-empty 'tables:' mapping")
    extra = sorted(set(doc) - {"tables"})
    if extra:
        raise ConfigError(f"table registry {path}: unknown top-level field(s) {', '.join(extra)}")
    tables = {name: parse_table(name, spec) for name, spec in doc["tables"].items()}
    gold_path = Path(gold_dir) if gold_dir else path.parent / "gold"
    models = [parse_gold_model(p, tables) for p in sorted(gold_path.glob("*.sql"))] if gold_path.is_dir() else []
    return Registry(tables=tables, gold={m.name: m for m in models})


def resolve(path: str | os.PathLike[str]) -> Path:
    """Relative paths are relative to the project root (DESIGN 3.4), not to the caller's cwd."""
    p = Path(path)
    return p if p.is_absolute() else PROJECT_ROOT / p


def resolve_uri(uri: str) -> str:
    """Local paths become absolute (project-root relative); s3:// URIs pass through."""
    return uri if "://" in uri else str(resolve(uri))


def env_settings() -> dict[str, str]:
    """The CDC_* environment (DESIGN 3.4) with its defaults."""
    return {
        "config": os.environ.get("CDC_CONFIG", "include/tables.yaml"),
        "landing": os.environ.get("CDC_LANDING_URI", "data/landing"),
        "lake": os.environ.get("CDC_LAKE_URI", "data/lake"),
        # how long a run's sensors wait for new landing files before skipping the table (seconds)
        "sensor_timeout": os.environ.get("CDC_SENSOR_TIMEOUT", "600"),
        "sensor_poke_interval": os.environ.get("CDC_SENSOR_POKE_INTERVAL", "60"),
    }
