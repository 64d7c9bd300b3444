"""The benchmark's results file: a Markdown table of every figure (README links it) and the same as JSON."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any


def _seconds(value: float | None, note: str) -> str:
    """Seconds, or what the figure's note says it is: a ratio, a count or a share in percent."""
    if value is None:
        return ""
    if not note:
        return f"{value:.2f} s"
    if "percent" in note:
        return f"{value:.1f} %"
    return f"{value:.0f}" if "count" in note else f"{value:.2f}x"


# workloads whose sizes --scale does not change (database.py, airflow_e2e.py): their rows have no scale
UNSCALED = ("D", "DA", "W5")


def _scale(workload: str, scale: Any) -> Any:
    return None if workload in UNSCALED else scale


def write_results(path: Path, bench: Any, info: dict[str, str], workloads: list[str], elapsed_s: float) -> None:
    """Writes this run's figures; earlier figures not measured again (other workloads, modes, engines or
    scales) are kept, so one can be run again on its own, each row saying its scale and when it was measured."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    raw_path = path.with_name("results.json")
    earlier = json.loads(raw_path.read_text()) if raw_path.exists() else {}
    kept = [{"measured": earlier.get("written", ""), "scale": earlier.get("scale"), **f}
            for f in earlier.get("figures", [])]
    kept = [{**f, "scale": _scale(f["workload"], f["scale"])} for f in kept]
    current = [{**asdict(f), "ratio": f.ratio, "warm_ratio": f.warm_ratio, "spark_ratio": f.spark_ratio,
                "scale": _scale(f.workload, bench.scale), "measured": when}
               for f in bench.figures]
    # a figure measured again replaces its earlier row; the others (other modes, engines, scales) stay
    measured = {(f["workload"], f["name"], f["scale"]) for f in current}
    kept = [f for f in kept if (f["workload"], f["name"], f["scale"]) not in measured]
    figures = sorted(kept + current, key=lambda f: (f["workload"], f["scale"] or 0))
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` on {when}: `python -m tests.benchmarks --scale {bench.scale} --runs {bench.runs} "
        f"--workloads {','.join(workloads)} --engines {','.join(bench.engines)} "
        f"--modes {','.join(m or 'own' for m in bench.chosen_modes)}`, {elapsed_s / 60:.0f} minutes; "
        "rows measured by earlier runs are dated "
        "apart. Scale 1.0 is issue 6's sizes; each row gives its sizes and scale.",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
        "",
        "Project: `python -m spark_jobs run` as a fresh process (spark-submit-like: the JVM and the imports each time), "
        "or as a job on the warm pipeline service, as each row says (rows attached to a Spark Connect server measure "
        "the mode the project dropped on 2026-11-25: docs/architecture.md, \"One execution model\"), "
        "with the Delta engine each row names (W5: the first of the run's engines). "
        "Floor: DuckDB + a delta-rs merge with the same conditions (L: DuckDB + a delta-rs write; `tests/benchmarks/floor.py`), "
        "also a fresh process; the warm floor is the same step called inside the long-lived benchmark process, its "
        "imports done, as the project's jobs run on the warm service. The Spark floor is the least a warm PySpark "
        "program does for the step in one long-lived session (read the lines with their schema, newest per key, Arrow, "
        "the same delta-rs merge or write; `tests/benchmarks/spark_floor.py`): the project's ratio to it is the "
        "overhead the project itself adds on Spark. Figures are medians of the runs "
        "(W2: percentiles over its batches). Every workload "
        "checks that the project's silver equals the floor's and the generator's final state.",
        "",
        "| workload | figure | project | floor | project / floor | warm floor | project / warm floor | Spark floor "
        "| project / Spark floor | target | met | scale | measured |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |",
    ]
    for f in figures:
        ratio = "" if f["ratio"] is None or f["note"] else f"{f['ratio']:.1f}x"
        warm = f.get("warm_floor")
        warm_ratio = "" if not warm or f["note"] else f"{f['project'] / warm:.1f}x"
        spark = f.get("spark_floor")
        spark_ratio = "" if not spark or f["note"] else f"{f['project'] / spark:.1f}x"
        met = "" if f["met"] is None else ("yes" if f["met"] else "**no**")
        lines.append(f"| {f['workload']} | {f['name']} | {_seconds(f['project'], f['note'])} "
                     f"| {_seconds(f['floor'], f['note'])} | {ratio} | {'' if not warm else f'{warm:.3f} s'} | {warm_ratio} "
                     f"| {'' if not spark else f'{spark:.3f} s'} | {spark_ratio} "
                     f"| {f['target']} | {met} | {'-' if f['scale'] is None else f['scale']} | {f['measured']} |")
    notes = [f for f in figures if f["note"]]
    if notes:
        lines += ["", *[f"- {f['workload']} {f['name']}: {f['note']}" for f in notes]]
    existing = path.read_text() if path.exists() else ""
    analysis = existing[existing.index("## Analysis"):] if "## Analysis" in existing else ""
    path.write_text("\n".join(lines) + "\n\n" + analysis)
    raw = {"written": when, "scale": bench.scale, "runs": bench.runs, "machine": info, "figures": figures}
    raw_path.write_text(json.dumps(raw, indent=2) + "\n")
