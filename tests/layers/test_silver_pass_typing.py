"""A silver column's type over batches of plain JSON (no schema envelope): it takes the type of its first value and
never becomes text, through the silver pass and a table's own step."""

from __future__ import annotations

import pytest

from spark_jobs.lake import Lake
from tests.support import change_event, demo_registry, land, planner_run, silver_rows

TYPING_TABLES = {name: {"topic": f"shop.public.{name}", "keys": ["id"], "quality": {"max_quarantined": "100%"}}
                 for name in ("late", "late_too")}


@pytest.mark.parametrize("own_plan", [False, True], ids=["pass", "own-plan"])
def test_a_column_takes_the_type_of_its_first_value_and_never_becomes_text(spark, engine, tmp_path, capsys, monkeypatch,
                                                                            own_plan):
    """Plain JSON without the schema envelope. `n` is null in every event of the first batch: it has no type yet and
    silver leaves it out; its first integers make it bigint (older rows read null). `m`, new in the second batch, has
    an integer first and text later in that batch: bigint, the text quarantined. `s` holds text: a number or a
    boolean for it is quarantined, never kept as its text. The two tables' batches go through the silver pass, or
    each through its own plan."""
    runs = planner_run(monkeypatch, own_plan)
    config, landing, lake = demo_registry(tmp_path, [], TYPING_TABLES), tmp_path / "landing", tmp_path / "lake"
    for table in TYPING_TABLES:
        land(landing, f"shop.public.{table}", offset=0, lines=[
            change_event("c", 10, after={"id": 1, "n": None, "s": "a"}),
            change_event("c", 11, after={"id": 2, "n": None, "s": "b"})])
    code, out, err = runs(capsys, config, landing, lake, "--layers", "bronze,silver")
    assert code == 0, out + err
    for table in TYPING_TABLES:
        assert "n" not in engine.schema(Lake(str(lake)).silver(table)).fieldNames()
    land(landing, "shop.public.late", offset=2, lines=[
        change_event("u", 12, after={"id": 1, "n": 5, "s": "c", "m": 7}),
        change_event("u", 13, after={"id": 2, "n": 2**40, "s": 3, "m": "x"}),
        change_event("c", 14, after={"id": 3, "n": None, "s": "d", "m": None})])
    land(landing, "shop.public.late_too", offset=2, lines=[
        change_event("u", 12, after={"id": 1, "n": 6, "s": True}), change_event("c", 14, after={"id": 3, "n": -1})])
    code, out, err = runs(capsys, config, landing, lake, "--layers", "bronze,silver")
    assert code == 0, out + err
    if not own_plan:
        assert "silver: 2 of 2 tables' new bronze rows planned in one pass" in out and "plans its own" not in out, out
    assert silver_rows(spark, engine, lake, "late", ("id",)) == {
        (1,): {"id": 1, "n": 5, "s": "c", "m": 7}, (2,): {"id": 2, "n": None, "s": "b", "m": None},
        (3,): {"id": 3, "n": None, "s": "d", "m": None}}
    assert silver_rows(spark, engine, lake, "late_too", ("id",)) == {
        (1,): {"id": 1, "n": None, "s": "a"}, (2,): {"id": 2, "n": None, "s": "b"}, (3,): {"id": 3, "n": -1, "s": None}}
    for table, columns in (("late", ("n", "m")), ("late_too", ("n",))):
        schema = engine.schema(Lake(str(lake)).silver(table))
        assert {c: schema[c].dataType.simpleString() for c in (*columns, "s")} == {
            **dict.fromkeys(columns, "bigint"), "s": "string"}, table
    quarantined = {(r["_source_file"].rsplit("+", 1)[1], r["_line"], r["reason"]) for t in TYPING_TABLES
                   for r in engine.read(spark, Lake(str(lake)).quarantine(t)).collect()}
    assert quarantined == {("0000000002.json", 2, "incompatible_type: m (not bigint), s (not string)"),
                           ("0000000002.json", 1, "incompatible_type: s (boolean -> string)")}
