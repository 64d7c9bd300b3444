"""A source column widened by DDL, as MySQL's connector reports it in the schema envelope: silver (its ledger and
history too) takes a type that holds the old and the new values and keeps every row; a change no type widens to
quarantines the values that do not fit, naming both types. The silver pass and a table's own plan."""

from __future__ import annotations

import base64
import copy
import json
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import types as T

from spark_jobs.lake import Lake
from tests.support import land, own_steps, run, silver_rows, summary_line

RECORDED = (Path(__file__).resolve().parents[1] / "fixtures" / "debezium" / "mysql" / "topics"
            / "dbserver1.inventory.customers" / "partition=0" / "dbserver1.inventory.customers+0+0000000000.json")
TOPIC = "dbserver1.inventory.customers"
BIG = 3_000_000_000  # over 2^31: no INT holds it


def _credit_field(credit: tuple[int, int] | str) -> dict:
    """The `credit` column's schema: DECIMAL(precision, scale), or a plain Connect type."""
    if isinstance(credit, str):
        return {"type": credit, "optional": True, "field": "credit"}
    precision, scale = credit
    return {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
            "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)}, "field": "credit"}


def _encoded(value: str, scale: int) -> str:
    """Kafka Connect's Decimal: the unscaled value's big-endian two's complement, base64."""
    unscaled = int(Decimal(value).scaleb(scale))
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


def _event(op: str, row: dict, pos: int, id_type: str, credit: tuple[int, int] | str) -> str:
    """A change as MySQL's connector writes it (the recorded envelope), with `id` of `id_type` and a `credit` column
    (`_credit_field`)."""
    template = json.loads(RECORDED.read_text().splitlines()[0])
    event = copy.deepcopy(template)
    for image in event["schema"]["fields"][:2]:  # before, after
        image["fields"][0]["type"] = id_type
        image["fields"].append(_credit_field(credit))
    payload = event["payload"]
    image = {"id": row["id"], "first_name": "F", "last_name": "L", "email": f"{row['id']}@x.org",
             "credit": None if row.get("credit") is None else float(row["credit"]) if isinstance(credit, str)
             else _encoded(row["credit"], credit[1])}
    payload["before"], payload["after"] = (image, None) if op == "d" else (None, image)
    payload["op"], payload["source"]["pos"], payload["source"]["row"] = op, pos, 0
    return json.dumps(event)


def _schema(engine, path: str) -> dict[str, str]:
    schema = engine.schema(path)
    assert schema is not None
    return {f.name: f.dataType.simpleString() for f in schema.fields if not f.name.startswith("_")}


# both planners: the pass, and a table's own plan (which history takes). What the engine does here (an overwrite at
# the wider types) is each engine's contract, proven on both in tests/unit/test_delta_engines.py
@pytest.mark.parametrize("own_plan", [False, True], ids=["pass", "own-plan"])
def test_a_widened_source_column_widens_silver_and_an_incompatible_one_quarantines(spark, engine, tmp_path, capsys,
                                                                              monkeypatch, own_plan):
    config = tmp_path / "tables.yaml"
    # the own plan's run keeps history too, to check its versions at the wider types
    config.write_text(f"tables:\n  customers:\n    topic: {TOPIC}\n    keys: [id]\n"
                      f"    quality: {{max_quarantined: 100%}}\n{'    history: true' if own_plan else ''}\n")
    landing, lake = tmp_path / "landing", Lake(str(tmp_path / "lake"))

    def land_and_run(offset: int, *events: str) -> str:
        land(landing, TOPIC, list(events), offset)
        if own_plan:
            code, out, err = own_steps(monkeypatch, capsys, config, landing, lake.root)
        else:
            code, out, err = run(capsys, config, landing, lake.root)
        assert (code, err) == (0, "")
        if not own_plan and "no new bronze rows" not in out:  # the pass planned each batch, the widening ones too
            assert "plans its own" not in out and "planned in one pass" in out, out
        return out

    land_and_run(0, *[_event("c", {"id": i, "credit": "10.50"}, 100 + i, "int32", (10, 2)) for i in (1, 2, 3)])
    assert _schema(engine, lake.silver("customers"))["id"] == "int"

    # ALTER TABLE customers MODIFY id BIGINT, MODIFY credit DECIMAL(14,2): the envelope's types widen
    out = land_and_run(3, _event("c", {"id": BIG, "credit": "123456789012.25"}, 200, "int64", (14, 2)),
               _event("u", {"id": 1, "credit": "1.25"}, 201, "int64", (14, 2)),
               _event("d", {"id": 2, "credit": None}, 202, "int64", (14, 2)))
    line = summary_line(out, "silver", "customers")
    assert line["widened"] == "id:int->bigint;credit:decimal(10,2)->decimal(14,2)"
    assert "quarantined" not in line
    wide = {"id": "bigint", "first_name": "string", "last_name": "string", "email": "string", "credit": "decimal(14,2)"}
    assert _schema(engine, lake.silver("customers")) == wide
    assert _schema(engine, lake.tombstones("customers")) == {"id": "bigint"}
    expected = {(1,): Decimal("1.25"), (3,): Decimal("10.50"), (BIG,): Decimal("123456789012.25")}
    # the step's column lineage: each of silver's columns, traced to the envelope's fields (OpenLineage's facet)
    from spark_jobs.report import load_runs

    step = next(s for s in load_runs(lake, 1)[0][1] if s["layer"] == "silver")
    assert step["lineage"]["credit"] == ["customers.after.credit", "customers.before.credit"]
    assert set(step["lineage"]) == set(wide) | {"_op", "_seq", "_source_ts_ms", "_ingested_at", "_batch_id"}
    assert {k: r["credit"] for k, r in silver_rows(spark, engine, lake.root, "customers", ("id",)).items()} == expected
    if own_plan:  # every version kept, at the wider types
        assert _schema(engine, lake.history("customers")) == wide
        history = engine.read(spark, lake.history("customers"))
        assert sorted((r["id"], r["_op"], r["credit"]) for r in history.collect()) == [
            (1, "c", Decimal("10.50")), (1, "u", Decimal("1.25")), (2, "c", Decimal("10.50")), (2, "d", None),
            (3, "c", Decimal("10.50")), (BIG, "c", Decimal("123456789012.25"))]

    # MODIFY credit DECIMAL(14,4): two more fraction digits, two fewer integer ones. Neither type holds the other's
    # values; DECIMAL(16,4) holds both, and silver widens to it. `id` back to INT: it fits silver's BIGINT
    out = land_and_run(6, _event("u", {"id": 3, "credit": "5.5000"}, 300, "int32", (14, 4)),
               _event("u", {"id": BIG, "credit": "1.2345"}, 301, "int64", (14, 4)))
    line = summary_line(out, "silver", "customers")
    assert line["widened"] == "credit:decimal(14,2)->decimal(16,4)" and "quarantined" not in line
    wide["credit"] = "decimal(16,4)"
    assert _schema(engine, lake.silver("customers")) == wide
    expected.update({(3,): Decimal("5.5000"), (BIG,): Decimal("1.2345")})
    assert {k: r["credit"] for k, r in silver_rows(spark, engine, lake.root, "customers", ("id",)).items()} == expected

    # one batch across the three schemas (a first run, a backfill): each event decoded by its own schema (10.50 at
    # scale 2 is not 0.1050 at scale 4), the column typed to hold them all: the same table
    one_run = Lake(str(tmp_path / "one_run"))
    code, out, _ = run(capsys, config, landing, one_run.root)
    assert code == 0 and "quarantined" not in summary_line(out, "silver", "customers")
    assert _schema(engine, one_run.silver("customers")) == wide
    assert {k: r["credit"] for k, r in silver_rows(spark, engine, one_run.root, "customers", ("id",)).items()} == expected

    # MODIFY credit DOUBLE: Delta widens no decimal to a double. A value the decimal holds exactly is kept; one it does
    # not is quarantined, naming both types
    out = land_and_run(9, _event("u", {"id": 3, "credit": "2.5"}, 400, "int64", "float64"),
               _event("u", {"id": 1, "credit": "1.23456789"}, 401, "int64", "float64"))
    assert "widened" not in summary_line(out, "silver", "customers")
    quarantine = engine.read(spark, lake.quarantine("customers"))
    assert [r["reason"] for r in quarantine.collect()] == ["incompatible_type: credit (double -> decimal(16,4))"]
    expected[(3,)] = Decimal("2.5000")
    assert {k: r["credit"] for k, r in silver_rows(spark, engine, lake.root, "customers", ("id",)).items()} == expected
    assert _schema(engine, lake.silver("customers")) == wide

    # the same files again: nothing changes
    land_and_run(9, _event("u", {"id": 3, "credit": "2.5"}, 400, "int64", "float64"),
         _event("u", {"id": 1, "credit": "1.23456789"}, 401, "int64", "float64"))
    assert {k: r["credit"] for k, r in silver_rows(spark, engine, lake.root, "customers", ("id",)).items()} == expected


def test_widening_follows_deltas_type_widening_rules():
    from spark_jobs.debezium.types import widened, widening_to, widens

    allowed = [(T.ByteType(), T.ShortType()), (T.IntegerType(), T.LongType()), (T.FloatType(), T.DoubleType()),
               (T.IntegerType(), T.DoubleType()), (T.DecimalType(10, 2), T.DecimalType(12, 4)),
               (T.IntegerType(), T.DecimalType(12, 2)), (T.LongType(), T.DecimalType(20, 0))]
    refused = [(T.LongType(), T.IntegerType()), (T.LongType(), T.DoubleType()), (T.DoubleType(), T.FloatType()),
               (T.DecimalType(10, 2), T.DecimalType(10, 4)), (T.DecimalType(10, 2), T.DecimalType(10, 2)),
               (T.IntegerType(), T.DecimalType(11, 2)), (T.LongType(), T.DecimalType(19, 0)),
               (T.DateType(), T.TimestampType()), (T.DateType(), T.TimestampNTZType()), (T.IntegerType(), T.StringType()),
               (T.StringType(), T.LongType())]
    assert [widens(old, new) for old, new in allowed] == [True] * len(allowed)
    assert [widens(old, new) for old, new in refused] == [False] * len(refused)
    # no widening to the batch's type, but to one holding both
    assert widening_to(T.DecimalType(10, 2), T.DecimalType(10, 4)) == T.DecimalType(12, 4)
    assert widening_to(T.IntegerType(), T.DecimalType(5, 2)) == T.DecimalType(12, 2)
    assert widening_to(T.DecimalType(38, 2), T.DecimalType(38, 10)) is None  # 46 digits: none holds both
    assert widening_to(T.DecimalType(16, 4), T.DoubleType()) is None
    assert widening_to(T.LongType(), T.IntegerType()) is None  # narrower: silver's type holds it already
    target = T.StructType([T.StructField("id", T.IntegerType()), T.StructField("v", T.DoubleType()),
                           T.StructField("kept", T.StringType())])
    batch = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.LongType())])
    schema, changes = widened(target, batch)
    assert [str(c) for c in changes] == ["id:int->bigint"]
    assert schema is not None and [f.dataType for f in schema.fields] == [T.LongType(), T.DoubleType(), T.StringType()]
    assert widened(None, batch) == (None, ())


def test_a_batch_across_a_widening_types_each_column_by_its_wider_schema(spark):  # types parse in the JVM
    """Whichever order a batch's envelope schemas come in (combined_fields sorts them by their text), a column's
    wider type wins: precision 9 sorts after 10 as text."""
    from spark_jobs.debezium.types import DECIMAL_LOGICAL, ImageField, merge_fields

    wide = [ImageField("id", "BIGINT"), ImageField("credit", "STRING", DECIMAL_LOGICAL, scale=2, precision=10)]
    narrow = [ImageField("id", "INT"), ImageField("credit", "STRING", DECIMAL_LOGICAL, scale=2, precision=9),
              ImageField("note", "STRING")]
    assert [(f.name, f.spark_type) for f in merge_fields([narrow, wide])] == [
        ("id", "BIGINT"), ("credit", "DECIMAL(10,2)"), ("note", "STRING")]
    assert [f.spark_type for f in merge_fields([wide, narrow])] == ["BIGINT", "DECIMAL(10,2)", "STRING"]
