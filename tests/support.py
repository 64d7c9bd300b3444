"""Test helpers that are safe to import anywhere: unlike conftest, importing this sets no environment
(the benchmarks use it too)."""

from __future__ import annotations

import socket

from spark_jobs import cli
from spark_jobs.lake import Lake


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(capsys, config, landing, lake, *extra):
    code = cli.main(["run", "--config", str(config), "--landing", str(landing), "--lake", str(lake), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def summary_line(out: str, layer: str, table: str) -> dict[str, str]:
    for line in out.splitlines():
        parts = line.split()
        if parts[:2] == [layer, table]:
            return dict(p.split("=", 1) for p in parts[2:] if "=" in p)
    raise AssertionError(f"no {layer} {table} line in:\n{out}")


def silver_rows(spark, engine, lake, table, keys):
    df = engine.read(spark, Lake(str(lake)).silver(table))
    return {tuple(r[k] for k in keys): {c: r[c] for c in df.columns if not c.startswith("_")} for r in df.collect()}
