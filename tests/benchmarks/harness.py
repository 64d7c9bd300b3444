"""`make bench`: the pipeline against the single-node floor (tests/benchmarks/floor.py) on the same files.

    python -m tests.benchmarks [--scale 1.0] [--runs 3] [--workloads L,W1,W2,W3,W4,W5,D,DA,G,GJ] [--workdir data/bench]

Every workload generates its change files with the project's generator (pagila's `actor`, PostgreSQL,
without the schema envelope), runs the project's CLI and the floor as separate processes on the same
files, checks that both silver tables are equal (and equal to the generator's final state), and prints
each figure with the ratio project/floor. `--scale` multiplies table and batch sizes (1.0 = the sizes
of issue 6); the results go to tests/benchmarks/RESULTS.md and results.json. D, a whole database of many small
tables, and DA, one cycle of it through the real scheduler, are in tests/benchmarks/database.py (their sizes do
not scale). G, a gold model refreshed incrementally over a large silver table, and GJ, a join model refreshed
incrementally, are tests/benchmarks/gold.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.benchmarks.equality import KEYS, check_equal
from tests.benchmarks.spark_floor import SparkFloor

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CONFIG = HERE / "config" / "tables.yaml"
TABLE, MODEL = "actor", "actors_by_last_name"
FLUSH_SIZE = 20_000  # the S3 sink's flush.size: records per landing file
MIX = (20, 70, 10)  # insert, update, delete (percent of change events)


@dataclass
class Figure:
    workload: str
    name: str
    project: float
    floor: float | None = None  # the floor as a process of its own: its imports and start-up paid each time
    target: str = ""
    met: bool | None = None
    note: str = ""
    # the floor's step timed inside this long-lived process (imports done), as the project's jobs are timed on the
    # warm pipeline service
    warm_floor: float | None = None
    # the least a warm PySpark program does for the step (spark_floor.py): the project's ratio to it is the overhead
    # the project itself adds on Spark
    spark_floor: float | None = None

    @property
    def ratio(self) -> float | None:
        return None if not self.floor else self.project / self.floor

    @property
    def spark_ratio(self) -> float | None:
        return None if not self.spark_floor else self.project / self.spark_floor

    @property
    def warm_ratio(self) -> float | None:
        return None if not self.warm_floor else self.project / self.warm_floor


@dataclass
class Bench:
    workdir: Path
    scale: float
    runs: int
    services: Services | None = None  # the pipeline services of the "service" figures, one per deployment
    chosen_modes: tuple[str, ...] = ("", "service")
    engine: str = "delta-rs"  # CDC_DELTA_ENGINE of the project's runs (the floor always merges with delta-rs)
    engines: tuple[str, ...] = ("delta-rs",)  # every engine this bench runs L and W1-W3 with
    figures: list[Figure] = field(default_factory=list)
    spark_jobs: list[int] = field(default_factory=list)  # per service job, in the order they ran
    gx_seconds: list[float] = field(default_factory=list)  # per service job: its time in Great Expectations
    # (engine, rows) -> the project's lake holding the initial load of `rows` rows
    seeds: dict[tuple[str, int], Path] = field(default_factory=dict)
    floor_seeds: dict[int, Path] = field(default_factory=dict)  # rows -> the floor's silver, loaded by the floor
    floor_load_s: dict[int, float] = field(default_factory=dict)  # rows -> seconds the floor's load took
    warm_load_s: dict[int, float] = field(default_factory=dict)  # rows -> seconds of the floor's load, warm
    spark_load_s: dict[int, float] = field(default_factory=dict)  # rows -> seconds of the Spark floor's load
    spark: SparkFloor = field(default_factory=SparkFloor)

    @property
    def modes(self) -> tuple[tuple[str, str], ...]:
        return tuple(m for m in MODES if m[0] in self.chosen_modes)

    def n(self, full: int, least: int = 100) -> int:
        return max(least, int(full * self.scale))

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)
        ratio = f"  ratio {figure.ratio:5.2f}" if figure.ratio else ""
        floor = f"  floor {figure.floor:8.2f}s" if figure.floor is not None else ""
        warm = f"  warm floor {figure.warm_floor:7.3f}s  ratio {figure.warm_ratio:6.1f}" if figure.warm_ratio else ""
        warm += f"  Spark floor {figure.spark_floor:7.3f}s  ratio {figure.spark_ratio:5.1f}" if figure.spark_ratio else ""
        verdict = "" if figure.met is None else f"  target {figure.target}: {'met' if figure.met else 'MISSED'}"
        unit = "%" if "percent" in figure.note else "" if "count" in figure.note else "s"
        print(f"{figure.workload} {figure.name:<44} project {figure.project:8.2f}{unit}{floor}{ratio}{warm}{verdict}", flush=True)


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "CDC_", "AIRFLOW"))}
    return {**clean, "PYTHONPATH": str(ROOT), "TZ": "UTC", "GX_ANALYTICS_ENABLED": "false"}


def timed(cmd: list[str], extra_env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, str]:
    """Run a command to completion; (wall seconds, stdout). A failure stops the benchmark with its output."""
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env={**env(), **(extra_env or {})}, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def file_list(path: Path, landing: Path, files: list[str]) -> str:
    path.write_text(json.dumps([os.path.relpath(f, landing) for f in files]))
    return f"@{path}"


def project_run(landing: Path, lake: Path, files: str, engine: str, mode: str, bench: Bench) -> tuple[float, str]:
    """The project's CLI, bronze and silver, writing with `engine`: as a fresh process starting its own Spark
    (mode ""), or as a job submitted to the pipeline service, the way the Airflow tasks run it ("service": submit
    to end, polled)."""
    argv = ["run", "--config", str(CONFIG), "--landing", str(landing), "--lake", str(lake), "--layers", "bronze,silver",
            "--tables", TABLE, "--files", files]
    if mode == "service":
        assert bench.services is not None
        service = bench.services(landing, lake)  # its start is not timed: a warm service is what a task meets
        seconds, status = service_job(service, argv, engine)
        bench.spark_jobs.append(status.spark_jobs or 0)
        bench.gx_seconds.append(status.gx_seconds or 0.0)
        return seconds, status.log
    return timed([sys.executable, "-m", "spark_jobs", *argv], {"CDC_DELTA_ENGINE": engine})


def service_job(service: Any, argv: list[str], engine: str) -> tuple[float, Any]:
    """`argv` as a job on the warm service, writing with `engine`, timed from submission to its end (polled):
    (seconds, its status). A failed job stops the benchmark with its log."""
    from spark_jobs.service_client import JobRequest, poll, submit

    request = JobRequest.from_argv(argv, job_settings={"delta_engine": engine})
    started = time.perf_counter()
    job = submit(service, request)
    while not (status := poll(service, job)).done:
        time.sleep(0.05)
    if status.exit_code != 0:
        raise RuntimeError(f"service job exited {status.exit_code}:\n{status.log[-3000:]}")
    return time.perf_counter() - started, status


class Services:
    """`python -m spark_jobs serve` as `make demo` starts it, one per deployment (a service serves one registry,
    landing and lake), started when a workload first needs it and stopped at the end."""

    def __init__(self, workdir: Path):
        self.workdir, self.stack, self.started = workdir, ExitStack(), {}

    def __call__(self, landing: Path | str, lake: Path | str, config: Path = CONFIG) -> Any:
        from tests.support import pipeline_service

        key = (str(landing), str(lake))
        if key not in self.started:
            deployment = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": str(landing), "CDC_LAKE_URI": str(lake)}
            log = self.workdir / f"service-{len(self.started)}.log"
            self.started[key] = self.stack.enter_context(pipeline_service({**env(), **deployment}, log))
        return self.started[key]

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stack.close()


def check_floor_restates_the_pipeline() -> None:
    """The floor restates the pipeline's merge conditions and snapshot markers (it must not import pyspark,
    whose import would count in its time): stop if they have drifted apart."""
    from spark_jobs.debezium.connectors import SNAPSHOT_MARKERS
    from spark_jobs.layers.silver import SILVER_MERGE
    from tests.benchmarks import floor

    restated = (floor.DELETE_WHEN, floor.UPDATE_WHEN, floor.INSERT_WHEN, floor.SNAPSHOT_MARKERS)
    if restated != (SILVER_MERGE.delete_when, SILVER_MERGE.update_when, SILVER_MERGE.insert_when, SNAPSHOT_MARKERS):
        raise AssertionError("tests/benchmarks/floor.py no longer restates SILVER_MERGE and SNAPSHOT_MARKERS exactly")


def floor_run(landing: Path, silver: Path, files: str) -> float:
    return timed([sys.executable, "-m", "tests.benchmarks.floor", "apply", "--landing", str(landing), "--files", files,
                  "--silver", str(silver), "--keys", ",".join(KEYS)])[0]


def floor_load(landing: Path, silver: Path, files: str, schema_of: Path) -> float:
    return timed([sys.executable, "-m", "tests.benchmarks.floor", "load", "--landing", str(landing), "--files", files,
                  "--silver", str(silver), "--schema-of", str(schema_of), "--keys", ",".join(KEYS)])[0]


def warm_floor(step: str, landing: Path, silver: Path, files: str, schema_of: Path | None = None) -> float:
    """The floor's `apply` or `load` called in this process, its imports long done: the least a warm, long-lived
    process pays for the step (what the project's jobs on the pipeline service compare with)."""
    from tests.benchmarks import floor

    listed = json.loads(Path(files.removeprefix("@")).read_text())
    started = time.perf_counter()
    if step == "load":
        assert schema_of is not None
        floor.load(str(landing), listed, str(silver), str(schema_of), KEYS, "floor")
    else:
        floor.apply(str(landing), listed, str(silver), KEYS, "floor")
    return time.perf_counter() - started


def spark_floor(bench: Bench, step: str, landing: Path, silver: Path, files: str, schema_of: Path | None = None) -> float:
    """Seconds of the Spark floor's `apply` or `load` (spark_floor.py) into `silver`."""
    listed = json.loads(Path(files.removeprefix("@")).read_text())
    return bench.spark.timed(step, landing, listed, silver, KEYS, schema_of, bench.workdir / "spark-floor-warm-up")


def generate(landing: Path, rows: int, changes: int, batches: int, mix: tuple[int, int, int] = MIX,
             redeliver: float = 0.05) -> Any:
    from spark_jobs.generate import Options
    from spark_jobs.generate import generate as write
    from spark_jobs.registry import load_registry

    shutil.rmtree(landing, ignore_errors=True)
    opts = Options(rows=rows, changes=changes, batches=batches, redeliver=redeliver, shuffle=True, mix=mix,
                   records_per_file=FLUSH_SIZE, seed=7)
    return write(load_registry(str(CONFIG)).select([TABLE]), landing, opts)[0]


def seeded(bench: Bench, rows: int, landing: Path, generated: Any) -> tuple[Path, Path]:
    """(the project's lake, the floor's silver) holding the snapshot of `rows` rows, each loaded by its own
    code once per size and engine (the snapshot files are the same in every landing of that size: same
    seed): workload L's figure, with its equality check. The project loads the way the bench's last chosen
    mode runs (the service, by default, timed on its second load: the first, into a lake then deleted, warms it)."""
    if (bench.engine, rows) not in bench.seeds:
        lake, floor_silver = bench.workdir / f"seed-{bench.engine}-{rows}", bench.workdir / f"seed-floor-{rows}"
        shutil.rmtree(lake, ignore_errors=True)
        mode, how = bench.modes[-1] if bench.modes else MODES[0]
        files = file_list(bench.workdir / f"seed-{rows}.json", landing, generated.batches[0])
        if mode == "service":  # timed warm, as users' loads run: the service's first job (its JVM's start) runs untimed
            project_run(landing, lake, files, bench.engine, mode, bench)
            shutil.rmtree(lake)
        seconds, _ = project_run(landing, lake, files, bench.engine, mode, bench)
        if rows not in bench.floor_seeds:  # the floor's load takes silver's schema from the project's table
            shutil.rmtree(floor_silver, ignore_errors=True)
            floor_s = floor_load(landing, floor_silver, files, lake / "silver" / TABLE)
            bench.floor_seeds[rows] = floor_silver
            bench.floor_load_s[rows] = floor_s
            warm_silver = bench.workdir / f"seed-floor-warm-{rows}"
            shutil.rmtree(warm_silver, ignore_errors=True)
            bench.warm_load_s[rows] = warm_floor("load", landing, warm_silver, files, lake / "silver" / TABLE)
            check_equal(warm_silver, floor_silver, generated, snapshot=True)
            shutil.rmtree(warm_silver)
            bench.spark_load_s[rows] = spark_floor(bench, "load", landing, warm_silver, files, lake / "silver" / TABLE)
            check_equal(warm_silver, floor_silver, generated, snapshot=True)
            shutil.rmtree(warm_silver)
        check_equal(lake / "silver" / TABLE, bench.floor_seeds[rows], generated, snapshot=True)
        bench.seeds[(bench.engine, rows)] = lake
        figure = Figure("L", f"initial load of {rows:,} rows (bronze+silver; one run), {how}, {bench.engine}", seconds,
                        bench.floor_load_s[rows], SPARK_TARGET, warm_floor=bench.warm_load_s[rows],
                        spark_floor=bench.spark_load_s[rows])
        figure.met = within_spark_target(figure)
        bench.add(figure)
    return bench.seeds[(bench.engine, rows)], bench.floor_seeds[rows]


def initial_load(bench: Bench) -> None:
    """L: the initial snapshot of a 1M-row table (at scale 1.0) into an empty lake, against the floor's load."""
    rows = bench.n(1_000_000)
    landing = bench.workdir / "landing-l"
    seeded(bench, rows, landing, generate(landing, rows, 0, batches=1))


def fresh_copy(seed: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(seed, dest)
    return dest


MODES = (("", "own Spark"), ("service", "on the warm pipeline service"))
SPARK_TARGET = "<= 2x Spark floor, <= 10x warm floor"


def within_spark_target(figure: Figure) -> bool:
    assert figure.spark_floor and figure.warm_floor
    return figure.project <= 2 * figure.spark_floor and figure.project <= 10 * figure.warm_floor


def one_batch(bench: Bench, label: str, rows: int, changes: int) -> dict[str, float]:
    """Median seconds of the project's CLI (bronze+silver: with its own Spark, and on the warm pipeline
    service) and of the floor, for one shuffled batch of `changes` events into a `rows`-row table, every
    run from a copy of the same seeded lake."""
    landing = bench.workdir / f"landing-{label}"
    generated = generate(landing, rows, changes, batches=1)
    seed, floor_seed = seeded(bench, rows, landing, generated)
    files = file_list(bench.workdir / f"{label}.json", landing, generated.batches[1])
    seconds: dict[str, list[float]] = {mode: [] for mode, _ in (*MODES, ("floor", ""), ("warm", ""), ("spark", ""))}
    for _ in range(bench.runs):
        warm_silver = fresh_copy(floor_seed, bench.workdir / f"floor-warm-{label}")
        seconds["warm"].append(warm_floor("apply", landing, warm_silver, files))
        spark_silver = fresh_copy(floor_seed, bench.workdir / f"floor-spark-{label}")
        seconds["spark"].append(spark_floor(bench, "apply", landing, spark_silver, files))
        floor_silver = fresh_copy(floor_seed, bench.workdir / f"floor-{label}")
        seconds["floor"].append(floor_run(landing, floor_silver, files))  # the floor once per run
        check_equal(warm_silver, floor_silver, generated)
        check_equal(spark_silver, floor_silver, generated)
        for mode, _ in bench.modes:
            lake = fresh_copy(seed, bench.workdir / f"lake-{label}")
            seconds[mode].append(project_run(landing, lake, files, bench.engine, mode, bench)[0])
            check_equal(lake / "silver" / TABLE, floor_silver, generated)
    return {mode: statistics.median(values) for mode, values in seconds.items() if values}


def w1(bench: Bench) -> None:
    rows, changes = bench.n(1_000_000), bench.n(100_000)
    seconds = one_batch(bench, "w1", rows, changes)
    for mode, how in bench.modes:
        figure = Figure("W1", f"{changes:,} events into {rows:,} rows, {how}, {bench.engine}", seconds[mode], seconds["floor"],
                        SPARK_TARGET, warm_floor=seconds["warm"], spark_floor=seconds["spark"])
        figure.met = within_spark_target(figure)
        bench.add(figure)


def w2(bench: Bench) -> None:
    rows, batches, per_batch = bench.n(1_000_000), max(5, round(50 * min(1.0, bench.scale))), 1_000
    landing = bench.workdir / "landing-w2"
    generated = generate(landing, rows, batches * per_batch, batches=batches)
    seed, floor_seed = seeded(bench, rows, landing, generated)
    floor_silver = fresh_copy(floor_seed, bench.workdir / "floor-w2")
    warm_silver = fresh_copy(floor_seed, bench.workdir / "floor-warm-w2")
    spark_silver = fresh_copy(floor_seed, bench.workdir / "floor-spark-w2")
    seconds: dict[str, list[float]] = {mode: [] for mode, _ in (*MODES, ("floor", ""), ("warm", ""), ("spark", ""))}
    lakes = {mode: fresh_copy(seed, bench.workdir / f"lake-w2{mode}") for mode, _ in bench.modes}
    jobs: list[int] = []
    gx: list[float] = []  # seconds in Great Expectations (validations, Data Docs) per service batch
    for n, files in enumerate(generated.batches[1:], start=1):
        listed = file_list(bench.workdir / f"w2-{n}.json", landing, files)
        for mode, _ in bench.modes:
            seconds[mode].append(project_run(landing, lakes[mode], listed, bench.engine, mode, bench)[0])
            if mode == "service":
                jobs.append(bench.spark_jobs[-1])
                gx.append(bench.gx_seconds[-1])
        seconds["floor"].append(floor_run(landing, floor_silver, listed))
        seconds["warm"].append(warm_floor("apply", landing, warm_silver, listed))
        seconds["spark"].append(spark_floor(bench, "apply", landing, spark_silver, listed))
    check_equal(warm_silver, floor_silver, generated)
    check_equal(spark_silver, floor_silver, generated)
    for mode, _ in bench.modes:
        check_equal(lakes[mode] / "silver" / TABLE, floor_silver, generated)
    # the batch's own GX seconds, which no floor pays, are allowed on top of 2x the Spark floor (the service times
    # validations and Data Docs pages together, so the allowance is a little wider than issue 80's); a batch off the
    # service has no such figure
    gx_p50 = percentile(gx[1:], 0.5) if gx else 0.0
    for mode, how in bench.modes:
        for name, share in (("p50", 0.5), ("p95", 0.95)):
            # the first batch of each warms the page cache (and the server's JIT): "once warm" leaves it out
            p, f = percentile(seconds[mode][1:], share), percentile(seconds["floor"][1:], share)
            figure = Figure("W2", f"{name} per batch of {per_batch:,} ({batches} batches, {rows:,} rows), {how}, "
                                  f"{bench.engine}", p, f,
                            "p50 <= 2 s, <= 2x Spark floor + its GX seconds" if name == "p50" else "",
                            warm_floor=percentile(seconds["warm"][1:], share),
                            spark_floor=percentile(seconds["spark"][1:], share))
            allowed = 2 * figure.spark_floor + (gx_p50 if mode == "service" else 0.0) if figure.spark_floor else 0.0
            figure.met = (p <= 2 and p <= allowed) if name == "p50" and figure.spark_floor else None
            bench.add(figure)
    if jobs:  # what a batch costs in Spark jobs (bronze and silver, gates and audits included)
        figure = Figure("W2", f"Spark jobs per batch of {per_batch:,}, p50, on the pipeline service, {bench.engine}",
                        statistics.median(jobs), target="<= 5", note="a count of Spark jobs, not seconds")
        figure.met = figure.project <= 5
        bench.add(figure)
    if gx:  # the gates' fixed cost beside the Spark floor: two validations and their pages, whatever the batch's size
        bench.add(Figure("W2", f"seconds in Great Expectations per batch of {per_batch:,}, p50, on the pipeline service, "
                               f"{bench.engine}", gx_p50, spark_floor=percentile(seconds["spark"][1:], 0.5)))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def w3(bench: Bench) -> None:
    """The same batch (1% of the smaller table) into two table sizes: the cost should follow the batch."""
    small, large, changes = bench.n(1_000_000), bench.n(10_000_000), bench.n(10_000)
    at = {rows: one_batch(bench, f"w3-{rows}", rows, changes) for rows in (small, large)}
    for mode, how in bench.modes:
        for rows in (small, large):
            bench.add(Figure("W3", f"{changes:,} events into {rows:,} rows, {how}, {bench.engine}", at[rows][mode],
                             at[rows]["floor"]))
        growth = Figure("W3", f"growth {small:,} -> {large:,} rows, {how}, {bench.engine} (floor: x)",
                        at[large][mode] / at[small][mode],
                        at[large]["floor"] / at[small]["floor"], "<= 3x", note="ratios of run times, not seconds")
        growth.met = growth.project <= 3
        bench.add(growth)


def w4(bench: Bench) -> None:
    """Dedupe only: Spark's latest_per_key (the pipeline's transform, warm session) against DuckDB's
    QUALIFY row_number(), both reading the same Parquet of parsed events and writing Parquet."""
    keys, events = bench.n(1_000_000), bench.n(10_000_000)
    landing = bench.workdir / "landing-w4"
    generated = generate(landing, keys, events - keys, batches=1, mix=(0, 100, 0), redeliver=0.0)
    parsed = bench.workdir / "w4-events.parquet"
    _parse_events(generated.files, parsed)
    spark_s = _spark_dedupe(parsed, bench.workdir / "w4-spark", bench.runs)
    duck_s = []
    for n in range(bench.runs):
        out = bench.workdir / f"w4-duckdb-{n}.parquet"
        duck_s.append(json.loads(timed([sys.executable, "-m", "tests.benchmarks.floor", "dedupe", "--events", str(parsed),
                                        "--out", str(out), "--keys", ",".join(KEYS)])[1])["seconds"])
    import pyarrow.parquet as pq

    spark_rows = pq.read_table(bench.workdir / "w4-spark", columns=[*KEYS, "_seq"]).sort_by(KEYS[0])
    duck_rows = pq.read_table(out, columns=[*KEYS, "_seq"]).sort_by(KEYS[0])
    if not spark_rows.equals(duck_rows.cast(spark_rows.schema)):
        raise AssertionError("Spark's and DuckDB's latest events per key differ")
    figure = Figure("W4", f"latest per key, {events:,} events over {keys:,} keys", statistics.median(spark_s),
                    statistics.median(duck_s), "<= 3x floor")
    figure.met = figure.ratio is not None and figure.ratio <= 3
    bench.add(figure)


def _parse_events(files: list[str], out: Path) -> None:
    """The events as the pipeline's silver step sees them: key, position, file, line, op, images."""
    from tests.benchmarks.floor import connect, sequence_sql

    connect().execute(f"""
        COPY (SELECT CAST((CASE WHEN j->>'op' = 'd' THEN j->'before' ELSE j->'after' END)->>'actor_id' AS BIGINT) AS actor_id,
                     {sequence_sql("j->>'op'", "(j->'source')")} AS _seq,
                     _source_file, _line, j->>'op' AS op, CAST(j->'before' AS VARCHAR) AS before,
                     CAST(j->'after' AS VARCHAR) AS after
              FROM (SELECT filename AS _source_file, json AS j,
                           row_number() OVER (PARTITION BY filename) AS _line
                    FROM read_json_objects({files!r}, format = 'newline_delimited', filename = true))
              WHERE json_type(j) = 'OBJECT')
        TO '{out}' (FORMAT parquet)""")


def _spark_dedupe(parsed: Path, out: Path, runs: int) -> list[float]:
    """Seconds of changes.latest_per_key written to Parquet, in one warm session (a first, untimed run
    warms the JVM)."""
    from spark_jobs.layers import changes
    from spark_jobs.session import build_session

    spark = build_session("bench-w4")  # the session of the benchmark process (the Spark floor's too): kept
    seconds = []
    for n in range(runs + 1):
        started = time.perf_counter()
        events = spark.read.parquet(str(parsed))
        changes.latest_per_key(events, KEYS).write.mode("overwrite").parquet(str(out))
        if n:
            seconds.append(time.perf_counter() - started)
    return seconds


WORKLOADS: dict[str, Callable[[Bench], None]] = {"L": initial_load, "W1": w1, "W2": w2, "W3": w3, "W4": w4}


def machine() -> dict[str, str]:
    from importlib.metadata import version

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), "0")
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    return {"cpu": f"{os.cpu_count()} x {cpu}", "memory": f"{int(memory) // 1024**2} GiB", "python": platform.python_version(),
            "java": java, **{name: version(name) for name in ("pyspark", "deltalake", "duckdb", "apache-airflow",
                                                               "great_expectations", "pyarrow")}}


def main(argv: list[str] | None = None) -> int:
    from tests.benchmarks.airflow_e2e import w5
    from tests.benchmarks.database import database, database_on_airflow
    from tests.benchmarks.gold import gold_join_refresh, gold_refresh
    from tests.benchmarks.results import write_results

    WORKLOADS["W5"] = w5
    WORKLOADS["D"] = database
    WORKLOADS["DA"] = database_on_airflow
    WORKLOADS["G"] = gold_refresh
    WORKLOADS["GJ"] = gold_join_refresh
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="table and batch sizes relative to issue 6's (1.0)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure (medians are reported)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of L,W1..W5,D,DA,G,GJ")
    p.add_argument("--engines", default="delta-rs,delta-spark",
                   help="CDC_DELTA_ENGINE of the project's runs, comma-separated: L and W1-W3 run once per engine")
    p.add_argument("--modes", default="own,service",
                   help="how the project runs, comma-separated: own (its own Spark, as spark-submit), service")
    p.add_argument("--workdir", default=str(ROOT / "data" / "bench"), help="generated files and lakes (deleted first)")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="the results file ('' to skip writing it)")
    args = p.parse_args(argv)
    chosen = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}")
    check_floor_restates_the_pipeline()
    import tests.benchmarks.floor  # noqa: F401  (imported once: the warm floor's steps are timed without their imports)

    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    info = machine()
    print(f"bench: scale={args.scale} runs={args.runs} workloads={','.join(chosen)} on {info['cpu']}, {info['memory']}",
          flush=True)
    started = time.perf_counter()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    modes = tuple("" if m.strip() == "own" else m.strip() for m in args.modes.split(",") if m.strip())
    with Services(workdir) if "service" in modes else nullcontext(None) as services, SparkFloor() as spark:
        bench = Bench(workdir, args.scale, args.runs, services, modes, engines=tuple(engines), spark=spark)
        # W4 reads no Delta table and W5 runs Airflow's embedded default: once, not per engine
        for name, engine in [(w, e) for w in chosen for e in (engines if w in ("L", "W1", "W2", "W3") else engines[:1])]:
            bench.engine = engine
            WORKLOADS[name](bench)
            if args.results:  # after each workload, so a long run's figures so far are kept
                write_results(Path(args.results), bench, info, chosen, time.perf_counter() - started)
    print(f"bench: done in {time.perf_counter() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
