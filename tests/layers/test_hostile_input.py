"""What hostile and odd input does: names and values Spark would substitute into (${env:...} and its kind) reach the
lake as they were; a stale event's claimed type changes no schema; names a source can send (a backtick, a colon)
keep their column; undecodable decimals are quarantined with their reason while their batch goes on; a full disk is
a retryable failure with its cause (a landing file turned into a link after its listing: tests/unit/test_landing.py).
Each on the silver pass and a table's own plan where the planner matters; the engines' part (quoting in merges) is
tests/unit/test_delta_engines.py's, on both."""

from __future__ import annotations

import base64
import errno
import json
from pathlib import Path

import pytest

from spark_jobs.lake import Lake
from tests.support import change_event, land, planner_run, run, silver_rows, summary_line

TOPIC = "shop.public.orders"
CONFIG = f"quality: {{max_quarantined: 100%}}\ntables:\n  orders:\n    topic: {TOPIC}\n    keys: [id]\n"
# what Spark's variable substitution would put in their place: the test session's own values
PROBES = ("${env:HOME}", "${system:java.vm.name}", "${spark:spark.app.name}", "${hivevar:x}")


def _lake_text(lake: Path) -> str:
    """Every Delta log line of the lake (what a commit records: its files, predicates, metrics)."""
    return "\n".join(p.read_text() for p in lake.rglob("_delta_log/*.json"))


@pytest.mark.parametrize("own_plan", [False, True], ids=["pass", "own-plan"])
def test_names_and_values_spark_would_substitute_into_reach_the_lake_as_they_were(spark, engine, tmp_path, capsys,
                                                                                 monkeypatch, own_plan):
    (tmp_path / "tables.yaml").write_text(CONFIG)
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    name = "".join(PROBES)
    path = land(landing, TOPIC, [
        change_event("c", 10, after={"id": 1, **{probe: probe for probe in PROBES}, "c:d": 4, "a`b": "x", "e.f": 5}),
        change_event("c", 11, after={"id": 2, PROBES[0]: "plain", "c:d": 6, "a`b": "y", "e.f": 7}),
        '{"before":null,"after":{"id":3,'],  # a line to quarantine: its file's name goes there too
        suffix=f"-{name}.json")
    code, out, err = planner_run(monkeypatch, own_plan)(capsys, tmp_path / "tables.yaml", landing, lake)
    assert (code, err) == (0, ""), out
    tables = Lake(str(lake))
    bronze = {r["_source_file"] for r in engine.read(spark, tables.bronze("orders")).collect()}
    quarantined = {r["_source_file"] for r in engine.read(spark, tables.quarantine("orders")).collect()}
    assert bronze == quarantined == {str(path.relative_to(landing))}
    assert silver_rows(spark, engine, lake, "orders", ("id",)) == {
        (1,): {"id": 1, **{probe: probe for probe in PROBES}, "c:d": 4, "a`b": "x", "e.f": 5},
        (2,): {"id": 2, PROBES[0]: "plain", **dict.fromkeys(PROBES[1:]), "c:d": 6, "a`b": "y", "e.f": 7}}
    # nothing substituted anywhere: not the session's home, JVM or application name
    substituted = [str(Path.home()), spark.sparkContext.appName, "OpenJDK", "Server VM"]
    text = _lake_text(lake) + json.dumps(sorted(bronze | quarantined))
    assert not [value for value in substituted if value in text.replace(str(tmp_path), "")]


def _typed_event(op: str, row: dict, lsn: int, fields: dict[str, dict]) -> str:
    """PostgreSQL's change event with the schema envelope, its image of `fields` (Connect schemas by column)."""
    image = {"type": "struct", "optional": True, "fields": [{"field": name, **schema} for name, schema in fields.items()]}
    schema = {"type": "struct", "fields": [{**image, "field": "before"}, {**image, "field": "after"}]}
    images = {"before": row} if op == "d" else {"after": row}
    return json.dumps({"schema": schema, "payload": json.loads(change_event(op, lsn, **images))})


def _decimal(precision: object, scale: object) -> dict:
    return {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)}}


def _unscaled(value: int) -> str:
    return base64.b64encode(value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)).decode()


ID = {"type": "int32"}


@pytest.mark.parametrize("own_plan", [False, True], ids=["pass", "own-plan"])
def test_an_undecodable_decimal_is_quarantined_with_its_reason_and_its_batch_goes_on(spark, engine, tmp_path, capsys,
                                                                                     monkeypatch, own_plan):
    """A scale that is not a number, a Connect decimal that is not base64 (of up to 18 digits, which SQL decodes,
    and of more, which Python does): each such event quarantined, naming the column and why; the others applied."""
    (tmp_path / "tables.yaml").write_text(CONFIG)
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    land(landing, TOPIC, [
        _typed_event("c", {"id": 1, "small": _unscaled(1050)}, 10, {"id": ID, "small": _decimal(10, 2)}),
        _typed_event("c", {"id": 2, "small": "not base64!"}, 11, {"id": ID, "small": _decimal(10, 2)}),
        _typed_event("c", {"id": 3, "small": _unscaled(5)}, 12, {"id": ID, "small": _decimal(10, "two")}),
        _typed_event("c", {"id": 4, "big": _unscaled(10**19 + 7)}, 13, {"id": ID, "big": _decimal(24, 3)}),
        _typed_event("c", {"id": 5, "big": "@@@@"}, 14, {"id": ID, "big": _decimal(24, 3)})])
    code, out, err = planner_run(monkeypatch, own_plan)(capsys, tmp_path / "tables.yaml", landing, lake)
    assert (code, err) == (0, ""), out
    assert own_plan or ("1 of 1 tables' new bronze rows planned in one pass" in out and "plans its own" not in out), out
    rows = silver_rows(spark, engine, lake, "orders", ("id",))
    assert sorted(rows) == [(1,), (4,)]
    assert (str(rows[(1,)]["small"]), str(rows[(4,)]["big"])) == ("10.50", "10000000000000000.007")
    reasons = sorted((r["_line"], r["reason"]) for r in engine.read(spark, Lake(str(lake)).quarantine("orders")).collect())
    assert reasons == [
        (2, "incompatible_type: small (not decimal(10,2))"),
        (3, "incompatible_type: small (undecodable: the schema's decimal scale 'two' and precision '10')"),
        (5, "incompatible_type: big (not decimal(24,3))")]


@pytest.mark.parametrize("own_plan", [False, True], ids=["pass", "own-plan"])
def test_a_stale_events_claimed_type_changes_no_schema_and_a_newer_ones_widens(spark, engine, tmp_path, capsys,
                                                                               monkeypatch, own_plan):
    """The type comes from the log: an event older than its key's state (stale: it changes no row) whose envelope
    claims a wider type leaves silver's types as they were; the first event the merge applies with that claim widens
    them. A claim the column cannot take (a timestamp for a date) is quarantined, naming both types."""
    (tmp_path / "tables.yaml").write_text(CONFIG)
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    runs = planner_run(monkeypatch, own_plan)
    narrow, wide = {"id": ID, "n": {"type": "int32", "optional": True}}, {"id": ID, "n": {"type": "int64", "optional": True}}
    land(landing, TOPIC, [_typed_event("c", {"id": 1, "n": 1}, 100, narrow), _typed_event("c", {"id": 2, "n": 2}, 101, narrow)])
    assert runs(capsys, tmp_path / "tables.yaml", landing, lake)[0] == 0
    silver = Lake(str(lake)).silver("orders")
    versions = engine.version(silver)
    land(landing, TOPIC, [_typed_event("u", {"id": 1, "n": 5}, 50, wide)], offset=2)  # older than key 1's insert
    code, out, err = runs(capsys, tmp_path / "tables.yaml", landing, lake)
    assert (code, err) == (0, ""), out
    line = summary_line(out, "silver", "orders")
    assert (line["stale_ignored"], "widened" in line) == ("1", False), line
    # the pass types the batch at the claimed type: its own plan types it again at silver's
    assert own_plan or "widens a type only a stale event claims, it plans its own" in out, out
    assert engine.schema(silver)["n"].dataType.simpleString() == "int" and engine.version(silver) == versions
    land(landing, TOPIC, [_typed_event("u", {"id": 2, "n": 2**40}, 200, wide)], offset=3)
    code, out, err = runs(capsys, tmp_path / "tables.yaml", landing, lake)
    assert (code, err) == (0, "") and summary_line(out, "silver", "orders")["widened"] == "n:int->bigint", out
    assert own_plan or ("plans its own" not in out and "planned in one pass" in out), out
    assert silver_rows(spark, engine, lake, "orders", ("id",)) == {(1,): {"id": 1, "n": 1}, (2,): {"id": 2, "n": 2**40}}
    # a date column, then an event claiming a timestamp without a zone for it: no type of both engines holds both
    day = {"id": ID, "d": {"type": "int32", "optional": True, "name": "io.debezium.time.Date"}}
    stamp = {"id": ID, "d": {"spark_type": "TIMESTAMP_NTZ", "type": "string", "optional": True}}
    land(landing, TOPIC, [_typed_event("u", {"id": 1, "n": 1, "d": 19000}, 300, {**wide, **day})], offset=4)
    assert runs(capsys, tmp_path / "tables.yaml", landing, lake)[0] == 0
    land(landing, TOPIC, [_typed_event("u", {"id": 1, "n": 1, "d": "2026-01-02T03:04:05.000000"}, 301, {**wide, **stamp})],
         offset=5)
    code, out, err = runs(capsys, tmp_path / "tables.yaml", landing, lake)
    assert (code, err) == (0, ""), out
    assert engine.schema(silver)["d"].dataType.simpleString() == "date"
    reasons = [r["reason"] for r in engine.read(spark, Lake(str(lake)).quarantine("orders")).collect()]
    assert reasons == ["incompatible_type: d (timestamp_ntz -> date)"]


def test_a_full_disk_is_a_retryable_failure_naming_its_cause(spark, engine, tmp_path, capsys, monkeypatch):
    """The storage refusing a write (here the run's report: the disk full) ends the run with the retryable exit code
    and one line saying so, never exit 1 and a traceback."""
    from spark_jobs import report

    (tmp_path / "tables.yaml").write_text(CONFIG)
    land(tmp_path / "landing", TOPIC, [change_event("c", 10, after={"id": 1})])

    def full(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "lake" / "reports"))

    monkeypatch.setattr(report, "publish", full)
    code, _, err = run(capsys, tmp_path / "tables.yaml", tmp_path / "landing", tmp_path / "lake")
    assert code == 75, err
    assert err.strip().splitlines()[-1].startswith("infrastructure: the storage is full: [Errno 28] No space left")
