"""Sample Debezium change files in the Kafka Connect S3 sink layout (docs/architecture.md, "Landing layout").

Each demo source table replays a realistic connector history: a snapshot phase (op=r, all rows at one
log position), then transactions of inserts, updates and deletes. PostgreSQL tables use lsn/txId with
the default replica identity (updates carry no `before`, deletes carry only the key in `before`) and a
Kafka tombstone (`null`) after each delete; MySQL tables use binlog file/pos/row. Some topics carry the
schema envelope, some do not. The generator also returns each table's final state, so tests can compare
silver with what the source database would hold.

Pure Python: no Spark. Deterministic for a given seed.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spark_jobs.registry import TableConfig
from spark_jobs.sample_avro import avro_file
from spark_jobs.sample_sources import PROFILES, Column, SourceProfile
from spark_jobs.storage import lake_files

__all__ = ["PROFILES", "Column", "GeneratedTable", "Options", "generate"]


@dataclass
class Options:
    rows: int = 200  # snapshot rows per table
    changes: int = 400  # streaming change events per table
    seed: int = 7
    records_per_file: int = 250  # the sink's flush.size
    partitions: int = 2  # Kafka partitions per topic
    compress: bool = False  # .json.gz instead of .json (Avro: deflate blocks)
    format: str = "json"  # json | avro (the sink's AvroFormat: no tombstones, logical types in the Avro schema)
    start_offset: int = 0  # first Kafka offset (continue a topic across generate calls)
    start_ms: int = 1_700_000_000_000  # the source time of the first snapshot row (reproducible files)
    ends_ms: int | None = None  # instead: the source time of the newest commit (e.g. now), start_ms moved to suit
    batches: int = 0  # > 0: the snapshot lands first, then the changes in this many batches of files
    redeliver: float = 0.0  # share of change events the sink receives twice (at-least-once delivery)
    shuffle: bool = False  # change events of a batch land in random order, not in commit order
    mix: tuple[int, int, int] = (20, 70, 10)  # percent of change events that insert, update, delete
    # land only these phases (0: the snapshot, 1..batches: the change batches); the others are generated, not
    # written, so a later call with the same options lands them at the offsets they would have had
    phases: frozenset[int] | None = None


@dataclass
class GeneratedTable:
    table: str
    topic: str
    final_rows: dict[tuple[Any, ...], dict[str, Any]]  # key -> row (logical values)
    snapshot_rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)  # the state the snapshot read
    events: int = 0
    tombstones: int = 0
    files: list[str] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)  # files landed per phase (snapshot, then batches)


class _Log:
    """The connector's position in the source's log: PostgreSQL lsn/txId or MySQL binlog file/pos/row."""

    def __init__(self, connector: str, rng: random.Random):
        self.connector, self.rng = connector, rng
        self.lsn, self.tx = 24_023_128, 555
        self.binlog, self.pos = 3, 154

    def begin(self) -> None:
        self.tx += 1
        if self.connector == "mysql":
            if self.rng.random() < 0.02:  # binlog rotation: the position restarts in a new file
                self.binlog, self.pos = self.binlog + 1, 4
            self.pos += self.rng.randint(200, 900)

    def source(self, topic: str, ts_ms: int, snapshot: str, row: int) -> dict[str, Any]:
        server, schema_or_db, table = topic.split(".")
        if self.connector == "postgresql":
            if snapshot == "false":
                self.lsn += self.rng.randint(40, 400)
            return {"version": "2.7.3.Final", "connector": "postgresql", "name": server, "ts_ms": ts_ms,
                    "snapshot": snapshot, "db": server.split("_")[0], "sequence": f'[null,"{self.lsn}"]',
                    "schema": schema_or_db, "table": table, "txId": self.tx, "lsn": self.lsn, "xmin": None}
        return {"version": "2.7.3.Final", "connector": "mysql", "name": server, "ts_ms": ts_ms,
                "snapshot": snapshot, "db": schema_or_db, "sequence": None, "table": table, "server_id": 223344,
                "gtid": None, "file": f"mysql-bin.{self.binlog:06d}", "pos": self.pos, "row": row,
                "thread": 7 if snapshot == "false" else None, "query": None}


def _envelope_schema(profile: SourceProfile) -> dict[str, Any]:
    def value(optional_fields: bool) -> dict[str, Any]:
        return {"type": "struct", "optional": True, "name": f"{profile.topic}.Value",
                "fields": [c.schema(optional_fields or c.name not in profile.keys) for c in profile.columns]}

    source_fields = [{"type": "string", "optional": False, "field": "version"},
                     {"type": "string", "optional": False, "field": "connector"},
                     {"type": "int64", "optional": False, "field": "ts_ms"}]
    return {"type": "struct", "optional": False, "name": f"{profile.topic}.Envelope", "version": 2, "fields": [
        {**value(False), "field": "before"}, {**value(False), "field": "after"},
        {"type": "struct", "optional": False, "name": f"io.debezium.connector.{profile.connector}.Source",
         "fields": source_fields, "field": "source"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ]}


Record = tuple[tuple[Any, ...], dict[str, Any] | None]  # (Kafka key, value); value None = tombstone
# One change event as the sink receives it: its record and, for a PostgreSQL delete, the tombstone after it
Unit = list[Record]


State = dict[tuple[Any, ...], dict[str, Any]]  # key -> row (logical values)


def history(profile: SourceProfile, opts: Options, rng: random.Random, state: State) -> Iterator[tuple[int, Unit]]:
    """The table's change log in commit order, as (phase, unit): phase 0 is the snapshot, phases 1..batches
    the change batches (everything is phase 0 when `opts.batches` is 0). `state` ends as the final state."""
    replay = _Replay(profile, rng, state, _Log(profile.connector, rng))
    clock = opts.start_ms
    insert_below, update_below = opts.mix[0] / 100, (opts.mix[0] + opts.mix[1]) / 100
    # snapshot: every row at one log position (pg: one lsn; mysql: one binlog pos)
    replay.log.begin()
    for i in range(opts.rows):
        key = replay.insert()
        marker = "first" if i == 0 else "last" if i == opts.rows - 1 else "true"
        clock += rng.randint(0, 1)  # the snapshot reads many rows per millisecond: ts_ms ties
        yield 0, [replay.record("r", key, None, state[key], marker, 0, clock)]
    done = 0
    while done < opts.changes:
        replay.log.begin()
        clock += rng.randint(1, 2_000)
        for row_in_tx in range(min(rng.randint(1, 5), opts.changes - done)):
            phase = 1 + done * opts.batches // opts.changes if opts.batches else 0
            roll = rng.random()
            kind = "c" if roll < insert_below or len(replay.live) < 2 else "u" if roll < update_below else "d"
            yield phase, replay.change(kind, row_in_tx, clock)
            done += 1


class _Replay:
    """One table's source rows as a connector sees them change: `state` (key -> row) and its keys in
    insertion order (`live`, indexable for random picks)."""

    def __init__(self, profile: SourceProfile, rng: random.Random, state: State, log: _Log):
        self.profile, self.rng, self.state, self.log = profile, rng, state, log
        self.encode = {c.name: c.encode for c in profile.columns}
        self.live: list[tuple[Any, ...]] = []
        self.next_key = 0

    def image(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if row is None else {c.name: self.encode[c.name](row.get(c.name)) for c in self.profile.columns}

    def record(self, op: str, key: tuple[Any, ...], before: dict[str, Any] | None, after: dict[str, Any] | None,
               snapshot: str, row: int, commit_ms: int) -> Record:
        payload = {"before": self.image(before), "after": self.image(after),
                   "source": self.log.source(self.profile.topic, commit_ms, snapshot, row), "op": op,
                   "ts_ms": commit_ms + self.rng.randint(5, 400), "transaction": None}
        return key, payload

    def insert(self) -> tuple[Any, ...]:
        key = self.profile.new_key(self.rng, self.next_key)
        self.next_key += 1
        self.state[key] = self.profile.row(self.rng, key)
        self.live.append(key)
        return key

    def change(self, kind: str, row_in_tx: int, clock: int) -> Unit:
        """An insert (c), an update (u) of a random live key, or a delete (d) of one."""
        if kind == "c":
            key = self.insert()
            return [self.record("c", key, None, self.state[key], "false", row_in_tx, clock)]
        if kind == "u":
            key = self.live[self.rng.randrange(len(self.live))]  # the same draw as rng.choice(live)
            fresh = self.profile.row(self.rng, key)
            self.state[key] = {**self.state[key], **{c: fresh[c] for c in self.profile.mutable}}
            # default replica identity: no before image
            return [self.record("u", key, None, self.state[key], "false", row_in_tx, clock)]
        key = self.live.pop(self.rng.randrange(len(self.live)))
        del self.state[key]
        key_only = dict(zip(self.profile.keys, key, strict=False))
        unit = [self.record("d", key, key_only, None, "false", row_in_tx, clock)]
        if self.profile.connector == "postgresql":  # tombstones.on.delete=true (the default)
            unit.append((key, None))
        return unit


class _Sink:
    """Writes records as the S3 sink does: a key always lands in one partition; per partition, a file per
    flush.size records, named by its first Kafka offset. `flush` writes partial files (the end of a batch)."""

    def __init__(self, profile: SourceProfile, landing: str, opts: Options):
        self.profile, self.landing, self.opts = profile, landing.rstrip("/"), opts
        self.files = lake_files(landing)  # a local folder, or s3://bucket/prefix as the sink writes it
        # Avro records carry their schema in the file: the lines stay plain payloads until written
        self.schema = _envelope_schema(profile) if profile.envelope and opts.format != "avro" else None
        self.offsets = {p: opts.start_offset for p in range(opts.partitions)}
        self.pending: dict[int, list[str]] = {p: [] for p in range(opts.partitions)}
        self.written: list[str] = []
        self.lands = True  # False: the phase being sent takes its offsets but lands no file

    def line(self, key: tuple[Any, ...], payload: dict[str, Any] | None) -> tuple[int, str]:
        text = "null" if payload is None else json.dumps(
            {"schema": self.schema, "payload": payload} if self.schema else payload, separators=(",", ":"))
        return _partition(key, self.opts.partitions), text

    def add(self, partition: int, text: str) -> None:
        self.pending[partition].append(text)
        if len(self.pending[partition]) == self.opts.records_per_file:
            self._write(partition)

    def flush(self) -> list[str]:
        """Write what is pending; returns the files written since the last flush, sorted by path."""
        for partition in self.pending:
            if self.pending[partition]:
                self._write(partition)
        files, self.written = sorted(self.written), []
        return files

    def _write(self, partition: int) -> None:
        lines, self.pending[partition] = self.pending[partition], []
        topic = self.profile.topic
        ext = ".avro" if self.opts.format == "avro" else ".json.gz" if self.opts.compress else ".json"
        path = (f"{self.landing}/topics/{topic}/partition={partition}/"
                f"{topic}+{partition}+{self.offsets[partition]:010d}{ext}")
        self.offsets[partition] += len(lines)  # a tombstone the Avro sink drops still took its offset
        if not self.lands:
            return
        text = "\n".join(lines) + "\n"
        if self.opts.format == "avro":
            data = avro_file(self.profile, [json.loads(line) for line in lines if line != "null"], self.opts.compress)
        else:
            data = gzip.compress(text.encode(), mtime=0) if self.opts.compress else text.encode()
        self.files.write(path, data)  # whole or not at all, as the sink's uploads appear
        self.written.append(path)


def _partition(key: tuple[Any, ...], partitions: int) -> int:
    # stable across processes (unlike hash()), like Kafka's murmur2 on the serialized key
    return sum(ord(ch) for ch in json.dumps(list(key))) % partitions


def write_table(profile: SourceProfile, table: str, landing: str, opts: Options, index: int) -> GeneratedTable:
    """Generate the table's history and land it phase by phase (`batches`: the files of each phase). Within a
    phase, `redeliver` sends a share of the change events again later (a connector restart: the same events
    at new offsets) and `shuffle` lands the change events in random order (a delete keeps its tombstone)."""
    if opts.ends_ms is not None:
        opts = replace(opts, start_ms=opts.start_ms + opts.ends_ms - _newest_commit_ms(profile, opts, index),
                       ends_ms=None)
    rng = _history_rng(opts, index)
    delivery = random.Random(f"{opts.seed}-delivery-{index}")  # apart, so the history is the same either way
    state: State = {}
    sink, out = _Sink(profile, landing, opts), GeneratedTable(table, profile.topic, state)
    held: list[list[tuple[int, str]]] = []  # the phase's change events, when they are re-sent or reordered

    def send(unit: list[tuple[int, str]]) -> None:
        for partition, text in unit:
            sink.add(partition, text)
            out.events += sink.lands and text != "null"
            out.tombstones += sink.lands and text == "null" and opts.format != "avro"

    def land() -> None:
        held.extend([unit for unit in held if delivery.random() < opts.redeliver] if opts.redeliver else [])
        if opts.shuffle:
            delivery.shuffle(held)
        for unit in held:
            send(unit)
        held.clear()
        out.batches.append(sink.flush())

    current = 0
    sink.lands = opts.phases is None or 0 in opts.phases
    for phase, unit in history(profile, opts, rng, state):
        if phase != current:
            land()
            current = phase
            sink.lands = opts.phases is None or phase in opts.phases
        lines = [sink.line(key, payload) for key, payload in unit]
        if unit[0][1] is not None and unit[0][1]["op"] == "r":  # changes replace a row's dict, never alter it
            out.snapshot_rows[unit[0][0]] = state[unit[0][0]]
        is_change = unit[0][1] is not None and unit[0][1]["op"] != "r"
        if is_change and (opts.redeliver or opts.shuffle):
            held.append(lines)
        else:
            send(lines)
    land()
    out.files = sorted(f for batch in out.batches for f in batch)
    return out


def _history_rng(opts: Options, index: int) -> random.Random:
    return random.Random(opts.seed * 1_000 + index)


def _newest_commit_ms(profile: SourceProfile, opts: Options, index: int) -> int:
    """The source time of the history's last event: the history replayed without landing it (its clock depends on
    every draw before it)."""
    newest = opts.start_ms
    for _, unit in history(profile, opts, _history_rng(opts, index), {}):
        payload = unit[0][1]  # a unit starts with its event; only a tombstone after it is None
        newest = newest if payload is None else payload["source"]["ts_ms"]
    return newest


def generate(tables: list[TableConfig], landing: str | Path, opts: Options) -> list[GeneratedTable]:
    out = []
    for index, table in enumerate(tables):
        profile = PROFILES.get(table.topic)
        if profile is None:
            raise ValueError(f"table {table.name!r}: no sample profile for topic {table.topic!r} "
                             f"(known: {', '.join(PROFILES)})")
        out.append(write_table(profile, table.name, str(landing), opts, index))
    return out
