"""Unit tests on tiny DataFrames with exact expected rows."""

import json

from spark_jobs.debezium import envelope, ordering
from spark_jobs.layers import changes

BRONZE = "_source_file STRING, _line BIGINT, op STRING, source STRING, before STRING, after STRING"


def pg(lsn, snapshot="false", **extra):
    return json.dumps({"connector": "postgresql", "lsn": lsn, "snapshot": snapshot, "ts_ms": 1, **extra})


def mysql(file, pos, row=0, snapshot="false"):
    return json.dumps({"connector": "mysql", "file": file, "pos": pos, "row": row, "snapshot": snapshot, "ts_ms": 1})


def events(spark, rows):
    return spark.createDataFrame(rows, BRONZE)


def test_line_fields_drop_the_cr_of_crlf_and_cut_lines_too_large(spark):
    lines = spark.createDataFrame([("a.json", 1, "x"), ("a.json", 2, ""), ("a.json", 3, "y\r"), ("b.json", 1, "z"),
                                   ("c.json", 1, "{}"), ("c.json", 2, "\ufeff{}"), ("c.json", 3, "0123456789")],
                                  "_source_file STRING, _line BIGINT, _text STRING")
    got = [tuple(r) for r in envelope.line_fields(lines, max_line_bytes=9).orderBy("_source_file", "_line").collect()]
    too_large = "line_too_large: 10 bytes (max 9, CDC_MAX_LINE_BYTES); the line stays whole in its landing file"
    assert got == [("a.json", 1, "x", None), ("a.json", 2, "", None), ("a.json", 3, "y", None), ("b.json", 1, "z", None),
                   # a byte-order mark past the file's opening one (which the reader drops) is content
                   ("c.json", 1, "{}", None), ("c.json", 2, "\ufeff{}", None), ("c.json", 3, "0123456789", too_large)]


def test_parse_and_classify_every_kind_of_line(spark):
    lines = [
        '{"before":null,"after":{"id":1,"v":"a"},"source":{"lsn":5},"op":"c","ts_ms":9}',
        '{"schema":{"type":"struct"},"payload":{"before":{"id":2},"after":null,"source":{"lsn":6},"op":"d","ts_ms":9}}',
        "null",
        "{not json",
        '{"hello":"world"}',
        '{"before":null,"after":{"id":3},"source":{},"op":"x"}',
        '{"before":null,"after":null,"source":{},"op":"d"}',
        '{"before":null,"after":{"v":"no key"},"source":{},"op":"u"}',
        '{"before":null,"after":null,"source":{"lsn":7},"op":"t"}',
        "",
        '{"schema": null, "payload": null}',
        # MongoDB: a Debezium 1.x update's patch, with its filter naming the _id; change streams' updateDescription
        '{"after":null,"patch":"{\\"$set\\":{\\"v\\":1}}","filter":"{\\"_id\\":3}","source":{"connector":"mongodb"},'
        '"op":"u","ts_ms":9}',
        '{"schema":{},"payload":{"after":null,"updateDescription":{"updatedFields":"{\\"v\\":2}"},"source":{},"op":"u"}}',
    ]
    df = spark.createDataFrame([("f", i + 1, line) for i, line in enumerate(lines)],
                               "_source_file STRING, _line BIGINT, _raw STRING")
    got = envelope.classify(envelope.parse_envelope(df), ("id",)).orderBy("_line")
    rows = [(r["_line"], r["_kind"], r["reason"], r["op"], r["_schema"] is not None) for r in got.collect()]
    assert rows == [
        (1, "event", None, "c", False),
        (2, "event", None, "d", True),
        (3, "tombstone", None, None, False),
        (4, "quarantine", "malformed_json", None, False),
        (5, "quarantine", "not_debezium: no op field", None, False),
        (6, "quarantine", "unknown_op: x", "x", False),
        (7, "quarantine", "delete_has_key: id", "d", False),
        (8, "quarantine", "event_has_key: id", "u", False),
        (9, "event", None, "t", False),
        (10, "quarantine", "empty_line", None, False),
        (11, "tombstone", None, None, False),
        (12, "quarantine", envelope.PARTIAL_UPDATE, "u", False),
        (13, "quarantine", envelope.PARTIAL_UPDATE, "u", True),
    ]
    enveloped = got.where("_line = 2").first()
    assert json.loads(enveloped["before"]) == {"id": 2} and enveloped["after"] is None


def test_flattened_records_map_onto_the_envelope_columns(spark):
    lines = [
        '{"id":1,"v":"a","__op":"c","__lsn":100,"__source_ts_ms":7,"__ts_ms":8}',
        '{"id":1,"v":"a","__op":"d","__deleted":"true","__lsn":101,"__source_ts_ms":7}',
        '{"id":2,"v":"b","__deleted":"true","__file":"mysql-bin.000002","__pos":40,"__row":1}',
        '{"id":3,"v":"c","__deleted":"false","__source_file":"mysql-bin.000002","__source_pos":41}',
        '{"schema":{"type":"struct","fields":[{"field":"id","type":"int32"},{"field":"__op","type":"string"}]},'
        '"payload":{"id":4,"__op":"r","__lsn":5,"__snapshot":"true"}}',
        '{"id":5,"op":"shipped","__op":"u","__lsn":102}',
        "null",
    ]
    df = spark.createDataFrame([("f", i + 1, line) for i, line in enumerate(lines)],
                               "_source_file STRING, _line BIGINT, _raw STRING")
    got = ordering.order_key(envelope.classify(envelope.parse_envelope(df), ("id",)), None).orderBy("_line").collect()
    assert [(r["_kind"], r["op"], r["ts_ms"], r["_seq"]) for r in got] == [
        ("event", "c", 8, "00000000000000000100|1"),
        ("event", "d", 7, "00000000000000000101|1"),
        ("event", "d", None, "0000000002|00000000000000000040|1|0000000001"),
        ("event", "u", None, "0000000002|00000000000000000041|1|0000000000"),
        ("event", "r", None, "00000000000000000005|0"),
        ("event", "u", None, "00000000000000000102|1"),
        ("tombstone", None, None, None),
    ]
    # the record is the row image: in `before` for deletes, in `after` otherwise
    assert (got[1]["after"], json.loads(got[1]["before"])["id"]) == (None, 1)
    assert json.loads(got[5]["after"])["op"] == "shipped"
    assert got[4]["_schema"] is not None and json.loads(got[0]["source"]) == {"lsn": "100", "ts_ms": "7"}
    # format: json never reads `__` fields as metadata; json-flat always does
    assert [r["op"] for r in envelope.parse_envelope(df, "json").orderBy("_line").collect()][:2] == [None, None]
    plain = spark.createDataFrame([("f", 1, '{"id":9,"__deleted":"true"}')], "_source_file STRING, _line BIGINT, _raw STRING")
    assert envelope.parse_envelope(plain, "json-flat").first()["op"] == "d"


def test_missing_keys_names_every_absent_column(spark):
    df = spark.createDataFrame([("u", None, '{"a":1}'), ("d", '{"b":2}', None)], "op STRING, before STRING, after STRING")
    assert [r[0] for r in df.select(envelope.missing_keys(("a", "b"))).collect()] == ["b", "a"]


def test_postgres_snapshot_events_rank_before_streaming_events_at_the_same_lsn(spark):
    df = events(spark, [
        ("f", 1, "u", pg(100), None, "{}"),
        ("f", 2, "r", pg(100, "last"), None, "{}"),
        ("f", 3, "c", pg(99), None, "{}"),
        ("f", 4, "u", pg(1000), None, "{}"),
    ])
    ordered = [r["_line"] for r in ordering.order_key(df, None).orderBy("_seq").collect()]
    assert ordered == [3, 2, 1, 4]  # numeric, not lexicographic: 99 < 100 < 1000


def test_mysql_orders_by_binlog_file_number_then_pos_then_row(spark):
    df = events(spark, [
        ("f", 1, "u", mysql("mysql-bin.000004", 4, 0), None, "{}"),
        ("f", 2, "u", mysql("mysql-bin.000003", 900, 1), None, "{}"),
        ("f", 3, "u", mysql("mysql-bin.000003", 900, 0), None, "{}"),
        ("f", 4, "c", mysql("mysql-bin.000003", 154, 0, "true"), None, "{}"),
        ("f", 5, "u", mysql("mysql-bin.000003", 154, 0), None, "{}"),
        ("f", 6, "u", mysql("mysql-bin.000010", 4, 0), None, "{}"),
    ])
    ordered = [r["_line"] for r in ordering.order_key(df, None).orderBy("_seq").collect()]
    assert ordered == [4, 5, 3, 2, 1, 6]  # old connectors' snapshot rows are op=c with snapshot=true


def test_sqlserver_and_unknown_connectors(spark):
    def sql(commit, change, serial):
        return json.dumps({"connector": "sqlserver", "commit_lsn": commit, "change_lsn": change,
                                                         "event_serial_no": serial})
    df = events(spark, [
        ("f", 1, "u", sql("0000002b:00000358:0003", "0000002b:00000358:0002", 2), None, "{}"),
        ("f", 2, "u", sql("0000002b:00000358:0003", "0000002b:00000358:0002", 1), None, "{}"),
        ("f", 3, "u", sql("0000002a:00000100:0001", "0000002a:00000100:0001", 1), None, "{}"),
        ("f", 4, "u", json.dumps({"connector": "mongodb", "ord": 1}), None, "{}"),
    ])
    got = {r["_line"]: r["_seq"] for r in ordering.order_key(df, None).collect()}
    assert got[4] is None
    assert sorted([1, 2, 3], key=lambda line: got[line]) == [3, 2, 1]


def ordered_lines(spark, rows):
    df = events(spark, [("f", i + 1, op, json.dumps(source), None, "{}") for i, (op, source) in enumerate(rows)])
    got = ordering.order_key(df, None).orderBy("_seq").collect()
    assert [r["_line"] for r in got if r["_seq"] is None] == []  # every event has a position
    return [r["_line"] for r in got]


def test_sqlserver_snapshot_events_have_no_change_lsn_and_come_first_at_their_commit(spark):
    def sql(commit, change=None, serial=None, snapshot="false"):
        return {"connector": "sqlserver", "commit_lsn": commit, "change_lsn": change, "event_serial_no": serial,
                "snapshot": snapshot}
    # every Debezium version: snapshot rows carry commit_lsn only
    assert ordered_lines(spark, [
        ("u", sql("0000002b:00000358:0003", "0000002b:00000358:0002", 1)),
        ("r", sql("0000002b:00000358:0003", snapshot="last")),
        ("r", sql("0000002b:00000358:0003", snapshot="true")),
        ("u", sql("0000002c:00000010:0001", "0000002c:00000010:0001", 1)),
    ]) == [2, 3, 1, 4]


def test_oracle_orders_by_commit_scn_then_scn_redo_record_and_sql_sequence(spark):
    def ora(scn, commit=None, rs_id=None, ssn=None, snapshot="false"):
        return {"connector": "oracle", "scn": scn, "commit_scn": commit, "rs_id": rs_id, "ssn": ssn, "snapshot": snapshot}
    assert ordered_lines(spark, [
        ("u", ora("1000", "1005", " 0x000011.000000a0.0010 ", 1)),
        ("u", ora("1000", "1005", " 0x000011.000000a0.0010 ", 0)),
        ("u", ora("999", "1005", " 0x000011.0000009f.0010 ", 0)),  # earlier change in the same transaction
        ("c", ora("998", "1001", " 0x000010.00000001.0010 ", 0)),  # an earlier transaction
        ("r", ora("900", snapshot="true")),  # snapshot rows: scn only
        ("u", ora("990", "10000", " 0x000012.00000001.0010 ", 0)),  # numeric, not lexicographic
    ]) == [5, 4, 3, 2, 1, 6]


def test_db2_orders_by_commit_lsn_then_change_lsn_snapshot_first(spark):
    def db2(commit, change=None):
        return {"connector": "db2", "commit_lsn": commit, "change_lsn": change}
    assert ordered_lines(spark, [
        ("u", db2("00000000:0000e2a8:0000000000020a01", "00000000:0000e2a8:0000000000020a00")),
        ("r", db2("00000000:0000e2a8:0000000000020a01")),
        ("u", db2("00000000:0000e2a0:0000000000000001", "00000000:0000e2a0:0000000000000001")),
    ]) == [3, 2, 1]


def test_mariadb_is_ordered_like_mysql(spark):
    def maria(file, pos, row):
        return {"connector": "mariadb", "file": file, "pos": pos, "row": row}
    assert ordered_lines(spark, [("u", maria("mariadb-bin.000004", 4, 0)), ("u", maria("mariadb-bin.000003", 900, 0))]) \
        == [2, 1]


def test_sequence_by_uses_image_columns_and_source_fields(spark):
    df = events(spark, [
        ("f", 1, "u", json.dumps({"txn": 7}), None, '{"version": 10}'),
        ("f", 2, "u", json.dumps({"txn": 7}), None, '{"version": 9}'),
        ("f", 3, "d", json.dumps({"txn": 8}), '{"version": 2}', None),
        ("f", 4, "u", json.dumps({}), None, '{"version": 11}'),
    ])
    got = {r["_line"]: r["_seq"] for r in ordering.order_key(df, ("source.txn", "version")).collect()}
    assert got == {1: "00000000000000000007|00000000000000000010", 2: "00000000000000000007|00000000000000000009",
                   3: "00000000000000000008|00000000000000000002", 4: None}


def test_latest_per_key_picks_highest_sequence_and_flags_ties(spark):
    df = spark.createDataFrame([
        (1, "0001", "a.json", 1, "u", None, '{"v":1}', {"n": "1"}),
        (1, "0003", "a.json", 2, "u", None, '{"v":3}', {"n": "3"}),
        (1, "0002", "a.json", 3, "u", None, '{"v":2}', {"n": "2"}),
        (1, None, "z.json", 9, "u", None, '{"v":0}', {"n": "0"}),  # no position: never the newest
        (2, "0005", "a.json", 4, "u", None, '{"v":"y"}', {}),
        (2, "0005", "b.json", 1, "u", None, '{"v":"x"}', {}),  # same position, other content: a tie
        (3, "0007", "a.json", 5, "d", '{"k":3}', None, None),
        (3, "0007", "c.json", 9, "d", '{"k":3}', None, None),  # re-delivered duplicate: not a tie
        (4, "0009", "a.json", 6, "u", None, '{"v":"b"}', None),  # the newest has the smallest content ...
        (4, "0009", "a.json", 7, "u", None, '{"v":"a"}', None),
        (4, "0009", "a.json", 8, "u", None, '{"v":"a"}', None),
        (4, "0008", "a.json", 9, "u", None, '{"v":"c"}', None),  # ... and an older one the largest
    ], "k INT, _seq STRING, _source_file STRING, _line BIGINT, op STRING, before STRING, after STRING, "
       "m MAP<STRING, STRING>")
    latest = changes.latest_per_key(df, ("k",))
    assert latest.columns == [*df.columns, "_events", "_tie"]
    got = [(r["k"], r["_seq"], r["_source_file"], r["_line"], r["after"], r["m"], r["_tie"], r["_events"])
           for r in latest.orderBy("k").collect()]
    assert got == [(1, "0003", "a.json", 2, '{"v":3}', {"n": "3"}, False, 4),
                   (2, "0005", "b.json", 1, '{"v":"x"}', {}, True, 2),
                   (3, "0007", "c.json", 9, None, None, False, 2),
                   (4, "0009", "a.json", 8, '{"v":"a"}', None, True, 4)]


def test_effective_changes_drop_events_older_than_the_row_or_its_delete(spark):
    latest = spark.createDataFrame([(1, "05"), (2, "05"), (3, "05"), (4, "05"), (5, "05")], "k INT, _seq STRING")
    # 1: live at 03 -> newer; 2: live at 07 -> stale; 3: deleted at 06 -> stale (no resurrection);
    # 4: deleted at 04 -> newer insert applies; 5: unknown -> applies
    state = spark.createDataFrame([(1, "03", True, False), (2, "07", True, False), (3, "06", False, False),
                                   (4, "04", False, False)], "k INT, _seq STRING, _live BOOLEAN, _ledger_behind BOOLEAN")
    got = sorted(r["k"] for r in changes.effective_changes(changes.against_state(latest, state, ("k",))).collect())
    assert got == [1, 4, 5]


def test_key_image_reads_before_for_deletes(spark):
    df = spark.createDataFrame([("d", "B", "A"), ("u", "B", "A")], "op STRING, before STRING, after STRING")
    assert [r[0] for r in df.select(envelope.key_image()).collect()] == ["B", "A"]


def _optimized_plan(df) -> str:
    return df._jdf.queryExecution().optimizedPlan().toString()


def test_classify_evaluates_each_check_once_per_line(spark):
    """Spark shares no work between the branches of a CASE: a check passed on as a Column object into later
    expressions runs again in each. The costly ones (the overflow count's regex split, the tombstone pattern, the
    key-nesting parse) stand once in classify's plan."""
    lines = spark.createDataFrame([("a.json", 1, '{"after":{"id":1},"source":{"lsn":5},"op":"c","ts_ms":9}')],
                                  "_source_file STRING, _line BIGINT, _raw STRING")
    plan = _optimized_plan(envelope.classify(envelope.parse_envelope(lines), ("id",)))
    assert plan.count("split(coalesce") == 3  # before, after and the raw line, once each
    assert plan.count("RLIKE") == 1
    assert plan.count("variant_get") == 1


# Each connector's transaction ids as it writes them (provide.transaction.metadata): per transaction, the BEGIN's
# id, its change events' `transaction.id`s and the END's id; two transactions each
TRANSACTION_IDS = {
    # Debezium 2.x: `<txId>:<LSN of the record>` on every record; 1.x: the txId alone
    "postgresql": ({"lsn": 33300040, "txId": 801},
                   [("801:33300000", ["801:33300040", "801:33300096"], "801:33300144"),
                    ("802:33300200", ["802:33300232"], "802:33300272"), ("571", ["571", "571"], "571")]),
    "mysql": ({"file": "mysql-bin.000003", "pos": 154},  # the GTID, or the BEGIN's binlog position without GTIDs
              [("3e11fa47-71ca-11e1-9e33-c80aa9429562:23", ["3e11fa47-71ca-11e1-9e33-c80aa9429562:23"] * 2,
                "3e11fa47-71ca-11e1-9e33-c80aa9429562:23"),
               ("3e11fa47-71ca-11e1-9e33-c80aa9429562:24", ["3e11fa47-71ca-11e1-9e33-c80aa9429562:24"],
                "3e11fa47-71ca-11e1-9e33-c80aa9429562:24"),
               ("file=mysql-bin.000003,pos=154", ["file=mysql-bin.000003,pos=154"], "file=mysql-bin.000003,pos=154")]),
    "mariadb": ({"file": "mariadb-bin.000004", "pos": 4}, [("0-1-23", ["0-1-23"], "0-1-23"), ("0-1-24", ["0-1-24"], "0-1-24")]),
    "sqlserver": ({"commit_lsn": "00000025:00000d08:0025", "change_lsn": "00000025:00000d08:0002"},
                  [("00000025:00000d08:0025", ["00000025:00000d08:0025"] * 2, "00000025:00000d08:0025"),
                   ("00000025:00000d90:0003", ["00000025:00000d90:0003"], "00000025:00000d90:0003")]),
    "db2": ({"commit_lsn": "00000000:0000e2a8:0000000000020a01"},
            [("00000000:0000e2a8:0000000000020a01", ["00000000:0000e2a8:0000000000020a01"],
              "00000000:0000e2a8:0000000000020a01"),
             ("00000000:0000e2a8:0000000000020b07", ["00000000:0000e2a8:0000000000020b07"],
              "00000000:0000e2a8:0000000000020b07")]),
    "oracle": ({"scn": "1000", "commit_scn": "1005"},
               [("0a001b00c8030000", ["0a001b00c8030000"] * 2, "0a001b00c8030000"),
                ("0a001300d2030000", ["0a001300d2030000"], "0a001300d2030000")]),
    "mongodb": ({"ord": 1, "ts_ms": 1700000000000},
                [("1462833718356672513", ["1462833718356672513"], "1462833718356672513"),
                 ("1462833718356672514", ["1462833718356672514"], "1462833718356672514")]),
}


def test_each_connectors_change_events_match_their_own_transactions_begin_and_end_only(spark):
    from pyspark.sql import functions as F

    from spark_jobs.debezium import connectors

    rows = [(json.dumps({"connector": name, **source}), json.dumps({"transaction": {"id": event}}), name, n)
            for name, (source, transactions) in TRANSACTION_IDS.items()
            for n, (_, ids, _) in enumerate(transactions) for event in ids]
    keyed = ordering.with_transaction_key(spark.createDataFrame(rows, "source STRING, _raw STRING, name STRING, n INT"))
    keys: dict[tuple[str, int], set[str]] = {}
    for r in keyed.collect():
        keys.setdefault((r["name"], r["n"]), set()).add(r["_transaction_id"])
    bounds = spark.createDataFrame([(name, n, begin, end) for name, (_, transactions) in TRANSACTION_IDS.items()
                                    for n, (begin, _, end) in enumerate(transactions)], "name STRING, n INT, b STRING, e STRING")
    matches = bounds.select("name", "n", F.expr(connectors.transaction_keys_sql("b")).alias("b"),
                            F.expr(connectors.transaction_keys_sql("e")).alias("e")).collect()
    for m in matches:
        (key,) = keys[(m["name"], m["n"])]  # every event of a transaction has one key
        assert key in m["b"] and key in m["e"], (m["name"], m["n"], key)
        others = [o for o in matches if o["name"] == m["name"] and o["n"] != m["n"]]
        assert not any(key in o["e"] or key in o["b"] for o in others), (m["name"], m["n"])
    assert keys[("postgresql", 0)] == {"801"} and keys[("sqlserver", 0)] == {"00000025:00000d08:0025"}
    # outside a transaction (a snapshot read) an event has none
    snapshot = spark.createDataFrame([(json.dumps({"connector": "postgresql", "lsn": 1}), "{}")], "source STRING, _raw STRING")
    assert ordering.with_transaction_key(snapshot).first()["_transaction_id"] is None
