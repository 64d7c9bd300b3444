"""Great Expectations gates: the checks' tallies counted in one Spark job from the flags their records declare,
findings per expectation with its action; a gate fails on a `fail` finding (one line naming table, layer,
expectation and counts) and publishes Data Docs either way."""

import re
import uuid
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_jobs.errors import GateFailed
from spark_jobs.lake import Lake
from spark_jobs.quality.audit import Audit, Figures, Tally, tally, tally_tables
from spark_jobs.quality.expectations import EXPECTATIONS, Quality, flagged
from spark_jobs.quality.gates import bronze_checks, run_gate, silver_checks
from spark_jobs.registry import TableConfig
from tests.support import data_docs_text

TABLE = TableConfig(name="orders", topic="t", keys=("id",))
PAIR = TableConfig(name="pairs", topic="t", keys=("a", "b"))


def _rows_gate(df, table, lake, **kwargs):
    """Silver's gate on its merged rows alone (the key checks)."""
    audit = Audit(Figures(), tally({"rows": df}, flagged("silver"), table.keys))
    return run_gate(audit, {}, table.name, "silver", silver_checks(table), lake, run_name="r1", **kwargs)


def test_silver_key_checks_pass_and_publish_data_docs(spark, tmp_path):
    df = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    result = _rows_gate(df, TABLE, Lake(str(tmp_path)))
    assert (result.verdict(), [(f.check, f.action, f.unexpected, f.total) for f in result.findings]) == (
        "passed", [("key_not_null", "fail", 0, 2), ("key_unique", "fail", 0, 2),
                   ("max_quarantined", "fail", None, None)])
    assert result.docs == str(tmp_path / "reports" / "data_docs" / "orders" / "index.html")
    assert data_docs_text(Path(result.docs)).count("orders.silver.audit") >= 1


def test_silver_gate_fails_on_duplicate_and_null_keys(spark, tmp_path):
    df = spark.createDataFrame([(1, "x"), (1, "y"), (None, "z"), (4, "w")], "id INT, v STRING")
    with pytest.raises(GateFailed) as failure:
        _rows_gate(df, TABLE, Lake(str(tmp_path)))
    assert str(failure.value) == (  # a null key is not a duplicate: uniqueness applies to the 3 keyed rows
        "gate failed: table=orders layer=silver expectation=key_not_null unexpected=1 of 4; "
        "expectation=key_unique unexpected=2 of 3")
    assert (tmp_path / "reports" / "data_docs" / "orders" / "index.html").exists()


def test_compound_keys_are_checked_together_and_warn_actions_never_fail(spark, tmp_path):
    ok = spark.createDataFrame([(1, 1), (1, 2), (2, 1)], "a INT, b INT")
    assert _rows_gate(ok, PAIR, Lake(str(tmp_path))).success
    bad = spark.createDataFrame([(1, 1), (1, 1), (2, 1), (None, 1)], "a INT, b INT")
    with pytest.raises(GateFailed, match=r"expectation=key_not_null unexpected=1 of 4; "
                                         r"expectation=key_unique unexpected=2 of 3$"):
        _rows_gate(bad, PAIR, Lake(str(tmp_path)))
    lenient = TableConfig(name="pairs", topic="t", keys=("a", "b"),
                          quality=Quality(overrides=(("key_unique", "warn"), ("key_not_null", "warn"))))
    result = _rows_gate(bad, lenient, Lake(str(tmp_path)))
    assert (result.verdict(), result.warnings()) == ("passed-with-warnings", 2)


def _reference_tallies(events, deletes, rows):
    """The tallies by hand, row by row in Python: what the flags of quality/expectations.py say."""
    def counted(pairs):
        applied = [ok for ok in pairs if ok is not None]
        return Tally(len(applied), sum(1 for ok in applied if not ok))

    keys = [k for k in rows if k is not None]
    return {
        "sequence_present": counted([seq is not None for seq, _ in events]),
        "sequence_increasing": counted([None if variants is None else variants == 1 for _, variants in events]),
        "key_not_null": counted([k is not None for k in rows]),
        "key_unique": counted([None if k is None else keys.count(k) == 1 for k in rows]),
        "deleted_keys_not_live": counted([live is None or live > seq for seq, live in deletes]),
    }


def _silver_frames(spark, events, deletes, rows):
    return {"events": spark.createDataFrame(events, "_seq STRING, _variants INT"),
            "deletes": spark.createDataFrame(deletes, "_seq STRING, _live_seq STRING"),
            "rows": spark.createDataFrame([(k,) for k in rows], "id INT")}


@settings(max_examples=15, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from([None, "a", "b"]), st.sampled_from([None, 1, 2])), max_size=6),
       deletes=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([None, "a", "b", "c"])), max_size=4),
       rows=st.lists(st.sampled_from([None, 1, 2, 3]), max_size=6), partitions=st.sampled_from([1, 3]))
def test_the_tallies_of_several_frames_are_what_the_flags_say_row_by_row(spark, events, deletes, rows, partitions):
    """Silver's checks on its three sets of rows, counted together however the rows are partitioned, equal the
    flags evaluated row by row."""
    frames = {name: df.repartition(partitions) for name, df in _silver_frames(spark, events, deletes, rows).items()}
    assert tally(frames, flagged("silver"), TABLE.keys) == _reference_tallies(events, deletes, rows)


def test_a_small_batchs_tallies_are_one_spark_job(spark):
    """A small batch's audited rows are one partition each (layers/common.checkpoint): the tallies of all of
    them, the key windows included, are counted in one Spark job."""
    frames = {name: df.localCheckpoint().coalesce(1) for name, df in _silver_frames(
        spark, [("a", 1), ("b", 2), (None, None)], [("a", None), ("b", "a")], [1, 2, 2, None]).items()}
    context = spark.sparkContext
    context.setJobGroup("small-tally", "a tally")
    try:
        got = tally(frames, flagged("silver"), TABLE.keys)
    finally:
        context.setJobGroup("", "")
    assert (got["key_unique"], got["deleted_keys_not_live"], got["sequence_increasing"]) == (
        Tally(3, 2), Tally(2, 1), Tally(2, 1))
    assert len(context.statusTracker().getJobIdsForGroup("small-tally")) == 1


@settings(max_examples=10, deadline=None)
@given(tables=st.lists(st.tuples(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([None, "a", "b", "c"])), max_size=3),
    st.lists(st.sampled_from([None, 1, 2, 3]), max_size=5), st.sampled_from(["int64", "string", "float64"])),
    min_size=1, max_size=4))
@example(tables=[([("a", "b")], [1, 1, 2, 3, None], "float64")])  # NaN twice, and the two zeros: always drawn
def test_many_tables_frames_on_the_driver_are_tallied_each_as_alone_without_a_spark_job(spark, tables):
    """tally_tables counts each table's frames on the driver: each table's keys count within its own rows (tables
    share key values here, and a duplicate in one fails that one only), a float key's NaNs as one value and its zeros
    as one (as Spark's window groups them), and every table's tallies equal what its flags say row by row; no Spark job
    runs for it."""
    import pyarrow as pa

    odd = {1: float("nan"), 2: -0.0, 3: 0.0}  # a float key: NaN, and two zeros that are one key

    def key(k: int | None, key_type: str):  # noqa: ANN202
        return None if k is None else {"int64": k, "string": str(k), "float64": odd[k]}[key_type]

    arrow = {}
    for n, (deletes, rows, key_type) in enumerate(tables):
        keys = pa.array([key(k, key_type) for k in rows], key_type)
        arrow[f"t{n}"] = ({"rows": pa.table({"id": keys}), "deletes": pa.table({
            "_seq": pa.array([seq for seq, _ in deletes], pa.string()),
            "_live_seq": pa.array([live for _, live in deletes], pa.string())})}, ("id",))
    context, group = spark.sparkContext, f"tables-tally-{uuid.uuid4()}"  # one group per example
    context.setJobGroup(group, "many tables' tallies")
    try:
        got = tally_tables(arrow, flagged("silver"))
    finally:
        context.setJobGroup("", "")
    one_zero = {None: None, 1: 1, 2: 2, 3: 2}  # the reference's keys: a float key's two zeros are one
    expected = {f"t{n}": {name: t for name, t in _reference_tallies(
        [], deletes, [one_zero[k] if kind == "float64" else k for k in rows]).items()
                          if name not in ("sequence_present", "sequence_increasing")}
                for n, (deletes, rows, kind) in enumerate(tables)}
    assert got == expected
    assert context.statusTracker().getJobIdsForGroup(group) == []


def test_bronze_row_checks_quarantine_with_the_reason_their_record_gives(spark):
    """The quarantine reason of a bronze row-level check comes from its record: its flag and its detail."""
    from spark_jobs.debezium import envelope

    lines = spark.createDataFrame([
        ("f", 1, '{"op": "c", "after": {"v": 1}}'), ("f", 2, '{"op": "d", "before": {"id": 2}}'),
        ("f", 3, '{"op": "d", "before": {"v": 3}}')], "_source_file STRING, _line BIGINT, _raw STRING")
    got = envelope.classify(envelope.parse_envelope(lines), ("id",)).orderBy("_line").collect()
    assert [(r["_kind"], r["reason"]) for r in got] == [
        ("quarantine", "event_has_key: id"), ("event", None), ("quarantine", "delete_has_key: id")]
    events = envelope.classify(envelope.parse_envelope(lines), ("id",)).selectExpr("*", "NULL AS _follows_delete")
    bronze = tally({"events": events}, flagged("bronze"))
    assert (bronze["event_has_key"], bronze["delete_has_key"]) == (Tally(1, 1), Tally(2, 1))


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
        _rows_gate(df, TABLE, lake)
        assert data_docs_text(Path(lake.data_docs("orders"), "index.html")).count("orders.silver.audit") >= 1
        if n == 0:
            assert any(name and name.endswith(".j2") for name in compiled), compiled
            compiled.clear()
    assert [name for name in compiled if name and name.endswith(".j2")] == []


def test_a_tables_gx_objects_are_made_once_and_again_only_when_its_checks_change(spark, tmp_path, monkeypatch):
    """The pipeline service runs every batch of a table in one process: a gate's suite, definition and
    Checkpoint are made on its first run and reused (each run still validates its own audit), made again when a
    check changes; other layers' gates added to the same data source since keep theirs."""
    from spark_jobs.quality import gx_project

    made = []
    make = gx_project.Project._make
    monkeypatch.setattr(gx_project.Project, "_make", lambda self, frame: made.append(frame.name) or make(self, frame))
    lake = Lake(str(tmp_path))
    good = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    bad = spark.createDataFrame([(1, "x"), (1, "y"), (3, "z")], "id INT, v STRING")
    assert _rows_gate(good, TABLE, lake).success
    with pytest.raises(GateFailed, match=r"expectation=key_unique unexpected=2 of 3$"):
        _rows_gate(bad, TABLE, lake)
    assert made == ["orders.silver.audit"]
    # another layer's gate on the same (driver-side) data source, then the first again: still found
    events = spark.createDataFrame([("c", "", None, None, None)], "op STRING, _missing_key STRING, _flat_op STRING, "
                                                                 "_flat_deleted STRING, _follows_delete BOOLEAN")
    audit = Audit(Figures(), tally({"events": events}, flagged("bronze")))
    assert run_gate(audit, {}, "orders", "bronze", bronze_checks(TABLE), lake, run_name="r1").success
    assert _rows_gate(good, TABLE, lake).success
    assert made == ["orders.silver.audit", "orders.bronze.audit"]
    lenient = TableConfig(name="orders", topic="t", keys=("id",), quality=Quality(overrides=(("key_unique", "warn"),)))
    result = _rows_gate(bad, lenient, lake)
    assert (result.verdict(), made[-1]) == ("passed-with-warnings", "orders.silver.audit")
    # the first checks again: stored anew (the lenient suite replaced theirs under the same name)
    with pytest.raises(GateFailed, match=r"expectation=key_unique unexpected=2 of 3$"):
        _rows_gate(bad, TABLE, lake)
    assert len(made) == 4


def test_gx_objects_the_lake_lost_under_a_running_process_are_made_again(spark, tmp_path):
    """A lake's folder deleted (and its GX stores with it) while the service runs: the next gate of the table
    stores its objects again and validates its rows, instead of failing on the Checkpoint it made before."""
    import shutil

    lake = Lake(str(tmp_path / "lake"))
    good = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    assert _rows_gate(good, TABLE, lake).success
    shutil.rmtree(tmp_path / "lake")
    bad = spark.createDataFrame([(1, "x"), (1, "y")], "id INT, v STRING")
    with pytest.raises(GateFailed, match=r"expectation=key_unique unexpected=2 of 2$"):
        _rows_gate(bad, TABLE, lake)
    assert (tmp_path / "lake" / "reports" / "data_docs" / "orders" / "index.html").exists()


def test_gx_static_files_are_copied_once_for_every_site_not_by_every_gate(spark, tmp_path, monkeypatch):
    """GX copies its fonts, images and styles (4 MB) into the site on every Data Docs build: the lake keeps one copy
    beside the sites while it is whole, of the files GX names (its favicon and logo, which its pages link, and a
    style: 17 KB, where it ships 4 MB of tutorial animations and fonts no page loads), every site's pages link to
    it, another table's site writes none of its own, and a lake that lost the copy gets it again."""
    import dataclasses
    import shutil

    import great_expectations

    from spark_jobs import storage
    from spark_jobs.quality.docs_assets import GX_STATIC

    written = []
    write = storage.LocalFiles.write
    monkeypatch.setattr(storage.LocalFiles, "write", lambda self, path, data: written.append(path) or write(self, path, data))
    lake = Lake(str(tmp_path))
    static = Path(lake.data_docs("orders")).parent / GX_STATIC
    good = spark.createDataFrame([(1, "x"), (2, "y")], "id INT, v STRING")
    shipped = Path(great_expectations.__file__).parent / "render" / "view" / "static"  # what GX's build copies

    def copied() -> dict[str, bytes]:
        return {str(p.relative_to(static)): p.read_bytes() for p in static.rglob("*")
                if p.is_file() and p.name != ".complete"}

    assert _rows_gate(good, TABLE, lake).success
    page = (Path(lake.data_docs("orders")) / "index.html").read_text()
    assert f'href="../{GX_STATIC}/images/favicon.ico"' in page and not re.search(r'"(\.{1,2}/)*static/', page)
    linked = set(re.findall(rf'"\.\./{GX_STATIC}/([^"]+)"', page))
    assert linked == {"images/favicon.ico", "images/logo-long.png"}  # GX's styles are inline in its pages
    expected = {str(p.relative_to(shipped)): p.read_bytes() for p in shipped.rglob("*") if p.is_file()}
    assert linked <= set(copied()) and all(copied()[name] == expected[name] for name in copied())
    assert sum(map(len, copied().values())) < 50_000 < sum(map(len, expected.values()))
    written.clear()
    assert _rows_gate(good, TABLE, lake).success
    other = dataclasses.replace(TABLE, name="customers")
    assert _rows_gate(good, other, lake).success
    assert written and not [p for p in written if f"/{GX_STATIC}/" in p or "/static/" in p]  # pages, not GX's files
    assert not (Path(lake.data_docs("customers")) / "static").exists()
    kept = copied()
    shutil.rmtree(static)
    assert _rows_gate(good, TABLE, lake).success
    assert copied() == kept


def test_every_check_on_rows_declares_its_rows_and_flag_and_none_is_named_like_a_figure():
    on_rows = [e for e in EXPECTATIONS.values() if e.flag is not None]
    assert all(e.rows and e.figure is None for e in on_rows)
    assert all(e.figure for e in EXPECTATIONS.values() if e.flag is None)
    assert not {e.name for e in on_rows} & set(Figures.__dataclass_fields__)


def test_a_tables_gates_share_one_gx_project_whether_or_not_they_validate_rows_on_spark(spark, tmp_path, monkeypatch):
    """A gate with only its audit (bronze here) and one with a user's expectation on Spark rows (silver) use the
    same GX context: the project is the process's Spark application's, not named by the gate's frames."""
    from spark_jobs.quality import gx_project
    from spark_jobs.quality.expectations import UserExpectation
    from spark_jobs.quality.gates import user_checks

    monkeypatch.setattr(gx_project, "_projects", type(gx_project._projects)())
    made = []
    context = gx_project.context
    monkeypatch.setattr(gx_project, "context", lambda lake, table: made.append(table) or context(lake, table))
    lake = Lake(str(tmp_path))
    events = spark.createDataFrame([("c", "", None, None, None)], "op STRING, _missing_key STRING, _flat_op STRING, "
                                                                 "_flat_deleted STRING, _follows_delete BOOLEAN")
    bronze = Audit(Figures(), tally({"events": events}, flagged("bronze")))
    assert run_gate(bronze, {}, "orders", "bronze", bronze_checks(TABLE), lake, run_name="r1").success
    upserts = spark.createDataFrame([(1, "x"), (2, None)], "id INT, v STRING")
    not_null = UserExpectation("expect_column_values_to_not_be_null", '{"column": "v"}', "warn", "table 'orders'")
    result = run_gate(Audit(Figures()), {"upserts": upserts}, "orders", "silver", user_checks((not_null,), "upserts"),
                      lake, run_name="r1")
    assert [(f.check, f.success, f.unexpected) for f in result.findings] == [
        ("expect_column_values_to_not_be_null(v)", False, 1)]
    assert made == ["orders"]


def test_a_pass_of_tables_whose_settings_differ_is_one_validation_of_its_layers_suite_and_each_verdict_its_own(
        spark, tmp_path, monkeypatch):
    """A pass gates tables with the default settings and tables with their own (a warned check, a higher quarantine
    limit) in one GX validation of one suite, `silver.audit`: each table's findings are those of its own gate alone."""
    import dataclasses

    from spark_jobs.quality import gx_project
    from spark_jobs.quality.gates import AuditGate, run_audit_gates

    made = []
    make = gx_project.Project._make
    monkeypatch.setattr(gx_project.Project, "_make", lambda self, frame: made.append(frame.name) or make(self, frame))
    lake = Lake(str(tmp_path))
    lenient = Quality(overrides=(("key_unique", "warn"),), max_quarantined=0.6)
    qualities = {"a": Quality(), "b": Quality(), "c": Quality(), "d": lenient, "e": lenient}
    duplicated = {"a", "d"}  # a duplicate key: fails a, warns d
    quarantined = {"b", "e"}  # half the batch quarantined: over b's limit, under e's
    gates = []
    for name, quality in qualities.items():
        table = dataclasses.replace(TABLE, name=name, quality=quality)
        tallies = {"key_not_null": Tally(4, 0), "key_unique": Tally(4, 2 if name in duplicated else 0)}
        figures = Figures(quarantined=4, quarantined_share=0.5) if name in quarantined else Figures()
        gates.append(AuditGate(name, "silver", Audit(figures, tallies), silver_checks(table), lake, "r1"))
    together = run_audit_gates(gates, "silver", lake, "r1")
    assert made == ["silver.audit"]
    assert {t: r.verdict() for t, r in together.items()} == {
        "a": "failed", "b": "failed", "c": "passed", "d": "passed-with-warnings", "e": "passed"}
    for gate in gates:
        alone = gate.answer_alone()
        assert together[gate.table].findings == alone.findings and together[gate.table].layer == "silver"
    assert "silver.audit" in data_docs_text(Path(together["a"].docs))
    # the page's row per table: each judged by its own checks alone (d's key_unique warns; e is within its limit)
    page = next((tmp_path / "reports" / "data_docs" / "silver-pass" / "validations").rglob("r1/*/*.html"))
    cells = re.findall(r'<div class="show-scrollbars">([^<]*)</div>', data_docs_text(page).split("Checks it failed")[1])
    assert cells[:15] == ["a", "failed", "key_unique", "b", "failed", "max_quarantined", "c", "passed", "-",
                          "d", "passed-with-warnings", "key_unique", "e", "passed", "-"]
