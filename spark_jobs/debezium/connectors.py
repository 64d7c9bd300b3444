"""Debezium connectors' log positions and transaction ids: one entry per connector, the only place ordering
rules, and the rules that match a change event to its transaction's BEGIN and END, live.

Each entry turns an event's `source` block into a sortable text (`_seq`): fixed-width fields joined by
'|', so comparing two texts compares the positions. `ts_ms` is never used: it ties and it is a wall
clock (docs/architecture.md, "Ordering"); MongoDB's source.ts_ms is the exception: there it is the oplog
position. A connector not listed here needs `sequence_by` in tables.yaml.

Snapshot events share one position with the streaming events that may follow at it; each rule ranks
them first: `{snapshot}` is '0' for a snapshot event and '1' for a streaming one.

Changing a rule's text for events it already handled would compare new positions with the stored
`_seq` of silver rows: keep a rule's output unchanged for the events it accepted before.

With provide.transaction.metadata, BEGIN and END events (on the `<prefix>.transaction` topic) and each change event
(its `transaction.id`) name the transaction. Most connectors give every record of a transaction the same id; the
PostgreSQL connector writes `<txId>:<LSN of that record>`, so only the part before ':' (source.txId) is shared.
Each entry's `transaction_key` is the part of an id its records share: a change event keeps its key (silver's
`_transaction_id`), and an END matches the events whose key is one of `transaction_keys_sql`'s for its id.
"""

from __future__ import annotations

from collections.abc import Callable
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
    # SQL over `{id}` (a record's transaction id): what every record of the transaction shares
    transaction_key: str = "{id}"


def _num(field: str, width: int = 20) -> str:
    return f"lpad(_src.{field}, {width}, '0')"


CONNECTORS = (
    Connector(
        "postgresql", ("postgresql",), "_src.lsn IS NOT NULL",
        f"CASE WHEN _src.lsn IS NOT NULL THEN concat_ws('|', {_num('lsn')}, {SNAPSHOT_RANK}) END",
        # `<txId>:<lsn>`, the LSN the record's own (BEGIN's, each event's, END's); txId is the server's xid
        "substring_index({id}, ':', 1)"),
    # MySQL and MariaDB: the GTID (`<server uuid>:<n>`, `<domain>-<server>-<n>`), or `file=<binlog>,pos=<offset>`
    # of the transaction's BEGIN without GTIDs: the same on every record. SQL Server and Db2: the commit LSN; Oracle:
    # the XID (hex); MongoDB: `<lsid>:<txnNumber>`: each the same on every record of the transaction
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


def transaction_key_sql(id_column: str) -> str:
    """SQL over `_src` (as for `sequence_sql`) and the column `id_column` (the event's transaction id): the part of
    it every record of the transaction shares, by the event's connector; the whole id for a connector not listed."""
    return _per_connector(lambda c: c.transaction_key.format(id=id_column), otherwise=id_column)


def transaction_keys_sql(id_column: str) -> str:
    """SQL over the column `id_column` (a BEGIN or END event's id): the keys it may share with its change events, one
    per connector rule. A transaction topic carries no connector name, and one connector writes it: its events' keys
    follow that connector's rule, and another rule's key for the same id never has the shape that connector's keys
    do (an id split at ':' is never a whole id of a connector that keeps its ids whole, and the other way round)."""
    rules = dict.fromkeys(c.transaction_key.format(id=id_column) for c in CONNECTORS)
    return f"array_distinct(array({', '.join(rules)}))"


def sequence_sql() -> str:
    """SQL over `_src` (the source block parsed with SOURCE_FIELDS) and `op`: the event's `_seq`."""
    return _per_connector(lambda c: c.position, otherwise="NULL")


def _per_connector(rule: Callable[[Connector], str], otherwise: str) -> str:
    """SQL over `_src`: `rule` of the event's connector, by source.connector, or without one by the fields present;
    `otherwise` for a connector not listed."""
    named = " ".join(f"WHEN lower(_src.connector) IN ({', '.join(repr(n) for n in c.names)}) THEN {rule(c)}"
                     for c in CONNECTORS)
    detected = " ".join(f"WHEN {c.detect} THEN {rule(c)}" for c in CONNECTORS)
    return f"CASE {named} WHEN _src.connector IS NULL THEN CASE {detected} ELSE {otherwise} END ELSE {otherwise} END"
