"""Bronze: landing files -> the raw change events of each table, appended once per file (docs/architecture.md,
"Bronze"). Bad lines and unreadable files go to quarantine with a reason; the ingest log records every
file taken, so a file is never appended twice, even after a crash between the two commits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.debezium import envelope
from spark_jobs.delta import DeltaEngine, driver_rows
from spark_jobs.errors import ConcurrentWrite, OutOfMemory, PipelineError
from spark_jobs.lake import Lake
from spark_jobs.landing import LandingFile, LandingWindow, in_topic, list_topic, spark_paths
from spark_jobs.layers.bronze_pass import (
    Candidate,
    LineTally,
    TableRead,
    audited_lines,
    bronze_rows,
    fold_tally,
    line_groups,
    quarantining,
    read_together,
)
from spark_jobs.layers.common import (
    ONE_TASK_BYTES,
    QUARANTINED,
    QUARANTINED_COLUMNS,
    checkpoint,
    gate,
    in_passes,
    lag_seconds,
    landing_bytes,
    now,
    read_shared,
    settle,
    share,
    small_landing,
    whole_file_rows,
    write_quarantine,
)
from spark_jobs.layers.landing_reader import read_landing, with_record_keys
from spark_jobs.layers.summary import BronzeSummary, Counts
from spark_jobs.layers.tombstones import (
    PENDING_TOMBSTONES,
    TombstoneCounts,
    preceding_rows,
    tombstone_counts,
    track_pending_tombstones,
)
from spark_jobs.logs import logger
from spark_jobs.quality.audit import Audit, Figures, Tally, tally
from spark_jobs.quality.expectations import flagged
from spark_jobs.quality.findings import GateResult
from spark_jobs.quality.gates import AuditGate, bronze_checks
from spark_jobs.quality.user_expectations import check_columns, violations
from spark_jobs.registry import TableConfig
from spark_jobs.session import ran_out_of_memory
from spark_jobs.settings import settings
from spark_jobs.state import advance_marks, ingest_log, ingested_files, read_marks

log = logger(__name__)

if TYPE_CHECKING:
    from spark_jobs.delta import Rows


@dataclass(frozen=True)
class Selection:
    """Which landing files a bronze run takes: those in the landing-time window, only the `files` named
    (the sensor's exact list) when given; files already in bronze are left alone unless `reprocess`,
    which reads them again and replaces their rows."""

    window: LandingWindow = LandingWindow()
    files: frozenset[str] | None = None
    reprocess: bool = False


@dataclass(frozen=True)
class _Listing:
    """The topic's files after the table's landing marks, what bronze had taken before this run, and the
    files this run takes."""

    marks: dict[str, str]
    listed: list[LandingFile]
    done: set[str]
    chosen: list[LandingFile]
    waiting: list[LandingFile]  # files whose key file has not landed yet (record_keys): taken by a later run

    def advance(self, lake: Lake, table: str) -> None:
        """After the run's files are logged: the marks move over every file now taken."""
        advance_marks(lake, table, self.marks, self.listed, self.done | {f.path for f in self.chosen})


def _select(landing: str, lake: Lake, table: TableConfig, selection: Selection, done: set[str]) -> _Listing:
    # the sensor's files (after its marks) are found by listing after the marks too; a run that lists for
    # itself (by hand, a window, a reprocess) lists everything, which also finds a file that landed late
    # under a name before its folder's mark (the sink does not, a copy by hand may), and recomputes the marks
    marks = read_marks(lake, table.name) if selection.files is not None and not selection.reprocess else {}
    listed = list_topic(landing, table.topic, marks=marks)
    chosen = listed
    if selection.files is not None:
        # of the files named to the run (the sensor's, of every table it found), the table's own; those bronze has
        # taken since (another run of the table) are not gone: they are done
        named = {path for path in selection.files if in_topic(path, table.topic)}
        gone = sorted(named - {f.path for f in listed} - done)
        if gone:
            raise PipelineError(table.name, "bronze", f"{len(gone)} landing file(s) handed to this run are no longer "
                                f"in {landing}: {', '.join(gone[:5])}")
        chosen = [f for f in listed if f.path in named]
    skip = set() if selection.reprocess else done
    chosen = [f for f in chosen if f in selection.window and f.path not in skip]
    # the sink commits a value file, then its key file: one listed alone is taken once its keys are there too
    waiting = [f for f in chosen if table.record_keys and f.keys_file is None]
    return _Listing(marks, listed, done, [f for f in chosen if f not in waiting], waiting)


def bronze_ingest(spark: SparkSession, engine: DeltaEngine, table: TableConfig, landing: str, lake: Lake,
                  batch_id: str, selection: Selection = Selection(), read: TableRead | None = None
                  ) -> Generator[AuditGate, GateResult, BronzeSummary]:
    """The table's new landing files into bronze. `read`: the batch a shared pass over many tables read
    (read_rounds), taken when the files are still those and the table has no tombstones pending, which asks for its
    gate's verdict before its commit (AuditGate: the pass's tables are gated together, steps.Steps.run_together);
    otherwise the table reads its own."""
    # the ingest log read once, for both: a cycle asks this of every table, most of which have nothing new
    logged = ingest_log(lake, table.name, ["file", "bronze_version"])
    recovered = _recover_unlogged_files(spark, engine, lake, table.name, batch_id, logged["bronze_version"])
    listing = _select(landing, lake, table, selection, set(logged["file"]) | recovered)
    files = listing.chosen
    summary = BronzeSummary(table=table.name, batch_id=batch_id, files=len(files), recovered_files=len(recovered),
                            mode="reprocess" if selection.reprocess else None,
                            waiting_for_keys=len(listing.waiting) if listing.waiting else None)
    if listing.waiting:
        log.info(f"bronze {table.name}: {len(listing.waiting)} file(s) wait for their key file (record_keys), e.g. "
                 f"{listing.waiting[0].path}")
    if not files:
        summary.gate, summary.lines, summary.events, summary.tombstones = "skipped (no new files)", 0, 0, 0
        listing.advance(lake, table.name)  # files another run took (or recovered ones) move the marks too
        return summary
    # what a killed run staged goes (one writer per table: no live run of it has any; a shared pass removed its own)
    _clear_staging(lake, table.name)
    if read is not None and read.holds(files, listing.done) and not _pending_tombstones(engine, lake, table.name):
        yield from _ingest_read(engine, _Batch(table, lake, batch_id, files, []), read, summary)
        listing.advance(lake, table.name)
        return summary
    # a backlog goes in bounded batches of files, each its own commit in landing order: memory stays bounded,
    # and a run that dies midway keeps the batches it committed (the retry takes the rest)
    size = settings().bronze_batch_files
    chunks = [files[i:i + size] for i in range(0, len(files), size)]
    unreadable_n = 0
    for number, chunk in enumerate(chunks, 1):
        part = summary if len(chunks) == 1 else BronzeSummary(table=table.name, batch_id=batch_id, files=len(chunk),
                                                               mode=summary.mode)
        unreadable = _ingest_chunk(spark, engine, _Batch(table, lake, batch_id, chunk, _in_bronze(
            engine, lake, table.name, chunk) if selection.reprocess else []), landing, part)
        if part is not summary:
            summary.absorb(part)
            unreadable_n += unreadable
            summary.quarantined_share = share(sum((summary.quarantined or {}).values()), (summary.lines or 0) + unreadable_n)
            log.info(f"bronze {table.name}: batch {number}/{len(chunks)} committed: {len(chunk)} files, {part.lines} "
                     f"lines, {part.events} events, {sum((part.quarantined or {}).values())} quarantined "
                     f"({min(number * size, len(files))} of {len(files)} files)")
    listing.advance(lake, table.name)
    return summary


def _pending_tombstones(engine: DeltaEngine, lake: Lake, table: str) -> bool:
    """Does the table hold tombstones waiting for their previous record? Settling them reads the table's own lines."""
    return engine.version(lake.pending_tombstones(table)) is not None


# What shared passes read ahead of the tables' own steps at most (landing bytes, as small_landing counts them): the
# reads wait on the driver, as Arrow, until each table commits its own
READ_AHEAD_BYTES = 4 * ONE_TASK_BYTES


def read_rounds(spark: SparkSession, engine: DeltaEngine, tables: list[TableConfig], landing: str, lake: Lake,
                batch_id: str, selection: Selection) -> Iterator[tuple[list[TableConfig], dict[str, TableRead]]]:
    """The tables in rounds, each with the new files of its small tables read in shared passes (bronze_pass; one small
    table's too, a pass of one), at most READ_AHEAD_BYTES a round; the tables' own bronze steps then take their reads
    (bronze_ingest). Tables a pass cannot take (`_candidate`, a reprocess, a topic two tables read) read their own
    files. A pass that fails leaves its tables to read their own, which then fail or not each on its own input."""
    if selection.reprocess:
        yield tables, {}
        return
    members: list[TableConfig] = []
    candidates: list[Candidate] = []
    read_ahead = 0
    for table in tables:
        members.append(table)
        candidate = _candidate(engine, table, landing, lake, selection)
        if candidate is not None:
            candidates.append(candidate)
            read_ahead += landing_bytes(candidate.files)
        if read_ahead >= READ_AHEAD_BYTES:
            yield members, _read_shared(spark, engine, lake, landing, candidates, batch_id)
            members, candidates, read_ahead = [], [], 0
    if members:
        yield members, _read_shared(spark, engine, lake, landing, candidates, batch_id)


def _candidate(engine: DeltaEngine, table: TableConfig, landing: str, lake: Lake,
               selection: Selection) -> Candidate | None:
    """The table's new files, when a shared pass can read them: small, JSON lines (a file of another kind is
    quarantined as bronze does), no key files, no expectations on raw events, one batch."""
    if table.record_keys or table.format not in ("auto", "json", "json-flat") or table.layer_expectations("bronze"):
        return None
    try:
        # nothing after the marks: nothing for a pass (the table's own step still lists in full), and an idle
        # table costs this listing only, not its ingest log read twice
        if _pending_tombstones(engine, lake, table.name) or not list_topic(landing, table.topic,
                                                                             marks=read_marks(lake, table.name)):
            return None
        done = ingested_files(lake, table.name)
        files = _select(landing, lake, table, selection, done).chosen
    except Exception:  # not swallowed: its own step lists again, and fails alone if it must
        return None
    if not files or len(files) > settings().bronze_batch_files or any(f.kind in ("parquet", "avro") for f in files) \
            or not small_landing(files):
        return None
    return Candidate(table, files, frozenset(done))


def _read_shared(spark: SparkSession, engine: DeltaEngine, lake: Lake, landing: str, candidates: list[Candidate],
                 batch_id: str) -> dict[str, TableRead]:
    """The candidates in passes of one small batch of lines each (one format each; a topic two tables read is left
    to them)."""
    topics = Counter(c.table.topic for c in candidates)
    passes = [together for fmt in sorted({c.table.format for c in candidates}) for together in in_passes(
        (c for c in candidates if c.table.format == fmt and topics[c.table.topic] == 1),
        lambda p: small_landing(f for c in p for f in c.files))]
    return read_shared(
        "bronze", "reads its own files", passes,
        lambda together: read_together(spark, engine, lake, landing, together, together[0].table.format, batch_id),
        lambda together, _: f"{_tables(len(together))} new files ({sum(len(c.files) for c in together)}) read")


def _tables(n: int) -> str:
    return "1 table's" if n == 1 else f"{n} tables'"


def _ingest_chunk(spark: SparkSession, engine: DeltaEngine, batch: _Batch, landing: str, part: BronzeSummary) -> int:
    """One bounded batch of a table's files into bronze, staged where Spark reads them (names it cannot read where
    they are get copies in the lake, which a cluster's executors see as the driver does); how many were unreadable.
    A driver out of memory is said with the largest files and what to do."""
    table, chunk = batch.table, batch.files
    staging = batch.lake.staged_files(table.name, batch.batch_id)
    try:
        keys = {f.keys_file: f for f in chunk if f.keys_file and table.record_keys}
        staged_keys = spark_paths(landing, list(keys), f"{staging}/keys")
        return _ingest(spark, engine, batch, spark_paths(landing, chunk, staging),
                       {staged: keys[f] for staged, f in staged_keys.items()}, part)
    except Exception as exc:
        if ran_out_of_memory(exc):
            largest = sorted(chunk, key=lambda f: -f.size)[:3]
            raise OutOfMemory(table.name, "bronze", "the Spark driver ran out of memory reading "
                              + ", ".join(f"{f.path} ({f.size:,} bytes)" for f in largest)
                              + (f" and {len(chunk) - 3} more file(s)" if len(chunk) > 3 else "")
                              + f"; a line must fit in the driver's heap, CDC_DRIVER_MEMORY={settings().driver_memory}: "
                              "raise it, or set the file aside (run --mode skip --files ...)") from exc
        raise
    finally:
        batch.lake.files.delete_tree(staging)


def _ingest_read(engine: DeltaEngine, batch: _Batch, read: TableRead, summary: BronzeSummary
                 ) -> Generator[AuditGate, GateResult, None]:
    """A batch a shared pass read (read_rounds), taken as `_ingest` takes one it reads: quarantine, gate (asked for),
    pending tombstones, commit and ingest log, from the driver."""
    table, lake = batch.table, batch.lake
    quarantine = read.quarantine + whole_file_rows(read.unreadable)
    summary.quarantined = write_quarantine(engine, lake, table.name, quarantine, "bronze", batch.batch_id,
                                           _with_unreadable(read.tally.quarantined, read.unreadable))
    _count(read.tally, read.tombstones, batch, len(read.unreadable), summary)
    settle((yield _audit_gate(read.audit, batch, summary)), summary)
    summary.tombstones_matched_late = 0  # none were pending (bronze_ingest)
    if read.waiting is not None and read.waiting.num_rows:
        engine.merge(read.waiting, lake.pending_tombstones(table.name), PENDING_TOMBSTONES, small=True)

    def rows_at(version: int) -> pa.Table:  # the read's rows, committed as `version` now
        rows, n = read.events, read.events.num_rows
        for name, value in (("_bronze_version", version), ("_ingested_at", now())):
            field = rows.schema.field(name)
            rows = rows.set_column(rows.schema.get_field_index(name), field, pa.array([value] * n, field.type))
        return rows

    _log_batch(engine, batch, read.tally, read.unreadable, _commit(engine, rows_at, batch, summary))


def skip_files(spark: SparkSession, engine: DeltaEngine, table: TableConfig, landing: str, lake: Lake, batch_id: str,
               selection: Selection, reason: str) -> BronzeSummary:
    """Set pending landing files aside unread (the way on after a bad file stops bronze, besides fixing it):
    each is logged as taken, so the sensor and later runs pass it by, and quarantined whole (line 0, the
    reason `skipped: <reason>`), so it is counted and found. It stays in landing: a reprocess over its
    landing time reads it again."""
    listing = _select(landing, lake, table, selection, ingested_files(lake, table.name))
    # set aside unread, whether or not their key files have landed
    listing = replace(listing, chosen=sorted(listing.chosen + listing.waiting, key=lambda f: f.path), waiting=[])
    files = listing.chosen
    summary = BronzeSummary(table=table.name, batch_id=batch_id, files=len(files), mode="skip",
                            gate="skipped (files set aside)")
    if files:
        rows = spark.createDataFrame(whole_file_rows({f: f"skipped: {reason}" for f in files}), QUARANTINED)
        summary.quarantined = write_quarantine(engine, lake, table.name, rows, "bronze", batch_id)
        # lines, events and tombstones unknown: the files were not read
        log_files(engine, lake, table.name, {f.path: (f.size, f.modified_ms, None, 0, None, None)
                                             for f in files}, batch_id, None)
        listing.advance(lake, table.name)
    return summary


def _clear_staging(lake: Lake, table: str) -> None:
    mine = lake.staged_files(table, "")
    for folder in {p.rsplit("/", 1)[0] for p in lake.files.list(lake.staging_files) if p.startswith(mine)}:
        lake.files.delete_tree(folder)


@dataclass(frozen=True)
class _Batch:
    """The landing files one bronze run takes; `again` those of them bronze holds already (a reprocess)."""

    table: TableConfig
    lake: Lake
    batch_id: str
    files: list[LandingFile]
    again: list[str]

    @property
    def small(self) -> bool:
        """Small landing files: planned in one partition (common.checkpoint), written from the driver (DeltaEngine)."""
        return small_landing(self.files)


def _ingest(spark: SparkSession, engine: DeltaEngine, batch: _Batch, staged: dict[str, LandingFile],
            staged_keys: dict[str, LandingFile], summary: BronzeSummary) -> int:
    """Bronze for the batch's files, read where `staged` says (landing.spark_paths), with their key files
    (`staged_keys`: where Spark reads each -> the value file it serves; record_keys): read and
    classify, quarantine, audit, then append (or replace, for a reprocess) and log the files. Returns the
    number of files that could not be read."""
    table, lake = batch.table, batch.lake
    small = batch.small
    lines, unreadable = read_landing(spark, staged, batch.files, table.format, small)
    if table.record_keys:
        lines, keyless = with_record_keys(spark, lines, staged_keys, small)
        unreadable |= keyless
    parsed = envelope.parse_envelope(lines, table.format)
    if table.record_keys:
        parsed = envelope.keys_from_record_key(parsed, table.keys)
    parsed = parsed.withColumn("_schema", F.coalesce("_typed_schema", "_schema")).drop("_typed_schema")
    classified = checkpoint(envelope.classify(parsed, table.keys, quarantining(table)), small)
    raw = _raw_events(classified, table)
    classified = _quarantine_by_expectations(classified, raw, table)
    tally = fold_tally(line_groups(classified).collect())
    _quarantine(spark, engine, batch, classified, tally.quarantined, unreadable, summary)
    # tombstone lines that open a file follow a record of an earlier batch: look in bronze for those only
    earlier = preceding_rows(spark, engine, lake, table.name, tally.opening) if tally.opening else None
    # a batch without tombstone lines (an initial snapshot, most batches) matches none: no pass over its records
    matched = checkpoint(envelope.match_tombstones(classified, earlier), small) if tally.tombstones else None
    tombstones = tombstone_counts(matched) if matched is not None else TombstoneCounts(0, 0)
    _count(tally, tombstones, batch, len(unreadable), summary)
    _audit(classified, matched, raw, batch, summary)
    summary.tombstones_matched_late = track_pending_tombstones(spark, engine, lake, table.name, classified, matched,
                                                               tombstones.waiting > 0)
    events = classified.where("_kind = 'event'")
    _log_batch(engine, batch, tally, unreadable,
               _commit(engine, lambda version: bronze_rows(events, batch.batch_id, version), batch, summary))
    return len(unreadable)


def _with_unreadable(counts: Counts, unreadable: dict[LandingFile, str]) -> Counts:
    """Quarantine counts by reason with the unreadable files, each one quarantined row."""
    merged = dict(counts)
    for reason in unreadable.values():
        merged[reason] = merged.get(reason, 0) + 1
    return merged


def _log_batch(engine: DeltaEngine, batch: _Batch, tally: LineTally, unreadable: dict[LandingFile, str],
               committed: int | None) -> None:
    """The batch's files into the ingest log, with their counts (an unreadable file: one quarantined row)."""
    per_file = dict(tally.per_file) | {f.path: (0, 0, 0, 1) for f in unreadable}
    log_files(engine, batch.lake, batch.table.name, {f.path: (f.size, f.modified_ms, *per_file.get(f.path, (0, 0, 0, 0)))
                                                     for f in batch.files}, batch.batch_id, committed)


def _raw_events(classified: DataFrame, table: TableConfig) -> DataFrame | None:
    """The change events as they landed, as the user's `layer: bronze` expectations see them (RAW_COLUMNS,
    and the key columns as text); None when the table declares none."""
    if not table.layer_expectations("bronze"):
        return None
    source = {f"source_{f}": F.get_json_object("source", f"$.{f}") for f in ("connector", "db", "table", "snapshot")}
    raw = classified.where("_kind = 'event'").select(
        "op", "ts_ms", *[c.alias(n) for n, c in source.items()],
        F.get_json_object("source", "$.ts_ms").cast("long").alias("source_ts_ms"), "_source_file", "_line",
        *[F.get_json_object(envelope.key_image(), f"$.{k}").alias(k) for k in table.keys])
    check_columns(raw, table.layer_expectations("bronze"), "bronze's raw event columns")
    return raw


def _quarantine_by_expectations(classified: DataFrame, raw: DataFrame | None, table: TableConfig) -> DataFrame:
    """Events failing a `quarantine` expectation of `layer: bronze` are quarantined with it as the reason."""
    failing = None if raw is None else violations(
        raw.withColumn(EVENT, F.struct("_source_file", "_line")), table.layer_expectations("bronze"), EVENT)
    if failing is None:
        return classified
    failing = failing.select(F.col(f"{EVENT}._source_file").alias("_source_file"), F.col(f"{EVENT}._line").alias("_line"),
                             F.col("reason").alias("_failed"))
    refused = classified.join(failing, ["_source_file", "_line"], "left")
    return refused.withColumn("_kind", F.when(F.col("_failed").isNotNull(), "quarantine").otherwise(F.col("_kind"))) \
        .withColumn("reason", F.coalesce("reason", "_failed")).drop("_failed").localCheckpoint()


EVENT = "_cdc_event"


def _quarantine(spark: SparkSession, engine: DeltaEngine, batch: _Batch, classified: DataFrame, counts: Counts,
                unreadable: dict[LandingFile, str], summary: BronzeSummary) -> None:
    """Bad lines (`counts` of them by reason), and unreadable files whole (line 0), to quarantine; a
    reprocess replaces what the files' earlier reading quarantined."""
    quarantine = classified.where("_kind = 'quarantine'").select(*QUARANTINED_COLUMNS)
    if unreadable:
        quarantine = quarantine.unionByName(spark.createDataFrame(whole_file_rows(unreadable), QUARANTINED))
    counts = _with_unreadable(counts, unreadable)
    path = batch.lake.quarantine(batch.table.name)
    if batch.again and engine.version(path) is not None:
        engine.delete(path, f"layer = 'bronze' AND {_files_predicate(engine, batch.again)}")
    summary.quarantined = write_quarantine(engine, batch.lake, batch.table.name, quarantine, "bronze", batch.batch_id,
                                           counts, small=batch.small)


def _count(tally: LineTally, tombstones: TombstoneCounts, batch: _Batch, unreadable: int, summary: BronzeSummary) -> None:
    lines_in, events_in = (sum(stats[i] for stats in tally.per_file.values()) for i in range(2))
    summary.lines, summary.events, summary.tombstones = lines_in, events_in, tally.tombstones
    summary.tombstones_matched, summary.tombstones_unmatched = tombstones.matched, tally.tombstones - tombstones.matched
    summary.quarantined_share = share(sum((summary.quarantined or {}).values()), lines_in + unreadable)
    summary.empty_files = sum(1 for f in batch.files if f.size == 0)
    summary.lag_s, summary.newest_change_ms = lag_seconds(tally.newest_ts_ms), tally.newest_ts_ms
    summary.flagged = tally.flagged or None


def _audit(classified: DataFrame, matched: DataFrame | None, raw: DataFrame | None, batch: _Batch,
           summary: BronzeSummary) -> None:
    """The bronze gate: its checks' tallies over the batch's change events and tombstone lines, and its figures."""
    _gate(tally({"events": audited_lines(classified, matched)}, flagged("bronze")), raw, batch, summary)


def _gate(tallies: dict[str, Tally], raw: DataFrame | None, batch: _Batch, summary: BronzeSummary) -> None:
    asked = _audit_gate(tallies, batch, summary)
    gate(asked.audit, {"raw": raw} if raw is not None else {}, asked.table, asked.layer, asked.checks, asked.lake,
         summary, asked.actions)


def _audit_gate(tallies: dict[str, Tally], batch: _Batch, summary: BronzeSummary) -> AuditGate:
    """The bronze gate on the batch's audit: its checks' tallies and the batch's figures."""
    table = batch.table
    figures = Figures(sum((summary.quarantined or {}).values()), summary.quarantined_share or 0.0)
    return AuditGate(table.name, "bronze", Audit(figures, tallies), bronze_checks(table), batch.lake, batch.batch_id,
                     table.quality.actions)


def _commit(engine: DeltaEngine, rows_at: Callable[[int], Rows], batch: _Batch, summary: BronzeSummary) -> int | None:
    """Append the events (`rows_at(version)`: as bronze rows of that version) in one commit (a reprocess replaces
    the files' earlier rows in one commit: bronze never holds a line twice). Returns the commit's version, None
    when nothing was written."""
    path = batch.lake.bronze(batch.table.name)
    version_before = engine.version(path)
    bronze_version = 0 if version_before is None else version_before + 1
    rows = rows_at(bronze_version)
    committed = None
    if batch.again:
        # every file read is in the predicate: files landed since the last run are read too, and a replace
        # refuses rows its predicate does not cover
        committed = engine.replace(rows, path, _files_predicate(engine, [f.path for f in batch.files]))
    elif summary.events:
        committed = engine.append(rows, path, small=batch.small)
    if committed == version_before:  # a reprocess that removed and added nothing: delta-spark makes no commit
        committed = None
    if committed is not None and committed != bronze_version:
        raise ConcurrentWrite(batch.table.name, "bronze", f"another writer committed version {committed - 1} "
                              "during this run; runs of one table must be serialized")
    summary.version = committed if committed is not None else version_before
    return committed


def _in_bronze(engine: DeltaEngine, lake: Lake, table: str, files: list[LandingFile]) -> list[str]:
    """Those of `files` bronze has taken before (by the ingest log)."""
    if engine.version(lake.bronze(table)) is None:
        return []
    done = ingested_files(lake, table)
    return [f.path for f in files if f.path in done]


def _files_predicate(engine: DeltaEngine, paths: list[str]) -> str:
    """Rows of these landing files (a landing path may hold quotes: each is a literal of the engine's SQL)."""
    return f"_source_file IN ({', '.join(engine.literal(p) for p in sorted(paths))})"


INGEST_LOG_SCHEMA = ("table STRING, file STRING, size BIGINT, modified_ms BIGINT, lines BIGINT, events BIGINT, "
                     "tombstones BIGINT, quarantined BIGINT, _batch_id STRING, bronze_version BIGINT, ingested_at TIMESTAMP")


def log_files(engine: DeltaEngine, lake: Lake, table: str,
              files: dict[str, tuple[Any, ...]], batch_id: str, bronze_version: int | None) -> None:
    """Record files as ingested: (size, modified_ms, lines, events, tombstones, quarantined) per path;
    `bronze_version` is the bronze commit that holds their rows (None when they had no events)."""
    logged_at = now()
    rows = [(table, path, *stats, batch_id, bronze_version, logged_at) for path, stats in sorted(files.items())]
    engine.append(driver_rows(rows, INGEST_LOG_SCHEMA), lake.ingest_log(table))


def _recover_unlogged_files(spark: SparkSession, engine: DeltaEngine, lake: Lake, table: str, batch_id: str,
                            logged_versions: list[int | None]) -> set[str]:
    """Bronze commits its rows before the ingest log (whose `logged_versions` are given). If a run died between
    the two, bronze's rows newer than the last logged commit name the files it already holds: log them now,
    never append them twice."""
    current = engine.version(lake.bronze(table))
    if current is None:
        return set()
    logged = max((v for v in logged_versions if v is not None), default=-1)  # version 0 is a real commit, not "none"
    if current <= logged:
        return set()
    bronze = engine.read(spark, lake.bronze(table))
    assert bronze is not None
    held = bronze.where(F.col("_bronze_version") > logged).groupBy("_source_file", "_bronze_version").agg(
        F.count(F.lit(1)).alias("events")).collect()
    for version in sorted({r["_bronze_version"] for r in held}):
        # sizes, line and tombstone counts of those files were lost with the run: left null
        files = {r["_source_file"]: (None, None, None, r["events"], None, None) for r in held if r["_bronze_version"] == version}
        log_files(engine, lake, table, files, batch_id, version)
    return {r["_source_file"] for r in held}
