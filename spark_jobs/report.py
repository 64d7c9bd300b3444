"""Run summaries: one JSON per table and layer under <lake>/reports/runs/<run id>/, and an index page
listing runs newest first with their gate verdicts and links to the GX Data Docs."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from spark_jobs.state import Lake, ensure_dir


def publish(lake: Lake, run_id: str, summary: dict[str, Any]) -> Path:
    folder = ensure_dir(f"{lake.reports}/runs/{run_id}")
    path = folder / f"{summary['table']}.{summary['layer']}.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    render_index(lake)
    return path


def load_runs(lake: Lake, newest: int = 200) -> list[tuple[str, list[dict[str, Any]]]]:
    """The newest runs first, each with its summaries (the index lists at most `newest` runs)."""
    runs_dir = Path(lake.reports) / "runs"
    if not runs_dir.is_dir():
        return []
    runs = []
    folders = sorted((p for p in runs_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for run in folders[:newest]:
        runs.append((run.name, [json.loads(f.read_text()) for f in sorted(run.glob("*.json"))]))
    return runs


def render_index(lake: Lake) -> Path:
    rows = []
    for run_id, summaries in load_runs(lake):
        for s in summaries:
            quarantined = sum((s.get("quarantined") or {}).values())
            docs = f'<a href="data_docs/{html.escape(s["table"])}/index.html">data docs</a>' if s.get("docs") else ""
            rows.append(
                f"<tr><td>{html.escape(run_id)}</td><td>{html.escape(s['table'])}</td><td>{s['layer']}</td>"
                f"<td>{html.escape(str(s.get('gate')))}</td><td>{s.get('events', s.get('rows', ''))}</td>"
                f"<td>{quarantined}</td><td>{s.get('version', '')}</td><td>{docs}</td></tr>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>CDC pipeline runs</title>"
            "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:left}</style></head><body>"
            "<h1>CDC pipeline runs</h1><table><tr><th>run</th><th>table</th><th>layer</th><th>gate</th>"
            "<th>events / rows</th><th>quarantined</th><th>version</th><th></th></tr>"
            + "".join(rows) + "</table></body></html>")
    path = Path(lake.reports) / "index.html"
    path.write_text(page)
    return path
