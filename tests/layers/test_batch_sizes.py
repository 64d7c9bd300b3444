"""Any batch size applies, in any order: a gate validates a small audit frame on the driver and a large one on Spark
(quality/gates.py, LOCAL_ROWS); whatever one run stored, the next run of the other size applies exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

from spark_jobs.generate import Options, generate
from spark_jobs.quality.gates import LOCAL_ROWS
from spark_jobs.registry import load_registry
from tests.support import run, silver_rows, summary_line

CONFIG = "tables:\n  customers:\n    topic: burst.burst_bank.customers\n    keys: [custkey]\n"


def test_a_batch_over_the_local_threshold_between_small_ones_applies_exactly(spark, engine, tmp_path, capsys):
    config = tmp_path / "tables.yaml"
    config.write_text(CONFIG)
    rows = LOCAL_ROWS + 15_000  # the first file (5,000) alone, then a batch of 110,000 events and keys
    (g,) = generate(load_registry(str(config)).select(None), tmp_path / "sink",
                    Options(rows=rows, changes=300, records_per_file=5_000, batches=1, seed=3))
    snapshot, changes = g.batches[0], g.batches[1]
    landing, lake = tmp_path / "landing", tmp_path / "lake"

    def land(files: list[str]) -> None:
        for path in files:
            target = landing / Path(path).relative_to(tmp_path / "sink")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)

    # small first (one file: 5,000 events), then the rest of the snapshot in one batch (over LOCAL_ROWS events and
    # keys), then a small batch of changes again
    for phase, files in enumerate(([snapshot[0]], snapshot[1:], changes)):
        land(files)
        code, out, err = run(capsys, config, landing, lake, "--layers", "bronze,silver")
        assert (code, err) == (0, ""), (phase, out)
        assert summary_line(out, "bronze", "customers")["gate"] == summary_line(out, "silver", "customers")["gate"] == "passed"
        if phase == 1:
            assert int(summary_line(out, "bronze", "customers")["events"]) == 110_000 > LOCAL_ROWS
            assert silver_rows(spark, engine, lake, "customers", ("custkey",)) == g.snapshot_rows
    assert silver_rows(spark, engine, lake, "customers", ("custkey",)) == g.final_rows
