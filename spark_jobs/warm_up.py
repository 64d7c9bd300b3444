"""The pipeline service's warm-up: before it takes jobs, it runs the pipeline's own `run` (bronze and silver, gates and
Data Docs) over a few sample tables in a folder of its own, then deletes them. A JVM's first queries pay for loading
and compiling their classes (the JIT, Spark's generated code, the JSON reader's parser, GX's first validation): on two
cores a whole database's first load took 28 s on a just-started service and 17 s once one small load had run before it
(tests/benchmarks/RESULTS.md, workload D). The service exists so that jobs do not pay that; its first job would.

The samples are the generator's (spark_jobs/generate.py): nothing of the deployment's registry, landing or lake is read
or written, and nothing leaves the folder."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from spark_jobs.logs import logger

log = logger(__name__)

# one source of each envelope the connectors write (PostgreSQL, MySQL, pagila's plain JSON): their typing differs;
# each table's topic names the generator's profile, which holds its keys
SAMPLES = {"warm_actor": "pagila.public.actor", "warm_customers": "burst.burst_bank.customers",
           "warm_products": "dbserver1.inventory.products"}
SAMPLE_ROWS = 5  # rows a sample's snapshot holds, and changes to them (updates, deletes) landed with it


def warm_up(run_job: Callable[[list[str]], int], scratch: Path) -> float:
    """Runs the samples' load through `run_job` (the command line's main) in a folder under `scratch`, deletes it and
    returns the seconds it took. A warm-up that fails is an error: the same run would fail the users' first job."""
    import yaml

    from spark_jobs.generate import PROFILES, Options, write_table

    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="warm-up-", dir=scratch))
    try:
        landing, lake, registry = folder / "landing", folder / "lake", folder / "tables.yaml"
        registry.write_text(yaml.safe_dump({"tables": {name: {"topic": topic, "keys": list(PROFILES[topic].keys)}
                                                       for name, topic in SAMPLES.items()}}))
        options = Options(rows=SAMPLE_ROWS, changes=SAMPLE_ROWS, records_per_file=SAMPLE_ROWS, start_ms=int(time.time() * 1000))
        for index, (name, topic) in enumerate(SAMPLES.items()):
            write_table(PROFILES[topic], name, str(landing), options, index)
        code = run_job(["run", "--config", str(registry), "--landing", str(landing), "--lake", str(lake),
                        "--layers", "bronze,silver"])
        if code != 0:
            raise RuntimeError(f"the service's warm-up run exited {code} (its log is above)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    seconds = time.monotonic() - started
    log.info(f"warm-up: the pipeline ran over {len(SAMPLES)} sample tables in {seconds:.1f}s")
    return seconds
