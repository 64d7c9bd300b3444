"""Run summaries: one JSON per table and layer under <lake>/reports/runs/<run id>/, a page per run
(`runs/<run id>/index.html`: every table and layer with its counts, quarantine reasons, delete
reconciliation and gate findings), and from the event log (spark_jobs/event_log.py) the history page
(`reports/index.html`: runs newest first with their verdicts) and each table's trend page
(`reports/tables/<table>.html`). Links are relative, so the pages work from the lake's folder and behind
the Airflow plugin alike. Pure Python and delta-rs: no Spark."""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import TYPE_CHECKING, Any

from spark_jobs.lake import Lake

if TYPE_CHECKING:
    from spark_jobs.event_log import Step
    from spark_jobs.status import LakeStatus

STYLE = ("body{font-family:system-ui,sans-serif;margin:1.5em;color:#1b1f24}td,th{padding:3px 10px;text-align:left;"
         "vertical-align:top}th{background:#eef1f4}table{border-collapse:collapse;margin:.4em 0 1.2em}"
         "tr:nth-child(even){background:#f7f8fa}.failed{color:#b00020;font-weight:600}.passed{color:#1a7f37}"
         ".passed-with-warnings{color:#9a6700}.error{color:#b00020}code{font-size:90%}")
COUNTS = ("files", "lines", "events", "rows", "inserted", "updated", "deleted", "duplicates_dropped",
          "superseded_in_batch", "stale_ignored", "ties", "truncates", "tombstones", "tombstones_matched",
          "tombstones_unmatched", "tombstones_matched_late", "recovered_commits", "quarantined_share", "lag_s", "version",
          "bronze_version", "history_rows", "files_before", "files_after", "bytes_before", "bytes_after",
          "stored_files_before", "stored_files_after", "results_removed", "late_files", "seconds")
UPKEEP = ("name", "files_before", "files_after", "bytes_before", "bytes_after", "stored_before", "stored_after",
          "version_before", "version_after", "compacted")


SECONDS = ("lag_s", "seconds")


def published_now() -> dt.datetime:
    """The time a summary is published at (the event log's `published_at`)."""
    return dt.datetime.now(dt.UTC)


def publish(lake: Lake, run_id: str, summary: dict[str, Any]) -> str:
    """Writes a step's summary to its run's report. The event log takes the run's summaries and the pages are
    rendered apart, once per run (steps.Steps)."""
    path = f"{lake.run_reports(run_id)}/{summary['table']}.{summary['layer']}.json"
    stamped = {**summary, "published_at": published_now().isoformat()}
    lake.files.write(path, json.dumps(stamped, indent=2, sort_keys=True, default=str))
    return path


def render_pages(lake: Lake, run_id: str, tables: list[str]) -> None:
    """The run's page, the index of runs and the trend pages of `tables`, the last two from the event log."""
    render_run(lake, run_id)
    render_history(lake, tables)


def render_history(lake: Lake, names: list[str]) -> None:
    """The index of runs and the trend pages of `names` (tables and gold models), from the event log's newest runs."""
    from spark_jobs import event_log

    steps = event_log.recent_steps(lake)
    render_index(lake, steps)
    failed = event_log.failed_checks(lake, [s.run_id for s in steps if s.table in names])
    lineage = event_log.column_lineage(lake, [s.table for s in steps if s.layer == "gold" and s.table in names])
    for name in dict.fromkeys(names):
        render_table(lake, name, steps, failed, lineage.get(name))


def human_seconds(value: Any) -> str:
    """Durations and lags as people read them: `850 ms`, `12.5 s`, `3.2 min`, `5.0 h`, `3.1 d`, `3.0 years`."""
    if value is None or value == "":
        return ""
    s = float(value)
    for limit, unit, size in ((1, "ms", 0.001), (60, "s", 1), (3600, "min", 60), (86400, "h", 3600),
                              (86400 * 365.25, "d", 86400)):
        if abs(s) < limit:
            return f"{s / size:.0f} {unit}" if unit == "ms" else f"{s / size:.1f} {unit}"
    return f"{s / (86400 * 365.25):.1f} years"


# A lag over a day is more often a quiet source (or old sample files) than a slow pipeline: such a lag names the
# source commit it is measured from
OLD_LAG_S = 86_400


def lag_text(lag_s: Any, newest_change_at: dt.datetime | str | None) -> str:
    """A lag as people read it; one over a day says what it is measured from: the source's commit time."""
    text = human_seconds(lag_s)
    if not text or newest_change_at is None or float(lag_s) < OLD_LAG_S:
        return text
    at = dt.datetime.fromisoformat(newest_change_at) if isinstance(newest_change_at, str) else newest_change_at
    return f"{text} (since the source's commit at {at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC)"


def load_run(lake: Lake, run_id: str, paths: list[str] | None = None) -> list[dict[str, Any]]:
    """A run's summaries, from `paths` when the caller has listed them already."""
    order = {"bronze": 0, "silver": 1, "gold": 2}
    files = lake.files
    if paths is None:
        paths = [p for p in files.list(lake.run_reports(run_id)) if p.endswith(".json")]
    summaries = [s for s in (json.loads(files.read(p) or b"{}") for p in paths) if s]
    return sorted(summaries, key=lambda s: (s.get("published_at", ""), order.get(s.get("layer", ""), 3)))


def load_runs(lake: Lake, newest: int | None = 200) -> list[tuple[str, list[dict[str, Any]]]]:
    """The newest runs first (by when their first summary was published), each with its summaries (all of
    them when `newest` is None). One listing of every run's files (on S3 one LIST, not one per run)."""
    prefix = lake.runs_reports + "/"
    by_run: dict[str, list[str]] = {}
    for p in lake.files.list(lake.runs_reports):
        if p.endswith(".json"):
            by_run.setdefault(p[len(prefix):].split("/", 1)[0], []).append(p)
    runs = [(name, load_run(lake, name, paths)) for name, paths in by_run.items()]
    runs = [(name, s) for name, s in runs if s]
    runs.sort(key=lambda r: (r[1][0].get("published_at", ""), r[0]), reverse=True)
    return runs if newest is None else runs[:newest]


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


def _count(s: dict[str, Any], key: str) -> str:
    if key == "lag_s":
        newest = s.get("newest_change_ms")
        return lag_text(s[key], None if newest is None else dt.datetime.fromtimestamp(newest / 1000, dt.UTC))
    return human_seconds(s[key]) if key in SECONDS else str(s[key])


def _section(s: dict[str, Any]) -> str:
    counts = "".join(f"<tr><th>{k}</th><td>{_e(_count(s, k))}</td></tr>" for k in COUNTS if s.get(k) not in (None, ""))
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
    if s.get("tables"):  # maintenance: each Delta table of the source table
        rows = "".join("<tr>" + "".join(f"<td>{_e(t.get(k))}</td>" for k in UPKEEP) + "</tr>" for t in s["tables"])
        parts.append("<h3>Delta tables</h3><table><tr>" + "".join(f"<th>{k}</th>" for k in UPKEEP)
                     + f"</tr>{rows}</table>")
    if s.get("layer") == "gold":
        parts.append(_lineage(s.get("lineage")))
    if s.get("checks"):
        rows = "".join(_check_row(c) for c in s["checks"])
        parts.append("<h3>Expectations</h3><table><tr><th>expectation</th><th>action</th><th>result</th>"
                     f"<th>unexpected</th><th>observed</th></tr>{rows}</table>")
    if s.get("docs"):
        parts.append(f"<p><a href='../../data_docs/{_e(s['table'])}/index.html'>Great Expectations Data Docs</a></p>")
    return "".join(parts)


def _lineage(lineage: dict[str, list[str]] | None) -> str:
    """A gold model's column lineage: each column, and the silver columns it is computed from."""
    if not lineage:
        return ""
    none = "(no column: rows counted, or a constant)"
    rows = "".join(f"<tr><td><code>{_e(column)}</code></td><td>{_e(', '.join(sources) or none)}</td></tr>"
                   for column, sources in lineage.items())
    return f"<h2>Column lineage</h2><table><tr><th>column</th><th>computed from (silver)</th></tr>{rows}</table>"


def render_run(lake: Lake, run_id: str) -> str:
    summaries = load_run(lake, run_id)
    body = (f"<p><a href='../../index.html'>← all runs</a></p><h1>Run {_e(run_id)} — "
            f"{_verdict(run_verdict(summaries))}</h1>" + "".join(_section(s) for s in summaries))
    path = f"{lake.run_reports(run_id)}/index.html"
    lake.files.write(path, _page(f"CDC run {run_id}", body))
    return path


def _by_run(steps: list[Step]) -> list[tuple[str, list[Step]]]:
    """The steps grouped by run, the newest run (by its first step) first."""
    runs: dict[str, list[Step]] = {}
    for step in steps:
        runs.setdefault(step.run_id, []).append(step)
    return sorted(runs.items(), key=lambda r: (r[1][0].published_at, r[0]), reverse=True)


def render_index(lake: Lake, steps: list[Step]) -> str:
    """The history page, from the event log's steps of the newest runs."""
    rows = []
    for run_id, mine in _by_run(steps):
        tables = ", ".join(f"{_e(s.layer)}/{_e(s.table)}: {_verdict(s.verdict)}" for s in mine)
        quarantined = sum(s.quarantined or 0 for s in mine)
        verdict = run_verdict([{"gate": s.verdict} for s in mine])
        rows.append(f"<tr><td><a href='runs/{_e(run_id)}/index.html'>{_e(run_id)}</a></td>"
                    f"<td>{_e(mine[0].published_at.isoformat()[:19])}Z</td><td>{_verdict(verdict)}</td>"
                    f"<td>{quarantined}</td><td>{tables or 'nothing new'}</td></tr>")
    names = sorted({s.table for s in steps})
    links = " · ".join(f"<a href='tables/{_e(t)}.html'>{_e(t)}</a>" for t in names)
    body = ("<h1>CDC pipeline runs</h1><p>Newest first. Each run links to its report; each report links to the "
            "Great Expectations Data Docs of its tables. <a href='status'>Where every table stands now</a> (in the "
            f"Airflow UI; <code>python -m spark_jobs status</code> on a terminal).</p><p>Trends per table: {links}</p>"
            "<table><tr><th>run</th><th>started</th><th>verdict</th>"
            "<th>quarantined</th><th>gates</th></tr>" + "".join(rows) + "</table>")
    path = lake.reports_index
    lake.files.write(path, _page("CDC pipeline runs", body))
    return path


# Charts are drawn here as inline SVG: the pages must render from the lake's files and behind a firewall with
# no script, and the plotting library at hand (altair, which GX brings) needs a Vega runtime of its own version
COLOURS = ("#0969da", "#1a7f37", "#9a6700", "#b00020", "#8250df")
LABELLED = 20  # runs up to which every point is labelled with its value


def line_chart(title: str, labels: list[str], series: dict[str, list[float | None]], shown: Any = str) -> str:
    """One SVG line chart over the runs (oldest left): a line and a dot per series and run with a value, each dot
    labelled with its value (the newest only, past LABELLED runs) and its tooltip saying which run, the y axis from 0
    to the largest value."""
    width, height, left, bottom, top = 660, 200, 78, 24, 28
    values = [v for points in series.values() for v in points if v is not None]
    if not values:
        return f"<p class='chart-empty'>{_e(title)}: no figures yet</p>"
    high = max(values) or 1.0
    step = (width - left - 12) / max(len(labels) - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return left + i * step, top + (height - top - bottom) * (1 - v / high)

    parts = [f"<svg class='chart' role='img' aria-label='{_e(title)}' width='{width}' height='{height + 18}' "
             f"xmlns='http://www.w3.org/2000/svg'><text x='{left}' y='12' font-size='12' font-weight='600'>{_e(title)}"
             "</text>",
             f"<line x1='{left}' y1='{height - bottom}' x2='{width - 8}' y2='{height - bottom}' stroke='#8c959f'/>",
             f"<line x1='{left}' y1='{top}' x2='{left}' y2='{height - bottom}' stroke='#8c959f'/>",
             f"<text class='axis' x='{left - 4}' y='{top + 4}' font-size='10' text-anchor='end'>{_e(shown(high))}</text>",
             f"<text class='axis' x='{left - 4}' y='{height - bottom}' font-size='10' text-anchor='end'>{_e(shown(0))}</text>",
             f"<text x='{left}' y='{height - 8}' font-size='10'>{_e(labels[0])}</text>",
             f"<text x='{width - 8}' y='{height - 8}' font-size='10' text-anchor='end'>{_e(labels[-1])}</text>"]
    for n, (name, points) in enumerate(series.items()):
        colour = COLOURS[n % len(COLOURS)]
        dots = [(i, v) for i, v in enumerate(points) if v is not None]
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in dots))
        parts.append(f"<polyline class='series' points='{line}' fill='none' stroke='{colour}' stroke-width='1.5'/>")
        parts += [f"<circle cx='{x:.1f}' cy='{y:.1f}' r='2.5' fill='{colour}'><title>{_e(labels[i])}: {_e(name)} "
                  f"{_e(shown(v))}</title></circle>" for i, v in dots for x, y in [xy(i, v)]]
        parts += [f"<text class='point' x='{x:.1f}' y='{y - 5:.1f}' font-size='10' fill='{colour}' "
                  f"text-anchor='{'end' if i == len(labels) - 1 and i else 'middle'}'>{_e(shown(v))}</text>"
                  for i, v in dots if len(dots) <= LABELLED or i == dots[-1][0] for x, y in [xy(i, v)]]
        parts.append(f"<text x='{left + 8 + n * 120}' y='{height + 14}' font-size='11' fill='{colour}'>■ {_e(name)}</text>")
    return "".join(parts) + "</svg>"


def _percent(value: float) -> str:
    return f"{value:.1%}"


def render_table(lake: Lake, table: str, steps: list[Step], failed: dict[tuple[str, str, str], list[str]],
                 lineage: dict[str, list[str]] | None = None) -> str:
    """`reports/tables/<table>.html`: the table's (or gold model's) runs among `steps` (the event log's, oldest
    first), oldest left, as charts of lag, rows per run and the quarantined share, each run's verdicts and the
    checks that did not pass (`failed`, by run, table and layer), and a gold model's column lineage."""
    mine = [(run_id, {s.layer: s for s in run}) for run_id, run in reversed(_by_run([s for s in steps if s.table == table]))]
    labels = [next(iter(layers.values())).published_at.isoformat()[:16].replace("T", " ") for _, layers in mine]

    def figure(layer: str, key: str) -> list[float | None]:
        values = [getattr(layers[layer], key) if layer in layers else None for _, layers in mine]
        return [None if v is None else float(v) for v in values]

    charts = []
    if labels:
        lag_layer = "gold" if any("gold" in layers for _, layers in mine) else "silver"
        charts.append(line_chart("Lag: the run's time less the source commit time of the newest change it held", labels,
                                 {lag_layer: figure(lag_layer, "lag_s")}, human_seconds))
        rows = ({"rows": figure("gold", "rows")} if lag_layer == "gold" else
                {"events in": figure("bronze", "events"), "inserted": figure("silver", "inserted"),
                 "updated": figure("silver", "updated"), "deleted": figure("silver", "deleted")})
        charts.append(line_chart("Rows per run", labels, rows, lambda v: f"{v:,.0f}"))
        charts.append(line_chart("Quarantined share of the batch", labels,
                                 {layer: figure(layer, "quarantined_share") for layer in ("bronze", "silver", "gold")
                                  if any(layer in layers for _, layers in mine)}, _percent))
    verdicts = []
    for (run_id, layers), when in zip(reversed(mine), reversed(labels), strict=True):
        cells = "".join(f"<td>{_verdict(layers[layer].verdict) if layer in layers else ''}</td>"
                        for layer in ("bronze", "silver", "gold"))
        failing = [c for layer in layers for c in failed.get((run_id, table, layer), [])]
        verdicts.append(f"<tr><td><a href='../runs/{_e(run_id)}/index.html'>{_e(run_id)}</a></td><td>{_e(when)}</td>"
                        f"{cells}<td>{_e(', '.join(failing))}</td></tr>")
    body = (f"<p><a href='../index.html'>← all runs</a> · <a href='../data_docs/{_e(table)}/index.html'>Data Docs</a>"
            f"</p><h1>{_e(table)}</h1>" + "".join(f"<div>{c}</div>" for c in charts) + _lineage(lineage)
            + "<h2>Runs, newest first</h2><table><tr><th>run</th><th>published</th><th>bronze</th><th>silver</th>"
              "<th>gold</th><th>checks not passed</th></tr>" + "".join(verdicts) + "</table>")
    path = f"{lake.reports}/tables/{table}.html"
    lake.files.write(path, _page(f"CDC table {table}", body))
    return path


def _ago(at: str | None, now: dt.datetime) -> str:
    if not at:
        return ""
    return f"{human_seconds((now - dt.datetime.fromisoformat(at)).total_seconds())} ago"


def render_status(state: LakeStatus) -> str:
    """Where every table stands (`status.lake_status`, which `python -m spark_jobs status` prints): each table's and
    gold model's layers with rows, lag, the newest verdict and how long ago the last success was, linked to the run
    and the trend page. Rendered when asked (the Airflow plugin's /cdc-reports/status), so the lag is now's."""
    now = dt.datetime.fromisoformat(state.at)
    rows = []
    for item in state.tables:
        for layer, s in item.layers.items():
            run = f"<a href='runs/{_e(s.last_run)}/index.html'>{_e(s.last_run)}</a>" if s.last_run else ""
            rows.append(f"<tr><td><a href='tables/{_e(item.name)}.html'>{_e(item.name)}</a></td><td>{_e(layer)}</td>"
                        f"<td>{'' if s.rows is None else f'{s.rows:,}'}</td><td>{_e(lag_text(s.lag_s, s.newest_change_at))}"
                        f"</td><td>{_verdict(s.last_verdict) if s.last_verdict else 'no run yet'}</td>"
                        f"<td>{_e(_ago(s.last_success, now))}</td><td>{run}</td></tr>")
    body = (f"<p><a href='./'>← all runs</a></p><h1>Where every table stands</h1><p>As of {_e(state.at[:19])}Z. "
            "Lag: now less the source commit time of the newest change the layer holds (Debezium's "
            "<code>source.ts_ms</code>), as of its last passed run. Rows: the table's now.</p>"
            "<table><tr><th>table</th><th>layer</th><th>rows</th><th>lag</th><th>last verdict</th>"
            "<th>last success</th><th>last run</th></tr>" + "".join(rows) + "</table>")
    return _page("CDC pipeline status", body)
