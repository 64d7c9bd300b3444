"""Bronze's Spark work over many small tables' new landing files in one pass: one scan, parse and classification of
every table's JSON lines, then one Arrow collect of the rows with their line tally and their audit, split by table on
the driver. A cycle over a whole database then costs a few Spark jobs, not a few dozen a table
(tests/benchmarks/RESULTS.md, workload D). Each table still gates, quarantines, commits and logs its own batch under
its own writer lock (bronze.bronze_ingest), which first checks that its files are still the ones read here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from spark_jobs.debezium import envelope
from spark_jobs.delta import DeltaEngine, all_nullable
from spark_jobs.lake import Lake
from spark_jobs.landing import LandingFile, spark_paths
from spark_jobs.layers.common import checkpoint, lookup, now
from spark_jobs.layers.landing_reader import read_landing
from spark_jobs.layers.summary import Counts
from spark_jobs.layers.tombstones import TombstoneCounts, counting, preceding_rows
from spark_jobs.quality.audit import Tally, collect_with, grouped_tally
from spark_jobs.quality.expectations import QUARANTINE, flagged, row_checks
from spark_jobs.registry import TableConfig
from spark_jobs.sql_text import ident, sql

# a change event's columns in bronze, before the batch's own (_batch_id, _bronze_version, _ingested_at)
EVENT_COLUMNS = ("_source_file", "_line", "_raw", "op", "ts_ms", "source", "before", "after", "_schema")


def bronze_rows(events: DataFrame, batch_id: str, version: int, *carried: str) -> DataFrame:
    """A batch's change events as bronze rows (after the `carried` columns): committed as `version`, ingested now."""
    return events.select(*[sql(ident(c)) for c in (*carried, *EVENT_COLUMNS)], F.lit(batch_id).alias("_batch_id"),
                         F.lit(version).cast("long").alias("_bronze_version"),
                         F.lit(now()).cast("timestamp").alias("_ingested_at"))


def quarantining(table: TableConfig) -> frozenset[str]:
    """The row expectations whose failure quarantines one of the table's events (the rest warn or fail)."""
    return frozenset(n for n in row_checks("bronze") if table.quality.action(n) == QUARANTINE)


@dataclass(frozen=True)
class LineTally:
    """What bronze counts of a batch's classified lines, all from one Spark job."""

    per_file: dict[str, tuple[int, int, int, int]]  # (lines, events, tombstones, quarantined) per landing file
    quarantined: Counts  # lines by quarantine reason
    flagged: Counts  # kept events by the (warn) expectation they fail
    newest_ts_ms: int | None  # the newest event's source time
    opening: list[str]  # files whose first line is a tombstone

    @property
    def tombstones(self) -> int:
        return sum(stats[2] for stats in self.per_file.values())


def line_groups(classified: DataFrame, *by: str) -> DataFrame:
    """The classified lines counted by (`by`,) file, kind, reason and expectation: what LineTally folds."""
    return classified.groupBy(*[sql(ident(c)) for c in (*by, "_source_file", "_kind", "reason", "_expectation")]).agg(
        *[sql(text) for text in ("count(1) AS n", "max(ts_ms) AS newest", "max(_kind = 'tombstone' AND _line = 1) AS opens")])


def fold_tally(groups: Iterable[Row | dict[str, Any]]) -> LineTally:
    groups = list(groups)
    per_file: dict[str, list[int]] = {}
    quarantined: Counts = {}
    flags: Counts = {}
    for g in groups:
        stats = per_file.setdefault(g["_source_file"], [0, 0, 0, 0])
        stats[0] += g["n"]
        stats[1 + ("event", "tombstone", "quarantine").index(g["_kind"])] += g["n"]
        if g["_kind"] == "quarantine":
            quarantined[g["reason"]] = quarantined.get(g["reason"], 0) + g["n"]
        elif g["_kind"] == "event" and g["_expectation"] is not None:
            flags[g["_expectation"]] = flags.get(g["_expectation"], 0) + g["n"]
    newest = [g["newest"] for g in groups if g["_kind"] == "event" and g["newest"] is not None]
    return LineTally({f: (s[0], s[1], s[2], s[3]) for f, s in per_file.items()}, quarantined, flags,
                     max(newest) if newest else None, sorted({g["_source_file"] for g in groups if g["opens"]}))


def audited_lines(classified: DataFrame, matched: DataFrame | None, *by: str) -> DataFrame:
    """The lines bronze's gate audits: the change events, and the tombstone lines with whether each follows a delete
    (and what tombstones.counting reads)."""
    change_events = classified.where(f"_kind <> 'tombstone' AND _json_ok AND op IN {envelope.OPS}")
    if matched is None:
        return change_events.withColumn("_follows_delete", F.lit(None).cast("boolean"))
    return change_events.unionByName(matched.select(*by, "_follows_delete", "_previous_unseen", "_part", "_source_file"),
                                     allowMissingColumns=True)


@dataclass(frozen=True)
class Candidate:
    """A table's new files for a shared pass, and the files its ingest log held when they were chosen."""

    table: TableConfig
    files: list[LandingFile]
    done: frozenset[str]


@dataclass(frozen=True)
class TableRead:
    """One table's batch as a shared pass read it: everything its bronze step needs, on the driver."""

    files: tuple[tuple[str, int, int], ...]  # (path, size, modified_ms) of each file read
    done: frozenset[str]
    tally: LineTally
    unreadable: dict[LandingFile, str]
    tombstones: TombstoneCounts
    audit: dict[str, Tally]
    events: pa.Table  # EVENT_COLUMNS and the batch's own, _bronze_version to be set as the table commits
    quarantine: list[tuple[str, int, str, str]]  # (_source_file, _line, _raw, reason) of each quarantined line
    waiting: pa.Table | None  # tombstones whose previous record has not landed (_source_file, _line, _part, _offset)

    def holds(self, files: list[LandingFile], done: set[str]) -> bool:
        """Are these the files read, unchanged, and is the ingest log as it was? (Another run of the table may have
        taken files since: then the table reads its own.)"""
        return self.files == _identity(files) and self.done == frozenset(done)


def _identity(files: list[LandingFile]) -> tuple[tuple[str, int, int], ...]:
    return tuple((f.path, f.size, f.modified_ms) for f in files)


def read_together(spark: SparkSession, engine: DeltaEngine, lake: Lake, landing: str, candidates: list[Candidate],
                  fmt: str, batch_id: str) -> dict[str, TableRead]:
    """The candidates' new files (JSON lines of `fmt`, together one small batch, each topic one table's) read,
    classified, tallied and audited in one pass; their rows collected to the driver, by table."""
    table_of = {f.path: c.table.name for c in candidates for f in c.files}
    files = [f for c in candidates for f in c.files]
    # each table's files staged where its own runs stage them: a killed pass leaves nothing its tables do not clear
    staged_at = [lake.staged_files(c.table.name, batch_id) for c in candidates]
    try:
        staged = {path: f for c, folder in zip(candidates, staged_at, strict=True)
                  for path, f in spark_paths(landing, c.files, folder).items()}
        lines, unreadable = read_landing(spark, staged, files, fmt, together=True)
        lines = lines.withColumn("_table", lookup(table_of, "_source_file"))
        parsed = envelope.parse_envelope(lines, fmt)
        parsed = parsed.withColumn("_schema", F.coalesce("_typed_schema", "_schema")).drop("_typed_schema")
        rules = {c.table.name: (c.table.keys, quarantining(c.table)) for c in candidates}
        classified = checkpoint(envelope.classify_tables(parsed, rules), True)
        # the rest in one Spark job: the rows collected with the line tally, the audit and the tombstones' counts. The
        # tombstones are matched before the tally says which files open with one, as if none did; when one does, the
        # delete before it is among bronze's rows: matched again with them, and the audit counted again
        read = _collect(classified, _match_tombstones(spark, engine, lake, classified, {}, table_of), batch_id, True)
        tallies = {c.table.name: fold_tally(read.lines.get(c.table.name, [])) for c in candidates}
        opening = {name: t.opening for name, t in tallies.items() if t.opening}
        if opening:
            read = replace(_collect(classified, _match_tombstones(spark, engine, lake, classified, opening, table_of),
                                    batch_id, False), events=read.events, quarantine=read.quarantine)
    finally:
        for folder in staged_at:
            lake.files.delete_tree(folder)
    no_events = next(iter(read.events.values())).slice(0, 0)
    no_audit = {e.name: Tally(0, 0) for e in flagged("bronze", "events")}
    unreadable_by: dict[str, dict[LandingFile, str]] = {c.table.name: {} for c in candidates}
    for f, reason in unreadable.items():
        unreadable_by[table_of[f.path]][f] = reason
    quarantine_by: dict[str, list[tuple[str, int, str, str]]] = {c.table.name: [] for c in candidates}
    for r in read.quarantine.to_pylist():
        quarantine_by[r["_table"]].append((r["_source_file"], r["_line"], r["_raw"], r["reason"]))
    return {c.table.name: TableRead(
        _identity(c.files), c.done, tallies[c.table.name], unreadable_by[c.table.name],
        read.tombstones.get(c.table.name, TombstoneCounts(0, 0)), read.audits.get(c.table.name, no_audit),
        read.events.get(c.table.name, no_events), quarantine_by[c.table.name], read.waiting.get(c.table.name))
        for c in candidates}


@dataclass(frozen=True)
class _Collected:
    """What a pass collects of its classified lines, by table, in one Spark job."""

    lines: dict[str, list[dict[str, Any]]]  # line_groups' rows
    audits: dict[str, dict[str, Tally]]
    tombstones: dict[str, TombstoneCounts]
    events: dict[str, pa.Table]  # bronze's rows (_split)
    quarantine: pa.Table  # `_table`, `_source_file`, `_line`, `_raw`, `reason` of each quarantined line
    waiting: dict[str, pa.Table]  # tombstones whose previous record has not landed (_split)


def _collect(classified: DataFrame, matched: DataFrame, batch_id: str, rows: bool) -> _Collected:
    """The audit of the classified lines (the tombstones `matched`) and the waiting tombstones, collected with the
    line tally, the events' rows and the quarantined lines when `rows`: one Spark job."""
    grouped = grouped_tally({"events": audited_lines(classified, matched, "_table")}, flagged("bronze"), "_table",
                            counting())
    parts = {"waiting": matched.where("_previous_unseen AND _part <> _source_file").select(
        "_table", "_source_file", "_line", "_part", "_offset")}
    if rows:
        parts |= {"events": bronze_rows(classified.where("_kind = 'event'"), batch_id, 0, "_table"),
                  "quarantine": classified.where("_kind = 'quarantine'").select(
                      "_table", "_source_file", "_line", "_raw", "reason"),
                  "lines": line_groups(classified, "_table")}
    found, audited = collect_with(parts, grouped)
    lines: dict[str, list[dict[str, Any]]] = {}
    for group in found["lines"].to_pylist() if rows else []:
        lines.setdefault(group["_table"], []).append(group)
    empty = pa.table({})
    return _Collected(lines, {name: a.tallies for name, a in audited.items()},
                      {name: TombstoneCounts(a.measures["matched"], a.measures["waiting"]) for name, a in audited.items()},
                      _split(found["events"]) if rows else {}, found.get("quarantine", empty), _waiting(found["waiting"]))


def _waiting(rows: pa.Table) -> dict[str, pa.Table]:
    return _split(rows) if rows.num_rows else {}


def _match_tombstones(spark: SparkSession, engine: DeltaEngine, lake: Lake, classified: DataFrame,
                      opening: dict[str, list[str]], table_of: dict[str, str]) -> DataFrame:
    """Every table's tombstone lines matched to the records before them (and to bronze's rows, for the files
    `opening` names by table: those that open with one, the delete before it in an earlier batch), by table. Topics
    are each one table's, so places never mix."""
    earlier_parts = [rows.select("_source_file", "_line", "op") for name, files in opening.items()
                     if (rows := preceding_rows(spark, engine, lake, name, files)) is not None]
    earlier = reduce(DataFrame.unionByName, earlier_parts) if earlier_parts else None
    return checkpoint(envelope.match_tombstones(classified, earlier), True).withColumn(
        "_table", lookup(table_of, "_source_file"))


def _split(rows: pa.Table) -> dict[str, pa.Table]:
    """Arrow rows by their `_table`, without it; "" holds the empty schema when there are none."""
    rows = rows.cast(all_nullable(rows.schema))
    if rows.num_rows == 0:
        return {"": rows.drop_columns(["_table"])}
    names = rows.column("_table")
    return {name: rows.filter(pc.equal(names, name)).drop_columns(["_table"])
            for name in pc.unique(names).to_pylist()}
