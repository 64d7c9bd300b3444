"""Columns written as SQL text (spark_jobs/sql_text.py): names and values of any characters go in as themselves, a
text is one column for the process, and a rule per table is one CASE branch per distinct rule."""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.layers.common import lookup
from spark_jobs.sql_text import ident, labels_where, literal, named_struct, per_table, sql, sql_type

AWKWARD = ("plain", "it's", 'say "hi"', "back\\slash", "tick`s", "two`` ticks", "new\nline", "caf\u00e9", "\\'",
           "' OR 1 = 1 --", "a\\u0041", "$.key", "")


def test_names_and_values_of_any_characters_go_in_as_themselves(spark):
    frame = spark.createDataFrame([tuple(range(len(AWKWARD)))], [f"c{n}{name}" for n, name in enumerate(AWKWARD)])
    named = frame.select(*[sql(f"{ident(c)} AS {ident(c)}") for c in frame.columns])
    assert named.columns == frame.columns and list(named.first()) == list(range(len(AWKWARD)))
    values = frame.select(*[sql(f"{literal(value)} AS v{n}") for n, value in enumerate(AWKWARD)]).first()
    assert tuple(values) == AWKWARD


def test_a_type_names_its_struct_fields_of_any_characters(spark):
    inner = T.StructType([T.StructField(name, T.StringType()) for name in AWKWARD if name])
    shape = T.StructType([T.StructField("a b`c:d", T.DecimalType(10, 2)), T.StructField("nested", inner),
                          T.StructField("many", T.ArrayType(T.MapType(T.StringType(), inner)))])
    assert spark.range(1).select(sql(f"CAST(NULL AS {sql_type(shape)}) AS v")).schema["v"].dataType == shape


def test_a_struct_names_its_fields_of_any_characters_in_order(spark):
    fields = {name: f"{n} + 1" for n, name in enumerate(AWKWARD)}
    got = spark.range(1).select(sql(f"{named_struct(fields)} AS v")).first()["v"]
    assert list(got.asDict().items()) == [(name, n + 1) for n, name in enumerate(AWKWARD)]


def test_labels_are_listed_in_order_where_their_conditions_hold(spark):
    conditions = {"it's a": "n > 1", "b, `c`": "n > 2", "d": "n IS NULL"}
    frame = spark.createDataFrame([(1,), (2,), (3,), (None,)], "n INT")
    got = [r["v"] for r in frame.select(sql(f"{labels_where(conditions)} AS v")).collect()]
    assert got == ["", "it's a", "it's a, b, `c`", "d"]
    assert spark.range(1).select(sql(f"{labels_where({}, ',')} AS v")).first()["v"] == ""


def test_a_text_is_one_column_for_the_process():
    assert sql("1 + 1 AS two") is sql("1 + 1 AS two")
    assert sql("1 + 1 AS two") is not sql("1 + 2 AS two")


def test_a_rule_per_table_is_one_branch_per_distinct_rule(spark):
    rules = {"a": 1, "b'": 1, "c": 2}
    text = per_table(rules, lambda rule: str(rule * 10))
    assert text.count("WHEN") == 2
    frame = spark.createDataFrame([(t,) for t in [*rules, "other"]], ["_table"])
    assert {r["_table"]: r["v"] for r in frame.select("_table", sql(f"{text} AS v")).collect()} == {
        "a": 10, "b'": 10, "c": 20, "other": None}
    # one rule for every table reads no `_table`
    assert per_table({"a": 1, "b": 1}, lambda rule: str(rule)) == "1"


def test_a_lookup_maps_keys_of_any_characters_to_their_values(spark):
    frame = spark.createDataFrame([(key,) for key in AWKWARD], ["k"])
    texts = {key: f"value of {key}" for key in AWKWARD}
    numbers = {key: n * 2**40 for n, key in enumerate(AWKWARD)}  # past an INT: the map's values are BIGINT
    got = frame.select("k", lookup(texts, "k").alias("text"), lookup(numbers, "k").alias("number")).collect()
    assert {r["k"]: (r["text"], r["number"]) for r in got} == {key: (texts[key], numbers[key]) for key in AWKWARD}


def test_a_condition_holds_over_arrow_where_spark_says_it_holds(spark):
    """sql_text.holds, the silver pass's Arrow finish's reading of a rule's text, agrees with Spark's row for row,
    nulls and ties included: the rules' texts (layers/changes.py) and a condition of every construct it takes."""
    import itertools

    import pyarrow as pa
    import pytest

    from spark_jobs.layers import changes
    from spark_jobs.layers.changes import AUDITED_ROWS
    from spark_jobs.sql_text import holds

    positions = [None, "0000a", "0000b", "it's"]
    combos = list(itertools.product(positions, positions, positions, [None, True, False]))
    names = ["_seq", "_state_seq", "_winner_seq", "_live"]
    rows = pa.table({name: [c[i] for c in combos] for i, name in enumerate(names)})
    rows = rows.append_column("n", pa.array(range(rows.num_rows), pa.int64()))
    # the audit's rule reads a row's batch, the audited one and whether the batch touched the key: here `_seq`,
    # `_winner_seq` and `_live`
    rows = rows.append_column("_batch_id", rows.column("_seq")).append_column(
        "_audited_batch", rows.column("_winner_seq")).append_column("_touched", rows.column("_live"))
    frame = spark.createDataFrame(rows.to_pylist(), "_seq string, _state_seq string, _winner_seq string, _live boolean, "
                                                    "n long, _batch_id string, _audited_batch string, _touched boolean")
    rules = [changes.NEWER, changes.REDELIVERED, changes.after_truncate(None), changes.after_truncate("0000a"),
             *changes.delete_outcomes(None).values(), *changes.delete_outcomes("0000a").values(),
             AUDITED_ROWS]
    for condition in (*rules, changes.newer("_state_seq", "_seq"),
                      f"NOT (_seq IS NOT NULL AND _seq <> {literal(AWKWARD[1])}) OR _state_seq <= _seq AND n >= 3 AND n < 90",
                      f"{literal(chr(39))} = _seq OR `n` = 7 OR _state_seq >= '0000b' AND NOT n > 2.5 = false",
                      "coalesce(_live, _seq < _winner_seq, n < 40) AND true"):
        expected = [r["n"] for r in frame.where(sql(condition)).orderBy("n").collect()]
        assert [n for n, h in zip(range(rows.num_rows), holds(rows, condition).to_pylist(), strict=True) if h] == expected, \
            condition
    with pytest.raises(ValueError, match="does not evaluate"):
        holds(rows, "_seq LIKE 'a%'")


def test_a_value_over_arrow_is_what_spark_makes_of_its_text(spark):
    """sql_text.evaluated, the pass's reading of a rule's values (the tombstone ledger's rows: layers/changes.py), gives
    Spark's value row for row, nulls, times before the epoch and each construct it takes included."""
    import datetime

    import pyarrow as pa
    import pytest

    from spark_jobs.layers import changes
    from spark_jobs.sql_text import evaluated

    utc = datetime.UTC
    times = [None, datetime.datetime(2024, 2, 29, 12, 0, 0, 123456, utc),
             datetime.datetime(1969, 12, 31, 23, 59, 59, 999500, utc)]
    rows = pa.table({"_seq": ["0000a", None, AWKWARD[1]], "_state_seq": [None, "0000b", "0000c"], "_op": ["d", "u", None],
                     "_source_ts_ms": pa.array([None, 7, None], pa.int64()),
                     "_ingested_at": pa.array(times, pa.timestamp("us", utc)), "n": pa.array([1, 2, 3], pa.int64())})
    texts = {**changes.LEDGER_ENTRY, **{f"up{name}": text for name, text in changes.LEDGER_CATCH_UP.items()},
             "as_text": "CAST(n AS STRING)", "as_number": "CAST(CAST(n AS STRING) AS BIGINT)", "flag": "CAST(n AS BOOLEAN)",
             "stamp": "unix_millis(_ingested_at)"}
    frame = spark.createDataFrame(rows.to_pandas(), "_seq string, _state_seq string, _op string, _source_ts_ms long, "
                                                    "_ingested_at timestamp, n long")
    values = [sql(f"{t} AS {ident(name)}") for name, t in texts.items()]
    expected = [r.asDict() for r in frame.orderBy("n").select(*values).collect()]
    assert evaluated(rows, texts).to_pylist() == expected
    assert expected[2]["_deleted_at_ms"] == -1 and expected[1]["_deleted_at_ms"] == 7  # the cases are ones that differ
    with pytest.raises(ValueError, match="does not evaluate"):
        evaluated(rows, {"x": "upper(_op)"})
