"""Transaction-consistent gold: a gold model over two tables of one connector never publishes a state the source
never had, however the source transaction's events, and its END event, are split across files and runs.

The source (tests/support.py's, with transaction metadata) keeps an order's `total` equal to the sum of its lines in
every transaction: T1 inserts order 2 with two lines, T2 raises order 1 and adds a line to it, T3 deletes order 2
and its lines. Every state the source had is one of `STATES`; the gold model shows each order's total beside the
sum of its lines."""

import json
from pathlib import Path

from spark_jobs.lake import Lake
from tests.support import (
    TX_ENDS_FIRST_NEWEST_FIRST,
    TX_STATES,
    TX_T1,
    TX_T2,
    TX_T3,
    run,
    summary_line,
    tx_gold_versions,
    tx_land,
    tx_registry,
    tx_run_in_order,
)


def test_gold_never_shows_part_of_a_source_transaction_whatever_order_its_files_land_in(spark, engine, tmp_path, capsys):
    lake, outs = tx_run_in_order(capsys, tmp_path, with_metadata=True)
    versions = tx_gold_versions(spark, engine, lake)
    assert all(v in TX_STATES for v in versions), versions
    # and it moves on as soon as a transaction is whole: T1 and T2 with T1's last line, T3 with its lines
    assert versions[-1] == TX_STATES[3]
    assert TX_STATES[2] in versions
    # while the watermark is held its rows are not published again: each gold version differs from the one before
    assert all(a != b for a, b in zip(versions, versions[1:], strict=False)), versions
    watermarks = [summary_line(out, "gold", "order_totals") for out in outs]
    assert [w.get("transaction_watermark") for w in watermarks] == ["none"] * 6 + [TX_T2, TX_T3]
    assert [w["refresh"].startswith("unchanged") for w in watermarks] == [False] + [True] * 5 + [False] * 2
    assert watermarks[3]["waiting_for"] == f"{TX_T1}(order_lines:1/2)"
    assert not [w for w in watermarks if "transaction_ids_unmatched" in w]  # its events were late, their ids match
    assert watermarks[5]["transactions_waiting"] == "3"
    published = json.loads(Path(lake.gold_inputs("order_totals")).read_text())
    assert (published["transaction_watermark"], published["transaction_position"]) == (TX_T3, 5)  # tx_t3's END: offset 5
    # silver itself moves table by table: after the orders' T3 file, order 2 is gone from silver already
    assert summary_line(outs[5], "silver", "orders")["deleted"] == "1"
    # the same landing run again changes nothing
    code, out, _ = run(capsys, tmp_path / "tables.yaml", tmp_path / "landing", lake.root)
    assert code == 0 and summary_line(out, "gold", "order_totals")["gate"] == "skipped"
    assert tx_gold_versions(spark, engine, lake)[-1] == TX_STATES[3]


def test_gold_shows_no_transaction_before_all_its_events_even_when_its_deletes_land_before_its_inserts(
        spark, engine, tmp_path, capsys):
    lake, outs = tx_run_in_order(capsys, tmp_path, True, TX_ENDS_FIRST_NEWEST_FIRST)
    versions = tx_gold_versions(spark, engine, lake)
    shown = [v for i, v in enumerate(versions) if i == 0 or v != versions[i - 1]]
    assert shown == [TX_STATES[0], TX_STATES[3]]  # T1 holds back T2 and T3 until its order lands
    assert summary_line(outs[-2], "gold", "order_totals")["waiting_for"] == f"{TX_T1}(orders:0/1)"


def test_a_watermark_held_by_ids_that_match_no_event_says_so(spark, engine, tmp_path, capsys):
    """Events whose transaction ids follow no rule of their connector (here prefixed, as no connector writes them):
    no END ever counts them, and the gold line shows the first waiting END's id beside the first such event's
    instead of waiting silently."""
    config, landing, lake = tx_registry(tmp_path, with_metadata=True), tmp_path / "landing", Lake(str(tmp_path / "lake"))
    for name in ("orders_snapshot", "lines_snapshot", "orders_t1_t2", "lines_t1_first", "lines_t1_rest_t2", "tx_t1_t2"):
        tx_land(landing, name)
    for path in landing.glob("topics/shop.public.*/partition=0/*.json"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            if r.get("transaction"):
                r["transaction"]["id"] = "tx-" + r["transaction"]["id"]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out, err = run(capsys, config, landing, lake.root)
    assert (code, err) == (0, ""), out
    line = summary_line(out, "gold", "order_totals")
    assert line["waiting_for"] == f"{TX_T1}(order_lines:0/2,orders:0/1)"
    assert line["transaction_ids_unmatched"] == f"{TX_T1}(END),tx-801(event)"
    assert tx_gold_versions(spark, engine, lake)[-1] == TX_STATES[0]
