"""Run summaries: one JSON per table and layer under <lake>/reports/runs/<run id>/, a page per run
(`runs/<run id>/index.html`: every table and layer with its counts, quarantine reasons, delete
reconciliation and gate findings) and the history page (`reports/index.html`: runs newest first with
their verdicts). Links are relative, so the pages work from the lake's folder and behind the Airflow
plugin alike. Pure Python: the plugin renders with it without Spark."""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import Any

from spark_jobs.lake import Lake

STYLE = ("body{font-family:system-ui,sans-serif;margin:1.5em;color:#1b1f24}td,th{padding:3px 10px;text-align:left;"
         "vertical-align:top}th{background:#eef1f4}table{border-collapse:collapse;margin:.4em 0 1.2em}"
         "tr:nth-child(even){background:#f7f8fa}.failed{color:#b00020;font-weight:600}.passed{color:#1a7f37}"
         ".passed-with-warnings{color:#9a6700}.error{color:#b00020}code{font-size:90%}")
COUNTS = ("files", "lines", "events", "rows", "inserted", "updated", "deleted", "duplicates_dropped",
          "superseded_in_batch", "stale_ignored", "ties", "truncates", "tombstones", "tombstones_matched",
          "tombstones_unmatched", "tombstones_matched_late", "recovered_commits", "quarantined_share", "lag_s", "version",
          "bronze_version", "history_rows", "seconds")


def publish(lake: Lake, run_id: str, summary: dict[str, Any]) -> str:
    path = f"{lake.run_reports(run_id)}/{summary['table']}.{summary['layer']}.json"
    stamped = {**summary, "published_at": dt.datetime.now(dt.UTC).isoformat()}
    lake.files.write(path, json.dumps(stamped, indent=2, sort_keys=True, default=str))
    render_run(lake, run_id)
    render_index(lake)
    return path


def load_run(lake: Lake, run_id: str, paths: list[str] | None = None) -> list[dict[str, Any]]:
    """A run's summaries, from `paths` when the caller has listed them already."""
    order = {"bronze": 0, "silver": 1, "gold": 2}
    files = lake.files
    if paths is None:
        paths = [p for p in files.list(lake.run_reports(run_id)) if p.endswith(".json")]
    summaries = [s for s in (json.loads(files.read(p) or b"{}") for p in paths) if s]
    return sorted(summaries, key=lambda s: (s.get("published_at", ""), order.get(s.get("layer", ""), 3)))


def load_runs(lake: Lake, newest: int = 200) -> list[tuple[str, list[dict[str, Any]]]]:
    """The newest runs first (by when their first summary was published), each with its summaries. One
    listing of every run's files (on S3 one LIST, not one per run)."""
    prefix = lake.runs_reports + "/"
    by_run: dict[str, list[str]] = {}
    for p in lake.files.list(lake.runs_reports):
        if p.endswith(".json"):
            by_run.setdefault(p[len(prefix):].split("/", 1)[0], []).append(p)
    runs = [(name, load_run(lake, name, paths)) for name, paths in by_run.items()]
    runs = [(name, s) for name, s in runs if s]
    runs.sort(key=lambda r: (r[1][0].get("published_at", ""), r[0]), reverse=True)
    return runs[:newest]


def run_verdict(summaries: list[dict[str, Any]]) -> str:
    gates = [str(s.get("gate", "")) for s in summaries]
    if any(g in ("failed", "error") for g in gates):
        return "failed"
    return "passed-with-warnings" if "passed-with-warnings" in gates else "passed"


def _e(value: Any) -> str:
    return html.escape(str(value))


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{STYLE}</style>"
            f"</head><body>{body}</body></html>")


def _verdict(gate: Any) -> str:
    gate = str(gate)
    return f"<span class='{_e(gate.split(' ')[0])}'>{_e(gate)}</span>"


def _check_row(c: dict[str, Any]) -> str:
    result = "passed" if c["success"] else "failed" if c["action"] == "fail" else "passed-with-warnings"
    unexpected = "" if c["unexpected"] is None else f"{c['unexpected']} of {c['total']}"
    observed = "" if c["observed"] is None else c["observed"]
    return (f"<tr><td><code>{_e(c['expectation'])}</code></td><td>{_e(c['action'])}</td><td>{_verdict(result)}</td>"
            f"<td>{_e(unexpected)}</td><td>{_e(observed)}</td></tr>")


def _section(s: dict[str, Any]) -> str:
    counts = "".join(f"<tr><th>{k}</th><td>{_e(s[k])}</td></tr>" for k in COUNTS if s.get(k) not in (None, ""))
    parts = [f"<h2 id='{_e(s['table'])}.{_e(s['layer'])}'>{_e(s['layer'])} · {_e(s['table'])} — "
             f"{_verdict(s.get('gate'))}</h2>"]
    if s.get("error"):
        parts.append(f"<p class='error'><code>{_e(s['error'])}</code></p>")
    parts.append(f"<table>{counts}</table>")
    if s.get("quarantined"):
        rows = "".join(f"<tr><td><code>{_e(r)}</code></td><td>{n}</td></tr>" for r, n in sorted(s["quarantined"].items()))
        parts.append(f"<h3>Quarantined by reason</h3><table><tr><th>reason</th><th>rows</th></tr>{rows}</table>")
    if s.get("deletes"):
        order = ("received", "removed", "absent", "stale", "superseded", "before_truncate")
        d = {k: s["deletes"][k] for k in sorted(s["deletes"], key=lambda k: order.index(k) if k in order else 9)}
        accounted = sum(v for k, v in d.items() if k != "received")
        parts.append("<h3>Deletes: bronze → silver</h3><table><tr>" + "".join(f"<th>{_e(k)}</th>" for k in d)
                     + "<th>accounted</th></tr><tr>" + "".join(f"<td>{_e(v)}</td>" for v in d.values())
                     + f"<td>{accounted}</td></tr></table>")
    if s.get("checks"):
        rows = "".join(_check_row(c) for c in s["checks"])
        parts.append("<h3>Expectations</h3><table><tr><th>expectation</th><th>action</th><th>result</th>"
                     f"<th>unexpected</th><th>observed</th></tr>{rows}</table>")
    if s.get("docs"):
        parts.append(f"<p><a href='../../data_docs/{_e(s['table'])}/index.html'>Great Expectations Data Docs</a></p>")
    return "".join(parts)


def render_run(lake: Lake, run_id: str) -> str:
    summaries = load_run(lake, run_id)
    body = (f"<p><a href='../../index.html'>← all runs</a></p><h1>Run {_e(run_id)} — "
            f"{_verdict(run_verdict(summaries))}</h1>" + "".join(_section(s) for s in summaries))
    path = f"{lake.run_reports(run_id)}/index.html"
    lake.files.write(path, _page(f"CDC run {run_id}", body))
    return path


def render_index(lake: Lake) -> str:
    rows = []
    for run_id, summaries in load_runs(lake):
        tables = ", ".join(f"{_e(s['layer'])}/{_e(s['table'])}: {_verdict(s.get('gate'))}" for s in summaries
                           if not str(s.get("gate", "")).startswith("skipped"))
        quarantined = sum(sum((s.get("quarantined") or {}).values()) for s in summaries)
        rows.append(f"<tr><td><a href='runs/{_e(run_id)}/index.html'>{_e(run_id)}</a></td>"
                    f"<td>{_e(str(summaries[0].get('published_at', ''))[:19])}Z</td><td>{_verdict(run_verdict(summaries))}</td>"
                    f"<td>{quarantined}</td><td>{tables or 'nothing new'}</td></tr>")
    body = ("<h1>CDC pipeline runs</h1><p>Newest first. Each run links to its report; each report links to the "
            "Great Expectations Data Docs of its tables.</p><table><tr><th>run</th><th>started</th><th>verdict</th>"
            "<th>quarantined</th><th>gates</th></tr>" + "".join(rows) + "</table>")
    path = lake.reports_index
    lake.files.write(path, _page("CDC pipeline runs", body))
    return path
