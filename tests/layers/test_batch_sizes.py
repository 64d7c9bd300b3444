"""Any batch size applies, in any order: silver plans a small batch in one partition and a big one in its partitions
(layers/common.py, checkpoint), and bronze reads small landing files as one; whatever one run stored, the next run
of the other size applies exactly."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.layers import common, silver, silver_pass, silver_plan
from spark_jobs.layers.common import ONE_TASK_BYTES, ONE_TASK_ROWS
from spark_jobs.registry import load_registry
from tests.support import land_files, run, silver_rows, summary_line

CONFIG = "tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n"


def one_task_bounds(monkeypatch, rows: int) -> int:
    """The one-task bounds (layers/common.py) set to `rows` rows and the same share of the bytes bound, and a pass's
    bounds in the same share, in every module that reads them; returns the rows bound."""
    from spark_jobs.layers import bronze, silver, silver_pass

    share = rows / ONE_TASK_ROWS
    for module in (common, silver_plan, silver, silver_pass, bronze):
        for bound in ("ONE_TASK_ROWS", "ONE_TASK_BYTES", "PASS_ROWS", "PASS_BYTES"):
            if hasattr(module, bound):
                monkeypatch.setattr(module, bound, int(getattr(common, bound) * share))
    monkeypatch.setattr(bronze, "READ_AHEAD_BYTES", int(bronze.READ_AHEAD_BYTES * share))
    return rows


@pytest.mark.scale
def test_a_batch_over_the_one_task_threshold_between_small_ones_applies_exactly(spark, engine, tmp_path, capsys,
                                                                                monkeypatch, soak):
    """Three times the one-task bounds (over a pass's, twice them) between batches within them: 30,000 events at
    the default 10,000 rows (make soak), 1,200 at 400 (make test), with the bytes bounds set in the same proportion."""
    bound = ONE_TASK_ROWS if soak else one_task_bounds(monkeypatch, 400)
    config = tmp_path / "tables.yaml"
    config.write_text(CONFIG)
    first = bound // 2
    rows = first + 3 * bound  # the first file alone, then a batch of three times the bound in events and keys
    (g,) = generate(load_registry(str(config)).select(None), tmp_path / "sink",
                    Options(rows=rows, changes=bound * 3 // 100, records_per_file=first, batches=1, seed=3))
    snapshot, changes = g.batches[0], g.batches[1]
    landing, lake = tmp_path / "landing", tmp_path / "lake"

    # small first (one file: half the bound), then the rest of the snapshot in one batch (over the bound in events and
    # keys), then a small batch of changes again
    for phase, files in enumerate(([snapshot[0]], snapshot[1:], changes)):
        land_files(tmp_path / "sink", landing, files)
        code, out, err = run(capsys, config, landing, lake, "--layers", "bronze,silver")
        assert (code, err) == (0, ""), (phase, out)
        assert summary_line(out, "bronze", "customers")["gate"] == summary_line(out, "silver", "customers")["gate"] == "passed"
        if phase == 1:
            assert int(summary_line(out, "bronze", "customers")["events"]) == 3 * bound
            assert silver_rows(spark, engine, lake, "customers", ("custkey",)) == g.snapshot_rows
    assert silver_rows(spark, engine, lake, "customers", ("custkey",)) == g.final_rows


def _one_partition(df) -> bool:
    """Does the planner know `df` is in one partition (so aggregates and windows over it shuffle nothing)?"""
    return df._jdf.queryExecution().executedPlan().outputPartitioning().toString() == "SinglePartition"


@pytest.mark.parametrize("one_task_rows", [ONE_TASK_ROWS, 10])
def test_a_small_batch_is_planned_in_one_partition_and_a_big_one_keeps_its_partitions(spark, engine, tmp_path, capsys,
                                                                                       monkeypatch, one_task_rows):
    config = tmp_path / "tables.yaml"
    config.write_text(CONFIG)
    table = load_registry(str(config)).tables["customers"]
    generate(load_registry(str(config)).select(None), tmp_path / "landing",
             Options(rows=300, changes=50, records_per_file=100, batches=1, seed=5))
    lake = tmp_path / "lake"
    assert run(capsys, config, tmp_path / "landing", lake, "--layers", "bronze")[0] == 0
    monkeypatch.setattr(silver_plan, "ONE_TASK_ROWS", one_task_rows)
    bronze = engine.read(spark, Lake(str(lake)).bronze("customers"))
    plan = silver_plan.plan_batch(spark, engine, table, Lake(str(lake)), bronze, None)
    assert plan.rows_in == 350
    frames = [plan.typed, plan.latest, plan.state, plan.rows, plan.deletes]
    small = plan.rows_in <= one_task_rows
    assert [_one_partition(f) for f in frames] == [small] * len(frames)
    counts = plan.latest.agg(F.count(F.lit(1)))._jdf.queryExecution().executedPlan().toString()
    assert ("Exchange" in counts) != small


def _compiled(spark) -> int:
    """Classes Spark has generated and compiled in this JVM so far (a cache hit compiles none)."""
    return spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()


def test_a_tables_later_small_batches_reuse_the_classes_its_first_one_compiled(spark, engine, tmp_path, capsys):
    """A small batch compiles about two hundred generated classes with Spark's default cache of 100, which one
    table's cycle outgrows; the JVM keeps enough (session.CODEGEN_CACHE_ENTRIES) for the next batch of the same
    shape to compile almost none."""
    config = tmp_path / "tables.yaml"
    config.write_text(CONFIG)
    (g,) = generate(load_registry(str(config)).select(None), tmp_path / "sink",
                    Options(rows=100, changes=50, records_per_file=100, batches=2, seed=13))
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    compiled = []
    for files in g.batches:
        land_files(tmp_path / "sink", landing, files)
        before = _compiled(spark)
        assert run(capsys, config, landing, lake, "--layers", "bronze,silver")[0] == 0
        compiled.append(_compiled(spark) - before)
    assert silver_rows(spark, engine, lake, "customers", ("custkey",)) == g.final_rows
    # the snapshot and the first change batch compiled what a cycle needs (unless this JVM's earlier work had); the
    # second change batch reuses it (a literal Spark inlines, such as a timestamp, makes a few classes new each time)
    assert compiled[2] <= 25, compiled


@pytest.mark.parametrize("one_task_bytes", [ONE_TASK_BYTES, 2_000])
def test_a_small_batchs_rows_are_written_from_the_driver_and_a_bigger_ones_by_spark(spark, engine, tmp_path, capsys,
                                                                                    monkeypatch, one_task_bytes):
    """A batch within the one-task bounds (rows, and bytes as landed) reaches delta-rs as Arrow collected on the driver:
    bronze's append and quarantine and silver's merges make no Spark write. Over the bytes bound, Spark writes the rows
    (delta-rs commits the files). Both apply exactly, one after the other on the same tables."""
    from spark_jobs.delta.delta_rs import DeltaRsEngine

    config = tmp_path / "tables.yaml"
    config.write_text(CONFIG)
    (g,) = generate(load_registry(str(config)).select(None), tmp_path / "sink",
                    Options(rows=100, changes=50, records_per_file=100, batches=2, seed=17))
    landing, lake = tmp_path / "landing", Lake(str(tmp_path / "lake"))
    handed: list[bool] = []  # for each write delta-rs made, whether a Spark frame reached it
    stage, rows = DeltaRsEngine._stage, DeltaRsEngine._rows
    monkeypatch.setattr(DeltaRsEngine, "_stage", lambda self, df, path: handed.append(True) or stage(self, df, path))
    monkeypatch.setattr(DeltaRsEngine, "_rows", lambda self, df: handed.append(not isinstance(df, pa.Table))
                        or rows(self, df))
    for number, files in enumerate(g.batches):
        if number == 2:
            for module, bound in ((common, "ONE_TASK_BYTES"), (silver_plan, "ONE_TASK_BYTES"), (silver, "PASS_BYTES"),
                                  (silver_pass, "PASS_BYTES")):  # the bound, where each path reads it
                monkeypatch.setattr(module, bound, one_task_bytes)
        land_files(tmp_path / "sink", landing, files)
        if number:  # a bad line in each change batch: the first makes the quarantine table, the second merges into it
            landed = landing / Path(files[0]).relative_to(tmp_path / "sink")
            landed.write_text(landed.read_text().rstrip("\n") + f"\nnot json {number}\n")
        handed.clear()
        code, out, _ = run(capsys, config, landing, lake.root, "--layers", "bronze,silver")
        assert code == 0, out
    assert summary_line(out, "bronze", "customers")["quarantined"] == "malformed_json:1"
    small = one_task_bytes == ONE_TASK_BYTES
    # the last change batch: bronze's append and quarantine, silver's merge and ledger merge, besides rows made on the
    # driver
    assert handed.count(True) == (0 if small else 4), handed
    assert silver_rows(spark, engine, lake.root, "customers", ("custkey",)) == g.final_rows


@pytest.mark.parametrize("rows", [0, 1, 2_000])
def test_a_checkpoints_measures_are_taken_by_the_job_that_makes_its_rows(spark, rows):
    """`observed_checkpoint`: the measures equal the aggregate over the materialised rows (none, one, many over
    several partitions and an exchange), and cost no Spark job beyond the checkpoint's own."""
    df = spark.range(rows, numPartitions=3).withColumn("k", F.col("id") % 7).groupBy("k").agg(F.max("id").alias("top"))
    measures = (F.count(F.lit(1)).alias("groups"), F.max("top").alias("top"), F.sum("k").alias("ks"))
    context = spark.sparkContext
    jobs = {}
    for group, make in (("bare", lambda: (df.localCheckpoint(), None)),
                        ("observed", lambda: common.observed_checkpoint(df, *measures))):
        context.setJobGroup(group, group)
        try:
            materialised, measured = make()
        finally:
            context.setJobGroup("", "")
        jobs[group] = len(context.statusTracker().getJobIdsForGroup(group))
    expected = materialised.agg(*measures).first().asDict()
    assert measured == expected and expected["groups"] == min(rows, 7)
    assert jobs["observed"] == jobs["bare"]
    assert common.counted_checkpoint(df)[1] == min(rows, 7)
