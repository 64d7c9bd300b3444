"""The single-node floor the benchmarks compare the pipeline with: DuckDB reads the change files and
keeps the newest event per key, then delta-rs merges it into silver with the pipeline's own merge
conditions (`apply`), or writes silver from it (`load`: the initial snapshot). No bronze, no gates, no
ledger, no quarantine: the least work that gets silver right for in-order batches of well-formed
PostgreSQL events without the schema envelope (the benchmark's table).

    python -m tests.benchmarks.floor apply --landing L --files @list.json --silver PATH --keys k1,k2
    python -m tests.benchmarks.floor load --landing L --files @list.json --silver NEW --schema-of PATH --keys k1,k2
    python -m tests.benchmarks.floor dedupe --events in.parquet --out out.parquet --keys k1,k2

Run as its own process, like the pipeline's CLI, so both pay their imports and start-up."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

# spark_jobs.layers.silver.SILVER_MERGE, restated so the floor imports no pyspark (the harness checks they agree:
# check_floor_restates_the_pipeline)
DELETE_WHEN = "s._op = 'd' AND (t._seq IS NULL OR s._seq > t._seq)"
UPDATE_WHEN = "s._op <> 'd' AND (t._seq IS NULL OR s._seq > t._seq)"
INSERT_WHEN = "s._op <> 'd'"
# PostgreSQL's log position as spark_jobs.debezium.ordering orders it: the LSN, then snapshot events first
SNAPSHOT_MARKERS = ("true", "first", "last", "first_in_data_collection", "last_in_data_collection")


def sequence_sql(op: str, source: str) -> str:
    """`_seq` from the SQL expressions of an event's op and its source block (JSON)."""
    markers = ", ".join(repr(m) for m in SNAPSHOT_MARKERS)
    return (f"lpad({source}->>'lsn', 20, '0') || '|' || CASE WHEN {op} = 'r' OR "
            f"lower(coalesce({source}->>'snapshot', 'false')) IN ({markers}) THEN '0' ELSE '1' END")


DUCK_TYPES = {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.int16(): "SMALLINT", pa.string(): "VARCHAR",
              pa.large_string(): "VARCHAR", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET threads = 2")  # the machine's cores, as Spark's local[*]
    return con


def silver_schema(path: str) -> pa.Schema:
    """The target's Arrow schema, read from the Delta log (no data files)."""
    return pa.schema(DeltaTable(path).schema().to_arrow())


def latest_changes(con: duckdb.DuckDBPyConnection, files: list[str], schema: pa.Schema,
                   keys: tuple[str, ...]) -> pa.Table:
    """The newest event per key in the change files, as silver rows (source columns, `_op`, `_seq`,
    `_source_ts_ms`); Kafka tombstone lines (`null`) are skipped."""
    columns = [f for f in schema if not f.name.startswith("_")]
    values = ", ".join(f"CAST(img->>'{f.name}' AS {DUCK_TYPES[f.type]}) AS \"{f.name}\"" for f in columns)
    query = f"""
        WITH lines AS (
            SELECT filename AS _source_file, json AS j
            FROM read_json_objects({files!r}, format = 'newline_delimited', filename = true)),
        events AS (
            SELECT _source_file, j->>'op' AS op, CASE WHEN j->>'op' = 'd' THEN j->'before' ELSE j->'after' END AS img,
                   j->'source' AS src
            FROM lines WHERE json_type(j) = 'OBJECT')
        SELECT {values}, op AS _op, {sequence_sql('op', 'src')} AS _seq, CAST(src->>'ts_ms' AS BIGINT) AS _source_ts_ms
        FROM events
        QUALIFY row_number() OVER (PARTITION BY {', '.join(keys)} ORDER BY _seq DESC, _source_file DESC) = 1"""
    return con.sql(query).to_arrow_table()


def silver_rows(landing: str, files: list[str], schema: pa.Schema, keys: tuple[str, ...], batch_id: str) -> pa.Table:
    """The newest event per key in the files as rows of silver's schema."""
    return as_silver(latest_changes(connect(), [f"{landing}/{f}" for f in files], schema, keys), schema, batch_id)


def as_silver(latest: pa.Table, schema: pa.Schema, batch_id: str) -> pa.Table:
    """The newest events (source columns, `_op`, `_seq`, `_source_ts_ms`) as rows of silver's schema: the batch's
    time and id added (each floor's last step before Delta, DuckDB's here and Spark's: spark_floor.py)."""
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    latest = latest.append_column("_ingested_at", pa.array([now] * latest.num_rows, pa.timestamp("us")))
    latest = latest.append_column("_batch_id", pa.array([batch_id] * latest.num_rows, pa.string()))
    return latest.select(schema.names).cast(pa.schema([f.with_nullable(True) for f in schema]))


def load(landing: str, files: list[str], silver: str, schema_of: str, keys: tuple[str, ...], batch_id: str) -> dict[str, int]:
    """The initial snapshot: silver written anew (in the schema of the table `schema_of`: the floor does not
    infer types) from the newest event per key; deletes in the files leave no row."""
    return write_new(silver, silver_rows(landing, files, silver_schema(schema_of), keys, batch_id))


def write_new(silver: str, rows: pa.Table) -> dict[str, int]:
    rows = rows.filter(pc.not_equal(rows["_op"], "d"))
    write_deltalake(silver, rows, mode="error")
    return {"keys": rows.num_rows}


def apply(landing: str, files: list[str], silver: str, keys: tuple[str, ...], batch_id: str) -> dict[str, int]:
    return merge(silver, silver_rows(landing, files, silver_schema(silver), keys, batch_id), keys)


def merge(silver: str, latest: pa.Table, keys: tuple[str, ...]) -> dict[str, int]:
    """The newest events merged into silver with the pipeline's conditions, by delta-rs."""
    predicate = " AND ".join(f't."{k}" = s."{k}"' for k in keys)
    metrics = (DeltaTable(silver).merge(latest, predicate=predicate, source_alias="s", target_alias="t")
               .when_matched_delete(predicate=DELETE_WHEN).when_matched_update_all(predicate=UPDATE_WHEN)
               .when_not_matched_insert_all(predicate=INSERT_WHEN).execute())
    return {"keys": latest.num_rows, "inserted": metrics.get("num_target_rows_inserted", 0),
            "updated": metrics.get("num_target_rows_updated", 0), "deleted": metrics.get("num_target_rows_deleted", 0)}


def dedupe(events: str, out: str, keys: tuple[str, ...]) -> float:
    """Keep the newest event per key (the pipeline's ordering: `_seq`, then landing file and line); returns
    the seconds the query and its Parquet write took."""
    con = connect()
    started = time.perf_counter()
    con.execute(f"""COPY (SELECT * FROM read_parquet('{events}')
                          QUALIFY row_number() OVER (PARTITION BY {', '.join(keys)}
                                                     ORDER BY _seq DESC, _source_file DESC, _line DESC) = 1)
                    TO '{out}' (FORMAT parquet)""")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.floor", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("apply")
    a.add_argument("--landing", required=True)
    a.add_argument("--files", required=True, help="@file holding a JSON list of landing paths")
    a.add_argument("--silver", required=True)
    a.add_argument("--keys", required=True)
    a.add_argument("--batch-id", default="floor")
    load_ = sub.add_parser("load")
    load_.add_argument("--landing", required=True)
    load_.add_argument("--files", required=True, help="@file holding a JSON list of landing paths")
    load_.add_argument("--silver", required=True, help="the table to create")
    load_.add_argument("--schema-of", required=True, help="a Delta table whose schema silver takes")
    load_.add_argument("--keys", required=True)
    load_.add_argument("--batch-id", default="floor")
    d = sub.add_parser("dedupe")
    d.add_argument("--events", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--keys", required=True)
    args = p.parse_args(argv)
    keys = tuple(args.keys.split(","))
    if args.command in ("apply", "load"):
        files = json.loads(Path(args.files.removeprefix("@")).read_text())
        done = (apply(args.landing, files, args.silver, keys, args.batch_id) if args.command == "apply" else
                load(args.landing, files, args.silver, args.schema_of, keys, args.batch_id))
        print(json.dumps(done))
    else:
        print(json.dumps({"seconds": dedupe(args.events, args.out, keys)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
