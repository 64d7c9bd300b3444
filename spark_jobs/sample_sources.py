"""The demo source tables the generator replays (generate.py): their columns, keys, connector and how
their rows look, modelled on Debezium's tutorial databases (inventory, pagila) and a bank's customers."""

from __future__ import annotations

import base64
import datetime as dt
import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

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
