"""The event log: a Delta table in the lake (`<lake>/event_log`) with one row per run, table and layer (a step:
its figures, verdict, lag and versions, and its whole summary as JSON) and one per expectation result of that
step, for questions asked in SQL (docs/data-quality.md, "The event log"). The trend pages, the history page, `status` and the
freshness check read it; maintenance expires it with the run reports.

A run's rows are its run report's summaries (`reports/runs/<run id>/*.json`, written as steps publish): each
run, at its end, replaces its run's rows by what its report then holds, under one writer lock. Tasks of one
Airflow run that publish into one report each leave the log holding every summary published before them, and a
retried run (same id) replaces its rows: no step is in the log twice. Pure Python and delta-rs: read where no
Spark runs (the Airflow plugin, the freshness check)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_jobs.lake import Lake
from spark_jobs.settings import environ

STEP, EXPECTATION = "step", "expectation"
PASSED = ("passed", "passed-with-warnings")
# the figures a step's row holds as columns (the rest of its summary is in `summary`)
COUNTS = ("files", "lines", "events", "rows", "inserted", "updated", "deleted", "warnings", "version", "bronze_version")
# (name, Arrow type) in the table's order; built without Spark: maintenance records with delta-rs and no JVM
COLUMNS = (("kind", "string"), ("run_id", "string"), ("table_name", "string"), ("layer", "string"),
           ("published_at", "timestamp"), ("verdict", "string"), ("mode", "string"), ("seconds", "float64"),
           ("newest_change_at", "timestamp"), ("lag_s", "float64"), *((c, "int64") for c in COUNTS),
           ("quarantined", "int64"), ("quarantined_share", "float64"), ("error", "string"), ("summary", "string"),
           ("check_n", "int32"), ("expectation", "string"), ("action", "string"), ("success", "bool"),
           ("unexpected", "int64"), ("total", "int64"), ("observed", "string"))
LOCK = "reports.event_log"  # not a table's name (those are identifiers): its own writer lock


def _instant(value: Any) -> dt.datetime | None:
    return None if value in (None, "") else dt.datetime.fromisoformat(str(value)).astimezone(dt.UTC)


def _newest_change(summary: Mapping[str, Any], published: dt.datetime | None) -> dt.datetime | None:
    """The source time of the newest change the step's batch held: recorded by the step, else (a summary from
    before it was) its publication less its lag."""
    if summary.get("newest_change_ms") is not None:
        return dt.datetime.fromtimestamp(summary["newest_change_ms"] / 1000, dt.UTC)
    if summary.get("lag_s") is not None and published is not None:
        return published - dt.timedelta(seconds=float(summary["lag_s"]))
    return None


def _observed(value: Any) -> str | None:
    return None if value is None else value if isinstance(value, str) else json.dumps(value, default=str)


def rows(run_id: str, summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The event log's rows of a run's summaries (columns left out are null): a step row each, then its
    expectations'."""
    out: list[dict[str, Any]] = []
    for s in summaries:
        published = _instant(s.get("published_at"))
        identity = {"run_id": run_id, "table_name": s["table"], "layer": s["layer"], "published_at": published,
                    "verdict": s.get("gate")}
        quarantined = s.get("quarantined")
        out.append({"kind": STEP, **identity, **{c: s.get(c) for c in COUNTS}, "mode": s.get("mode"),
                    "seconds": s.get("seconds"), "newest_change_at": _newest_change(s, published), "lag_s": s.get("lag_s"),
                    "quarantined": sum(quarantined.values()) if isinstance(quarantined, dict) else None,
                    "quarantined_share": s.get("quarantined_share"), "error": s.get("error"),
                    "summary": json.dumps(s, sort_keys=True, default=str)})
        out += [{"kind": EXPECTATION, **identity, "check_n": n, "expectation": check["expectation"],
                 "action": check["action"], "success": bool(check["success"]), "unexpected": check.get("unexpected"),
                 "total": check.get("total"), "observed": _observed(check.get("observed"))}
                for n, check in enumerate(s.get("checks") or [])]
    return out


def record_run(engine: Any, lake: Lake, run_id: str, summaries: Callable[[], list[dict[str, Any]]]) -> int:
    """The run's rows replaced by its report's `summaries` (read under the lock, so a later writer reads what an
    earlier one published), in one commit; returns how many rows the run has."""
    import pyarrow as pa

    from spark_jobs.state import writer_lock

    with writer_lock(lake, LOCK, run_id):
        events = rows(run_id, summaries())
        if not events:
            return 0
        schema = pa.schema([(name, pa.timestamp("us", "UTC") if kind == "timestamp" else pa.type_for_alias(kind))
                            for name, kind in COLUMNS])
        table = pa.Table.from_pylist(events, schema=schema)
        if engine.version(lake.event_log) is None:
            engine.append(table, lake.event_log)
        else:
            engine.replace(table, lake.event_log, f"run_id = {engine.literal(run_id)}")
    return len(events)


def expire(engine: Any, lake: Lake, before: dt.datetime) -> int:
    """Rows of steps published before `before` removed (with the run reports, maintenance.expire_reports)."""
    from spark_jobs.state import writer_lock

    if engine.version(lake.event_log) is None:
        return 0
    with writer_lock(lake, LOCK, "maintenance"):
        # a text literal, which both engines compare as an instant (DataFusion refuses a cast's zoneless timestamp)
        return int(engine.delete(lake.event_log, f"published_at < '{before.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}+00:00'"))


@dataclass(frozen=True)
class Step:
    """A step's row as the pages and `status` read it."""

    run_id: str
    table: str
    layer: str
    published_at: dt.datetime
    verdict: str
    lag_s: float | None = None
    newest_change_at: dt.datetime | None = None
    events: int | None = None
    rows: int | None = None
    inserted: int | None = None
    updated: int | None = None
    deleted: int | None = None
    quarantined: int | None = None
    quarantined_share: float | None = None


def _query(lake: Lake, sql: str, env: Mapping[str, str] = environ) -> list[dict[str, Any]]:
    """`sql` over the event log (named `t`), through delta-rs' DataFusion; [] before the first run."""
    from spark_jobs.delta.reads import query_table

    columns = query_table(lake.event_log, sql, env)
    if columns is None:
        return []
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


_STEP_COLUMNS = ", ".join("table_name" if name == "table" else name for name in Step.__dataclass_fields__)


def _step(row: dict[str, Any]) -> Step:
    row = {("table" if k == "table_name" else k): v for k, v in row.items()}
    return Step(**row)


def _literal(value: str) -> str:
    """A text literal of DataFusion's SQL: a quote inside is doubled."""
    return "'" + value.replace("'", "''") + "'"


def recent_steps(lake: Lake, newest_runs: int = 200) -> list[Step]:
    """The steps of the newest runs (by their first step's publication), oldest first."""
    return [_step(r) for r in _query(lake, (
        f"SELECT {_STEP_COLUMNS} FROM t WHERE kind = '{STEP}' AND run_id IN (SELECT run_id FROM t WHERE kind = '{STEP}' "
        f"GROUP BY run_id ORDER BY min(published_at) DESC LIMIT {int(newest_runs)}) ORDER BY published_at, run_id"))]


def logged_runs(lake: Lake) -> set[str]:
    """The runs the log holds."""
    return {r["run_id"] for r in _query(lake, "SELECT DISTINCT run_id FROM t")}


def failed_checks(lake: Lake, run_ids: list[str]) -> dict[tuple[str, str, str], list[str]]:
    """The expectations that did not pass, by (run, table, layer), in the checks' order."""
    if not run_ids:
        return {}
    found: dict[tuple[str, str, str], list[str]] = {}
    for r in _query(lake, f"SELECT run_id, table_name, layer, expectation FROM t WHERE kind = '{EXPECTATION}' AND NOT success "
                          f"AND run_id IN ({', '.join(_literal(i) for i in sorted(set(run_ids)))}) ORDER BY check_n"):
        found.setdefault((r["run_id"], r["table_name"], r["layer"]), []).append(r["expectation"])
    return found


def column_lineage(lake: Lake, models: list[str]) -> dict[str, dict[str, list[str]]]:
    """Each of `models`' column lineage as its newest refresh recorded it (GoldSummary.lineage); a model no refresh
    has recorded one for is left out."""
    if not models:
        return {}
    found: dict[str, dict[str, list[str]]] = {}
    for r in _query(lake, f"SELECT table_name, summary FROM t WHERE kind = '{STEP}' AND layer = 'gold' AND table_name IN "
                          f"({', '.join(_literal(m) for m in sorted(set(models)))}) AND summary LIKE '%\"lineage\"%' "
                          "ORDER BY published_at"):
        found[r["table_name"]] = json.loads(r["summary"])["lineage"]
    return found


@dataclass(frozen=True)
class Standing:
    """A table's (or model's) layer as of its newest step: that step, its newest passed step, and the newest source
    change any passed step held."""

    last: Step | None
    last_passed: Step | None
    newest_change_at: dt.datetime | None


def standings(lake: Lake, name: str | None = None, env: Mapping[str, str] = environ) -> dict[tuple[str, str], Standing]:
    """Per (table, layer): its newest step and newest passed step (`name`: that table's or model's only)."""
    only = f" AND table_name = {_literal(name)}" if name is not None else ""
    passed = f"verdict IN ({', '.join(_literal(v) for v in PASSED)})"
    newest = _query(lake, (
        f"SELECT {_STEP_COLUMNS}, is_passed FROM (SELECT {_STEP_COLUMNS}, {passed} AS is_passed, row_number() OVER "
        f"(PARTITION BY table_name, layer, {passed} ORDER BY published_at DESC) AS n FROM t WHERE kind = '{STEP}'{only}) "
        "WHERE n = 1"), env)
    changes = {(r["table_name"], r["layer"]): r["newest"] for r in _query(lake, (
        f"SELECT table_name, layer, max(newest_change_at) AS newest FROM t WHERE kind = '{STEP}' AND {passed}{only} "
        "GROUP BY table_name, layer"), env)}
    found: dict[tuple[str, str], dict[bool, Step]] = {}
    for r in newest:
        is_passed = r.pop("is_passed")
        step = _step(r)
        found.setdefault((step.table, step.layer), {})[bool(is_passed)] = step
    out = {}
    for key, by in found.items():
        steps = list(by.values())
        out[key] = Standing(max(steps, key=lambda s: s.published_at), by.get(True), changes.get(key))
    return out
