"""Sample Debezium change files in the Kafka Connect S3 sink layout (DESIGN.md 3.1).

Each demo source table replays a realistic connector history: a snapshot phase (op=r, all rows at one
log position), then transactions of inserts, updates and deletes. PostgreSQL tables use lsn/txId with
the default replica identity (updates carry no `before`, deletes carry only the key in `before`) and a
Kafka tombstone (`null`) after each delete; MySQL tables use binlog file/pos/row. Some topics carry the
schema envelope, some do not. The generator also returns each table's final state, so tests can compare
silver with what the source database would hold.

Pure Python: no Spark. Deterministic for a given seed.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from spark_jobs.registry import TableConfig

EPOCH = dt.date(1970, 1, 1)
FIRST_NAMES = ["Anne", "Bob", "Chen", "Dana", "Edward", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kemal", "Lea",
               "Mina", "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sven", "Tara"]
LAST_NAMES = ["Kretchmar", "Walker", "Thomas", "Bailey", "Guinness", "Monroe", "Berry", "Nolte", "Wood", "Tracy"]
CITIES = [("Austin", "TX"), ("Dallas", "TX"), ("Boston", "MA"), ("Denver", "CO"), ("Seattle", "WA"),
          ("Portland", "OR"), ("Miami", "FL"), ("Chicago", "IL"), ("Albany", "NY"), ("Fresno", "CA")]
PRODUCTS = ["scooter", "car battery", "12-pack drill bits", "hammer", "rocks", "jacket", "spare tire", "kettle"]
DOMAINS = ["example.com", "acme.org", "noanswer.org", "walker.com"]
RATINGS = ["G", "PG", "PG-13", "R", "NC-17"]
WORDS = ["Epic", "Drama", "Astounding", "Saga", "Mad", "Scientist", "Boat", "Lacklusture", "Reflection", "Moose"]


@dataclass(frozen=True)
class Column:
    """A source column and how the connector encodes it (Kafka Connect type + Debezium logical name)."""

    name: str
    connect_type: str  # int16 | int32 | int64 | float64 | boolean | string | bytes
    logical: str | None = None  # e.g. io.debezium.time.Date, org.apache.kafka.connect.data.Decimal
    parameters: dict[str, str] | None = None

    def encode(self, value: Any) -> Any:
        """Logical value -> the JSON value the connector writes."""
        if value is None:
            return None
        if self.logical == "io.debezium.time.Date":
            return (value - EPOCH).days
        if self.logical == "io.debezium.time.MicroTimestamp":
            return int((value - dt.datetime(1970, 1, 1)).total_seconds()) * 1_000_000 + value.microsecond
        if self.logical == "org.apache.kafka.connect.data.Decimal":
            scale = int((self.parameters or {})["scale"])
            unscaled = int(value.scaleb(scale))
            length = max(1, (unscaled.bit_length() + 8) // 8)
            return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()
        return value

    def schema(self, optional: bool) -> dict[str, Any]:
        spec: dict[str, Any] = {"type": self.connect_type, "optional": optional}
        if self.logical:
            spec.update(name=self.logical, version=1)
        if self.parameters:
            spec["parameters"] = dict(self.parameters)
        spec["field"] = self.name
        return spec


RowFactory = Callable[[random.Random, tuple[Any, ...]], dict[str, Any]]


@dataclass(frozen=True)
class SourceProfile:
    """A demo source table: its columns, key, connector and how its rows look."""

    topic: str
    columns: tuple[Column, ...]
    keys: tuple[str, ...]
    connector: str  # postgresql | mysql
    envelope: bool
    new_key: Callable[[random.Random, int], tuple[Any, ...]]  # (rng, n-th key) -> key values
    row: RowFactory
    mutable: tuple[str, ...]  # columns an update changes


def _days(rng: random.Random) -> dt.date:
    return EPOCH + dt.timedelta(days=rng.randint(15_000, 20_000))


def _stamp(rng: random.Random) -> dt.datetime:
    return dt.datetime(2020, 1, 1) + dt.timedelta(seconds=rng.randint(0, 150_000_000), microseconds=rng.randint(0, 999_999))


def _customer(rng: random.Random, key: tuple[Any, ...]) -> dict[str, Any]:
    city, state = rng.choice(CITIES)
    return {"custkey": key[0], "first_name": rng.choice(FIRST_NAMES), "city": city, "state": state,
            "fico": rng.randint(300, 850), "registration_date": _days(rng)}


def _product(rng: random.Random, key: tuple[Any, ...]) -> dict[str, Any]:
    name = rng.choice(PRODUCTS)
    return {"id": key[0], "name": name, "description": f"{rng.choice(WORDS).lower()} {name}",
            "weight": round(rng.uniform(0.1, 12.0), 3)}


def _inventory_customer(rng: random.Random, key: tuple[Any, ...]) -> dict[str, Any]:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    return {"id": key[0], "first_name": first, "last_name": last,
            "email": f"{first.lower()}.{last.lower()}{key[0]}@{rng.choice(DOMAINS)}"}


def _film(rng: random.Random, key: tuple[Any, ...]) -> dict[str, Any]:
    title = f"{rng.choice(WORDS)} {rng.choice(WORDS)}".upper()
    return {"film_id": key[0], "title": title, "description": f"A {rng.choice(WORDS)} of a {rng.choice(WORDS)}",
            "release_year": rng.randint(1990, 2024), "language_id": 1, "rental_duration": rng.randint(3, 7),
            "rental_rate": Decimal(rng.choice(["0.99", "2.99", "4.99"])), "length": rng.randint(46, 185),
            "replacement_cost": Decimal(rng.randint(999, 2999)).scaleb(-2), "rating": rng.choice(RATINGS),
            "last_update": _stamp(rng)}


def _actor(rng: random.Random, key: tuple[Any, ...]) -> dict[str, Any]:
    return {"actor_id": key[0], "first_name": rng.choice(FIRST_NAMES).upper(),
            "last_name": rng.choice(LAST_NAMES).upper(), "last_update": _stamp(rng)}


def _film_actor(rng: random.Random, key: tuple[Any, ...]) -> dict[str, Any]:
    return {"actor_id": key[0], "film_id": key[1], "last_update": _stamp(rng)}


def _sequential(start: int) -> Callable[[random.Random, int], tuple[Any, ...]]:
    return lambda rng, n: (start + n,)


def _pair(rng: random.Random, n: int) -> tuple[Any, ...]:
    # (actor_id, film_id) pairs enumerated without repeats; small ids so they join with actor and film
    return (1 + n % 200, 1 + n // 200)


_TS = Column("last_update", "int64", "io.debezium.time.MicroTimestamp")
PROFILES: dict[str, SourceProfile] = {
    p.topic: p
    for p in [
        SourceProfile(
            "burst.burst_bank.customers",
            (Column("custkey", "int32"), Column("first_name", "string"), Column("city", "string"),
             Column("state", "string"), Column("fico", "int32"),
             Column("registration_date", "int32", "io.debezium.time.Date")),
            ("custkey",), "postgresql", True, _sequential(1), _customer, ("city", "state", "fico")),
        SourceProfile(
            "dbserver1.inventory.products",
            (Column("id", "int32"), Column("name", "string"), Column("description", "string"),
             Column("weight", "float64")),
            ("id",), "mysql", True, _sequential(101), _product, ("description", "weight")),
        SourceProfile(
            "dbserver1.inventory.customers",
            (Column("id", "int32"), Column("first_name", "string"), Column("last_name", "string"),
             Column("email", "string")),
            ("id",), "mysql", True, _sequential(1001), _inventory_customer, ("last_name", "email")),
        SourceProfile(
            "pagila.public.film",
            (Column("film_id", "int32"), Column("title", "string"), Column("description", "string"),
             Column("release_year", "int32"), Column("language_id", "int16"), Column("rental_duration", "int16"),
             Column("rental_rate", "bytes", "org.apache.kafka.connect.data.Decimal",
                    {"scale": "2", "connect.decimal.precision": "4"}),
             Column("length", "int16"),
             Column("replacement_cost", "bytes", "org.apache.kafka.connect.data.Decimal",
                    {"scale": "2", "connect.decimal.precision": "5"}),
             Column("rating", "string", "io.debezium.data.Enum", {"allowed": ",".join(RATINGS)}), _TS),
            ("film_id",), "postgresql", True, _sequential(1), _film, ("rental_rate", "rating", "last_update")),
        SourceProfile(
            "pagila.public.actor",
            (Column("actor_id", "int32"), Column("first_name", "string"), Column("last_name", "string"), _TS),
            ("actor_id",), "postgresql", False, _sequential(1), _actor, ("last_name", "last_update")),
        SourceProfile(
            "pagila.public.film_actor",
            (Column("actor_id", "int16"), Column("film_id", "int16"), _TS),
            ("actor_id", "film_id"), "postgresql", False, _pair, _film_actor, ("last_update",)),
    ]
}


@dataclass
class Options:
    rows: int = 200  # snapshot rows per table
    changes: int = 400  # streaming change events per table
    seed: int = 7
    records_per_file: int = 250  # the sink's flush.size
    partitions: int = 2  # Kafka partitions per topic
    compress: bool = False  # .json.gz instead of .json
    start_offset: int = 0  # first Kafka offset (continue a topic across generate calls)
    start_ms: int = 1_700_000_000_000
    batches: int = 0  # > 0: the snapshot lands first, then the changes in this many batches of files
    redeliver: float = 0.0  # share of change events the sink receives twice (at-least-once delivery)
    shuffle: bool = False  # change events of a batch land in random order, not in commit order
    mix: tuple[int, int, int] = (20, 70, 10)  # percent of change events that insert, update, delete


@dataclass
class GeneratedTable:
    table: str
    topic: str
    final_rows: dict[tuple[Any, ...], dict[str, Any]]  # key -> row (logical values)
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
    log = _Log(profile.connector, rng)
    encode = {c.name: c.encode for c in profile.columns}
    live: list[tuple[Any, ...]] = []  # the keys of `state` in insertion order, indexable for random picks
    clock = opts.start_ms
    next_key = 0
    insert_below, update_below = opts.mix[0] / 100, (opts.mix[0] + opts.mix[1]) / 100

    def image(row: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if row is None else {c.name: encode[c.name](row.get(c.name)) for c in profile.columns}

    def record(op: str, key: tuple[Any, ...], before: dict[str, Any] | None, after: dict[str, Any] | None,
               snapshot: str, row: int, commit_ms: int) -> Record:
        payload = {"before": image(before), "after": image(after),
                   "source": log.source(profile.topic, commit_ms, snapshot, row), "op": op,
                   "ts_ms": commit_ms + rng.randint(5, 400), "transaction": None}
        return key, payload

    def insert() -> tuple[Any, ...]:
        nonlocal next_key
        key = profile.new_key(rng, next_key)
        next_key += 1
        state[key] = profile.row(rng, key)
        live.append(key)
        return key

    # snapshot: every row at one log position (pg: one lsn; mysql: one binlog pos)
    log.begin()
    for i in range(opts.rows):
        key = insert()
        marker = "first" if i == 0 else "last" if i == opts.rows - 1 else "true"
        clock += rng.randint(0, 1)  # the snapshot reads many rows per millisecond: ts_ms ties
        yield 0, [record("r", key, None, state[key], marker, 0, clock)]

    done = 0
    while done < opts.changes:
        log.begin()
        clock += rng.randint(1, 2_000)
        for row_in_tx in range(min(rng.randint(1, 5), opts.changes - done)):
            phase = 1 + done * opts.batches // opts.changes if opts.batches else 0
            roll = rng.random()
            if roll < insert_below or len(live) < 2:
                key = insert()
                yield phase, [record("c", key, None, state[key], "false", row_in_tx, clock)]
            elif roll < update_below:
                key = live[rng.randrange(len(live))]  # the same draw as rng.choice(live)
                fresh = profile.row(rng, key)
                state[key] = {**state[key], **{c: fresh[c] for c in profile.mutable}}
                # default replica identity: no before image
                yield phase, [record("u", key, None, state[key], "false", row_in_tx, clock)]
            else:
                index = rng.randrange(len(live))
                key = live.pop(index)
                del state[key]
                key_only = dict(zip(profile.keys, key, strict=False))
                unit = [record("d", key, key_only, None, "false", row_in_tx, clock)]
                if profile.connector == "postgresql":  # tombstones.on.delete=true (the default)
                    unit.append((key, None))
                yield phase, unit
            done += 1


class _Sink:
    """Writes records as the S3 sink does: a key always lands in one partition; per partition, a file per
    flush.size records, named by its first Kafka offset. `flush` writes partial files (the end of a batch)."""

    def __init__(self, profile: SourceProfile, landing: Path, opts: Options):
        self.profile, self.landing, self.opts = profile, landing, opts
        self.schema = _envelope_schema(profile) if profile.envelope else None
        self.offsets = {p: opts.start_offset for p in range(opts.partitions)}
        self.pending: dict[int, list[str]] = {p: [] for p in range(opts.partitions)}
        self.written: list[str] = []

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
        folder = self.landing / "topics" / self.profile.topic / f"partition={partition}"
        folder.mkdir(parents=True, exist_ok=True)
        ext = ".json.gz" if self.opts.compress else ".json"
        path = folder / f"{self.profile.topic}+{partition}+{self.offsets[partition]:010d}{ext}"
        self.offsets[partition] += len(lines)
        text = "\n".join(lines) + "\n"
        if self.opts.compress:
            path.write_bytes(gzip.compress(text.encode(), mtime=0))
        else:
            path.write_text(text)
        self.written.append(str(path))


def _partition(key: tuple[Any, ...], partitions: int) -> int:
    # stable across processes (unlike hash()), like Kafka's murmur2 on the serialized key
    return sum(ord(ch) for ch in json.dumps(list(key))) % partitions


def write_table(profile: SourceProfile, table: str, landing: Path, opts: Options, index: int) -> GeneratedTable:
    """Generate the table's history and land it phase by phase (`batches`: the files of each phase). Within a
    phase, `redeliver` sends a share of the change events again later (a connector restart: the same events
    at new offsets) and `shuffle` lands the change events in random order (a delete keeps its tombstone)."""
    rng = random.Random(opts.seed * 1_000 + index)
    delivery = random.Random(f"{opts.seed}-delivery-{index}")  # apart, so the history is the same either way
    state: State = {}
    sink, out = _Sink(profile, landing, opts), GeneratedTable(table, profile.topic, state)
    held: list[list[tuple[int, str]]] = []  # the phase's change events, when they are re-sent or reordered

    def send(unit: list[tuple[int, str]]) -> None:
        for partition, text in unit:
            sink.add(partition, text)
            out.events += text != "null"
            out.tombstones += text == "null"

    def land() -> None:
        held.extend([unit for unit in held if delivery.random() < opts.redeliver] if opts.redeliver else [])
        if opts.shuffle:
            delivery.shuffle(held)
        for unit in held:
            send(unit)
        held.clear()
        out.batches.append(sink.flush())

    current = 0
    for phase, unit in history(profile, opts, rng, state):
        if phase != current:
            land()
            current = phase
        lines = [sink.line(key, payload) for key, payload in unit]
        is_change = unit[0][1] is not None and unit[0][1]["op"] != "r"
        if is_change and (opts.redeliver or opts.shuffle):
            held.append(lines)
        else:
            send(lines)
    land()
    out.files = sorted(f for batch in out.batches for f in batch)
    return out


def generate(tables: list[TableConfig], landing: str | Path, opts: Options) -> list[GeneratedTable]:
    out = []
    for index, table in enumerate(tables):
        profile = PROFILES.get(table.topic)
        if profile is None:
            raise ValueError(f"table {table.name!r}: no sample profile for topic {table.topic!r} "
                             f"(known: {', '.join(PROFILES)})")
        out.append(write_table(profile, table.name, Path(landing), opts, index))
    return out
