"""Great Expectations gates: findings per expectation with its action; a gate fails on a `fail` finding
(one line naming table, layer, expectation and counts) and publishes Data Docs either way."""

from pathlib import Path

import pytest

from spark_jobs.errors import GateFailed
from spark_jobs.lake import Lake
from spark_jobs.quality import gates
from spark_jobs.quality.expectations import Quality
from spark_jobs.quality.gates import bronze_checks, run_gate, silver_checks
from spark_jobs.registry import TableConfig
from tests.support import data_docs_text

TABLE = TableConfig(name="orders", topic="t", keys=("id",))
PAIR = TableConfig(name="pairs", topic="t", keys=("a", "b"))


def _rows_only(table):
    return [c for c in silver_checks(table) if c.frame == "rows"]


def test_silver_key_checks_pass_and_publish_data_docs(spark, tmp_path):
    df = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    result = run_gate({"rows": df}, "orders", "silver", _rows_only(TABLE), Lake(str(tmp_path)))
    assert (result.verdict(), [(f.check, f.action) for f in result.findings]) == (
        "passed", [("key_not_null(id)", "fail"), ("key_unique(id)", "fail")])
    assert result.docs == str(tmp_path / "reports" / "data_docs" / "orders" / "index.html")
    assert data_docs_text(Path(result.docs)).count("orders.silver.rows") >= 1


def test_silver_gate_fails_on_duplicate_and_null_keys(spark, tmp_path):
    df = spark.createDataFrame([(1, "x"), (1, "y"), (None, "z"), (4, "w")], "id INT, v STRING")
    with pytest.raises(GateFailed) as failure:
        run_gate({"rows": df}, "orders", "silver", _rows_only(TABLE), Lake(str(tmp_path)))
    assert str(failure.value) == (
        "gate failed: table=orders layer=silver expectation=key_not_null(id) unexpected=1 of 4; "
        "expectation=key_unique(id) unexpected=2 of 4")
    assert (tmp_path / "reports" / "data_docs" / "orders" / "index.html").exists()


def test_compound_keys_are_checked_together_and_warn_actions_never_fail(spark, tmp_path):
    ok = spark.createDataFrame([(1, 1), (1, 2), (2, 1)], "a INT, b INT")
    assert run_gate({"rows": ok}, "pairs", "silver", _rows_only(PAIR), Lake(str(tmp_path))).success
    bad = spark.createDataFrame([(1, 1), (1, 1), (2, 1)], "a INT, b INT")
    with pytest.raises(GateFailed, match=r"expectation=key_unique\(a,b\) unexpected=2 of 3$"):
        run_gate({"rows": bad}, "pairs", "silver", _rows_only(PAIR), Lake(str(tmp_path)))
    lenient = TableConfig(name="pairs", topic="t", keys=("a", "b"), quality=Quality(overrides=(("key_unique", "warn"),)))
    result = run_gate({"rows": bad}, "pairs", "silver", _rows_only(lenient), Lake(str(tmp_path)))
    assert (result.verdict(), result.warnings()) == ("passed-with-warnings", 1)


def _jobs_and_findings(spark, tmp_path, frames, checks, group):
    """The Spark jobs a gate ran, and its findings."""
    context = spark.sparkContext
    context.setJobGroup(group, "a gate")
    try:
        result = run_gate(frames, "orders", "bronze", checks, Lake(str(tmp_path)), raise_on_failure=False)
    finally:
        context.setJobGroup("", "")
    return len(context.statusTracker().getJobIdsForGroup(group)), [
        (f.check, f.action, f.success, f.unexpected, f.total) for f in result.findings]


def test_a_frame_of_flags_on_spark_costs_no_spark_job_for_samples_of_its_unexpected_values(spark, tmp_path,
                                                                                            monkeypatch):
    """GX's BASIC result samples each map expectation's unexpected values in a Spark job of its own; on flags
    (always False) the sample says nothing, so the gate asks for none: one job per flag column for its
    counts, the table's row count and the probe that found the frame too large to validate locally, not
    one more per flag (8 jobs here before)."""
    monkeypatch.setattr(gates, "LOCAL_ROWS", 0)  # validated on Spark, as a large frame is
    events = spark.createDataFrame([(True, True, None), (False, True, True)],
                                   "_seq_present BOOLEAN, _no_tie BOOLEAN, _not_live_after BOOLEAN").localCheckpoint()
    checks = [c for c in silver_checks(TABLE) if c.frame == "events"]
    jobs, findings = _jobs_and_findings(spark, tmp_path, {"events": events}, checks, "flags-on-spark")
    assert [f[::3] for f in findings] == [("sequence_present", 1), ("sequence_increasing", 0), ("deleted_keys_not_live", 0)]
    assert jobs <= len(checks) + 3


@pytest.mark.parametrize("table", [TABLE, PAIR])
def test_a_small_frame_of_the_gates_own_checks_is_validated_in_one_spark_job_with_the_same_findings(
        spark, tmp_path, monkeypatch, table):
    """Bronze's events (row conditions on the op, flags with nulls) and silver's rows (null and duplicate
    keys): validated locally in one Spark job per frame, the findings those of GX on Spark."""
    keys = ", ".join(f"{k} INT" for k in table.keys)
    ops = ["c", "u", "r", "d", "d", "u", "c"]
    key_values = [(1, 1), (None, 2), (3, None), (None, None), (5, 5), (1, 1), (None, 7)]
    events = spark.createDataFrame(
        [(op, *kv[:len(table.keys)], agrees, follows) for op, kv, agrees, follows in zip(
            ops, key_values, [True, False, None, True, True, False, None], [None, None, True, False, None, None, True],
            strict=True)],
        f"op STRING, {keys}, _deleted_flag_agrees BOOLEAN, _follows_delete BOOLEAN").localCheckpoint()
    rows = spark.createDataFrame([kv[:len(table.keys)] for kv in key_values], keys).localCheckpoint()
    checks = [c for c in bronze_checks(table) if c.frame == "events"] + _rows_only(table)
    frames = {"events": events, "rows": rows}
    local_jobs, local = _jobs_and_findings(spark, tmp_path / "local", frames, checks, f"local-{len(table.keys)}")
    monkeypatch.setattr(gates, "LOCAL_ROWS", 0)
    _, on_spark = _jobs_and_findings(spark, tmp_path / "spark", frames, checks, f"spark-{len(table.keys)}")
    assert local == on_spark
    assert local_jobs == len(frames)
    assert [f for f in local if not f[2]]  # the data fails some checks: the comparison means something


def test_data_docs_templates_are_compiled_once_per_process(spark, tmp_path, monkeypatch):
    """GX makes a new Jinja environment for every Data Docs build: the pages' compiled templates are kept."""
    import jinja2

    from spark_jobs.quality import docs_views

    monkeypatch.setattr(docs_views._TEMPLATES, "_code", {})
    compiled = []
    original = jinja2.Environment.compile

    def compile_counted(self, *args, **kwargs):
        compiled.append(args[1] if len(args) > 1 else kwargs.get("name"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", compile_counted)
    df = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    for n, lake in enumerate([Lake(str(tmp_path / "first")), Lake(str(tmp_path / "second"))]):
        run_gate({"rows": df}, "orders", "silver", _rows_only(TABLE), lake)
        assert data_docs_text(Path(lake.data_docs("orders"), "index.html")).count("orders.silver.rows") >= 1
        if n == 0:
            assert any(name and name.endswith(".j2") for name in compiled), compiled
            compiled.clear()
    assert [name for name in compiled if name and name.endswith(".j2")] == []


@pytest.mark.parametrize("sizes", [(3, 8, 3, 8), (8, 3, 8)])
def test_frames_crossing_the_local_threshold_either_way_validate_every_time(spark, tmp_path, monkeypatch, sizes):
    """A frame over LOCAL_ROWS is validated on Spark, one under it on the driver: whatever one run's size stored
    (its asset, validation definition, checkpoint), the next run of the other size validates all the same."""
    monkeypatch.setattr(gates, "LOCAL_ROWS", 5)
    lake = Lake(str(tmp_path))
    for n in sizes:
        df = spark.createDataFrame([(i, "x") for i in range(n)], "id INT, v STRING")
        result = run_gate({"rows": df}, "orders", "silver", _rows_only(TABLE), lake)
        assert [(f.check, f.success, f.unexpected, f.total) for f in result.findings] == [
            ("key_not_null(id)", True, 0, n), ("key_unique(id)", True, 0, n)], n
    dup = spark.createDataFrame([(1, "x")] * 8, "id INT, v STRING")
    with pytest.raises(GateFailed, match=r"key_unique\(id\) unexpected=8 of 8$"):
        run_gate({"rows": dup}, "orders", "silver", _rows_only(TABLE), lake)


def test_a_tables_gx_objects_are_made_once_and_again_only_when_its_checks_change(spark, tmp_path, monkeypatch):
    """The pipeline service runs every batch of a table in one process: a frame's suite, definition and
    Checkpoint are made on its first gate and reused (each run still validates its own rows), made again when a
    check changes; frames of other layers added to the same data source since keep theirs."""
    from spark_jobs.quality import gx_project

    made = []
    make = gx_project.Project._make
    monkeypatch.setattr(gx_project.Project, "_make", lambda self, frame: made.append(frame.name) or make(self, frame))
    lake = Lake(str(tmp_path))
    good = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    bad = spark.createDataFrame([(1, "x"), (1, "y"), (3, "z")], "id INT, v STRING")
    assert run_gate({"rows": good}, "orders", "silver", _rows_only(TABLE), lake).success
    with pytest.raises(GateFailed, match=r"expectation=key_unique\(id\) unexpected=2 of 3$"):
        run_gate({"rows": bad}, "orders", "silver", _rows_only(TABLE), lake)
    assert made == ["orders.silver.rows"]
    # another layer's frame on the same (driver-side) data source, then the first frame again: still found
    events = spark.createDataFrame([("c", "1", None, True)], "op STRING, id STRING, _follows_delete BOOLEAN, "
                                                             "_deleted_flag_agrees BOOLEAN")
    bronze = [c for c in bronze_checks(TABLE) if c.frame == "events"]
    assert run_gate({"events": events}, "orders", "bronze", bronze, lake).success
    assert run_gate({"rows": good}, "orders", "silver", _rows_only(TABLE), lake).success
    assert made == ["orders.silver.rows", "orders.bronze.events"]
    lenient = TableConfig(name="orders", topic="t", keys=("id",), quality=Quality(overrides=(("key_unique", "warn"),)))
    result = run_gate({"rows": bad}, "orders", "silver", _rows_only(lenient), lake)
    assert (result.verdict(), made[-1]) == ("passed-with-warnings", "orders.silver.rows")
    # the first checks again: stored anew (the lenient suite replaced theirs under the same name)
    with pytest.raises(GateFailed, match=r"expectation=key_unique\(id\) unexpected=2 of 3$"):
        run_gate({"rows": bad}, "orders", "silver", _rows_only(TABLE), lake)
    assert len(made) == 4


def test_gx_objects_the_lake_lost_under_a_running_process_are_made_again(spark, tmp_path):
    """A lake's folder deleted (and its GX stores with it) while the service runs: the next gate of the table
    stores its objects again and validates its rows, instead of failing on the Checkpoint it made before."""
    import shutil

    lake = Lake(str(tmp_path / "lake"))
    good = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    assert run_gate({"rows": good}, "orders", "silver", _rows_only(TABLE), lake).success
    shutil.rmtree(tmp_path / "lake")
    bad = spark.createDataFrame([(1, "x"), (1, "y")], "id INT, v STRING")
    with pytest.raises(GateFailed, match=r"expectation=key_unique\(id\) unexpected=2 of 2$"):
        run_gate({"rows": bad}, "orders", "silver", _rows_only(TABLE), lake)
    assert (tmp_path / "lake" / "reports" / "data_docs" / "orders" / "index.html").exists()
