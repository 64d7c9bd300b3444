"""Where every table stands (`python -m spark_jobs status [--json]`): per source table its pending landing files,
per layer its rows, last gate verdict and last success, and its lag now; per gold model the same. Read from the
Delta logs, each layer's newest summaries (`reports/latest/`, written as runs publish) and a listing of the
landing: its cost follows the number of tables, not the lake's history, and it starts no Spark."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from spark_jobs.lake import Lake, row_count
from spark_jobs.registry import Registry


@dataclass
class LayerStatus:
    rows: int | None = None  # None: the table does not exist yet
    last_verdict: str | None = None  # the newest run's gate verdict (passed, passed-with-warnings, failed, error)
    last_run: str | None = None
    last_success: str | None = None  # when the newest run that passed its gate published (ISO 8601, UTC)
    lag_s: float | None = None  # now minus the newest source change the layer holds, as of its last success


@dataclass
class TableStatus:
    name: str
    kind: str  # table | gold
    pending_files: int | None = None  # landing files bronze has not taken (None: landing not listed)
    layers: dict[str, LayerStatus] = field(default_factory=dict)
    quarantined_rows: int | None = None


@dataclass
class LakeStatus:
    lake: str
    at: str
    tables: list[TableStatus]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def layer_status(lake: Lake, name: str, layer: str, now: dt.datetime | None = None) -> LayerStatus:
    """One table's (or gold model's) layer: rows, newest verdict and run, last success, and its lag now."""
    now = now or dt.datetime.now(dt.UTC)
    path = {"bronze": lake.bronze, "silver": lake.silver, "gold": lake.gold}[layer](name)
    status = LayerStatus(rows=row_count(path))
    last, good = (_read(lake, lake.latest_summary(name, layer, passed)) for passed in (False, True))
    if last:
        status.last_verdict, status.last_run = str(last.get("gate")), last.get("run_id")
    if good:
        status.last_success = good.get("published_at")
        if good.get("lag_s") is not None and status.last_success:
            since = (now - dt.datetime.fromisoformat(status.last_success)).total_seconds()
            status.lag_s = round(float(good["lag_s"]) + since, 3)
    return status


def lake_status(registry: Registry, lake: Lake, landing: str | None, now: dt.datetime | None = None) -> LakeStatus:
    """Every table's and gold model's status; `landing` None leaves pending files uncounted."""
    now = now or dt.datetime.now(dt.UTC)
    tables = []
    for table in registry.tables.values():
        item = TableStatus(table.name, "table", quarantined_rows=row_count(lake.quarantine(table.name)))
        if landing is not None:
            from spark_jobs.state import pending_files

            item.pending_files = len(pending_files(landing, lake, table.name, table.topic))
        item.layers = {layer: layer_status(lake, table.name, layer, now) for layer in ("bronze", "silver")}
        tables.append(item)
    for model in registry.gold.values():
        tables.append(TableStatus(model.name, "gold", quarantined_rows=row_count(lake.quarantine(model.name)),
                                  layers={"gold": layer_status(lake, model.name, "gold", now)}))
    return LakeStatus(lake=lake.root, at=now.isoformat(), tables=tables)


def _read(lake: Lake, path: str) -> dict[str, Any] | None:
    data = lake.files.read(path)
    return None if data is None else dict(json.loads(data))
