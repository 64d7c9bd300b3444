"""The silver pass (spark_jobs/layers/silver_pass.py, work in progress): many tables' new bronze rows read in one
scan, overviewed in one job and typed in one plan come out exactly as each table's own plan finds them
(silver_plan): the same overview and fields, and the same typed row and quarantine reason for every event, over
envelopes of every logical type the demo's connectors write, plain JSON, values that do not fit silver's columns,
missing keys and missing positions."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.debezium import envelope, ordering, types
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.layers import silver, silver_pass
from spark_jobs.layers.common import one_row
from spark_jobs.layers.silver import silver_progress
from spark_jobs.layers.silver_plan import (
    image_fields,
    overview_columns,
    plan_batch,
    resolve_mixed,
    truncate_reason,
    typed_changes,
)
from spark_jobs.quality.audit import tally
from spark_jobs.quality.expectations import flagged
from spark_jobs.registry import load_registry
from tests.support import (
    TX_T1,
    TX_T2,
    TX_T3,
    TX_TOPIC,
    assert_silver_is_the_source,
    change_event,
    demo_registry,
    land,
    land_generated,
    own_steps,
    run,
    silver_rows,
    step_summary,
    table_commits,
    tx_event,
)

GENERATED = ["customers", "products", "inventory_customers", "film", "actor", "film_actor"]
LANDING = "landing"


def _event(op: str, image: dict, lsn: int | None) -> str:
    return change_event(op, lsn, **({"before": image} if op == "d" else {"after": image}))


# `orders`' first batch makes silver's columns (id, qty BIGINT, note STRING); its second brings what typing refuses
FIRST = [_event("c", {"id": 1, "qty": 2, "note": "a"}, 10), _event("c", {"id": 2, "qty": 3, "note": "b"}, 11)]
SECOND = [_event("u", {"id": 1, "qty": "five", "note": "c"}, 12),  # the batch's qty is text: not silver's BIGINT
          _event("u", {"id": 2, "qty": 4.5, "note": "d"}, 13),  # nor is 4.5 (text in this batch)
          _event("c", {"qty": 1, "note": "no key"}, 14),  # no key: bronze quarantines it
          _event("c", {"id": 3, "qty": 1, "note": "no position"}, None),  # missing sequence
          _event("d", {"id": 2}, 15), _event("c", {"id": 4, "qty": 7, "note": "\u00fcn\u00ef\u0001"}, 16)]
# `typed` comes with the schema envelope: a value its declared type cannot hold is a decode problem
TYPED_SCHEMA = {"type": "struct", "fields": [
    {"field": "before", "type": "struct", "optional": True,
     "fields": [{"field": "id", "type": "int32"}, {"field": "n", "type": "int32", "optional": True}]},
    {"field": "after", "type": "struct", "optional": True,
     "fields": [{"field": "id", "type": "int32"}, {"field": "n", "type": "int32", "optional": True}]}]}
TYPED = [json.dumps({"schema": TYPED_SCHEMA, "payload": json.loads(_event("c", image, lsn))}) for image, lsn in
         (({"id": 1, "n": 5}, 20), ({"id": 2, "n": "five"}, 21), ({"id": None, "n": 1}, 22))]
HAND_MADE = {"orders": {"topic": "shop.public.orders", "keys": ["id"], "quality": {"max_quarantined": "100%"}},
             "typed": {"topic": "shop.public.typed", "keys": ["id"], "quality": {"max_quarantined": "100%"}}}


def _new_events(spark, engine, lake: Lake, table) -> DataFrame:
    """The table's bronze rows silver has not applied, ordered (what its own plan reads)."""
    bronze = engine.read(spark, lake.bronze(table.name))
    applied = silver_progress(lake, table.name).bronze_version
    return ordering.order_key(bronze.where(F.col("_bronze_version") > applied), table.sequence_by)


def test_events_typed_together_come_out_as_each_alone(spark, engine, tmp_path, capsys):
    config = demo_registry(tmp_path, GENERATED, HAND_MADE)
    registry = load_registry(str(config))
    source = tmp_path / "source"
    generated = generate(registry.select(GENERATED), source,
                         Options(rows=20, changes=40, records_per_file=25, batches=1, shuffle=True, seed=11))
    landing, lake_root = tmp_path / LANDING, tmp_path / "lake"
    land_generated(landing, source, generated, 0)
    land(landing, "shop.public.orders", offset=0, lines=FIRST)
    code, out, err = run(capsys, config, landing, lake_root, "--layers", "bronze,silver")
    assert code == 0, out + err
    land_generated(landing, source, generated, 1)
    land(landing, "shop.public.orders", offset=2, lines=SECOND)
    land(landing, "shop.public.typed", offset=0, lines=TYPED)
    code, out, err = run(capsys, config, landing, lake_root, "--layers", "bronze")  # silver has these to apply
    assert code == 0, out + err

    lake = Lake(str(lake_root))
    names = [*GENERATED, *HAND_MADE]
    candidates = [silver_pass.Candidate(registry.tables[n], silver_progress(lake, n).bronze_version,
                                        engine.new_files(lake.bronze(n), silver_progress(lake, n).bronze_version))
                  for n in names]
    events = silver_pass.scan(spark, candidates)
    overviews = silver_pass.overviews(events, [c.table for c in candidates])
    alone, typings = {}, []
    for name in names:
        table = registry.tables[name]
        own = _new_events(spark, engine, lake, table)
        assert overviews[name].figures == one_row(own.agg(*overview_columns(
            envelope.holds_placeholder(table.unavailable_value_placeholder), truncate_reason(table)))).asDict(), name
        changes = own.where("op <> 't'")
        has_plain = overviews[name].figures["plain"] > 0
        target = engine.schema(lake.silver(name))
        fields = resolve_mixed(image_fields(spark, table, changes, has_plain), target, changes)
        typed = typed_changes(table, changes, fields, types.widened(target, types.fields_type(fields))[0])
        seen = overviews[name].fields(table)
        assert seen == image_fields(spark, table, changes, has_plain), name
        assert types.mixed_typed_by_silver(seen, target) == fields, name  # qty's text and double in orders: bigint
        alone[name] = {(r["_source_file"], r["_line"]): (r["_row"], r["reason"]) for r in typed.collect()}
        typings.append(silver_pass.TableTyping(table, tuple(fields), None if target is None else target.json()))

    together = silver_pass.typed_events(events.where("op <> 't'"), typings)
    for typing in typings:
        name = typing.table.name
        rows = together.where(F.col("_table") == name).select(
            "_source_file", "_line", F.col("_row").cast(typing.row_type).alias("_row"), "reason").collect()
        assert {(r["_source_file"], r["_line"]): (r["_row"], r["reason"]) for r in rows} == alone[name], name
    # the newest event per key, and the plan's counts, as each table's own plan (silver_plan.plan_batch) finds them
    truncated_at = {n: silver_progress(lake, n).truncated_at for n in names}
    newest = silver_pass.newest_per_key(together, truncated_at)
    grouped = silver_pass.event_counts(together, truncated_at)
    counted = silver_pass.counted(grouped.read(grouped.frame.collect()))
    deletes = silver_pass.deletes_received(together)
    # the tables test_tables_planned_together_publish_as_each_alone does not hold to their own plans end to end (their
    # summaries carry these counts there): each own plan here is most of this test's time
    for typing in (t for t in typings if t.table.name not in PASSED):
        table = typing.table
        progress = silver_progress(lake, table.name)
        bronze = engine.read(spark, lake.bronze(table.name)).where(F.col("_bronze_version") > progress.bronze_version)
        plan = plan_batch(spark, engine, table, lake, bronze, progress.truncated_at)
        own = {tuple(r["_row"][k] for k in table.keys): (r["_seq"], r["op"], r["_row"], r["_events"], r["_tie"])
               for r in plan.latest.collect()}
        shared = {tuple(r["_row"][k] for k in table.keys): (r["_seq"], r["op"], r["_row"], r["_events"], r["_tie"])
                  for r in newest.where(F.col("_table") == table.name).select(
                      "_seq", "op", F.col("_row").cast(typing.row_type).alias("_row"), "_events", "_tie").collect()}
        assert shared == own, table.name
        latest = newest.where(F.col("_table") == table.name).select("_tie").toArrow()
        assert counted[table.name].figures(latest) == silver_pass.Figures(
            plan.events, plan.positions, plan.positions_after_truncate, plan.keys, plan.ties), table.name
        own_audit = tally({"events": plan.audited["events"]}, flagged("silver"), table.keys)
        assert counted[table.name].audit == own_audit, table.name
        assert sorted(r["_seq"] for r in deletes.where(F.col("_table") == table.name).collect()) == sorted(
            r["_seq"] for r in plan.deletes.collect()), table.name
    # the hand-made events were judged as intended, not only alike (a keyless one never left bronze)
    assert {line: reason for (_, line), (_, reason) in alone["orders"].items()} == {
        1: "incompatible_type: qty (not bigint)", 2: "incompatible_type: qty (not bigint)",
        4: "missing_sequence: no log position for this connector; set sequence_by", 5: None, 6: None}
    assert {line: (row.asDict(), reason) for (_, line), (row, reason) in alone["typed"].items()} == {
        1: ({"id": 1, "n": 5}, None), 2: ({"id": 2, "n": None}, "incompatible_type: n (not int)")}


# hand-made batches for the whole silver step through the pass: every way an event can go, each cycle's lines
EDGES = [
    {"edges": [_event("c", {"id": 1, "qty": 1}, 10), _event("c", {"id": 2, "qty": 1}, 11),
               _event("c", {"id": 3, "qty": 1}, 12), _event("d", {"id": 4}, 13),  # 4: a delete of a key never seen
               _event("c", {"id": 9, "qty": 1}, 14)],
     "refused": [_event("c", {"id": 1, "qty": 1}, 10), _event("c", {"id": 2, "qty": 1}, 11)],
     "truncated": [_event("c", {"id": 1, "qty": 1}, 10), _event("c", {"id": 2, "qty": 1}, 11),
                   _event("c", {"id": 3, "qty": 1}, 12), _event("d", {"id": 4}, 13)],
     # a snapshot read (no transaction), a change in T1, a change without its transaction block: quarantined
     "ordered": [tx_event("ordered", "r", {"id": 1, "total": 10}), tx_event("ordered", "c", {"id": 2, "total": 30},
                                                                           TX_T1, (1, 1)),
                 tx_event("ordered", "c", {"id": 3, "total": 5})],
     # its expectations on silver's rows: a qty above 100 is quarantined, a null one warned of
     "judged": [_event("c", {"id": 1, "qty": 1}, 10), _event("c", {"id": 2, "qty": 500}, 11),
                _event("c", {"id": 3, "qty": None}, 12)],
     "emptied": [_event("c", {"id": 1, "qty": 1}, 10), _event("d", {"id": 2}, 11)]},
    {"edges": [_event("u", {"id": 1, "qty": 2}, 20), _event("u", {"id": 1, "qty": 2}, 20),  # the same event twice
               _event("d", {"id": 2}, 21),  # a live key deleted
               _event("u", {"id": 3, "qty": 9}, 5),  # older than silver's row: stale
               _event("c", {"id": 4, "qty": 9}, 9),  # older than the ledger's delete: never brought back
               _event("c", {"id": 5, "qty": 1}, 30), _event("c", {"id": 5, "qty": 2}, 30),  # a tie
               _event("u", {"id": 6, "qty": "x"}, 31),  # not silver's BIGINT: quarantined
               _event("d", {"id": 7}, 40), _event("c", {"id": 7, "qty": 7}, 41),  # a delete superseded in the batch
               _event("c", {"id": 8, "qty": 8}, 42), _event("d", {"id": 8}, 43),  # created and deleted: absent
               _event("c", {"id": 9, "qty": 1}, 14)],  # delivered again (at least once): silver has it already
     # most of its batch not silver's type: the quarantine breaker fails its gate, in the pass as alone
     "refused": [_event("u", {"id": 1, "qty": "x"}, 20), _event("u", {"id": 2, "qty": "y"}, 21),
                 _event("c", {"id": 3, "qty": 3}, 22)],
     # a truncate at 25 empties the table and its ledger as of there: the events before it apply to nothing
     "truncated": [_event("u", {"id": 1, "qty": 2}, 20), _event("d", {"id": 2}, 21), change_event("t", 25),
                   _event("c", {"id": 5, "qty": 5}, 30), _event("u", {"id": 3, "qty": 3}, 31),  # 3: re-created
                   _event("d", {"id": 6}, 32),  # a key that is not live: the ledger records it
                   change_event("t", None)],  # a truncate without a position: quarantined, it empties nothing
     # a truncate in T2 (its log keeps T2), then T2's update of 1 and T3's delete of 2, which the truncate removed
     "ordered": [tx_event("ordered", "t", None, TX_T2, (1, 1)), tx_event("ordered", "u", {"id": 1, "total": 15}, TX_T2,
                                                                       (2, 1)),
                 tx_event("ordered", "d", {"id": 2, "total": 30}, TX_T3, (1, 1))],
     # a failing update leaves its key as it was, a later good one applies; a delete is never judged
     "judged": [_event("u", {"id": 1, "qty": 900}, 20), _event("u", {"id": 3, "qty": 7}, 21),
                _event("u", {"id": 3, "qty": 700}, 22), _event("d", {"id": 2}, 23)],
     # a batch of a truncate alone: no row event, silver and its ledger emptied, history closed by the truncate log
     "emptied": [change_event("t", 30)]},
]
# edges, truncated and ordered keep history (and its truncate log): the pass writes it as their own plans do
EDGE_TABLES = {"edges": {"topic": "shop.public.edges", "keys": ["id"], "quality": {"max_quarantined": "100%"},
                         "history": True},
               "refused": {"topic": "shop.public.refused", "keys": ["id"]},
               "truncated": {"topic": "shop.public.truncated", "keys": ["id"], "history": True,
                             "quality": {"max_quarantined": "100%"}},
               # its transactions: each row and history version carries its transaction's id
               "ordered": {"topic": "shop.public.ordered", "keys": ["id"], "transactions": TX_TOPIC,
                           "quality": {"max_quarantined": "100%"}},
               "judged": {"topic": "shop.public.judged", "keys": ["id"], "quality": {"max_quarantined": "100%"},
                          "expectations": [
                              {"expect_column_values_to_be_between": {"column": "qty", "max_value": 100},
                               "action": "quarantine"},
                              {"expect_column_values_to_not_be_null": {"column": "qty"}}]},
               "emptied": {"topic": "shop.public.emptied", "keys": ["id"], "history": True}}
PASSED = ["products", "film_actor", "actor", "customers"]  # generated (customers: expectations on silver's rows)


def _silver_state(spark, engine, lake_root: Path, table: str) -> dict:
    """A table's silver, ledger, history, truncate log and silver quarantine rows, without what names the run or its
    time."""
    lake = Lake(str(lake_root))

    def rows(path: str, drop: tuple[str, ...]) -> list:
        df = engine.read(spark, path)
        return [] if df is None else sorted((tuple(r) for r in df.drop(*drop).collect()), key=repr)  # nulls too

    quarantine = engine.read(spark, lake.quarantine(table))
    return {"silver": rows(lake.silver(table), ("_ingested_at", "_batch_id")),
            "ledger": rows(lake.tombstones(table), ("_deleted_at_ms",)),
            "history": rows(lake.history(table), ("_ingested_at", "_batch_id")),
            "truncates": rows(lake.truncates(table), ("_batch_id",)),
            "quarantine": [] if quarantine is None else sorted(
                (r["_source_file"].rsplit("/", 1)[1], r["_line"], r["reason"])
                for r in quarantine.where("layer = 'silver'").collect()),
            "commits": table_commits(engine, lake.silver(table))}


def test_tables_planned_together_publish_as_each_alone(spark, engine, tmp_path, capsys, monkeypatch):
    """The silver step through the pass (silver_pass.read_together, then silver_pass.plan_table on the driver) leaves every
    table's silver, tombstone ledger, quarantine and summary as its own plan does, over generated changes and every
    way an event can go; one table's failing gate fails that table only, in the same cycle as the others publish."""
    config = demo_registry(tmp_path, PASSED, EDGE_TABLES)
    registry = load_registry(str(config))
    source = tmp_path / "source"
    generated = generate(registry.select(PASSED), source,
                         Options(rows=20, changes=40, records_per_file=25, batches=1, shuffle=True, seed=5))
    together, alone = tmp_path / "together", tmp_path / "alone"
    names = [*PASSED, *EDGE_TABLES]
    asked: list[list[str]] = []  # the tables of each joint answer (tallies and gates) on merged rows
    answer_merged = silver.answer_merged
    monkeypatch.setattr(silver, "answer_merged",
                        lambda questions, *args: asked.append(sorted(questions)) or answer_merged(questions, *args))
    for cycle, edges in enumerate(EDGES):
        for where in (together, alone):
            land_generated(where / LANDING, source, generated, cycle)
            for table, lines in edges.items():
                land(where / LANDING, f"shop.public.{table}", lines, cycle)
        asked.clear()
        code, out, err = run(capsys, config, together / LANDING, together / "lake", "--layers", "bronze,silver")
        assert f"silver: {len(names)} of {len(names)} tables' new bronze rows planned in one pass" in out, out + err
        assert "plans its own" not in out + err  # each table's step took the pass's plan
        failed = [word for line in err.splitlines() for word in line.split() if word.startswith("table=")]
        assert (code, failed) == ((1, ["table=refused"]) if cycle else (0, [])), out + err
        # every table that merged had its merged rows tallied and gated in one joint answer (refused's batch was refused before)
        assert asked == [sorted(n for n in names if (n, cycle) != ("refused", 1))], asked
        # every table on its own step, in one run: one table's failing gate fails it alone there too
        code_alone, out_alone, err_alone = own_steps(monkeypatch, capsys, config, alone / LANDING, alone / "lake",
                                                     "--layers", "bronze,silver")
        failed_alone = [word for line in err_alone.splitlines() for word in line.split() if word.startswith("table=")]
        assert (code_alone, failed_alone) == (code, failed), out_alone + err_alone
        assert "planned in one pass" not in out_alone
        for table in names:
            assert _silver_state(spark, engine, together / "lake", table) == _silver_state(
                spark, engine, alone / "lake", table), (cycle, table)
            assert step_summary(out, "silver", table) == step_summary(out_alone, "silver", table), (cycle, table)
        if cycle == 0:  # as a run killed between its two merges leaves it: a ledger entry older than key 3's live row
            for where in (together, alone):
                _ledger_entry_behind(spark, engine, Lake(str(where / "lake")), "edges", 3)
    # right, not only alike: the generated tables equal their source's state, the edges as each event says
    assert_silver_is_the_source(spark, engine, together / "lake", generated, config)
    assert silver_rows(spark, engine, together / "lake", "edges", ("id",)) == {
        (1,): {"id": 1, "qty": 2}, (3,): {"id": 3, "qty": 1}, (5,): {"id": 5, "qty": 2}, (7,): {"id": 7, "qty": 7},
        (9,): {"id": 9, "qty": 1}}
    edges = step_summary(out, "silver", "edges")
    assert {k: edges[k] for k in ("duplicates_dropped", "ties", "stale_ignored", "quarantined", "inserted", "updated",
                                  "deleted")} == {
        # duplicates: key 1's event twice, key 9's delivered again (silver holds it); stale: keys 3 and 4
        "duplicates_dropped": "3", "ties": "1", "stale_ignored": "2", "quarantined": "incompatible_type:1",
        "inserted": "2", "updated": "1", "deleted": "1"}
    ledger = engine.read(spark, Lake(str(together / "lake")).tombstones("edges"))
    assert sorted(r["id"] for r in ledger.collect()) == [2, 4, 8]  # key 3's stale entry cleared, 7 re-created
    assert silver_rows(spark, engine, together / "lake", "truncated", ("id",)) == {
        (3,): {"id": 3, "qty": 3}, (5,): {"id": 5, "qty": 5}}
    truncated = engine.read(spark, Lake(str(together / "lake")).tombstones("truncated"))
    assert sorted(r["id"] for r in truncated.collect()) == [6]  # key 4's entry was before the truncate
    assert {k: step_summary(out, "silver", "truncated")[k] for k in ("truncates", "inserted", "updated", "deleted")} == {
        "truncates": "1", "inserted": "2", "updated": "0", "deleted": "3"}
    # every applied event a version, ended by its key's next event or, unless a delete, by the truncate at 25
    history = engine.read(spark, Lake(str(together / "lake")).history("truncated")).collect()

    def lsn(seq: str | None) -> int | None:
        return None if seq is None else int(seq.split("|")[0])
    assert sorted((r["id"], r["_op"], lsn(r["_seq"]), lsn(r["_valid_to"]), r["_is_current"]) for r in history) == [
        (1, "c", 10, 20, False), (1, "u", 20, 25, False), (2, "c", 11, 21, False), (2, "d", 21, None, False),
        (3, "c", 12, 25, False), (3, "u", 31, None, True), (4, "d", 13, None, False), (5, "c", 30, None, True),
        (6, "d", 32, None, False)]
    truncates = engine.read(spark, Lake(str(together / "lake")).truncates("truncated")).collect()
    assert [lsn(r["_seq"]) for r in truncates] == [25]
    assert [(r["_line"], r["reason"].split(":")[0]) for r in engine.read(
        spark, Lake(str(together / "lake")).quarantine("truncated")).collect()] == [(7, "missing_sequence")]
    ordered = Lake(str(together / "lake"))
    assert [(r["id"], r["total"], r["_transaction_id"]) for r in engine.read(spark, ordered.silver("ordered")).collect()
            ] == [(1, 15, "802")]
    assert sorted((r["id"], r["_op"], r["_transaction_id"]) for r in engine.read(spark, ordered.history("ordered")).collect()
                  ) == [(1, "r", None), (1, "u", "802"), (2, "c", "801"), (2, "d", "803")]
    assert [r["reason"].split(":")[0] for r in engine.read(spark, ordered.quarantine("ordered")).collect()] == [
        "missing_transaction"]
    assert [r["_transaction_id"] for r in engine.read(spark, ordered.truncates("ordered")).collect()] == ["802"]
    assert silver_rows(spark, engine, together / "lake", "judged", ("id",)) == {
        (1,): {"id": 1, "qty": 1}, (3,): {"id": 3, "qty": 7}}
    too_many = "expectation: expect_column_values_to_be_between(qty) max_value=100"
    assert sorted((int(r["_source_file"].rsplit("+", 1)[1].split(".")[0]), r["_line"], r["reason"])  # cycle, line
                  for r in engine.read(spark, Lake(str(together / "lake")).quarantine("judged")).collect()) == [
        (0, 2, too_many), (1, 1, too_many), (1, 3, too_many)]
    assert step_summary(out, "silver", "judged")["warnings"] == "1"  # cycle 1 has no null: the quarantine's finding
    assert silver_rows(spark, engine, together / "lake", "refused", ("id",)) == {
        (1,): {"id": 1, "qty": 1}, (2,): {"id": 2, "qty": 1}}  # its failed batch left silver as it was
    # a truncate alone empties silver and the ledger (key 2's delete at 11) and ends key 1's version at 30
    emptied = Lake(str(together / "lake"))
    assert (silver_rows(spark, engine, together / "lake", "emptied", ("id",)),
            engine.read(spark, emptied.tombstones("emptied")).count()) == ({}, 0)
    assert sorted((r["id"], r["_op"], lsn(r["_seq"]), lsn(r["_valid_to"]), r["_is_current"])
                  for r in engine.read(spark, emptied.history("emptied")).collect()) == [
        (1, "c", 10, 30, False), (2, "d", 11, None, False)]
    assert [lsn(r["_seq"]) for r in engine.read(spark, emptied.truncates("emptied")).collect()] == [30]
    assert step_summary(out, "silver", "emptied")["truncates"] == "1"


def _ledger_entry_behind(spark, engine, lake: Lake, table: str, key: int) -> None:
    """A tombstone-ledger entry for `key` at a position before its live row's (key 1's row's, which is older)."""
    older = engine.read(spark, lake.silver(table)).where("id = 1").select("_seq").first()["_seq"]
    live = engine.read(spark, lake.silver(table)).where(F.col("id") == key).first()
    assert live is not None and older < live["_seq"]
    ledger = engine.read(spark, lake.tombstones(table))
    engine.append(ledger.limit(1).withColumn("id", F.lit(key).cast(ledger.schema["id"].dataType))
                  .withColumn("_seq", F.lit(older)), lake.tombstones(table))


def test_a_pass_holds_at_most_one_tasks_rows(spark, engine, tmp_path, capsys, monkeypatch):
    """More new rows than a pass's go in several passes, each within the bound (a `--layers silver` run over many
    tables would otherwise plan all of them in one partition and collect them at once); each table still publishes
    its own rows."""
    names = ["one", "two", "three"]
    config = demo_registry(tmp_path, [], {n: {"topic": f"shop.public.{n}", "keys": ["id"]} for n in names})
    landing, lake = tmp_path / LANDING, tmp_path / "lake"
    for n, name in enumerate(names):
        land(landing, f"shop.public.{name}",
             [_event("c", {"id": 1, "qty": n}, 10), _event("c", {"id": 2, "qty": n}, 11), _event("d", {"id": 1}, 12)])
    code, out, err = run(capsys, config, landing, lake, "--layers", "bronze")
    assert code == 0, out + err
    assert {n: engine.new_files(Lake(str(lake)).bronze(n), -1).rows for n in names} == dict.fromkeys(names, 3)
    monkeypatch.setattr(silver, "PASS_ROWS", 6)  # two tables' new rows fit in a pass, not three
    passes, real = [], silver_pass.read_together

    def recorded(spark, engine, lake, candidates):
        passes.append([c.table.name for c in candidates])
        return real(spark, engine, lake, candidates)

    monkeypatch.setattr(silver_pass, "read_together", recorded)
    code, out, err = run(capsys, config, landing, lake, "--layers", "silver")
    assert code == 0, out + err
    assert [len(p) for p in passes] == [2, 1], passes  # the third table in a pass of its own
    assert "silver: 2 of 2 tables' new bronze rows planned in one pass" in out, out
    assert "silver: 1 of 1 tables' new bronze rows planned in one pass" in out, out
    for n, name in enumerate(names):
        assert silver_rows(spark, engine, lake, name, ("id",)) == {(2,): {"id": 2, "qty": n}}, name


def _two_tables_through_a_pass(tmp_path: Path, capsys, names: list[str]) -> tuple[Path, Path, Path]:  # noqa: ANN001
    """`names`' first event each, through bronze and silver in one run: silver's first batch, planned in a pass."""
    config = demo_registry(tmp_path, [], {n: {"topic": f"shop.public.{n}", "keys": ["id"]} for n in names})
    landing, lake = tmp_path / LANDING, tmp_path / "lake"
    for name in names:
        land(landing, f"shop.public.{name}", offset=0, lines=[_event("c", {"id": 1, "qty": 1}, 10)])
    code, out, err = run(capsys, config, landing, lake, "--layers", "bronze,silver")
    assert code == 0 and f"{len(names)} of {len(names)} tables' new bronze rows planned in one pass" in out, out + err
    return config, landing, lake


def test_tables_whose_bronze_added_no_files_are_left_to_their_own_step(spark, engine, tmp_path, capsys):
    """A bronze commit that adds no file (a table property set, as maintenance may) gives silver nothing to read: no
    shared pass is tried over such tables (a scan of no files fails), and each one's own step finds nothing new."""
    import deltalake

    names = ["one", "two"]
    config, landing, lake = _two_tables_through_a_pass(tmp_path, capsys, names)
    for name in names:
        deltalake.DeltaTable(Lake(str(lake)).bronze(name)).alter.set_table_properties(
            {"delta.logRetentionDuration": "interval 30 days"})
    code, out, err = run(capsys, config, landing, lake, "--layers", "silver")
    assert code == 0, out + err
    assert "shared pass" not in err and "one pass" not in out, out + err
    for name in names:
        assert silver_rows(spark, engine, lake, name, ("id",)) == {(1,): {"id": 1, "qty": 1}}, name


def test_a_commit_that_changes_no_silver_row_keeps_the_next_batch_in_the_pass(spark, engine, tmp_path, capsys):
    """A commit after silver's recorded progress that is a setting's (gold turns the change feed on after silver's
    first batch) or maintenance's (OPTIMIZE) is no interrupted run: the next batch is still planned in the pass, where
    it once went to each table's own plan (in `make demo`, its second silver run took 26 s instead of 5)."""
    import deltalake

    names = ["one", "two"]
    config, landing, lake = _two_tables_through_a_pass(tmp_path, capsys, names)
    one, two = (deltalake.DeltaTable(Lake(str(lake)).silver(name)) for name in names)
    one.alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    two.optimize.compact()
    two.alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    for name in names:
        land(landing, f"shop.public.{name}", offset=1, lines=[_event("u", {"id": 1, "qty": 2}, 11),
                                                              _event("c", {"id": 2, "qty": 3}, 12)])
    code, out, err = run(capsys, config, landing, lake, "--layers", "bronze,silver")
    assert code == 0 and "2 of 2 tables' new bronze rows planned in one pass" in out, out + err
    for name in names:
        assert silver_rows(spark, engine, lake, name, ("id",)) == {(1,): {"id": 1, "qty": 2}, (2,): {"id": 2, "qty": 3}}


def test_one_tables_failing_gate_in_a_pass_fails_that_table_alone_and_gx_names_it(spark, engine, tmp_path, capsys,
                                                                                     monkeypatch):
    """A pass's tables are gated in one GX validation, a row per table: when one table's merged result is wrong (an
    engine that forgets the delete clause of its silver merge, for that table only), GX's result names that table, its
    gate fails and its silver is restored, while the pass's other tables publish; the pass's Data Docs page, opened in
    chromium, lists every table with its verdict."""
    import spark_jobs.delta.delta_rs as delta_rs
    from spark_jobs.quality import gates
    from tests.support import opened_in_chromium

    names = ["one", "two", "three"]
    config = demo_registry(tmp_path, [], {n: {"topic": f"shop.public.{n}", "keys": ["id"]} for n in names})
    landing, lake = tmp_path / LANDING, tmp_path / "lake"
    for name in names:
        land(landing, f"shop.public.{name}", offset=0, lines=[_event("c", {"id": 1, "qty": 1}, 10),
                                                             _event("c", {"id": 2, "qty": 1}, 11)])
    assert run(capsys, config, landing, lake, "--layers", "bronze,silver")[0] == 0
    merge = delta_rs.DeltaRsEngine.merge

    def forgetting_two(self, df, path, spec, *args, **kwargs):  # a broken merge, for table two's silver only
        broken = spec.delete_when is not None and path == Lake(str(lake)).silver("two")
        return merge(self, df, path, replace(spec, delete_when=None) if broken else spec, *args, **kwargs)

    monkeypatch.setattr(delta_rs.DeltaRsEngine, "merge", forgetting_two)
    gated: list[list[str]] = []
    run_audit_gates = gates.run_audit_gates
    monkeypatch.setattr(gates, "run_audit_gates", lambda asked, *args: gated.append(
        [g.table for g in asked if g.layer == "silver"]) or run_audit_gates(asked, *args))
    for name in names:
        land(landing, f"shop.public.{name}", offset=2, lines=[_event("d", {"id": 1}, 20),
                                                             _event("u", {"id": 2, "qty": 5}, 21)])
    code, out, err = run(capsys, config, landing, lake, "--layers", "bronze,silver", "--run-id", "pass-run")
    assert (code, err) == (1, "gate failed: table=two layer=silver expectation=deleted_keys_not_live unexpected=1 of 1; "
                              "expectation=deletes_reconcile observed=1 of 1 deletes received not accounted for\n")
    assert [sorted(g) for g in gated if g] == [sorted(names)]  # one GX validation for the pass's three tables
    for name in names:
        qty = 1 if name == "two" else 5  # two's batch is rolled back whole, its update too
        assert silver_rows(spark, engine, lake, name, ("id",)) == {
            **({(1,): {"id": 1, "qty": 1}} if name == "two" else {}), (2,): {"id": 2, "qty": qty}}, name
        if name != "two":
            assert step_summary(out, "silver", name)["gate"] == "passed", out

    results = list((lake / "_state" / "gx" / "silver-pass").rglob("pass-run/*/*.json"))
    assert len(results) == 1, results  # GX's run is the pipeline's
    by_check = {r["expectation_config"]["kwargs"]["column"]: r for r in json.loads(results[0].read_text())["results"]}
    assert {column: [row["table"] for row in r["result"].get("unexpected_index_list") or []]
            for column, r in by_check.items() if column != "table"} == {
        "deleted_keys_not_live": ["two"], "deletes_unaccounted": ["two"], "key_not_null": [], "key_unique": [],
        "quarantined_share": [], "sequence_increasing": [], "sequence_present": []}
    page = next((lake / "reports" / "data_docs" / "silver-pass" / "validations").rglob("pass-run/*/*.html"))
    shown = opened_in_chromium(page)["text"]
    assert ("Table\nVerdict\nChecks it failed\none\npassed\n-\nthree\npassed\n-\n"
            "two\nfailed\ndeleted_keys_not_live, deletes_reconcile\n") in shown, shown


def test_a_truncate_outside_its_tables_transactions_is_quarantined_and_empties_nothing(spark, engine, tmp_path,
                                                                                        capsys):
    """A truncate without its transaction block, on a table with transactions, is quarantined as a change without one
    is: it never reaches the truncate log, so it must not empty silver either (history would keep what it removed)."""
    config = demo_registry(tmp_path, [], {"ordered": {"topic": "shop.public.ordered", "keys": ["id"],
                                                      "transactions": TX_TOPIC, "quality": {"max_quarantined": "100%"}}})
    landing, lake = tmp_path / LANDING, tmp_path / "lake"
    land(landing, "shop.public.ordered", [tx_event("ordered", "r", {"id": 1, "total": 10}),
                                          tx_event("ordered", "c", {"id": 2, "total": 30}, TX_T1, (1, 1))], 0)
    land(landing, "shop.public.ordered", [tx_event("ordered", "t", None),
                                          tx_event("ordered", "c", {"id": 3, "total": 5}, TX_T2, (1, 1))], 1)
    code, out, err = run(capsys, config, landing, lake, "--layers", "bronze,silver")
    assert code == 0, out + err
    assert "1 of 1 tables' new bronze rows planned in one pass" in out and "plans its own" not in out, out
    assert silver_rows(spark, engine, lake, "ordered", ("id",)) == {
        (1,): {"id": 1, "total": 10}, (2,): {"id": 2, "total": 30}, (3,): {"id": 3, "total": 5}}
    tables = Lake(str(lake))
    assert [(r["_line"], r["reason"].split(":")[0]) for r in engine.read(spark, tables.quarantine("ordered")).collect()
            ] == [(1, "missing_transaction")]
    assert engine.read(spark, tables.truncates("ordered")) is None
    assert step_summary(out, "silver", "ordered")["truncates"] == "0"
