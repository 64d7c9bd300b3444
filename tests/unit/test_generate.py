"""The generator's delivery options: batches, re-delivery and shuffling change how the events land, never
which events the source emitted (pure Python, no Spark)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from spark_jobs.generate import Options, generate
from spark_jobs.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]


def landed(files: list[str]) -> list[str]:
    return [line for f in files for line in Path(f).read_text().splitlines()]


def test_batches_redelivery_and_shuffling_land_the_same_events_and_state(tmp_path):
    table = load_registry(str(ROOT / "include" / "tables.yaml")).select(["customers"])
    plain = generate(table, tmp_path / "plain", Options(rows=30, changes=90, records_per_file=25))[0]
    opts = Options(rows=30, changes=90, records_per_file=25, batches=3, redeliver=0.3, shuffle=True)
    batched = generate(table, tmp_path / "batched", opts)[0]

    assert batched.final_rows == plain.final_rows
    snapshot = [json.loads(line)["payload"] for line in landed(batched.batches[0])]
    assert [e["op"] for e in snapshot] == ["r"] * 30
    # each batch holds its third of the changes in commit order, some of them twice, in another order
    events = [landed(files) for files in batched.batches[1:]]
    emitted = [line for line in landed(plain.files) if line == "null" or json.loads(line)["payload"]["op"] != "r"]
    assert Counter(line for lines in events for line in lines if line != "null") - Counter(emitted) != Counter()
    assert set().union(*map(set, events)) == set(emitted)
    positions = [[json.loads(line)["payload"]["source"]["lsn"] for line in lines if line != "null"] for lines in events]
    assert max(positions[0]) < min(positions[1]) and max(positions[1]) < min(positions[2])
    assert any(p != sorted(p) for p in positions)  # shuffled
    # a delete keeps its Kafka tombstone right after it
    for lines in events:
        for i, line in enumerate(lines):
            assert line != "null" or json.loads(lines[i - 1])["payload"]["op"] == "d"
    assert batched.events == sum(1 for lines in [snapshot, *events] for line in lines if line != "null")
    assert sorted(batched.files) == sorted(f for files in batched.batches for f in files)


def test_the_change_mix_must_be_three_whole_percentages_adding_up_to_100(capsys):
    from spark_jobs.arguments import parser

    assert parser().parse_args(["generate", "--landing", "l", "--mix", "0, 100, 0"]).mix == (0, 100, 0)
    for bad in ("50,50,10", "20,70", "20.5,69.5,10", "-10,100,10"):
        with pytest.raises(SystemExit):
            parser().parse_args(["generate", "--landing", "l", f"--mix={bad}"])
        assert "three whole percentages adding up to 100" in capsys.readouterr().err


def test_a_history_can_end_at_any_time_and_is_the_same_history_moved_there(tmp_path):
    """`ends_ms` (the CLI's `--ends-at`, now by default) moves every source time by one amount, so the newest
    commit is at that time: the demo's lags read as a live source's would, not as the years since a fixed date."""
    table = load_registry(str(ROOT / "include" / "tables.yaml")).select(["customers"])
    opts = Options(rows=20, changes=60, records_per_file=25)
    fixed = generate(table, tmp_path / "fixed", opts)[0]
    ends = 1_800_000_000_123
    moved = generate(table, tmp_path / "moved", Options(rows=20, changes=60, records_per_file=25, ends_ms=ends))[0]

    def payloads(files: list[str]) -> list[dict]:
        lines = [json.loads(line) for line in landed(files) if line != "null"]
        return [line.get("payload", line) for line in lines]

    before, after = payloads(fixed.files), payloads(moved.files)
    assert max(p["source"]["ts_ms"] for p in after) == ends
    shift = {a["source"]["ts_ms"] - b["source"]["ts_ms"] for a, b in zip(after, before, strict=True)}
    assert shift == {ends - max(p["source"]["ts_ms"] for p in before)}
    for a, b in zip(after, before, strict=True):  # nothing else differs
        assert a["ts_ms"] - b["ts_ms"] in shift
        assert {**a, "ts_ms": 0, "source": {**a["source"], "ts_ms": 0}} == \
            {**b, "ts_ms": 0, "source": {**b["source"], "ts_ms": 0}}
    assert moved.final_rows == fixed.final_rows


def test_the_cli_dates_its_files_now_unless_told_otherwise():
    import datetime as dt

    from spark_jobs.arguments import parser

    now = dt.datetime.now(dt.UTC).timestamp() * 1000
    assert abs(parser().parse_args(["generate", "--landing", "l"]).ends_ms - now) < 60_000
    assert parser().parse_args(["generate", "--landing", "l", "--ends-at", "fixed"]).ends_ms is None
    at = parser().parse_args(["generate", "--landing", "l", "--ends-at", "2026-12-01T09:30:00Z"]).ends_ms
    assert at == int(dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC).timestamp() * 1000)


def test_landing_the_phases_in_two_calls_lands_what_one_call_does(tmp_path):
    """The demo lands the snapshot, runs the pipeline, then lands the changes: the two calls' files are one call's,
    each at its offsets, none twice."""
    table = load_registry(str(ROOT / "include" / "tables.yaml")).select(["film_actor"])
    opts = Options(rows=30, changes=90, records_per_file=25, batches=1, compress=True)
    whole = generate(table, tmp_path / "whole", opts)[0]
    first = generate(table, tmp_path / "parts", Options(**{**opts.__dict__, "phases": frozenset({0})}))[0]
    second = generate(table, tmp_path / "parts", Options(**{**opts.__dict__, "phases": frozenset({1})}))[0]

    def relative(files: list[str], root: Path) -> list[str]:
        return sorted(str(Path(f).relative_to(root)) for f in files)

    assert relative(first.files, tmp_path / "parts") == relative(whole.batches[0], tmp_path / "whole")
    assert relative(second.files, tmp_path / "parts") == relative(whole.batches[1], tmp_path / "whole")
    assert first.events + second.events == whole.events and first.tombstones + second.tombstones == whole.tombstones
    for name in relative(whole.files, tmp_path / "whole"):
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "parts").rglob("*.json.gz")) == \
        sorted(p.name for p in (tmp_path / "whole").rglob("*.json.gz"))
