"""Maintenance over months (issue 19, item 1): after 40 micro-batches, `maintain` leaves every table's rows
and every version inside the time-travel window readable, with fewer files; VACUUM and the report retention
go by the wall clock, so the later tests move it forward with faketime in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from spark_jobs import cli, maintenance
from spark_jobs.errors import ConfigError
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.registry import load_registry
from tests.support import data_docs_text, run, silver_rows, subprocess_env

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("custkey",)


def write_config(tmp_path: Path, maintenance_block: str = "") -> Path:
    config = tmp_path / "include" / "tables.yaml"
    (config.parent / "gold").mkdir(parents=True, exist_ok=True)
    (config.parent / "gold" / "customers_by_state.sql").write_text(
        (ROOT / "include" / "gold" / "customers_by_state.sql").read_text())
    config.write_text(f"{maintenance_block}tables:\n  customers:\n    topic: burst.burst_bank.customers\n"
                      "    keys: [custkey]\n")
    return config


def snapshot(path: str, version: int | None = None) -> list[str]:
    return DeltaTable(path, version=version).file_uris()


def readable(path: str, version: int) -> bool:
    """Every data file the version's snapshot names is on storage."""
    return all(os.path.exists(f.removeprefix("file://")) for f in snapshot(path, version))


def stored(path: str) -> int:
    return sum(1 for p in Path(path).rglob("*.parquet") if "_delta_log" not in p.parts)


def maintain(config: Path, lake: Path, *extra: str, clock: str | None = None) -> subprocess.CompletedProcess[str]:
    """`maintain` as its own process, the clock moved forward by `clock` (faketime's offset, e.g. +10d)."""
    command = [sys.executable, "-m", "spark_jobs", "maintain", "--config", str(config), "--lake", str(lake), *extra]
    if clock:
        command = ["faketime", "-f", clock, *command]
    done = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    return done


def test_micro_batches_then_maintain_keep_rows_and_every_version_with_fewer_files(spark, engine, tmp_path, capsys):
    """The pipeline's own tables after a snapshot and 4 micro-batches, each its own run (bronze, silver, gold)."""
    config = write_config(tmp_path, "maintenance:\n  min_small_files: 4\n")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    (landed,) = generate(load_registry(config).select(None), landing,
                         Options(rows=30, changes=40, records_per_file=4, batches=4, seed=11))
    assert len(landed.batches) == 5  # the snapshot, then 4 batches of changes
    for files in landed.batches:
        listed = json.dumps([os.path.relpath(f, landing) for f in files])
        code, _, err = run(capsys, config, landing, lake, "--files", listed)
        assert (code, err) == (0, ""), err
    table = load_registry(config).tables["customers"]
    paths = {name: path for name, path, _ in maintenance.table_paths(Lake(str(lake)), table)
             if Path(path, "_delta_log").is_dir()}
    paths["gold"] = Lake(str(lake)).gold("customers_by_state")
    versions = {name: DeltaTable(path).version() for name, path in paths.items()}
    files_before = {name: len(snapshot(path)) for name, path in paths.items()}
    rows_before = {name: sorted(map(tuple, engine.read(spark, path).collect())) for name, path in paths.items()}
    oldest_rows = {name: sorted(map(tuple, engine.read(spark, path, 0).collect())) for name, path in paths.items()}
    piled = {name for name, n in files_before.items() if n >= 4}
    assert {"bronze", "ingest_log"} <= piled and files_before["bronze"] == 5  # an append a run

    done = maintain(config, lake)
    assert "maintain customers bronze: files 5 -> 1," in done.stdout
    for name, path in paths.items():
        assert DeltaTable(path).version() == versions[name] + (name in piled), name
        assert sorted(map(tuple, engine.read(spark, path).collect())) == rows_before[name], name
        assert sorted(map(tuple, engine.read(spark, path, 0).collect())) == oldest_rows[name], name
        assert all(readable(path, v) for v in range(versions[name] + 1)), name  # the whole window, 7 days
    assert {name: len(snapshot(paths[name])) for name in piled} == {name: 1 for name in piled}
    assert silver_rows(spark, engine, lake, "customers", KEYS) == landed.final_rows
    report = json.loads(next((lake / "reports" / "runs").glob("*/customers.maintenance.json")).read_text())
    assert report["files_before"] == sum(files_before[n] for n in paths if n != "gold")
    assert report["files_after"] == report["files_before"] - sum(files_before[n] - 1 for n in piled)

    # a second maintain has nothing to compact: no commit, nothing changes
    again = {name: DeltaTable(path).version() for name, path in paths.items()}
    maintain(config, lake)
    assert {name: DeltaTable(path).version() for name, path in paths.items()} == again

    # three days on, inside the 7-day window: VACUUM keeps every version readable
    bronze_stored = stored(paths["bronze"])
    maintain(config, lake, clock="+3d")
    assert all(readable(path, v) for name, path in paths.items() for v in range(versions[name] + 1))
    assert stored(paths["bronze"]) == bronze_stored == 6
    # ten days on, the compacted-away files have outlived the window: VACUUM removes them, the latest stays
    maintain(config, lake, clock="+10d")
    assert stored(paths["bronze"]) == len(snapshot(paths["bronze"])) == 1
    assert not readable(paths["bronze"], 0)
    assert sorted(map(tuple, engine.read(spark, paths["bronze"]).collect())) == rows_before["bronze"]


def test_forty_micro_batches_of_appends_and_merges_compact_by_key_and_keep_every_version(tmp_path):
    """Forty small commits of each kind the pipeline makes (appends; merges that update, insert and delete by
    key), then maintenance: every version reads the rows it had, the latest in fewer, key-clustered files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    from spark_jobs.delta.delta_rs import DeltaRsEngine
    from spark_jobs.registry import Maintenance

    log, state = str(tmp_path / "log"), str(tmp_path / "state")
    for batch in range(40):
        # new keys, and every fourth batch the previous batch's first key again (an update; every eighth, a delete)
        keys = [batch * 10 + i for i in range(9)] + ([(batch - 1) * 10] if batch % 4 == 0 and batch else [batch * 10 + 9])
        rows = pa.table({"k": keys, "v": [f"{batch}-{k}" for k in keys], "batch": [batch] * 10})
        write_deltalake(log, rows, mode="append")
        if batch == 0:
            write_deltalake(state, rows)
            continue
        (DeltaTable(state).merge(rows, "t.k = s.k", source_alias="s", target_alias="t")
         .when_matched_delete("s.batch % 8 = 0").when_matched_update_all().when_not_matched_insert_all().execute())

    def rows_at(path: str, version: int) -> list[tuple]:
        table = pq.read_table([f.removeprefix("file://") for f in snapshot(path, version)])
        return sorted(zip(*table.to_pydict().values(), strict=True))

    history = {path: [rows_at(path, v) for v in range(DeltaTable(path).version() + 1)] for path in (log, state)}
    policy = Maintenance(min_small_files=4)
    upkeep = {path: maintenance.maintain_delta(DeltaRsEngine(), name, path, policy, cluster)
              for name, path, cluster in (("log", log, ()), ("state", state, ("k",)))}
    assert upkeep[log].files_before == 40 and upkeep[log].files_after == 1 and upkeep[log].compacted
    assert upkeep[state].files_before >= 30 and upkeep[state].files_after == 1
    for path, versions in history.items():
        assert [rows_at(path, v) for v in range(len(versions))] == versions  # every version, exactly
        assert rows_at(path, len(versions)) == versions[-1]  # the compaction's commit changes no row
    keys = pq.read_table(snapshot(state)[0].removeprefix("file://")).column("k").to_pylist()
    assert keys == sorted(keys)  # Z-order on one key: the file is in key order, a merge prunes by range


def test_reports_and_gx_results_past_their_retention_go_and_the_pages_follow(tmp_path, capsys):
    config = write_config(tmp_path, "maintenance:\n  report_retention: 30d\n")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    generate(load_registry(config).select(None), landing, Options(rows=10, changes=10, seed=2))
    code, _, err = run(capsys, config, landing, lake, "--run-id", "run-to-expire")
    assert (code, err) == (0, ""), err
    # the passes' gates of the table (its small batches: passes of one) and of the run's gold models
    sites = ("bronze-pass", "silver-pass", "gold-pass")
    results = lambda: sorted(p for site in sites for p in (lake / "_state" / "gx" / site).rglob("*.json"))  # noqa: E731
    pages = lambda: sorted(p for site in sites  # noqa: E731
                           for p in (lake / "reports" / "data_docs" / site / "validations").rglob("*.html"))
    validations = [p for p in results() if "uncommitted" in p.parts]
    assert {p.parts[len(lake.parts) + 2] for p in validations} == set(sites)
    assert {p.parts[len(lake.parts) + 2] for p in pages()} == set(sites)

    maintain(config, lake, clock="+20d")  # inside the retention: nothing goes
    assert (lake / "reports" / "runs" / "run-to-expire").is_dir() and pages()

    done = maintain(config, lake, clock="+40d")
    assert "maintain reports: 1 run report(s) past 30 days removed" in done.stdout
    assert not (lake / "reports" / "runs" / "run-to-expire").exists()
    assert not [p for p in results() if "uncommitted" in p.parts and p.name != ".ge_store_backend_id"]
    assert pages() == []
    for site in sites:
        index = data_docs_text(lake / "reports" / "data_docs" / site / "index.html")
        assert "validations/" not in index  # the index lists no result that is gone
    assert "run-to-expire" not in (lake / "reports" / "index.html").read_text()


def test_maintenance_settings_are_checked_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="top-level maintenance: 'maintenance.retain_versions' must be at least 1h"):
        load_registry(write_config(tmp_path, "maintenance:\n  retain_versions: 30m\n"))
    with pytest.raises(ConfigError, match="'maintenance.min_small_files' must be a whole number"):
        load_registry(write_config(tmp_path, "maintenance:\n  min_small_files: 0\n"))
    with pytest.raises(ConfigError, match="field 'maintenance' takes cluster_by_key"):
        load_registry(write_config(tmp_path, "maintenance:\n  vacuum: true\n"))
    assert cli.main(["maintain", "--config", str(write_config(tmp_path)), "--lake", str(tmp_path / "lake"),
                     "--tables", "nope"]) == 2
