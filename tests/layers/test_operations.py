"""Operations (issue 5) at the job level, the same code path the DAG tasks run: landing-time windows
(what a backfill interval takes) in any order or twice, reprocessing a fixed file, a rebuild killed midway,
one writer per table, and landing files on a local S3 server."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from pathlib import Path

import pytest

from spark_jobs import cli
from spark_jobs.delta.delta_rs import DeltaRsEngine
from spark_jobs.delta.reads import row_count
from spark_jobs.errors import PipelineError, TableBusy
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.landing import LandingWindow, list_topic
from spark_jobs.layers import bronze
from spark_jobs.registry import load_registry
from spark_jobs.session import use_s3_settings
from spark_jobs.state import writer_lock
from spark_jobs.steps import answered_alone
from tests.support import run, s3_environment, silver_rows, summary_line, upload_landing

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400


def write_config(tmp_path: Path, gold: bool = True) -> Path:
    config = tmp_path / "include" / "tables.yaml"
    (config.parent / "gold").mkdir(parents=True, exist_ok=True)
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n")
    if gold:
        (config.parent / "gold" / "customers_by_state.sql").write_text(
            (ROOT / "include" / "gold" / "customers_by_state.sql").read_text())
    return config


def table_rows(spark, engine, path: str, drop: tuple[str, ...] = ("_batch_id", "_ingested_at")) -> list[tuple]:
    df = engine.read(spark, path)
    return sorted(tuple(r) for r in df.drop(*drop).collect())


def land_over_two_days(landing: Path, topic: str, day1: int) -> list[str]:
    """The generated files, first half landed on day 1 and the rest on day 2 (by modification time)."""
    files = list_topic(str(landing), topic)
    for i, f in enumerate(files):
        moment = day1 + (0 if i < len(files) // 2 else DAY) + 60 * i
        os.utime(landing / f.path, (moment, moment))
    return [f.path for f in files]


def test_backfill_intervals_out_of_order_and_twice_give_the_tables_of_one_run(spark, engine, tmp_path, capsys):
    config = write_config(tmp_path)
    landing = tmp_path / "landing"
    generate(load_registry(str(config)).select(None), landing, Options(rows=20, changes=60, records_per_file=20, seed=5))
    day1 = 1_790_000_000 - 1_790_000_000 % DAY
    files = land_over_two_days(landing, "burst.burst_bank.customers", day1)
    iso = {d: f"{dt.datetime.fromtimestamp(day1 + d * DAY, dt.UTC):%Y-%m-%d}" for d in range(3)}

    one_run = tmp_path / "one_run"
    code, _, err = run(capsys, config, landing, one_run)
    assert (code, err) == (0, "")

    intervals = tmp_path / "intervals"
    seen = []
    for start, end in ((1, 2), (0, 1), (1, 2)):  # day 2 first, then day 1, then day 2 again
        code, out, err = run(capsys, config, landing, intervals, "--since", iso[start], "--until", iso[end])
        assert (code, err) == (0, ""), err
        seen.append(summary_line(out, "bronze", "customers")["files"])
    assert seen == [str(len(files) - len(files) // 2), str(len(files) // 2), "0"]  # the repeat takes nothing

    a, b = Lake(str(one_run)), Lake(str(intervals))
    assert row_count(a.bronze("customers")) == row_count(b.bronze("customers"))
    assert table_rows(spark, engine, b.silver("customers")) == table_rows(spark, engine, a.silver("customers"))
    assert table_rows(spark, engine, b.gold("customers_by_state")) == table_rows(spark, engine, a.gold("customers_by_state"))


def test_reprocess_reads_a_fixed_file_again_without_duplicating_bronze(spark, engine, tmp_path, capsys):
    config = write_config(tmp_path, gold=False)
    landing, lake = tmp_path / "landing", Lake(str(tmp_path / "lake"))
    generated = generate(load_registry(str(config)).select(None), landing,
                         Options(rows=30, changes=30, records_per_file=100, partitions=1, seed=3))[0]
    bad = landing / list_topic(str(landing), generated.topic)[0].path
    good = bad.read_text()
    lines = good.splitlines(keepends=True)
    lines[0] = '{"before": null, "after": {"custkey":\n'  # a broken snapshot record: malformed JSON
    bad.write_text("".join(lines))

    code, out, err = run(capsys, config, landing, lake.root, "--layers", "bronze,silver")
    assert (code, err) == (0, "")
    assert summary_line(out, "bronze", "customers")["quarantined"] == "malformed_json:1"
    assert row_count(lake.bronze("customers")) == generated.events - 1

    bad.write_text(good)  # the file is fixed at the source and landed again
    code, out, err = run(capsys, config, landing, lake.root, "--layers", "bronze,silver", "--mode", "reprocess")
    assert (code, err) == (0, "")
    line = summary_line(out, "bronze", "customers")
    assert (line["mode"], line["files"], line["events"], line["gate"]) == ("reprocess", "1", str(generated.events), "passed")
    assert row_count(lake.bronze("customers")) == generated.events
    bronze = engine.read(spark, lake.bronze("customers"))
    assert bronze.groupBy("_source_file", "_line").count().where("count > 1").count() == 0
    assert engine.read(spark, lake.quarantine("customers")).where("layer = 'bronze'").count() == 0
    silver = engine.read(spark, lake.silver("customers"))
    assert {(r["custkey"],) for r in silver.collect()} == set(generated.final_rows)

    # a window with no landing times in it reprocesses nothing
    code, out, err = run(capsys, config, landing, lake.root, "--layers", "bronze", "--mode", "reprocess",
                         "--since", "2001-01-01", "--until", "2001-01-02")
    assert (code, summary_line(out, "bronze", "customers")["files"]) == (0, "0")
    assert row_count(lake.bronze("customers")) == generated.events


def test_a_rebuild_killed_midway_leaves_committed_tables_and_the_retry_completes(spark, engine, tmp_path, capsys,
                                                                                monkeypatch):
    config = write_config(tmp_path, gold=False)
    landing, lake = tmp_path / "landing", Lake(str(tmp_path / "lake"))
    generate(load_registry(str(config)).select(None), landing, Options(rows=30, changes=60, seed=9))
    assert run(capsys, config, landing, lake.root, "--layers", "bronze,silver")[0] == 0
    before = table_rows(spark, engine, lake.silver("customers"))
    version = engine.version(lake.silver("customers"))

    published = []
    real_overwrite = DeltaRsEngine.overwrite

    def dies_after_silver(self, df, path, partition_by=()):
        if published:
            raise KeyboardInterrupt("worker lost")  # not an Exception: nothing may catch it on the way out
        published.append(path)
        return real_overwrite(self, df, path, partition_by)

    monkeypatch.setattr(DeltaRsEngine, "overwrite", dies_after_silver)
    with pytest.raises(KeyboardInterrupt):
        run(capsys, config, landing, lake.root, "--layers", "silver", "--mode", "rebuild")
    monkeypatch.setattr(DeltaRsEngine, "overwrite", real_overwrite)
    assert published == [lake.silver("customers")]
    assert engine.version(lake.silver("customers")) == version + 1  # committed: rebuilt silver, nothing half-written
    assert Path(lake.staged("customers").staging or "").is_dir()

    code, out, err = run(capsys, config, landing, lake.root, "--layers", "silver", "--mode", "rebuild")
    assert (code, err) == (0, "")
    assert summary_line(out, "silver", "customers")["mode"] == "rebuild"
    assert table_rows(spark, engine, lake.silver("customers")) == before
    assert not Path(lake.staged("customers").staging or "").exists()
    # and the incremental path after it finds nothing new to apply
    code, out, _ = run(capsys, config, landing, lake.root, "--layers", "silver")
    assert (code, summary_line(out, "silver", "customers")["events"]) == (0, "0")


def test_one_writer_per_table_a_busy_table_is_a_transient_failure(spark, tmp_path, capsys, monkeypatch):
    config = write_config(tmp_path, gold=False)
    lake = Lake(str(tmp_path / "lake"))
    released = threading.Event()
    with writer_lock(lake, "customers", "other-run"):
        with pytest.raises(TableBusy, match=r"customers is being written by another run \(run other-run, pid \d+"):
            with writer_lock(lake, "customers", "second", timeout_s=0.2):
                pass
        with writer_lock(lake, "orders", "third", timeout_s=0.2):  # other tables go on
            released.set()
        monkeypatch.setenv("CDC_LOCK_TIMEOUT", "0.5")
        failure = tmp_path / "failure.txt"
        monkeypatch.setenv("CDC_FAILURE_FILE", str(failure))
        code, _, err = run(capsys, config, tmp_path / "landing", lake.root, "--layers", "bronze")
    assert released.is_set()
    assert code == cli.EXIT_TRANSIENT
    assert err.startswith("table=customers layer=bronze failed: TableBusy: customers is being written by another run")
    assert failure.read_text() == err
    with writer_lock(lake, "customers", "after", timeout_s=0.2):  # released with its holder
        pass


def test_landing_files_on_a_local_s3_server_are_listed_and_read_through_s3a(spark, engine, tmp_path, capsys, monkeypatch,
                                                                           s3_endpoint):
    config = write_config(tmp_path, gold=False)
    generated = generate(load_registry(str(config)).select(None), tmp_path / "sink", Options(rows=20, changes=30))[0]
    keys = upload_landing(s3_endpoint, tmp_path / "sink", "s3://landing/cdc")
    for name, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    use_s3_settings(spark)  # as the CLI's session gets them: Spark reads the files through s3a:// itself
    # a name Spark would read as a glob: downloaded into the lake's staging under a safe name instead
    import boto3

    odd = keys[-1].rsplit("/", 1)[0] + "/late [copy] 1%.json"
    client = boto3.client("s3")
    client.copy_object(Bucket="landing", Key=odd, CopySource={"Bucket": "landing", "Key": keys[-1]})
    client.delete_object(Bucket="landing", Key=keys[-1])
    keys[-1] = odd
    listed = list_topic("s3://landing/cdc", generated.topic)
    assert [f"cdc/{f.path}" for f in listed] == keys
    assert [f.path for f in listed if f in LandingWindow.parse("2001-01-01", None)] == [f.path for f in listed]

    lake = Lake(str(tmp_path / "lake"))
    registry = load_registry(str(config))
    first = frozenset([listed[0].path])  # the sensor's exact list: one file now, the rest later
    summary = answered_alone(bronze.bronze_ingest(spark, engine, registry.tables["customers"], "s3://landing/cdc", lake,
                                                  "b1", bronze.Selection(files=first)))
    assert (summary.files, summary.gate) == (1, "passed")
    code, out, err = run(capsys, config, "s3://landing/cdc", lake.root)
    assert (code, err) == (0, "")
    assert summary_line(out, "bronze", "customers")["files"] == str(len(listed) - 1)
    assert row_count(lake.bronze("customers")) == generated.events
    silver = engine.read(spark, lake.silver("customers"))
    expected = {key: row["first_name"] for key, row in generated.final_rows.items()}
    assert {(r["custkey"],): r["first_name"] for r in silver.collect()} == expected

    with pytest.raises(PipelineError, match="1 landing file\\(s\\) handed to this run are no longer in"):
        answered_alone(bronze.bronze_ingest(spark, engine, registry.tables["customers"], "s3://landing/cdc", lake, "b3",
                                            bronze.Selection(files=frozenset([f"topics/{generated.topic}/gone.json"]))))


def test_the_sensors_list_of_several_tables_gives_each_its_own_files_and_names_a_file_no_table_takes(
        spark, engine, tmp_path, capsys):
    """Bronze's pass task hands one list (every table the sensor found files for) to one run: each table takes exactly
    the listed files of its topic, the rest staying pending; a listed file of no selected table's topic fails the run
    before any work, naming it (it would be taken by nobody)."""
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  customers: {topic: burst.burst_bank.customers, keys: [custkey]}\n"
                      "  actor: {topic: pagila.public.actor, keys: [actor_id]}\n")
    landing, lake = tmp_path / "landing", Lake(str(tmp_path / "lake"))
    generated = {g.table: g for g in generate(load_registry(str(config)).select(None), landing,
                                              Options(rows=20, changes=20, records_per_file=10, partitions=1, seed=8))}
    files = {t: [f.path for f in list_topic(str(landing), g.topic)] for t, g in generated.items()}
    named = [*files["customers"], *files["actor"][:1]]  # every customers file, actor's first
    code, out, err = run(capsys, config, landing, lake.root, "--layers", "bronze", "--tables", "actor,customers",
                         "--files", json.dumps(named))
    assert (code, err) == (0, "")
    taken = {t: sorted(engine.read(spark, lake.bronze(t)).select("_source_file").distinct().toPandas()["_source_file"])
             for t in generated}
    assert taken == {"customers": sorted(files["customers"]), "actor": files["actor"][:1]}
    assert row_count(lake.bronze("customers")) == generated["customers"].events

    code, out, err = run(capsys, config, landing, lake.root, "--layers", "bronze", "--tables", "actor",
                         "--files", json.dumps(files["actor"][1:] + files["customers"][:1]))
    assert (code, err) == (2, f"config error: 1 landing file(s) in --files are of no selected table's topic: "
                              f"{files['customers'][0]}\n")
    assert row_count(lake.bronze("actor")) < generated["actor"].events  # nothing was taken


def test_a_lake_on_another_store_and_a_bad_window_are_config_errors_the_task_reads(tmp_path, capsys, monkeypatch):
    config = write_config(tmp_path, gold=False)
    failure = tmp_path / "failure.txt"
    monkeypatch.setenv("CDC_FAILURE_FILE", str(failure))
    code, _, err = run(capsys, config, tmp_path / "landing", "gs://lake/cdc")
    assert (code, err) == (2, "config error: lake gs://lake/cdc: use a filesystem path (local or shared) or "
                              "s3://bucket/prefix\n")
    assert failure.read_text() == err
    for odd in ("lake {a,b}", "lake:2", "lake%41"):  # Spark would read a pattern, Hadoop a scheme, delta-rs a code
        code, _, err = run(capsys, config, tmp_path / "landing", tmp_path / odd)
        assert (code, err[:60]) == (2, f"config error: lake {tmp_path / odd}: Spark reads a "[:60]), err
    code, _, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake", "--since", "2026-03-02", "--until", "2026-03-01")
    assert (code, err) == (2, "config error: since (2026-03-02) must be before until (2026-03-01)\n")
    code, _, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake", "--until", "soon")
    assert (code, err) == (2, "config error: until: 'soon' is not an ISO 8601 date or timestamp\n")


def test_status_json_gives_each_tables_pending_files_rows_verdicts_last_success_and_lag(tmp_path, capsys):
    config = write_config(tmp_path)
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    (landed,) = generate(load_registry(str(config)).select(None), landing, Options(rows=20, changes=30, seed=4))

    def status() -> dict:
        assert cli.main(["status", "--json", "--config", str(config), "--lake", str(lake), "--landing", str(landing)]) == 0
        parsed = json.loads(capsys.readouterr().out)
        return {t["name"]: t for t in parsed["tables"]}

    before = status()
    assert before["customers"]["pending_files"] == len(landed.files)
    assert before["customers"]["layers"]["silver"] == {"rows": None, "last_verdict": None, "last_run": None,
                                                       "last_success": None, "lag_s": None, "newest_change_at": None}
    code, _, err = run(capsys, config, landing, lake, "--run-id", "first")
    assert (code, err) == (0, ""), err
    after = status()
    customers, gold = after["customers"], after["customers_by_state"]
    assert (customers["kind"], customers["pending_files"], customers["quarantined_rows"]) == ("table", 0, None)
    assert customers["layers"]["bronze"]["rows"] == landed.events
    silver = customers["layers"]["silver"]
    assert (silver["rows"], silver["last_verdict"], silver["last_run"]) == (len(landed.final_rows), "passed", "first")
    success = dt.datetime.fromisoformat(silver["last_success"])
    assert dt.datetime.now(dt.UTC) - success < dt.timedelta(minutes=5)
    # the generator's changes are from 2024: the lag is the age of the newest change, now
    newest_s = max(r["_source_ts_ms"] for r in silver_table_rows(lake)) / 1000
    assert abs(silver["lag_s"] - (dt.datetime.now(dt.UTC).timestamp() - newest_s)) < 300
    # and what it is measured from: that change's source commit time
    assert dt.datetime.fromisoformat(silver["newest_change_at"]).timestamp() == newest_s
    assert (gold["kind"], gold["layers"]["gold"]["last_verdict"]) == ("gold", "passed")

    # a new landing file is pending; a failed gate is the newest verdict, the last success stays
    (landing / "topics" / "burst.burst_bank.customers" / "partition=0" / "burst.burst_bank.customers+0+9999999999.json"
     ).write_text("not json\n" * 3)
    assert status()["customers"]["pending_files"] == 1
    code, _, _ = run(capsys, config, landing, lake, "--run-id", "second", "--max-quarantined", "0")
    assert code == 1
    failed = status()["customers"]["layers"]["bronze"]
    assert (failed["last_verdict"], failed["last_run"]) == ("failed", "second")
    assert failed["last_success"] == customers["layers"]["bronze"]["last_success"]

    # as text, no column or row that is empty: pending files only when the landing is listed, a quarantine row
    # only for a table that quarantined records (the bad lines above: 3)
    def text(*landing_args: str) -> list[list[str]]:
        assert cli.main(["status", "--config", str(config), "--lake", str(lake), *landing_args]) == 0
        return [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]

    listed, unlisted = text("--landing", str(landing)), text()
    assert (listed[0][5], unlisted[0][:6]) == ("pending", ["layer", "table", "rows", "gate", "lag", "last"])
    rows = {mode: {tuple(row[:2]): row[2:] for row in lines if row[0] in ("bronze", "silver")}
            for mode, lines in (("listed", listed), ("unlisted", unlisted))}
    # the lag ("3.0 years") is two words: then the pending count where listed, then the last success
    assert (rows["listed"][("bronze", "customers")][4], rows["listed"][("silver", "customers")][4]) == (
        "1", customers["layers"]["silver"]["last_success"])  # pending counts bronze's files alone
    assert rows["unlisted"][("bronze", "customers")][4] == customers["layers"]["bronze"]["last_success"]
    assert [row[1:] for row in unlisted if row[0] == "quarantine"] == [["customers", "3"]]


def silver_table_rows(lake: Path) -> list[dict]:
    from spark_jobs.delta.reads import read_columns

    columns = read_columns(Lake(str(lake)).silver("customers"))
    assert columns is not None
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def test_a_backlog_in_bounded_batches_gives_the_tables_and_counts_of_one_batch(spark, engine, tmp_path, capsys,
                                                                               monkeypatch):
    """Files taken five at a time (each batch its own commit, tombstones opening a file matched to the
    delete a batch before) give the bronze rows, silver and counts of taking them all at once."""
    config = write_config(tmp_path, gold=False)
    landing = tmp_path / "landing"
    (landed,) = generate(load_registry(str(config)).select(None), landing,
                         Options(rows=10, changes=30, records_per_file=3, seed=8, mix=(20, 40, 40)))
    code, whole, err = run(capsys, config, landing, tmp_path / "whole", "--layers", "bronze,silver")
    assert (code, err) == (0, ""), err
    monkeypatch.setenv("CDC_BRONZE_BATCH_FILES", "5")
    code, batched, err = run(capsys, config, landing, tmp_path / "batched", "--layers", "bronze,silver")
    assert (code, err) == (0, ""), err
    files = len(landed.files)
    batches = -(-files // 5)
    assert f"bronze customers: batch {batches}/{batches} committed: " in batched and f"({files} of {files} files)" in batched
    counted = ("files", "lines", "events", "tombstones", "tombstones_matched", "tombstones_unmatched",
               "quarantined_share", "gate")
    assert {k: summary_line(batched, "bronze", "customers")[k] for k in counted} == \
        {k: summary_line(whole, "bronze", "customers")[k] for k in counted}
    assert int(summary_line(whole, "bronze", "customers")["tombstones_matched"]) > 0
    drop = ("_batch_id", "_ingested_at", "_bronze_version")
    a, b = Lake(str(tmp_path / "whole")), Lake(str(tmp_path / "batched"))
    assert table_rows(spark, engine, b.bronze("customers"), drop) == table_rows(spark, engine, a.bronze("customers"), drop)
    assert engine.version(b.bronze("customers")) == batches - 1  # a commit a batch
    assert silver_rows(spark, engine, b.root, "customers", ("custkey",)) == landed.final_rows
