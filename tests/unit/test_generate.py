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
