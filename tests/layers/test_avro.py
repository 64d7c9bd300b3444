"""Avro landing files (the S3 sink's AvroFormat with Confluent's AvroConverter): read with spark-avro, with
the same semantics, quarantine and counts as JSON, and silver equal to the source's final state."""

from __future__ import annotations

import shutil

from spark_jobs.delta.reads import row_count
from spark_jobs.generate import Options, generate
from spark_jobs.lake import Lake
from spark_jobs.registry import load_registry
from tests.support import DEMO_CONFIG, run, silver_rows, summary_line

# an Avro decimal logical type (film), Debezium names on plain ints and longs (Date, MicroTimestamp), an
# Enum, MySQL and PostgreSQL source blocks, tables with and without the JSON schema envelope
TABLES = ["customers", "products", "film", "actor"]


def test_avro_files_give_the_source_state_typed_and_a_rerun_changes_nothing(spark, engine, tmp_path, capsys):
    registry = load_registry(DEMO_CONFIG)
    generated = generate(registry.select(TABLES), tmp_path / "landing",
                         Options(rows=30, changes=90, records_per_file=25, format="avro", seed=5))
    assert all(f.endswith(".avro") for g in generated for f in g.files)
    args = ("--tables", ",".join(TABLES), "--layers", "bronze,silver")
    code, out, err = run(capsys, DEMO_CONFIG, tmp_path / "landing", tmp_path / "lake", *args)
    assert (code, err) == (0, "")
    lake = Lake(str(tmp_path / "lake"))
    for g in generated:
        bronze = summary_line(out, "bronze", g.table)
        assert (int(bronze["files"]), int(bronze["events"]), int(bronze["tombstones"]), bronze["gate"]) == (
            len(g.files), g.events, 0, "passed")
        assert row_count(lake.quarantine(g.table)) in (None, 0)
        # every column typed by its logical type, whether the file had the JSON envelope or not
        assert silver_rows(spark, engine, tmp_path / "lake", g.table, registry.tables[g.table].keys) == g.final_rows
    film = engine.read(spark, lake.silver("film")).schema
    assert {f.name: f.dataType.simpleString() for f in film.fields if f.name in ("rental_rate", "last_update", "rating")} == {
        "rental_rate": "decimal(4,2)", "last_update": "timestamp", "rating": "string"}

    versions = {t: engine.version(lake.silver(t)) for t in TABLES}
    code, out, err = run(capsys, DEMO_CONFIG, tmp_path / "landing", tmp_path / "lake", *args)
    assert (code, err) == (0, "")
    assert {t: engine.version(lake.silver(t)) for t in TABLES} == versions


def test_a_broken_avro_file_is_quarantined_whole_and_the_rest_goes_on(spark, engine, tmp_path, capsys):
    config = tmp_path / "tables.yaml"  # two files of four quarantined: over the default 5% share
    config.write_text("quality: {max_quarantined: 100%}\ntables:\n  actor:\n    topic: pagila.public.actor\n"
                      "    keys: [actor_id]\n")
    [generated] = generate(load_registry(str(config)).select(None), tmp_path / "landing",
                           Options(rows=30, changes=0, records_per_file=10, partitions=1, format="avro"))
    first, second, third = generated.files
    data = open(second, "rb").read()
    with open(second, "wb") as f:  # cut short inside its block: fewer records than its header counts
        f.write(data[: len(data) - 40])
    shutil.copy(first, first.replace("+0000000000.avro", "+0000000099.avro"))
    with open(first.replace("+0000000000.avro", "+0000000099.avro"), "wb") as f:
        f.write(b"not avro at all")
    code, out, err = run(capsys, config, tmp_path / "landing", tmp_path / "lake", "--layers", "bronze,silver")
    assert (code, err) == (0, "")
    bronze = summary_line(out, "bronze", "actor")
    assert (bronze["files"], bronze["events"]) == ("4", "20")
    quarantine = engine.read(spark, Lake(str(tmp_path / "lake")).quarantine("actor")).collect()
    assert sorted((r["_source_file"].rsplit("/", 1)[1], r["reason"]) for r in quarantine) == sorted([
        ("pagila.public.actor+0+0000000010.avro", "unreadable_file: pagila.public.actor+0+0000000010.avro: "
         "not a valid Avro file"),
        ("pagila.public.actor+0+0000000099.avro", "unreadable_file: pagila.public.actor+0+0000000099.avro: "
         "not a valid Avro file"),
    ])
    kept = {k: v for k, v in generated.final_rows.items() if k[0] <= 10 or k[0] > 20}
    assert len(kept) == 20
    assert silver_rows(spark, engine, tmp_path / "lake", "actor", ("actor_id",)) == kept
