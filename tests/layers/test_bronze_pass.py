"""Bronze over many small tables in shared passes (spark_jobs/layers/bronze_pass.py): every table's bronze, quarantine,
ingest log, pending tombstones, summary and silver come out exactly as when the table runs alone, whatever the
tables' keys, connectors and bad lines; a table whose gate fails in a shared pass fails alone; a failed pass and
files that changed since the pass leave the tables to read their own."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.layers import bronze
from spark_jobs.registry import load_registry
from tests.support import (
    assert_silver_is_the_source,
    change_event,
    demo_registry,
    land,
    land_generated,
    own_steps,
    run,
    silver_rows,
    step_summary,
    summary_line,
    table_commits,
)

GENERATED = ["customers", "products", "film_actor"]  # keys id / id / (actor_id, film_id); PostgreSQL and MySQL
# a landing path Spark would take as a glob: every file is read from a staged copy, by the pass as by a table alone
LANDING = "landing [1]"


def _event(op: str, lsn: int, key: int, qty: int | None = None) -> str:
    image = {"id": key, "qty": qty} if qty is not None else {"id": key}
    return change_event(op, lsn, **({"before": image} if op == "d" else {"after": image}))


# per cycle: hand-made tables' files (topic, name, lines). `orders` takes bad lines (any share allowed); `strict`
# refuses its batch (the default 5% quarantined at most); the second cycle's `orders` file opens with the tombstone
# of the first cycle's last delete, which only bronze's earlier rows can match
CYCLES = [
    {("orders", "+0+0000000000.json"): [_event("c", 10, 1, 2), _event("c", 11, 2, 5), "null",
                                         '{"before":null,"after":{"id":3, "qty":', '{"id":9,"qty":1}',
                                         _event("m", 14, 4, 1), _event("d", 15, 1)],
     ("orders", "+1+0000000000.json"): [],
     ("orders", "+1+0000000001.txt"): ["hello"],
     ("strict", "+0+0000000000.json"): [_event("c", 10, 1, 1), "not json", _event("c", 12, 2, 1), "{bad"]},
    {("orders", "+0+0000000007.json"): ["null", _event("u", 16, 2, 6), _event("d", 17, 2), "null"],
     ("strict", "+0+0000000004.json"): [_event("u", 13, 1, 3)]},
]
HAND_MADE = {"orders": {"topic": "shop.public.orders", "keys": ["id"], "quality": {"max_quarantined": "100%"}},
             "strict": {"topic": "shop.public.strict", "keys": ["id"]}}






def _land_cycle(landing: Path, source: Path, generated: list, cycle: int) -> None:
    land_generated(landing, source, generated, cycle)
    for (table, name), lines in CYCLES[cycle].items():
        _, partition, offset, suffix = re.fullmatch(r"\+(\d+)\+(\d+)(\..+)", name).group(0, 1, 2, 3)
        land(landing, f"shop.public.{table}", lines, int(offset), int(partition), suffix)




def _lake_state(spark, engine, root: Path, table: str) -> dict:
    """A table's bronze, quarantine, ingest log and pending tombstones, without what names the run or its time, and
    with landing paths relative to the landing area; and silver's commits (its summary's version aside: `_summary`)."""
    paths = Lake(str(root / "lake"))

    def rows(path: str, drop: tuple[str, ...]) -> list:
        df = engine.read(spark, path)
        if df is None:
            return []
        return sorted(tuple(v.replace(str(root / LANDING), "") if isinstance(v, str) else v for v in r)
                      for r in df.drop(*drop).collect())

    return {"bronze": rows(paths.bronze(table), ("_batch_id", "_ingested_at")),
            "quarantine": rows(paths.quarantine(table), ("_batch_id", "_ingested_at")),
            "ingest_log": rows(paths.ingest_log(table), ("_batch_id", "ingested_at", "modified_ms")),
            "pending": rows(paths.pending_tombstones(table), ()),
            "silver_commits": table_commits(engine, paths.silver(table))}




def test_tables_read_together_come_out_as_each_alone(spark, engine, tmp_path, capsys, monkeypatch):
    from spark_jobs.quality import gates

    gated: list[list[str]] = []  # the tables of each joint bronze validation
    run_audit_gates = gates.run_audit_gates
    monkeypatch.setattr(gates, "run_audit_gates", lambda asked, layer, *args: (
        gated.append(sorted(g.table for g in asked)) if layer == "bronze" else None) or run_audit_gates(
        asked, layer, *args))
    config = demo_registry(tmp_path, GENERATED, HAND_MADE)
    tables = [*GENERATED, *HAND_MADE]
    source = tmp_path / "source"
    generated = generate(load_registry(str(config)).select(GENERATED), source,
                         Options(rows=30, changes=60, records_per_file=25, batches=1, shuffle=True, seed=3))
    together, alone = tmp_path / "together", tmp_path / "alone"
    for cycle in range(2):
        for where in (together, alone):
            _land_cycle(where / LANDING, source, generated, cycle)
        args = ("--layers", "bronze,silver", "--tables", ",".join(tables))
        gated.clear()
        code, out, err = run(capsys, config, together / LANDING, together / "lake", *args, "--run-id", f"cycle-{cycle}")
        assert code == 1 and "table=strict layer=bronze" in err, out + err  # strict: its gate refuses its batch
        assert f"bronze: {len(tables)} tables' new files" in out  # one shared pass read them all
        # ... and its tables that took files were gated in one GX validation per set of settings, whose results name
        # strict (and orders' unmatched tombstone, a warning)
        assert gated == [sorted(tables)], gated
        failing: dict[str, list[str]] = {}
        for result in (together / "lake" / "_state" / "gx" / "bronze-pass").rglob(f"cycle-{cycle}/*/*.json"):
            for r in json.loads(result.read_text())["results"]:
                failing.setdefault(r["expectation_config"]["kwargs"]["column"], []).extend(
                    row["table"] for row in r["result"].get("unexpected_index_list") or [])
        assert {column: names for column, names in failing.items() if names} == {
            "quarantined_share": ["strict"], **({"tombstone_follows_delete": ["orders"]} if cycle == 0 else {})}
        # every table on its own step, in one run: strict's gate fails it alone there too
        code_alone, out_alone, err_alone = own_steps(monkeypatch, capsys, config, alone / LANDING, alone / "lake",
                                                     "--layers", "bronze,silver")
        assert code_alone == 1 and [line for line in err_alone.splitlines() if "gate failed" in line] == [
            line for line in err.splitlines() if "gate failed" in line], err_alone
        assert "read in one pass" not in out_alone
        for table in tables:
            assert _lake_state(spark, engine, together, table) == _lake_state(spark, engine, alone, table), (cycle, table)
            assert step_summary(out, "bronze", table) == step_summary(out_alone, "bronze", table), (cycle, table)
            if table != "strict":
                assert step_summary(out, "silver", table) == step_summary(out_alone, "silver", table), (cycle, table)
    # what the shared pass gave is right, not only alike: the generated tables equal their source's state ...
    assert_silver_is_the_source(spark, engine, together / "lake", generated, config)
    # ... orders took every line once, its opening tombstone matched to the delete in bronze, the bad lines quarantined
    lake = Lake(str(together / "lake"))
    assert silver_rows(spark, engine, together / "lake", "orders", ("id",)) == {}
    quarantine = engine.read(spark, lake.quarantine("orders"))
    assert sorted((r["_source_file"].rsplit("+", 1)[1], r["_line"], r["reason"]) for r in quarantine.collect()) == [
        ("0000000000.json", 4, "malformed_json"), ("0000000000.json", 5, "not_debezium: no op field"),
        ("0000000000.json", 6, "unknown_op: m"), ("0000000001.txt", 0, "unsupported_file: shop.public.orders+1+0000000001.txt")]
    code, out, _ = run(capsys, config, together / LANDING, together / "lake", "--layers", "bronze", "--tables",
                       "orders")
    assert summary_line(out, "bronze", "orders")["files"] == "0"
    assert engine.version(lake.bronze("strict")) is None  # refused twice: nothing of it in bronze
    assert not list((together / "lake" / "_state" / "staging").glob("*/*"))  # the passes' staged copies are gone


def _two_tables(tmp_path: Path) -> tuple[Path, Path, Path, list]:
    config = demo_registry(tmp_path, ["customers", "products"])
    generated = generate(load_registry(str(config)).select(["customers", "products"]), tmp_path / "landing",
                         Options(rows=20, changes=30, records_per_file=20, seed=5))
    return config, tmp_path / "landing", tmp_path / "lake", generated




def test_a_failed_shared_pass_leaves_each_table_to_read_its_own(spark, engine, tmp_path, capsys, monkeypatch):
    config, landing, lake, generated = _two_tables(tmp_path)

    def failing(*args, **kwargs):
        raise RuntimeError("the shared pass broke")

    monkeypatch.setattr(bronze, "read_together", failing)
    code, out, err = run(capsys, config, landing, lake, "--layers", "bronze,silver", "--tables", "customers,products")
    assert code == 0
    assert "a shared pass over 2 tables failed, each reads its own files: RuntimeError: the shared pass broke" in err
    assert "read in one pass" not in out
    assert_silver_is_the_source(spark, engine, lake, generated, config)


def test_files_landed_after_the_shared_pass_are_read_by_their_table(spark, engine, tmp_path, capsys, monkeypatch):
    """The table's step lists again under its writer lock: files that are not those the pass read (one landed
    since) make it read its own, so nothing the pass missed is left behind or logged unread."""
    config, landing, lake, generated = _two_tables(tmp_path)
    late_source = tmp_path / "late"
    late = generate(load_registry(str(config)).select(["customers"]), late_source,
                    Options(rows=20, changes=30, records_per_file=20, seed=5, start_offset=10_000))[0]
    real = bronze.read_together

    def then_land(*args, **kwargs):
        reads = real(*args, **kwargs)
        for f in late.files[:1]:
            dest = landing / Path(f).relative_to(late_source)
            shutil.copyfile(f, dest)
        return reads

    monkeypatch.setattr(bronze, "read_together", then_land)
    code, out, _ = run(capsys, config, landing, lake, "--layers", "bronze", "--tables", "customers,products")
    assert code == 0 and "bronze: 2 tables' new files" in out
    customers = next(g for g in generated if g.table == "customers")
    assert summary_line(out, "bronze", "customers")["files"] == str(len(customers.files) + 1)
    logged = {r["file"] for r in engine.read(spark, Lake(str(lake)).ingest_log("customers")).collect()}
    assert any(Path(f).name == Path(late.files[0]).name for f in logged)
