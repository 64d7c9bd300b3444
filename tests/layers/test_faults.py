"""Real-world faults: files that cannot be read, names Spark would take as globs, bytes and lines that
must not be altered, connectors' own edge cases. Each file or line ends in bronze, in quarantine with a
reason, or in a counted category; the rest of its batch goes on."""

from __future__ import annotations

import base64
import gzip
import json
import os
from pathlib import Path

import pytest

from spark_jobs.delta.reads import row_count
from spark_jobs.lake import Lake
from tests.support import change_event, planner_run, run, silver_rows, summary_line

TOPIC = "shop.public.orders"
CONFIG = "quality: {max_quarantined: 100%}\ntables:\n  orders:\n    topic: shop.public.orders\n    keys: [id]\n"


def event(key, lsn, op="c", **values) -> str:
    image = {"id": key, **values}
    return change_event(op, lsn, **({"before": image} if op == "d" else {"after": image}))


def setup(tmp_path: Path, config: str = CONFIG) -> tuple[Path, Path]:
    (tmp_path / "tables.yaml").write_text(config)
    folder = tmp_path / "landing" / "topics" / TOPIC / "partition=0"
    folder.mkdir(parents=True)
    return tmp_path / "tables.yaml", folder


def quarantine_rows(spark, engine, lake: Path) -> list[tuple]:
    rows = engine.read(spark, Lake(str(lake)).quarantine("orders")).collect()
    return sorted((r["_source_file"].rsplit("/", 1)[1], r["_line"], r["reason"], r["_raw"]) for r in rows)


def test_unreadable_files_are_quarantined_whole_by_name_and_the_rest_of_the_batch_goes_on(spark, engine, tmp_path, capsys):
    config, folder = setup(tmp_path)
    good = folder / f"{TOPIC}+0+0000000000.json"
    good.write_text(event(1, 10) + "\n" + event(2, 11) + "\n")
    whole = gzip.compress(("\n".join(event(k, 20 + k) for k in range(3, 300)) + "\n").encode())
    (folder / f"{TOPIC}+0+0000000002.json.gz").write_bytes(whole[: len(whole) // 2])  # cut short
    (folder / f"{TOPIC}+0+0000000500.json.gz").write_text(event(7, 50) + "\n")  # not gzip at all
    (folder / f"{TOPIC}+0+0000000600.json").symlink_to(folder / "gone.json")  # dangling
    (folder / f"{TOPIC}+0+0000000700.json").symlink_to(folder / f"{TOPIC}+0+0000000701.json")  # a loop
    (folder / f"{TOPIC}+0+0000000701.json").symlink_to(folder / f"{TOPIC}+0+0000000700.json")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "orders")
    assert (bronze["files"], bronze["events"], bronze["quarantined"]) == ("6", "2", "unreadable_file:5")
    assert quarantine_rows(spark, engine, tmp_path / "lake") == [
        (f"{TOPIC}+0+0000000002.json.gz", 0,
         f"unreadable_file: {TOPIC}+0+0000000002.json.gz: Compressed file ended before the end-of-stream marker was reached",
         ""),
        (f"{TOPIC}+0+0000000500.json.gz", 0, f"unreadable_file: {TOPIC}+0+0000000500.json.gz: Not a gzipped file (b'{{\"')", ""),
        (f"{TOPIC}+0+0000000600.json", 0, f"unreadable_file: {TOPIC}+0+0000000600.json: cannot open: No such file or directory",
         ""),
        (f"{TOPIC}+0+0000000700.json", 0,
         f"unreadable_file: {TOPIC}+0+0000000700.json: cannot open: Too many levels of symbolic links", ""),
        (f"{TOPIC}+0+0000000701.json", 0,
         f"unreadable_file: {TOPIC}+0+0000000701.json: cannot open: Too many levels of symbolic links", ""),
    ]
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(1,): {"id": 1}, (2,): {"id": 2}}
    # the quarantined files are taken, not pending: the next run has nothing to do and fails on nothing
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err, summary_line(out, "bronze", "orders")["files"]) == (0, "", "0")


def test_a_landing_link_to_a_file_outside_the_landing_root_is_quarantined_by_name_and_never_read(spark, engine, tmp_path,
                                                                                               capsys):
    config, folder = setup(tmp_path)
    outside = tmp_path / "elsewhere" / "secrets.json"
    outside.parent.mkdir()
    outside.write_text(event(9, 90, token="s3cr3t") + "\n")  # would parse as an event of the table
    (folder / f"{TOPIC}+0+0000000000.json").write_text(event(1, 10) + "\n")
    (folder / f"{TOPIC}+0+0000000001.json").symlink_to(outside)
    inside = tmp_path / "landing" / "copies" / "kept.json"  # a link within the landing root is read as the file
    inside.parent.mkdir()
    inside.write_text(event(2, 11) + "\n")
    (folder / f"{TOPIC}+0+0000000002.json").symlink_to(inside)
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "orders")
    assert (bronze["files"], bronze["events"], bronze["quarantined"]) == ("3", "2", "unreadable_file:1")
    assert quarantine_rows(spark, engine, tmp_path / "lake") == [
        (f"{TOPIC}+0+0000000001.json", 0,
         f"unreadable_file: {TOPIC}+0+0000000001.json: not read: it resolves outside the landing root (a link)", "")]
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(1,): {"id": 1}, (2,): {"id": 2}}
    assert "s3cr3t" not in str(engine.read(spark, Lake(str(tmp_path / "lake")).bronze("orders")).collect())


def test_landing_names_reach_spark_literally_never_as_globs(spark, engine, tmp_path, capsys):
    config, folder = setup(tmp_path)
    names = ["x*.json", "xa.json", "q?.json", "q1.json", "r[ab].json", "ra.json", "s{t,u}.json", "st.json",
             "colon:1.json", "back\\slash.json", "pct%20 sp.json"]
    for key, name in enumerate(names, start=1):
        (folder / name).write_text(event(key, 10 + key) + "\n")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    assert (summary_line(out, "bronze", "orders")["files"], summary_line(out, "bronze", "orders")["events"]) == (
        str(len(names)), str(len(names)))
    bronze = engine.read(spark, Lake(str(tmp_path / "lake")).bronze("orders")).collect()
    # each line once, under its own file's name: no glob took another file's lines
    assert sorted((r["_source_file"].rsplit("/", 1)[1], json.loads(r["after"])["id"]) for r in bronze) == sorted(
        (name, key) for key, name in enumerate(names, start=1))


@pytest.mark.scale
def test_lines_are_never_altered_what_cannot_be_kept_as_is_is_quarantined_with_its_bytes(spark, engine, tmp_path, capsys,
                                                                                         monkeypatch, soak):
    config, folder = setup(tmp_path)
    invalid = event(3, 12, note="cafe").encode().replace(b"cafe", b"caf\xe9")  # Latin-1 bytes, not UTF-8
    # a line three times the line limit and 2 MiB more: 50 MiB over the default 16 MiB (make soak), 5 MiB over 1 MiB (make test)
    limit = 16 * 2**20 if soak else 2**20
    if not soak:
        monkeypatch.setenv("CDC_MAX_LINE_BYTES", str(limit))
    big = event(8, 17, note="x" * (3 * limit + 2 * 2**20))
    (folder / f"{TOPIC}+0+0000000000.json").write_bytes(b"\n".join([
        b"\xef\xbb\xbf" + event(1, 10).encode(),  # a byte-order mark: dropped, the event kept
        event(2, 11).encode() + b' {"op":"d"}',  # a record and more after it
        invalid,
        event(4, 13, note="ok").encode(),
        event({"a": 1}, 14).encode(),  # a key that is an object
        event([5], 15).encode(),  # a key that is an array
        event(2, 16).encode() + b"garbage",
        big.encode(),
        event(9, 18, note="\u00e9t\u00e9").encode(),  # valid UTF-8 beside the invalid line: kept as is
    ]) + b"\n")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "orders")
    assert (bronze["lines"], bronze["events"]) == ("9", "3")
    assert quarantine_rows(spark, engine, tmp_path / "lake") == sorted([
        (f"{TOPIC}+0+0000000000.json", 2, "malformed_json: content after the JSON record",
         event(2, 11) + ' {"op":"d"}'),
        (f"{TOPIC}+0+0000000000.json", 3,
         f"invalid_utf8: byte {invalid.index(0xE9)} is not UTF-8; the line's bytes are kept as base64 in _raw",
         base64.b64encode(invalid).decode()),
        (f"{TOPIC}+0+0000000000.json", 5, "invalid_key: id (an object or array, not a value)", event({"a": 1}, 14)),
        (f"{TOPIC}+0+0000000000.json", 6, "invalid_key: id (an object or array, not a value)", event([5], 15)),
        (f"{TOPIC}+0+0000000000.json", 7, "malformed_json: content after the JSON record", event(2, 16) + "garbage"),
        (f"{TOPIC}+0+0000000000.json", 8, f"line_too_large: {len(big)} bytes (max {limit}, CDC_MAX_LINE_BYTES); "
         "the line stays whole in its landing file", big[:1024]),
    ])
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {
        (1,): {"id": 1, "note": None}, (4,): {"id": 4, "note": "ok"}, (9,): {"id": 9, "note": "\u00e9t\u00e9"}}


def test_out_of_range_numbers_without_the_envelope_are_quarantined_not_turned_into_text(spark, engine, tmp_path, capsys):
    config, folder = setup(tmp_path)
    (folder / f"{TOPIC}+0+0000000000.json").write_text("\n".join([
        event(1, 10, amount=2.5), event(2, 11, amount=1e300).replace("1e+300", "1e400"), event(3, 12, amount=-7)]) + "\n")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    assert [(r[1], r[2]) for r in quarantine_rows(spark, engine, tmp_path / "lake")] == [
        (2, "number_out_of_range: a number in the record is beyond a double's range (about 1.8e308)")]
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {
        (1,): {"id": 1, "amount": 2.5}, (3,): {"id": 3, "amount": -7.0}}
    assert dict((f.name, f.dataType.simpleString()) for f in engine.schema(str(Lake(str(tmp_path / "lake")).silver("orders")))
                )["amount"] == "double"


def test_a_tombstone_landing_before_its_delete_is_matched_when_the_delete_lands(spark, engine, tmp_path, capsys):
    config, folder = setup(tmp_path)
    (folder / f"{TOPIC}+0+0000000002.json").write_text("null\n")  # the tombstone of the delete at offset 1
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    bronze = summary_line(out, "bronze", "orders")
    assert (code, bronze["tombstones"], bronze["tombstones_unmatched"], bronze["tombstones_matched_late"]) == (0, "1", "1", "0")
    (folder / f"{TOPIC}+0+0000000000.json").write_text(event(1, 10) + "\n" + event(1, 11, op="d") + "\n")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    bronze = summary_line(out, "bronze", "orders")
    assert (code, bronze["tombstones"], bronze["tombstones_matched_late"]) == (0, "0", "1")
    pending = engine.read(spark, Lake(str(tmp_path / "lake")).pending_tombstones("orders"))
    assert pending.count() == 0  # settled: nothing waits any more
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {}


@pytest.mark.parametrize("own_plan", [False, True], ids=["pass", "own-plan"])
def test_unchanged_toasted_values_keep_the_keys_previous_value_never_the_placeholder(spark, engine, tmp_path, capsys,
                                                                                      monkeypatch, own_plan):
    """Both planners: the silver pass fills each value from the batch or reads silver's by key, a table's own plan
    joins silver's scan."""
    config, folder = setup(tmp_path, CONFIG.replace("keys: [id]\n", "keys: [id]\n    history: true\n"))
    run = planner_run(monkeypatch, own_plan)
    unavailable = "__debezium_unavailable_value"
    as_bytes = base64.b64encode(unavailable.encode()).decode()
    (folder / f"{TOPIC}+0+0000000000.json").write_text(
        event(1, 10, op="r", bio="long text", data="AQI=", tags=["a", "b"], n=1) + "\n")
    code, _, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    (folder / f"{TOPIC}+0+0000000001.json").write_text("\n".join([
        event(1, 20, op="u", bio=unavailable, data=as_bytes, tags=[unavailable], n=2),  # from silver's row
        event(2, 21, bio="b2", data="AwQ=", tags=["c"], n=1),
        event(2, 22, op="u", bio=unavailable, data="BQY=", tags=[unavailable], n=3),  # from the event before it
        event(3, 23, op="u", bio=unavailable, data="Bwg=", tags=["d"], n=4),  # no earlier value anywhere
    ]) + "\n")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    assert own_plan or ("1 of 1 tables' new bronze rows planned in one pass" in out and "plans its own" not in out), out
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {
        (1,): {"id": 1, "bio": "long text", "data": "AQI=", "tags": '["a","b"]', "n": 2},
        (2,): {"id": 2, "bio": "b2", "data": "BQY=", "tags": '["c"]', "n": 3}}
    assert [(r[1], r[2]) for r in quarantine_rows(spark, engine, tmp_path / "lake")] == [
        (4, "unavailable_value: bio (an unchanged TOASTed value, and no earlier value of the key here)")]
    history = engine.read(spark, Lake(str(tmp_path / "lake")).history("orders")).collect()
    assert sorted((r["id"], r["n"], r["bio"], r["tags"]) for r in history) == [
        (1, 1, "long text", '["a","b"]'), (1, 2, "long text", '["a","b"]'), (2, 1, "b2", '["c"]'), (2, 3, "b2", '["c"]')]


class Killed(BaseException):
    """The process died in the middle of a write (after writing its data aside, before renaming it)."""


def test_a_kill_inside_a_gx_or_report_write_leaves_every_file_whole_and_the_next_run_works(
        spark, engine, tmp_path, capsys, monkeypatch):
    from spark_jobs import storage as lake_files  # LocalFiles.write

    config, folder = setup(tmp_path)
    (folder / f"{TOPIC}+0+0000000000.json").write_text(event(1, 10) + "\n")
    assert run(capsys, config, tmp_path / "landing", tmp_path / "lake")[0] == 0
    (folder / f"{TOPIC}+0+0000000001.json").write_text(event(2, 11) + "\n")
    renames = []

    def dies_on_the_third(src, dst):  # GX's suite, validation result, ...: the third is inside the gate's writes
        renames.append(dst)
        if len(renames) == 3:
            raise Killed(dst)
        os.replace(src, dst)

    monkeypatch.setattr(lake_files.os, "replace", dies_on_the_third)
    try:
        run(capsys, config, tmp_path / "landing", tmp_path / "lake")
        raise AssertionError("not killed")
    except Killed as kill:
        assert "/_state/gx/bronze-pass/" in str(kill)  # the bronze pass's gate (orders' small batch: a pass of one)
    monkeypatch.undo()
    written = [p for p in (tmp_path / "lake").rglob("*") if p.is_file() and p.suffix in (".json", ".yml", ".html")]
    assert [p for p in written if p.stat().st_size == 0] == []  # nothing half-written
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err, summary_line(out, "bronze", "orders")["gate"]) == (0, "", "passed")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(1,): {"id": 1}, (2,): {"id": 2}}
    from spark_jobs import cli

    assert cli.main(["status", "--config", str(config), "--lake", str(tmp_path / "lake")]) == 0


def test_the_retry_of_a_run_killed_before_its_progress_reports_what_the_killed_run_applied(
        spark, engine, tmp_path, capsys, monkeypatch):
    from spark_jobs.delta.delta_rs import DeltaRsEngine

    config, folder = setup(tmp_path)
    (folder / f"{TOPIC}+0+0000000000.json").write_text("\n".join([event(1, 10), event(2, 11), event(3, 12)]) + "\n")
    assert run(capsys, config, tmp_path / "landing", tmp_path / "lake")[0] == 0
    (folder / f"{TOPIC}+0+0000000003.json").write_text(
        "\n".join([event(1, 13, op="u", note="x"), event(2, 14, op="d"), event(4, 15)]) + "\n")
    merge = DeltaRsEngine.merge

    def killed_after_silvers_merge(self, df, path, spec, *args, **kwargs):
        result = merge(self, df, path, spec, *args, **kwargs)
        if path.endswith("/silver/orders"):
            raise Killed(path)
        return result

    monkeypatch.setattr(DeltaRsEngine, "merge", killed_after_silvers_merge)
    try:
        run(capsys, config, tmp_path / "landing", tmp_path / "lake")
        raise AssertionError("not killed")
    except Killed:
        monkeypatch.undo()
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    silver = summary_line(out, "silver", "orders")
    assert (code, err) == (0, "")
    assert (silver["inserted"], silver["updated"], silver["deleted"], silver["recovered_commits"]) == ("1", "1", "1", "1")
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {
        (1,): {"id": 1, "note": "x"}, (3,): {"id": 3, "note": None}, (4,): {"id": 4, "note": None}}


def test_a_parquet_file_corrupt_inside_is_quarantined_whole_and_the_rest_goes_on(spark, engine, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    config, folder = setup(tmp_path)
    records = pa.table({"id": list(range(1, 201)), "note": [f"note {i}" * 20 for i in range(1, 201)],
                        "__op": ["c"] * 200, "__lsn": list(range(10, 210))})
    corrupt = folder / f"{TOPIC}+0+0000000000.parquet"
    pq.write_table(records, corrupt, compression="snappy")
    data = bytearray(corrupt.read_bytes())
    middle = len(data) // 3
    data[middle:middle + 64] = b"\xff" * 64  # the footer (at the end) stays valid: only reading finds it
    corrupt.write_bytes(bytes(data))
    (folder / f"{TOPIC}+0+0000000200.json").write_text(event(500, 300) + "\n")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    assert [(r[0], r[1], r[2]) for r in quarantine_rows(spark, engine, tmp_path / "lake")] == [
        (corrupt.name, 0, f"unreadable_file: {corrupt.name}: corrupt, 0 of 200 records readable")]
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(500,): {"id": 500}}


def test_landing_files_are_staged_in_the_lake_and_a_killed_runs_staging_is_cleared(spark, engine, tmp_path, capsys):
    config, folder = setup(tmp_path)
    (folder / f"{TOPIC}+0+0000000000.json").write_text(event(1, 10) + "\n")
    left = tmp_path / "lake" / "_state" / "staging" / "orders-killed"  # what a killed bronze step left
    left.mkdir(parents=True)
    (left / "0000000.json").symlink_to(folder / f"{TOPIC}+0+0000000000.json")
    other = tmp_path / "lake" / "_state" / "staging" / "orders2-running"  # another table's: left alone
    other.mkdir()
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err, summary_line(out, "bronze", "orders")["events"]) == (0, "", "1")
    assert [p.name for p in (tmp_path / "lake" / "_state" / "staging").iterdir()] == ["orders2-running"]


def test_a_registry_naming_a_column_the_events_lack_is_a_config_error_naming_table_and_field(spark, engine, tmp_path,
                                                                                             capsys, monkeypatch):
    """The silver pass finds the first (the table's own plan never runs), the table's own plan the second."""
    from spark_jobs.layers import silver

    for field, value, own_plan in (("partition_by", "[region]", False), ("sequence_by", "[version]", True)):
        (tmp_path / field).mkdir()
        config, folder = setup(tmp_path / field, CONFIG + f"    {field}: {value}\n")
        (folder / f"{TOPIC}+0+0000000000.json").write_text(event(1, 10) + "\n" + event(2, 11) + "\n")
        with monkeypatch.context() as patched:
            if not own_plan:
                patched.setattr(silver, "apply_changes", lambda *args: pytest.fail("the table's own plan ran"))
            code, out, err = planner_run(patched, own_plan)(capsys, config, tmp_path / field / "landing",
                                                            tmp_path / field / "lake")
        assert code == 2, out
        assert err.strip().startswith(f"config error: table 'orders': field '{field}' names {value[1:-1]}, not a column "
                                      "of the change events (id) (layer silver)"), err
        assert row_count(Lake(str(tmp_path / field / "lake")).silver("orders")) is None  # nothing published


def test_an_event_without_its_sequence_by_field_is_quarantined_with_a_reason_that_says_so(spark, engine, tmp_path,
                                                                                          capsys):
    config, folder = setup(tmp_path, CONFIG + "    sequence_by: [source.seqno]\n")
    with_position = json.loads(event(1, 10))
    with_position["source"]["seqno"] = 5
    (folder / f"{TOPIC}+0+0000000000.json").write_text(json.dumps(with_position) + "\n" + event(2, 11) + "\n")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake")
    assert (code, err) == (0, "")
    assert [(line, reason) for _, line, reason, _ in quarantine_rows(spark, engine, tmp_path / "lake")] == [
        (2, "missing_sequence: sequence_by (source.seqno) is null or absent in this event")]
    assert silver_rows(spark, engine, tmp_path / "lake", "orders", ("id",)) == {(1,): {"id": 1}}
