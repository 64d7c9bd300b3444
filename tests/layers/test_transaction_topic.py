"""The transaction topic and the tables around it (test_transactions.py's source and files): its lines that are not
transaction events, a table given transactions after its silver was written, and gold over tables without
transaction metadata, which shows states the source never had. A module of its own so the transaction tests split
over the two test workers."""

import json

import pytest

from spark_jobs import maintenance
from spark_jobs.errors import PipelineError
from spark_jobs.lake import Lake
from spark_jobs.layers import transactions
from spark_jobs.registry import Maintenance
from tests.layers.test_transactions import (
    STATES,
    T1,
    T2,
    T3,
    TX,
    WORST_ORDER,
    _boundaries,
    _gold_versions,
    _land,
    _registry,
    _run_in_worst_order,
)
from tests.support import run, summary_line


def test_without_transaction_metadata_gold_shows_states_the_source_never_had(spark, engine, tmp_path, capsys):
    """Today's behaviour for tables without `transactions`: each table's silver moves on its own, and a gold run
    between two tables' files joins one's new state with the other's old one. The smallest arrival that shows it: the
    snapshots, then the orders' T1 and T2 before their lines."""
    lake, _ = _run_in_worst_order(capsys, tmp_path, with_metadata=False, order=WORST_ORDER[:2])
    versions = _gold_versions(spark, engine, lake)
    assert versions[-1] == {(1, 15, 10), (2, 30, 0)}  # T1's and T2's orders without their lines: never a state
    assert versions[-1] not in STATES and versions[0] == STATES[0]


def test_transaction_topic_lines_that_are_not_its_events_are_quarantined_and_ends_are_kept_once(spark, engine, tmp_path):
    landing, lake = tmp_path / "landing", Lake(str(tmp_path / "lake"))
    folder = landing / "topics" / TX / "partition=0"
    folder.mkdir(parents=True)
    end = _boundaries(T1, {"orders": 1})[1]
    lines = [json.dumps(end), "not json", json.dumps({"status": "COMMIT", "id": "x"}),
             json.dumps({**end, "id": T2, "event_count": 3}),  # its collections count 1
             json.dumps({"schema": {}, "payload": {**end, "id": T3}}), json.dumps(end)]  # T1 again: redelivered
    (folder / f"{TX}+0+0000000100.json").write_text("\n".join(lines) + "\n")
    taken = transactions.ingest(spark, engine, lake, str(landing), TX, "b1")
    assert (taken.files, taken.ends) == (1, 2)
    assert taken.quarantined == {transactions.NOT_AN_EVENT: 2, transactions.BAD_END: 1}
    ends = {r["id"]: r["_position"] for r in engine.read(spark, lake.transactions(TX)).collect()}
    assert ends == {T1: 100, T3: 104}
    assert transactions.ingest(spark, engine, lake, str(landing), TX, "b2") == transactions.Ingested()
    upkeep = maintenance.maintain_transactions(engine, lake, TX, Maintenance(), "m")
    assert [t["name"] for t in upkeep.tables] == ["transactions", "ingest_log", "quarantine"]
    (folder.parent / "partition=1").mkdir()
    (folder.parent / "partition=1" / f"{TX}+1+0000000000.json").write_text(json.dumps(end) + "\n")
    with pytest.raises(PipelineError, match="has partitions 0, 1"):
        transactions.ingest(spark, engine, lake, str(landing), TX, "b3")


def test_a_table_given_transactions_after_its_silver_was_written_is_rebuilt_first(spark, engine, tmp_path, capsys):
    """Its history's rows lack their transaction, which the watermark would never count: silver and gold refuse to
    go on (exit 2, naming the rebuild), and after the rebuild every transaction is placed from bronze's lines."""
    config, landing, lake = _registry(tmp_path, with_metadata=False), tmp_path / "landing", Lake(str(tmp_path / "lake"))
    for name in ("orders_snapshot", "lines_snapshot", "orders_t1_t2", "tx_t1_t2"):
        _land(landing, name)
    assert run(capsys, config, landing, lake.root)[0] == 0
    config.write_text(config.read_text().replace("keys: [id]}", f"keys: [id], transactions: {TX}}}"))
    _land(landing, "lines_t1_first")
    code, _, err = run(capsys, config, landing, lake.root)  # order_lines' silver: its new file
    assert code == 2 and "rebuild them first: run --mode rebuild --tables order_lines --layers silver" in err
    _land(landing, "tx_t3")
    code, _, err = run(capsys, config, landing, lake.root, "--tables", "orders")  # only gold has new input
    assert code == 2 and "rebuild them first: run --mode rebuild --tables orders,order_lines --layers silver" in err
    code, _, err = run(capsys, config, landing, lake.root, "--mode", "rebuild", "--layers", "silver")
    assert (code, err) == (0, "")
    assert _gold_versions(spark, engine, lake)[-1] not in STATES  # what gold showed before: T1's order, no lines
    code, out, err = run(capsys, config, landing, lake.root)
    assert (code, err) == (0, "")
    assert summary_line(out, "gold", "order_totals")["waiting_for"] == f"{T1}(order_lines:1/2)"
    assert _gold_versions(spark, engine, lake)[-1] == STATES[0]
    _land(landing, "lines_t1_rest_t2")
    assert run(capsys, config, landing, lake.root)[0] == 0
    assert _gold_versions(spark, engine, lake)[-1] == STATES[2]
