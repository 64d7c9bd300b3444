"""The CLI as a separate process: exit codes, the one-line failure message, and a clean exit every time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import subprocess_env

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_jobs", *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=600, **kwargs)


def test_gate_failure_exits_1_with_one_line_and_publishes_nothing(tmp_path):
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n")
    (tmp_path / "gold").mkdir()
    # a model whose declared key is not unique: the gold gate must stop it before it is written
    (tmp_path / "gold" / "states.sql").write_text("-- keys: state\n-- sources: customers\nSELECT state FROM customers")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    assert cli("generate", "--config", str(config), "--landing", str(landing), "--rows", "30", "--changes", "0").returncode == 0
    done = cli("run", "--config", str(config), "--landing", str(landing), "--lake", str(lake))
    assert done.returncode == 1
    stderr = [line for line in done.stderr.splitlines() if line.strip() and "WARN" not in line and "log4j" not in line
              and "setLogLevel" not in line]
    assert len(stderr) == 1, done.stderr
    assert stderr[0].startswith("gate failed: table=states layer=gold "
                                "expectation=key_unique unexpected=")
    assert stderr[0].endswith(" of 30")
    assert "Traceback" not in done.stderr
    assert (lake / "silver" / "customers" / "_delta_log").is_dir()  # the layers before it were published
    assert not (lake / "gold" / "states").exists()  # write-audit-publish: nothing published
    assert list((lake / "reports" / "data_docs" / "gold-pass").rglob("*.html"))  # the evidence: the models' joint gate
    failed = json.loads(next((lake / "reports" / "runs").glob("*/states.gold.json")).read_text())
    assert (failed["gate"], failed["error"]) == ("failed", stderr[0])


def test_state_reads_exit_cleanly_every_time(tmp_path):
    """delta-rs readers that go through a pyarrow dataset abort at exit about half the time (docs/architecture.md,
    "Measured facts that shaped the choices"); the sensor's and status' reads must not. Twenty processes, every one exits 0."""
    landing = tmp_path / "landing"
    assert cli("generate", "--landing", str(landing), "--tables", "actor", "--rows", "20", "--changes", "10").returncode == 0
    import pyarrow as pa
    from deltalake import write_deltalake

    log = pa.table({"file": ["topics/pagila.public.actor/partition=0/pagila.public.actor+0+0000000000.json"]})
    write_deltalake(str(tmp_path / "lake" / "_state" / "ingest_log" / "actor"), log)
    script = ("from spark_jobs.lake import Lake; from spark_jobs.delta.reads import row_count; "
              "from spark_jobs.state import pending_files; "
              f"lake = Lake({str(tmp_path / 'lake')!r}); "
              f"print(len(pending_files({str(landing)!r}, lake, 'actor', 'pagila.public.actor')), "
              "row_count(lake.ingest_log('actor')))")
    codes = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=subprocess_env(), capture_output=True,
                            text=True, timeout=120) for _ in range(20)]
    assert [(c.returncode, c.stdout.strip()) for c in codes] == [(0, "1 1")] * 20
