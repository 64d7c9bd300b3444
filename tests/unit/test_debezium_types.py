"""Typing row images: envelope logical types, plain-JSON inference, lossless alignment."""

import base64
import datetime as dt
import json
from decimal import Decimal

from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.debezium import types
from spark_jobs.generate import Column
from spark_jobs.sql_text import sql


def b64(unscaled: int) -> str:
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def test_connect_decimal_decodes_sign_and_scale_exactly(spark):
    values = [12345, -12345, 0, -1, 127, 128, -128, 10**18 - 1, -(10**18) + 1]
    df = spark.createDataFrame([(b64(v),) for v in values], "v STRING")
    got = [r[0] for r in df.select(sql(types.decode_decimal("v", 18, 2))).collect()]
    assert got == [Decimal(v).scaleb(-2) for v in values]


def test_values_that_do_not_fit_their_type_are_named_not_cast(spark):
    fields = [types.ImageField("n", "INT"), types.ImageField("p", "STRING", types.DECIMAL_LOGICAL, 2, 4)]
    df = spark.createDataFrame([(f'{{"n": 5, "p": "{b64(999)}"}}',), (f'{{"n": "five", "p": "{b64(10**6)}"}}',),
                                ('{"n": null}',)], "img STRING")
    got = [(r["r"]["n"], r["r"]["p"], r["_decode_problems"])
           for r in types.parse_image(df, "img", fields, "r").collect()]
    assert got == [(5, Decimal("9.99"), ""), (None, None, "n (not int), p (not decimal(4,2))"), (None, None, "")]


def test_wide_decimals_decode_through_the_exact_fallback(spark):
    values = [10**30 + 7, -(10**30) - 7, 10**37 + 1, -(10**38) + 1]  # past the 28 digits of Python's default context
    df = spark.createDataFrame([(b64(v),) for v in [*values, 10**38, 10**5000]], "v STRING")
    types.register_decoders(spark)
    got = [r[0] for r in df.select(sql(types.decode_decimal("v", 38, 4))).collect()]
    # from text: exact, as no arithmetic under that context is. 39 digits, and 5,001 (more than Python writes as
    # text): none of DECIMAL(38,4)'s values
    assert got == [*[Decimal(f"{v}E-4") for v in values], None, None]


def test_envelope_fields_decode_debezium_logical_types(spark):
    cols = [Column("id", "int32"), Column("day", "int32", "io.debezium.time.Date"),
            Column("at", "int64", "io.debezium.time.MicroTimestamp"),
            Column("ms", "int64", "io.debezium.time.Timestamp"),
            Column("ns", "int64", "io.debezium.time.NanoTimestamp"),
            Column("zoned", "string", "io.debezium.time.ZonedTimestamp"),
            Column("price", "bytes", "org.apache.kafka.connect.data.Decimal", {"scale": "2", "connect.decimal.precision": "6"}),
            Column("rating", "string", "io.debezium.data.Enum", {"allowed": "G,PG"})]
    schema = json.dumps({"fields": [{"field": "before"}, {"field": "after", "fields": [c.schema(True) for c in cols]}]})
    fields = types.fields_from_envelope(schema)
    assert [(f.name, f.spark_type) for f in fields] == [
        ("id", "INT"), ("day", "DATE"), ("at", "TIMESTAMP"), ("ms", "TIMESTAMP"), ("ns", "TIMESTAMP"),
        ("zoned", "TIMESTAMP"), ("price", "DECIMAL(6,2)"), ("rating", "STRING")]
    stamp = dt.datetime(2024, 2, 29, 13, 45, 1, 250001)
    image = {"id": 7, "day": Column("d", "int32", "io.debezium.time.Date").encode(dt.date(2024, 2, 29)),
             "at": Column("a", "int64", "io.debezium.time.MicroTimestamp").encode(stamp),
             "ms": 1709214301250, "ns": 1709214301250001999, "zoned": "2024-02-29T13:45:01.250001Z",
             "price": b64(-1999), "rating": "PG"}
    df = spark.createDataFrame([(json.dumps(image),)], "img STRING")
    row = types.parse_image(df, "img", fields, "r").select("r.*").first().asDict()
    assert row == {"id": 7, "day": dt.date(2024, 2, 29), "at": stamp, "ms": dt.datetime(2024, 2, 29, 13, 45, 1, 250000),
                   "ns": stamp, "zoned": stamp, "price": Decimal("-19.99"), "rating": "PG"}


def test_plain_json_keeps_json_types_over_the_whole_batch(spark):
    df = spark.createDataFrame([('{"id":1,"w":2,"name":"a","ok":true,"tags":[1]}',),
                                ('{"id":2,"w":2.5,"name":null,"extra":{"x":1}}',)], "img STRING")
    fields = types.infer_fields(df, "img")
    assert sorted((f.name, f.parse_type) for f in fields) == [
        ("extra", "STRING"), ("id", "BIGINT"), ("name", "STRING"), ("ok", "BOOLEAN"), ("tags", "STRING"), ("w", "DOUBLE")]


def test_mongodb_extended_json_is_typed_by_its_wrappers_in_every_mode(spark):
    """Canonical ($numberLong, $numberInt, $numberDouble, $date of $numberLong), relaxed (plain numbers, $date as
    ISO text) and legacy ($date as a number) forms; values that do not fit their type are named, not rounded."""
    documents = [
        '{"_id": {"$oid": "65a1f0c2e4b0a1b2c3d4e5f1"}, "n": {"$numberLong": "9007199254740993"}, "i": {"$numberInt": "7"},'
        ' "x": {"$numberDouble": "NaN"}, "d": {"$date": {"$numberLong": "-1000"}}, "m": {"$numberDecimal": "1.5"},'
        ' "bin": {"$binary": {"base64": "AQI=", "subType": "00"}}, "s": "text", "doc": {"a": 1}}',
        '{"_id": {"$oid": "65a1f0c2e4b0a1b2c3d4e5f2"}, "n": 12, "i": 8, "x": 2.5, "d": {"$date": "2024-02-29T13:45:01.25Z"},'
        ' "m": {"$numberDecimal": "1E+40"}, "s": null}',
        '{"_id": {"$oid": "65a1f0c2e4b0a1b2c3d4e5f3"}, "n": {"$numberLong": "13"}, "x": {"$numberDouble": "-Infinity"},'
        ' "d": {"$date": 1700000000123}, "m": {"$numberInt": "3"}}',
    ]
    df = spark.createDataFrame([(d, True) for d in documents], "img STRING, bson BOOLEAN")
    fields = types.infer_fields(df, "img", "bson")
    assert [(f.name, f.spark_type) for f in fields] == [
        ("_id", "STRING"), ("bin", "STRING"), ("d", "TIMESTAMP"), ("doc", "STRING"), ("i", "BIGINT"), ("m", "DECIMAL(38,18)"),
        ("n", "BIGINT"), ("s", "STRING"), ("x", "DOUBLE")]
    rows = types.parse_image(df, "img", fields, "r").select("r.*", "_decode_problems").collect()
    assert [r.asDict() for r in rows] == [
        {"_id": "65a1f0c2e4b0a1b2c3d4e5f1", "bin": '{"$binary":{"base64":"AQI=","subType":"00"}}',
         "d": dt.datetime(1969, 12, 31, 23, 59, 59), "doc": '{"a":1}', "i": 7, "m": Decimal("1.5"), "n": 9007199254740993,
         "s": "text", "x": float("nan"), "_decode_problems": ""} | {"x": rows[0]["x"]},
        {"_id": "65a1f0c2e4b0a1b2c3d4e5f2", "bin": None, "d": dt.datetime(2024, 2, 29, 13, 45, 1, 250000), "doc": None,
         "i": 8, "m": None, "n": 12, "s": None, "x": 2.5, "_decode_problems": "m (not decimal(38,18))"},
        {"_id": "65a1f0c2e4b0a1b2c3d4e5f3", "bin": None, "d": dt.datetime(2023, 11, 14, 22, 13, 20, 123000), "doc": None,
         "i": None, "m": Decimal(3), "n": 13, "s": None, "x": float("-inf"), "_decode_problems": ""},
    ]
    assert rows[0]["x"] != rows[0]["x"]  # NaN


def test_align_widens_safely_and_names_lossy_columns(spark):
    df = spark.createDataFrame([(1, 2.0, "a"), (2, 2.5, "b"), (3, None, "c")], "id BIGINT, w DOUBLE, s STRING")
    df = df.select(F.struct("id", "w", "s").alias("r"))
    target = T.StructType([T.StructField("id", T.DoubleType()), T.StructField("w", T.LongType())])
    got = [(r["r"]["id"], r["r"]["w"], r["_type_problems"]) for r in types.align(df, "r", target).collect()]
    assert got == [(1.0, 2, ""), (2.0, 2, "w (double -> bigint)"), (3.0, None, "")]


def test_merge_fields_unions_columns_with_the_newest_definition():
    a = [types.ImageField("id", "INT"), types.ImageField("x", "INT")]
    b = [types.ImageField("x", "BIGINT"), types.ImageField("y", "STRING")]
    assert types.merge_fields([a, b]) == [types.ImageField("id", "INT"), types.ImageField("x", "BIGINT"),
                                            types.ImageField("y", "STRING")]


def test_variable_scale_decimal_time_of_day_and_text_types_decode(spark):
    def vsd(unscaled: int, scale: int) -> dict:
        return {"scale": scale, "value": b64(unscaled)}

    cols = [Column("amount", "struct", "io.debezium.data.VariableScaleDecimal"),
            Column("t_ms", "int32", "io.debezium.time.Time"), Column("t_us", "int64", "io.debezium.time.MicroTime"),
            Column("t_ns", "int64", "io.debezium.time.NanoTime"), Column("doc", "string", "io.debezium.data.Json"),
            Column("mood", "string", "io.debezium.data.Enum"), Column("tz_time", "string", "io.debezium.time.ZonedTime")]
    schema = json.dumps({"fields": [{"field": "before"}, {"field": "after", "fields": [c.schema(True) for c in cols]}]})
    fields = types.fields_from_envelope(schema)
    assert [f.spark_type for f in fields] == ["DECIMAL(38,18)", *["STRING"] * 6]
    images = [
        {"amount": vsd(-12345, 3), "t_ms": 49_501_250, "t_us": 49_501_250_001, "t_ns": 49_501_250_001_999,
         "doc": '{"a": [1, 2]}', "mood": "happy", "tz_time": "13:45:01.25Z"},
        {"amount": vsd(1, 19), "t_ms": 0, "t_us": 86_399_999_999, "t_ns": None, "doc": None, "mood": None, "tz_time": None},
        # 38 digits, 18 of them places: exact. 27 digits, 3 places: beyond DECIMAL(38,18). A scale of -5000: 10^5000.
        # 5,001 digits (more than Python writes as text), then the same at 5,018 places: 10^-18
        *({"amount": vsd(unscaled, scale)} for unscaled, scale in (
            (10**37 + 1, 18), (10**26 + 7, 3), (1, -5000), (10**5000, 3), (10**5000, 5018))),
    ]
    df = spark.createDataFrame([(i, json.dumps(img)) for i, img in enumerate(images)], "i INT, img STRING")
    got = types.parse_image(df, "img", fields, "r").orderBy("i").select("r.*", "_decode_problems").collect()
    assert got[0].asDict() == {"amount": Decimal("-12.345"), "t_ms": "13:45:01.250", "t_us": "13:45:01.250001",
                               "t_ns": "13:45:01.250001999", "doc": '{"a": [1, 2]}', "mood": "happy",
                               "tz_time": "13:45:01.25Z", "_decode_problems": ""}
    # 19 decimal places do not fit DECIMAL(38,18): named as a problem (quarantined), never rounded
    assert (got[1]["amount"], got[1]["t_ms"], got[1]["t_us"]) == (None, "00:00:00.000", "23:59:59.999999")
    assert got[1]["_decode_problems"] == "amount (not decimal(38,18))"
    assert [(r["amount"], r["_decode_problems"]) for r in got[2:]] == [
        (Decimal("10000000000000000000.000000000000000001"), ""), *[(None, "amount (not decimal(38,18))")] * 3,
        (Decimal("1E-18"), "")]


def test_column_overrides_type_plain_json_exactly(spark):
    sample = spark.createDataFrame([('{"price": 1.5, "born": "2001-02-03", "n": 3}',)], "img STRING")
    inferred = types.infer_fields(sample, "img")
    fields = types.with_overrides(inferred, (("price", "decimal(6,2)"), ("born", "date"), ("n", "int")))
    assert [(f.name, f.spark_type) for f in fields] == [("born", "date"), ("n", "int"), ("price", "decimal(6,2)")]
    df = spark.createDataFrame([(0, '{"price": 12.25, "born": "2001-02-03", "n": 3}'),
                                (1, '{"price": 12.255, "born": "not a date", "n": 3.5}')], "i INT, img STRING")
    got = types.parse_image(df, "img", fields, "r").orderBy("i").select("r.*", "_decode_problems").collect()
    assert got[0].asDict() == {"born": dt.date(2001, 2, 3), "n": 3, "price": Decimal("12.25"), "_decode_problems": ""}
    assert got[1]["_decode_problems"] == "born (not date), n (not int), price (not decimal(6,2))"


def test_typed_files_keep_their_column_types_through_json(spark):
    df = spark.createDataFrame([(1, Decimal("12.50"), dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5, 6))],
                               "id BIGINT, price DECIMAL(10,2), day DATE, at TIMESTAMP")
    fields = types.fields_from_envelope(types.envelope_from_spark(df.schema))
    assert [f.spark_type for f in fields] == ["BIGINT", "DECIMAL(10,2)", "DATE", "TIMESTAMP"]
    text = df.select(F.to_json(F.struct(*df.columns), types.JSON_OPTIONS).alias("img"))
    row = types.parse_image(text, "img", fields, "r").select("r.*").first()
    assert tuple(row) == tuple(df.first())


def test_an_image_is_parsed_twice_whatever_its_columns(spark):
    """Typed with its declared types and as text (to name what did not fit): two parses per image, not two per
    column (a parse passed on as a Column object runs again in every expression that holds it)."""
    fields = [types.ImageField(name=f"c{i}", parse_type="BIGINT") for i in range(6)]
    df = spark.createDataFrame([('{"c0": 1}',)], "img STRING")
    plan = types.parse_image(df, "img", fields, "r")._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("from_json") == 2
