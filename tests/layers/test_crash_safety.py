"""Crash safety by construction: a run killed right after any one of its durable writes, then retried,
leaves the lake as if it had never been killed.

One plan runs the CLI as users do: a first batch (bronze, silver with history, gold), a second, a
reprocess of every file, a rebuild, then late and newer events. For each kill point the plan is run with
the job killed right after that durable write (a Delta commit or a report file): the step is retried
once, the plan goes on, and silver, history and gold are compared with the property test's reference
model (tests/properties/test_properties.py), never hand-written rows.

A kill is a BaseException raised inside the write's caller, so no `except Exception` can catch it, as
with SIGKILL; locks and temporary folders are released as a dead process's are. Gates are stubbed to
pass (their own tests are elsewhere): this test is about what a kill leaves behind.

Profiles: `ci` (default) kills after every Delta commit of the first two batches and after a sample of
the rest; `long` kills after every durable write of the plan:
    HYPOTHESIS_PROFILE=long pytest tests/layers/test_crash_safety.py   # about 80 kill points, ~30 s each
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from spark_jobs import cli
from spark_jobs.delta.delta_rs import DeltaRsEngine
from spark_jobs.lake import Lake
from spark_jobs.layers import common as layer_common
from spark_jobs.quality import gates
from spark_jobs.quality.findings import GateResult
from spark_jobs.storage import LocalFiles
from tests.support import SNAPSHOT_LSN, Event, image, land, position, reference

TOPIC = "src.public.items"
CONFIG = ("quality: {max_quarantined: 100%}\ntables:\n  items:\n    topic: src.public.items\n    keys: [tenant, id]\n"
          "    history: true\n")
GOLD = "-- keys: tenant\n-- sources: items\nSELECT tenant, COUNT(*) AS live FROM items GROUP BY tenant\n"
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")


class Killed(BaseException):
    """The process died right after a durable write."""


def source_log() -> tuple[list[Event], list[int]]:
    """A source table's log (snapshot, updates, deletes with tombstones, a re-insert, a primary-key change)
    and the batch each event lands in: batch 3 brings a late event and newer ones."""
    lsn, clock, log, batches = SNAPSHOT_LSN, 0, [], []

    def emit(batch: int, op: str, key: int, value: str | None = None, snapshot: bool = False, tombstone: bool = False):
        nonlocal clock
        clock += 1
        log.append(Event(0, op, key, value, lsn if snapshot else lsn + len(log), snapshot, clock, tombstone))
        batches.append(batch)

    for key, value in ((1, "a"), (2, "b"), (3, "c")):
        emit(1, "r", key, value, snapshot=True)
    emit(1, "u", 1, "a2")
    emit(1, "d", 2, tombstone=True)
    emit(3, "c", 2, "b3")  # late: lands in the last batch, after newer events of other keys
    emit(1, "d", 3, tombstone=True)  # a primary-key change: 3 -> 4
    emit(2, "c", 4, "d")
    emit(2, "c", 3, "c2")  # a re-insert of a key the ledger holds a delete for ...
    emit(3, "u", 3, "c3")  # ... and a newer event of it, landing while that run is down
    emit(2, "u", 1, "a3")
    emit(2, "u", 4, "d2")
    emit(3, "d", 1, tombstone=True)
    emit(3, "c", 5, "e")
    emit(3, "u", 2, "b4")
    return log, batches


def land_batch(landing: Path, log: list[Event], batches: list[int], batch: int) -> None:
    """The batch's events as sink files: one file per run of consecutive offsets, tombstones after deletes."""
    offset, files = 0, {}
    for event, landed in zip(log, batches, strict=True):
        lines = [event.line(), *(["null"] if event.tombstone else [])]
        if landed == batch:
            files.setdefault(landed, []).append((offset, lines))
        offset += len(lines)
    runs: list[list[tuple[int, list[str]]]] = []
    for start, lines in files.get(batch, []):
        if runs and runs[-1][-1][0] + len(runs[-1][-1][1]) == start:
            runs[-1].append((start, lines))
        else:
            runs.append([(start, lines)])
    for run in runs:
        land(landing, TOPIC, [line for _, lines in run for line in lines], run[0][0])


def plan(config: Path, landing: Path, lake: Path, log: list[Event], batches: list[int]):
    """The steps, each a CLI invocation (landing more files first where a batch arrives)."""
    base = ["run", "--config", str(config), "--landing", str(landing), "--lake", str(lake)]
    return [
        (lambda: land_batch(landing, log, batches, 1), base),
        (lambda: land_batch(landing, log, batches, 2), base),
        (None, [*base, "--mode", "reprocess", "--layers", "bronze,silver"]),
        (None, [*base, "--mode", "rebuild", "--layers", "silver,gold"]),
        (lambda: land_batch(landing, log, batches, 3), base),
    ]


@pytest.fixture()
def durable_writes(monkeypatch):
    """Counts every durable write (Delta commits, report files) and kills the run after the chosen one."""
    state = {"writes": [], "kill_at": None}

    def after_write(name, fn):
        def wrapper(*args, **kwargs):
            result = fn(*args, **kwargs)
            state["writes"].append(name)
            if len(state["writes"]) == state["kill_at"]:
                raise Killed(f"killed after write {len(state['writes'])}: {name}")
            return result
        return wrapper

    for method in ("append", "merge", "overwrite", "replace", "delete", "restore"):
        monkeypatch.setattr(DeltaRsEngine, method, after_write(f"delta.{method}", getattr(DeltaRsEngine, method)))
    monkeypatch.setattr(LocalFiles, "write", after_write("report", LocalFiles.write))
    # the gates pass without GX, whose writes (its stores made once per process) would make the counts differ by run
    monkeypatch.setattr(layer_common, "run_gate", lambda audit, frames, table, layer, *a, **k: GateResult(table, layer, [], None))
    monkeypatch.setattr(gates, "run_audit_gates", lambda asked, layer, *a: {
        g.table: GateResult(g.table, layer, [], None) for g in asked})
    return state


def setup_root(root: Path) -> None:
    (root / "gold").mkdir(parents=True)
    (root / "tables.yaml").write_text(CONFIG)
    (root / "gold" / "live_per_tenant.sql").write_text(GOLD)


def run_clean(capsys, root: Path, state: dict) -> list[Path]:
    """The plan without a kill; records every write and, before each step, a copy of the lake and landing."""
    setup_root(root)
    log, batches = source_log()
    state.update(writes=[], kill_at=None, step_starts=[])
    copies = []
    for step, (before, args) in enumerate(plan(root / "tables.yaml", root / "landing", root / "lake", log, batches)):
        copies.append(root.parent / f"{root.name}-before-step-{step}")
        shutil.copytree(root, copies[-1], symlinks=True)
        state["step_starts"].append(len(state["writes"]))
        if before:
            before()
        assert cli.main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    return copies


def run_killed(capsys, copy: Path, root: Path, step: int, state: dict, kill_at: int) -> str:
    """From the copy taken before `step`: the step killed after write `kill_at` of the plan; while it is
    down, every later batch lands; the step is retried, then one more run takes whatever it left."""
    shutil.copytree(copy, root, symlinks=True)
    log, batches = source_log()
    steps = plan(root / "tables.yaml", root / "landing", root / "lake", log, batches)
    state.update(writes=[None] * state["step_starts"][step], kill_at=kill_at)
    before, args = steps[step]
    if before:
        before()
    with pytest.raises(Killed) as kill:
        cli.main(args)
    state["kill_at"] = None
    for later, _ in steps[step + 1:]:
        if later:
            later()
    assert cli.main(args) == 0, capsys.readouterr().err  # the retry
    if step < len(steps) - 1:
        assert cli.main(steps[0][1]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return str(kill.value)


def assert_equals_the_model(spark, lake: Path, killed: str | None) -> None:
    engine, tables = DeltaRsEngine(), Lake(str(lake))
    log, _ = source_log()
    state, versions = reference(log)
    silver = {(r["tenant"], r["id"]): image(r) for r in engine.read(spark, tables.silver("items")).collect()}
    history = sorted(((r["tenant"], r["id"]), position(r["_seq"]), r["_op"], image(r), position(r["_valid_to"]),
                      r["_is_current"]) for r in engine.read(spark, tables.history("items")).collect())
    gold = {r["tenant"]: r["live"] for r in engine.read(spark, tables.gold("live_per_tenant")).collect()}
    assert (silver, history, gold) == (state, versions, {0: len(state)}), killed
    bronze = engine.read(spark, tables.bronze("items"))
    assert bronze.groupBy("_source_file", "_line").count().where("count > 1").count() == 0, killed  # no line twice
    assert bronze.count() == len(log), killed


def kill_points(writes: list[str], step_starts: list[int]) -> list[int]:
    """Every write in the long profile. In CI: each Delta commit of the first batch (where bronze, its
    ingest log, silver, the tombstone ledger, history, progress and gold each make their first commit);
    silver's merge in the second (it re-inserts a key the ledger holds a delete for: a kill before the
    ledger's merge once wedged the table); one Delta commit of the reprocess and of the rebuild; a report
    of the last batch."""
    if PROFILE == "long":
        return list(range(1, len(writes) + 1))
    ends = [*step_starts[1:], len(writes)]
    steps = [[i for i in range(start + 1, end + 1)] for start, end in zip(step_starts, ends, strict=True)]
    commits = [[i for i in step if writes[i - 1].startswith("delta.")] for step in steps]
    silver_merge = [i for i in commits[1] if writes[i - 1] == "delta.merge"][0]
    return [*commits[0], silver_merge, *[c[len(c) // 2] for c in commits[2:-1]],
            next(i for i in steps[-1] if writes[i - 1] == "report")]


def test_a_run_killed_after_any_durable_write_and_retried_leaves_what_an_unkilled_run_leaves(
        spark, tmp_path, capsys, durable_writes):
    copies = run_clean(capsys, tmp_path / "clean", durable_writes)
    assert_equals_the_model(spark, tmp_path / "clean" / "lake", "no kill")
    writes, step_starts = list(durable_writes["writes"]), list(durable_writes["step_starts"])
    assert {"delta.append", "delta.merge", "delta.overwrite", "delta.replace", "report"} <= set(writes)
    for kill_at in kill_points(writes, step_starts):
        step = max(s for s, start in enumerate(step_starts) if start < kill_at)
        root = tmp_path / f"kill-{kill_at}"
        killed = run_killed(capsys, copies[step], root, step, durable_writes, kill_at)
        assert killed == f"killed after write {kill_at}: {writes[kill_at - 1]}"
        assert_equals_the_model(spark, root / "lake", killed)
        shutil.rmtree(root)
