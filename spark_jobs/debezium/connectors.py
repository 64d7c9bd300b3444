"""Debezium connectors' log positions: one entry per connector, the only place ordering rules live.

Each entry turns an event's `source` block into a sortable text (`_seq`): fixed-width fields joined by
'|', so comparing two texts compares the positions. `ts_ms` is never used: it ties and it is a wall
clock (docs/architecture.md, "Ordering"); MongoDB's source.ts_ms is the exception: there it is the oplog
position. A connector not listed here needs `sequence_by` in tables.yaml.

Snapshot events share one position with the streaming events that may follow at it; each rule ranks
them first: `{snapshot}` is '0' for a snapshot event and '1' for a streaming one.

Changing a rule's text for events it already handled would compare new positions with the stored
`_seq` of silver rows: keep a rule's output unchanged for the events it accepted before.
"""

from __future__ import annotations

from dataclasses import dataclass

# source.snapshot values that mark a snapshot event (besides op = 'r')
SNAPSHOT_MARKERS = ("true", "first", "last", "first_in_data_collection", "last_in_data_collection")
SNAPSHOT_RANK = (f"CASE WHEN op = 'r' OR lower(coalesce(_src.snapshot, 'false')) IN "
                 f"({', '.join(repr(m) for m in SNAPSHOT_MARKERS)}) THEN '0' ELSE '1' END")


@dataclass(frozen=True)
class Connector:
    name: str
    names: tuple[str, ...]  # values of source.connector
    detect: str  # SQL over `_src`: the connector told by its fields, for records without source.connector
    position: str  # SQL over `_src`: the sortable position; null when the event lacks one


def _num(field: str, width: int = 20) -> str:
    return f"lpad(_src.{field}, {width}, '0')"


CONNECTORS = (
    Connector(
        "postgresql", ("postgresql",), "_src.lsn IS NOT NULL",
        f"CASE WHEN _src.lsn IS NOT NULL THEN concat_ws('|', {_num('lsn')}, {SNAPSHOT_RANK}) END"),
    Connector(
        "mysql", ("mysql", "mariadb"), "_src.file IS NOT NULL AND _src.pos IS NOT NULL",
        "CASE WHEN _src.file IS NOT NULL AND _src.pos IS NOT NULL THEN concat_ws('|', "
        f"lpad(regexp_extract(_src.file, '([0-9]+)$', 1), 10, '0'), {_num('pos')}, {SNAPSHOT_RANK}, "
        "lpad(coalesce(_src.row, '0'), 10, '0')) END"),
    # snapshot events carry commit_lsn only (change_lsn and event_serial_no are null): 'commit|' is a prefix
    # of every change's text at that commit, so it sorts first; streaming events keep the text they always had
    Connector(
        "sqlserver", ("sqlserver",), "_src.commit_lsn IS NOT NULL AND _src.scn IS NULL",
        "CASE WHEN _src.commit_lsn IS NOT NULL AND _src.change_lsn IS NULL THEN concat(_src.commit_lsn, '|') "
        "WHEN _src.commit_lsn IS NOT NULL THEN concat_ws('|', _src.commit_lsn, _src.change_lsn, "
        "lpad(coalesce(_src.event_serial_no, '0'), 20, '0')) END"),
    Connector(
        "db2", ("db2",), "false",  # its fields are SQL Server's: without source.connector, that rule orders it alike
        "CASE WHEN _src.commit_lsn IS NOT NULL THEN concat(_src.commit_lsn, '|', coalesce(_src.change_lsn, '')) END"),
    # MongoDB's oplog position is its cluster time: seconds (source.ts_ms, a multiple of 1000, from the oplog entry,
    # not a wall clock) and an increment within the second (source.ord). A snapshot event carries the position the
    # snapshot started at, where streaming resumes
    Connector(
        "mongodb", ("mongodb",), "_src.ord IS NOT NULL AND _src.ts_ms IS NOT NULL",
        f"CASE WHEN _src.ts_ms IS NOT NULL AND (_src.ord IS NOT NULL OR {SNAPSHOT_RANK} = '0') THEN concat_ws('|', "
        f"{_num('ts_ms')}, lpad(coalesce(_src.ord, '0'), 10, '0'), {SNAPSHOT_RANK}) END"),
    # LogMiner emits a transaction's changes at its commit: commit_scn orders transactions, then scn, the
    # redo record (rs_id) and SQL sequence (ssn) order the changes inside one. Snapshot events have only scn.
    Connector(
        "oracle", ("oracle",), "_src.scn IS NOT NULL",
        f"CASE WHEN _src.scn IS NOT NULL THEN concat_ws('|', lpad(coalesce(_src.commit_scn, _src.scn), 20, '0'), "
        f"{SNAPSHOT_RANK}, {_num('scn')}, coalesce(trim(_src.rs_id), ''), lpad(coalesce(_src.ssn, '0'), 10, '0')) END"),
)

# every source field a rule reads, parsed once per event
SOURCE_FIELDS = ("connector", "snapshot", "lsn", "file", "pos", "row", "commit_lsn", "change_lsn", "event_serial_no",
                 "scn", "commit_scn", "rs_id", "ssn", "ord", "ts_ms")


def sequence_sql() -> str:
    """SQL over `_src` (the source block parsed with SOURCE_FIELDS) and `op`: the event's `_seq`."""
    named = " ".join(f"WHEN lower(_src.connector) IN ({', '.join(repr(n) for n in c.names)}) THEN {c.position}"
                     for c in CONNECTORS)
    detected = " ".join(f"WHEN {c.detect} THEN {c.position}" for c in CONNECTORS)
    return f"CASE {named} WHEN _src.connector IS NULL THEN CASE {detected} END END"
