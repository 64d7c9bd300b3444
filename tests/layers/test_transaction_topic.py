"""The transaction topic and the tables around it (tests/support.py's source with transaction metadata): its lines
that are not transaction events, a table given transactions after its silver was written, and gold over tables without
transaction metadata, which shows states the source never had. A module of its own so the transaction tests split
over the two test workers."""

import json

import pytest

from spark_jobs import maintenance
from spark_jobs.errors import PipelineError
from spark_jobs.lake import Lake
from spark_jobs.layers import transactions
from spark_jobs.registry import Maintenance
from tests.support import (
    TX_STATES,
    TX_T1,
    TX_T2,
    TX_T3,
    TX_TOPIC,
    TX_WORST_ORDER,
    run,
    summary_line,
    tx_boundaries,
    tx_gold_versions,
    tx_land,
    tx_registry,
    tx_run_in_order,
)


def test_without_transaction_metadata_gold_shows_states_the_source_never_had(spark, engine, tmp_path, capsys):
    """Today's behaviour for tables without `transactions`: each table's silver moves on its own, and a gold run
    between two tables' files joins one's new state with the other's old one. The smallest arrival that shows it: the
    snapshots, then the orders' TX_T1 and TX_T2 before their lines."""
    lake, _ = tx_run_in_order(capsys, tmp_path, with_metadata=False, order=TX_WORST_ORDER[:2])
    versions = tx_gold_versions(spark, engine, lake)
    assert versions[-1] == {(1, 15, 10), (2, 30, 0)}  # T1's and T2's orders without their lines: never a state
    assert versions[-1] not in TX_STATES and versions[0] == TX_STATES[0]


def test_transaction_topic_lines_that_are_not_its_events_are_quarantined_and_ends_are_kept_once(spark, engine, tmp_path):
    landing, lake = tmp_path / "landing", Lake(str(tmp_path / "lake"))
    folder = landing / "topics" / TX_TOPIC / "partition=0"
    folder.mkdir(parents=True)
    end = tx_boundaries(TX_T1, {"orders": 1})[1]
    lines = [json.dumps(end), "not json", json.dumps({"status": "COMMIT", "id": "x"}),
             json.dumps({**end, "id": TX_T2, "event_count": 3}),  # its collections count 1
             json.dumps({"schema": {}, "payload": {**end, "id": TX_T3}}), json.dumps(end)]  # T1 again: redelivered
    (folder / f"{TX_TOPIC}+0+0000000100.json").write_text("\n".join(lines) + "\n")
    taken = transactions.ingest(spark, engine, lake, str(landing), TX_TOPIC, "b1")
    assert (taken.files, taken.ends) == (1, 2)
    assert taken.quarantined == {transactions.NOT_AN_EVENT: 2, transactions.BAD_END: 1}
    ends = {r["id"]: r["_position"] for r in engine.read(spark, lake.transactions(TX_TOPIC)).collect()}
    assert ends == {TX_T1: 100, TX_T3: 104}
    assert transactions.ingest(spark, engine, lake, str(landing), TX_TOPIC, "b2") == transactions.Ingested()
    upkeep = maintenance.maintain_transactions(engine, lake, TX_TOPIC, Maintenance(), "m")
    assert [t["name"] for t in upkeep.tables] == ["transactions", "ingest_log", "quarantine"]
    (folder.parent / "partition=1").mkdir()
    (folder.parent / "partition=1" / f"{TX_TOPIC}+1+0000000000.json").write_text(json.dumps(end) + "\n")
    with pytest.raises(PipelineError, match="has partitions 0, 1"):
        transactions.ingest(spark, engine, lake, str(landing), TX_TOPIC, "b3")


def test_a_table_given_transactions_after_its_silver_was_written_is_rebuilt_first(spark, engine, tmp_path, capsys):
    """Its history's rows lack their transaction, which the watermark would never count: silver and gold refuse to
    go on (exit 2, naming the rebuild), and after the rebuild every transaction is placed from bronze's lines."""
    config, landing, lake = tx_registry(tmp_path, with_metadata=False), tmp_path / "landing", Lake(str(tmp_path / "lake"))
    for name in ("orders_snapshot", "lines_snapshot", "orders_t1_t2", "tx_t1_t2"):
        tx_land(landing, name)
    assert run(capsys, config, landing, lake.root)[0] == 0
    config.write_text(config.read_text().replace("keys: [id]}", f"keys: [id], transactions: {TX_TOPIC}}}"))
    tx_land(landing, "lines_t1_first")
    code, _, err = run(capsys, config, landing, lake.root)  # order_lines' silver: its new file
    assert code == 2 and "rebuild them first: run --mode rebuild --tables order_lines --layers silver" in err
    tx_land(landing, "tx_t3")
    code, _, err = run(capsys, config, landing, lake.root, "--tables", "orders")  # only gold has new input
    assert code == 2 and "rebuild them first: run --mode rebuild --tables orders,order_lines --layers silver" in err
    code, _, err = run(capsys, config, landing, lake.root, "--mode", "rebuild", "--layers", "silver")
    assert (code, err) == (0, "")
    assert tx_gold_versions(spark, engine, lake)[-1] not in TX_STATES  # what gold showed before: T1's order, no lines
    code, out, err = run(capsys, config, landing, lake.root)
    assert (code, err) == (0, "")
    assert summary_line(out, "gold", "order_totals")["waiting_for"] == f"{TX_T1}(order_lines:1/2)"
    assert tx_gold_versions(spark, engine, lake)[-1] == TX_STATES[0]
    tx_land(landing, "lines_t1_rest_t2")
    assert run(capsys, config, landing, lake.root)[0] == 0
    assert tx_gold_versions(spark, engine, lake)[-1] == TX_STATES[2]
