"""Transaction-consistent gold: a gold model over two tables of one connector never publishes a state the source
never had, however the source transaction's events, and its END event, are split across files and runs.

The source (PostgreSQL, provide.transaction.metadata=true) keeps an order's `total` equal to the sum of its lines in
every transaction: T1 inserts order 2 with two lines, T2 raises order 1 and adds a line to it, T3 deletes order 2
and its lines. Every state the source had is one of `STATES`; the gold model shows each order's total beside the
sum of its lines."""

import json
from pathlib import Path

from spark_jobs.lake import Lake
from tests.support import run, summary_line

PREFIX = "shop"
ORDERS, LINES, TX = f"{PREFIX}.public.orders", f"{PREFIX}.public.order_lines", f"{PREFIX}.transaction"
# as the PostgreSQL connector (Debezium 2.x) names transactions: `<txId>:<LSN of the record>` on each record, so
# BEGIN, END and every change event of one transaction carry different ids that share the txId; T1-T3 are the ENDs'
T1, T2, T3 = "801:33900000", "802:33900100", "803:33900200"

# (order id, total, sum of its lines) per order, in each state the source went through
STATES = [
    {(1, 10, 10)},  # the snapshot
    {(1, 10, 10), (2, 30, 30)},  # after T1
    {(1, 15, 15), (2, 30, 30)},  # after T2
    {(1, 15, 15)},  # after T3
]

GOLD_SQL = """-- keys: order_id
-- sources: orders, order_lines
SELECT o.id AS order_id, o.total, CAST(coalesce(sum(l.amount), 0) AS BIGINT) AS lines_total
FROM orders o LEFT JOIN order_lines l ON l.order_id = o.id
GROUP BY o.id, o.total
"""

_lsn = iter(range(33_300_000, 34_000_000, 8))


def _txid(end_id: str) -> str:
    return end_id.split(":")[0]


def _event(table, op, row, txn=None, order=None):
    """One change event as the PostgreSQL connector writes it (without the schema envelope); `txn`: its transaction's
    END id."""
    lsn = next(_lsn)
    source = {"version": "2.7.3.Final", "connector": "postgresql", "name": PREFIX, "ts_ms": 1_730_000_000_000 + lsn,
              "snapshot": "true" if op == "r" else "false", "db": "shop", "schema": "public", "table": table,
              "txId": int(_txid(txn)) if txn else 700, "lsn": lsn, "xmin": None}
    before, after = (row, None) if op == "d" else (None, row)
    transaction = {"id": f"{_txid(txn)}:{lsn}", "total_order": order[0], "data_collection_order": order[1]} if txn else None
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": source["ts_ms"] + 50,
            "transaction": transaction}


def _boundaries(txn, counts):
    total = sum(counts.values())
    begin = f"{_txid(txn)}:{int(txn.split(':')[1]) - 99_000}"  # the BEGIN's own LSN
    return [{"status": "BEGIN", "id": begin, "ts_ms": 1_730_000_100_000, "event_count": None, "data_collections": None},
            {"status": "END", "id": txn, "ts_ms": 1_730_000_100_000, "event_count": total,
             "data_collections": [{"data_collection": f"public.{t}", "event_count": n} for t, n in counts.items()]}]


# the landing files: (topic, start offset, records), named in the order the source wrote them
FILES = {
    "orders_snapshot": (ORDERS, 0, [_event("orders", "r", {"id": 1, "total": 10})]),
    "lines_snapshot": (LINES, 0, [_event("order_lines", "r", {"id": 11, "order_id": 1, "amount": 10})]),
    "orders_t1_t2": (ORDERS, 1, [_event("orders", "c", {"id": 2, "total": 30}, T1, (1, 1)),
                                 _event("orders", "u", {"id": 1, "total": 15}, T2, (1, 1))]),
    "lines_t1_first": (LINES, 1, [_event("order_lines", "c", {"id": 21, "order_id": 2, "amount": 10}, T1, (2, 1))]),
    "lines_t1_rest_t2": (LINES, 2, [_event("order_lines", "c", {"id": 22, "order_id": 2, "amount": 20}, T1, (3, 2)),
                                    _event("order_lines", "c", {"id": 12, "order_id": 1, "amount": 5}, T2, (2, 1))]),
    "orders_t3": (ORDERS, 3, [_event("orders", "d", {"id": 2, "total": 30}, T3, (1, 1))]),
    "lines_t3": (LINES, 4, [_event("order_lines", "d", {"id": 21, "order_id": 2, "amount": 10}, T3, (2, 1)),
                            _event("order_lines", "d", {"id": 22, "order_id": 2, "amount": 20}, T3, (3, 2))]),
    "tx_t1_t2": (TX, 0, _boundaries(T1, {"orders": 1, "order_lines": 2}) + _boundaries(T2, {"orders": 1, "order_lines": 1})),
    "tx_t3": (TX, 4, _boundaries(T3, {"orders": 1, "order_lines": 2})),
}

# the worst order: the snapshots, then each transaction's events for orders long before its lines, the END events
# before the lines too, and T1's lines split across two runs
WORST_ORDER = [["orders_snapshot", "lines_snapshot"], ["orders_t1_t2"], ["tx_t1_t2"], ["lines_t1_first"], ["tx_t3"],
               ["orders_t3"], ["lines_t1_rest_t2"], ["lines_t3"]]


def _registry(tmp_path: Path, with_metadata: bool) -> Path:
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "order_totals.sql").write_text(GOLD_SQL)
    extra = f", transactions: {TX}" if with_metadata else ""
    config = tmp_path / "tables.yaml"
    config.write_text(f"tables:\n  orders: {{topic: {ORDERS}, keys: [id]{extra}}}\n"
                      f"  order_lines: {{topic: {LINES}, keys: [id]{extra}}}\n")
    return config


def _land(landing: Path, name: str) -> None:
    topic, offset, records = FILES[name]
    folder = landing / "topics" / topic / "partition=0"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{topic}+0+{offset:010d}.json").write_text("".join(json.dumps(r) + "\n" for r in records))


def _gold_versions(spark, engine, lake: Lake) -> list[set[tuple]]:
    path = lake.gold("order_totals")
    return [{tuple(r) for r in engine.read(spark, path, version=v).select("order_id", "total", "lines_total").collect()}
            for v in range(engine.version(path) + 1)]


# every END first, then each table's files newest first: T3's deletes land before the inserts they delete
ENDS_FIRST_NEWEST_FIRST = [["orders_snapshot", "lines_snapshot", "tx_t1_t2", "tx_t3"], ["lines_t3"], ["lines_t1_rest_t2"],
                           ["orders_t3"], ["lines_t1_first"], ["orders_t1_t2"]]


def _run_in_worst_order(capsys, tmp_path: Path, with_metadata: bool, order=WORST_ORDER) -> tuple[Lake, list[str]]:
    config, landing, lake = _registry(tmp_path, with_metadata), tmp_path / "landing", Lake(str(tmp_path / "lake"))
    lines = []
    for files in order:
        for name in files:
            _land(landing, name)
        code, out, err = run(capsys, config, landing, lake.root)
        assert (code, err) == (0, ""), out
        lines.append(out)
    return lake, lines


def test_gold_never_shows_part_of_a_source_transaction_whatever_order_its_files_land_in(spark, engine, tmp_path, capsys):
    lake, outs = _run_in_worst_order(capsys, tmp_path, with_metadata=True)
    versions = _gold_versions(spark, engine, lake)
    assert all(v in STATES for v in versions), versions
    # and it moves on as soon as a transaction is whole: T1 and T2 with T1's last line, T3 with its lines
    assert versions[-1] == STATES[3]
    assert STATES[2] in versions
    # while the watermark is held its rows are not published again: each gold version differs from the one before
    assert all(a != b for a, b in zip(versions, versions[1:], strict=False)), versions
    watermarks = [summary_line(out, "gold", "order_totals") for out in outs]
    assert [w.get("transaction_watermark") for w in watermarks] == ["none"] * 6 + [T2, T3]
    assert [w["refresh"].startswith("unchanged") for w in watermarks] == [False] + [True] * 5 + [False] * 2
    assert watermarks[3]["waiting_for"] == f"{T1}(order_lines:1/2)"
    assert not [w for w in watermarks if "transaction_ids_unmatched" in w]  # its events were late, their ids match
    assert watermarks[5]["transactions_waiting"] == "3"
    published = json.loads(Path(lake.gold_inputs("order_totals")).read_text())
    assert (published["transaction_watermark"], published["transaction_position"]) == (T3, 5)  # tx_t3's END: offset 5
    # silver itself moves table by table: after the orders' T3 file, order 2 is gone from silver already
    assert summary_line(outs[5], "silver", "orders")["deleted"] == "1"
    # the same landing run again changes nothing
    code, out, _ = run(capsys, tmp_path / "tables.yaml", tmp_path / "landing", lake.root)
    assert code == 0 and summary_line(out, "gold", "order_totals")["gate"] == "skipped"
    assert _gold_versions(spark, engine, lake)[-1] == STATES[3]


def test_gold_shows_no_transaction_before_all_its_events_even_when_its_deletes_land_before_its_inserts(
        spark, engine, tmp_path, capsys):
    lake, outs = _run_in_worst_order(capsys, tmp_path, True, ENDS_FIRST_NEWEST_FIRST)
    versions = _gold_versions(spark, engine, lake)
    shown = [v for i, v in enumerate(versions) if i == 0 or v != versions[i - 1]]
    assert shown == [STATES[0], STATES[3]]  # T1 holds back T2 and T3 until its order lands
    assert summary_line(outs[-2], "gold", "order_totals")["waiting_for"] == f"{T1}(orders:0/1)"


def test_a_watermark_held_by_ids_that_match_no_event_says_so(spark, engine, tmp_path, capsys):
    """Events whose transaction ids follow no rule of their connector (here prefixed, as no connector writes them):
    no END ever counts them, and the gold line shows the first waiting END's id beside the first such event's
    instead of waiting silently."""
    config, landing, lake = _registry(tmp_path, with_metadata=True), tmp_path / "landing", Lake(str(tmp_path / "lake"))
    for name in ("orders_snapshot", "lines_snapshot", "orders_t1_t2", "lines_t1_first", "lines_t1_rest_t2", "tx_t1_t2"):
        _land(landing, name)
    for path in landing.glob("topics/shop.public.*/partition=0/*.json"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            if r["transaction"]:
                r["transaction"]["id"] = "tx-" + r["transaction"]["id"]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out, err = run(capsys, config, landing, lake.root)
    assert (code, err) == (0, ""), out
    line = summary_line(out, "gold", "order_totals")
    assert line["waiting_for"] == f"{T1}(order_lines:0/2,orders:0/1)"
    assert line["transaction_ids_unmatched"] == f"{T1}(END),tx-801(event)"
    assert _gold_versions(spark, engine, lake)[-1] == STATES[0]
