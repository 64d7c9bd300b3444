"""Where every table stands (`python -m spark_jobs status [--json]`): per source table its pending landing files,
per layer its rows, last gate verdict and last success, and its lag now; per gold model the same. Read from the
Delta logs, the event log (two queries for the whole lake) and a listing of the landing; it starts no Spark."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any

from spark_jobs.delta.reads import row_count
from spark_jobs.event_log import Standing, standings
from spark_jobs.lake import Lake
from spark_jobs.registry import Registry

EMPTY = Standing(None, None, None)  # a layer with no step in the event log


@dataclass
class LayerStatus:
    rows: int | None = None  # None: the table does not exist yet
    last_verdict: str | None = None  # the newest run's gate verdict (passed, passed-with-warnings, failed, error)
    last_run: str | None = None
    last_success: str | None = None  # when the newest run that passed its gate published (ISO 8601, UTC)
    lag_s: float | None = None  # now minus the newest source change the layer holds, as of its last success
    newest_change_at: str | None = None  # that change's source commit time (ISO 8601, UTC): what the lag is measured from


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


def layer_status(lake: Lake, name: str, layer: str, now: dt.datetime | None = None,
                 standing: Standing | None = None) -> LayerStatus:
    """One table's (or gold model's) layer: rows, newest verdict and run, last success, and its lag now (the age
    of the newest source change a passed step held). `standing`: the event log's, read by the caller already."""
    now = now or dt.datetime.now(dt.UTC)
    path = {"bronze": lake.bronze, "silver": lake.silver, "gold": lake.gold}[layer](name)
    status = LayerStatus(rows=row_count(path))
    if standing is None:
        standing = standings(lake, name).get((name, layer))
    if standing is None:
        return status
    if standing.last is not None:
        status.last_verdict, status.last_run = standing.last.verdict, standing.last.run_id
    if standing.last_passed is not None:
        status.last_success = standing.last_passed.published_at.isoformat()
    if standing.newest_change_at is not None:
        status.lag_s = round((now - standing.newest_change_at).total_seconds(), 3)
        status.newest_change_at = standing.newest_change_at.isoformat()
    return status


def lake_status(registry: Registry, lake: Lake, landing: str | None, now: dt.datetime | None = None) -> LakeStatus:
    """Every table's and gold model's status; `landing` None leaves pending files uncounted."""
    now = now or dt.datetime.now(dt.UTC)
    known = standings(lake)
    tables = []
    for table in registry.tables.values():
        item = TableStatus(table.name, "table", quarantined_rows=row_count(lake.quarantine(table.name)))
        if landing is not None:
            from spark_jobs.state import pending_files

            item.pending_files = len(pending_files(landing, lake, table.name, table.topic))
        item.layers = {layer: layer_status(lake, table.name, layer, now, known.get((table.name, layer), EMPTY))
                       for layer in ("bronze", "silver")}
        tables.append(item)
    for model in registry.gold.values():
        tables.append(TableStatus(model.name, "gold", quarantined_rows=row_count(lake.quarantine(model.name)),
                                  layers={"gold": layer_status(lake, model.name, "gold", now,
                                                               known.get((model.name, "gold"), EMPTY))}))
    return LakeStatus(lake=lake.root, at=now.isoformat(), tables=tables)
