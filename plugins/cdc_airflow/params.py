"""Run params of the DAGs (a landing-time window; a replay's tables and mode), validated when the run
is created, and the checks JSON schema cannot express."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException

REPLAY_MODES = ("reprocess", "rebuild")


ISO_TIME = "^\\d{4}-\\d{2}-\\d{2}([T ]\\d{2}:\\d{2}(:\\d{2}(\\.\\d+)?)?)?(Z|[+-]\\d{2}:?\\d{2})?$"


def window_params(what: str) -> dict[str, Param]:
    """`since`, `until`: a landing-time window (ISO 8601, UTC when naive), validated with the run."""
    return {"since": Param(None, type=["null", "string"], pattern=ISO_TIME, title="Since",
                           description=f"landing time from which files are {what} (ISO 8601, UTC if naive)"),
            "until": Param(None, type=["null", "string"], pattern=ISO_TIME, title="Until",
                           description=f"landing time before which files are {what}")}


def pass_params(tables: list[str]) -> dict[str, Param]:
    """A layer pass's run by hand: the tables it takes (none: every table; a run asset events started takes theirs)."""
    return {"tables": Param([], type="array", items={"type": "string", "enum": list(tables)}, uniqueItems=True,
                            title="Tables", description="Tables to apply, in one pass (default: every table)")}


def replay_params(tables: list[str]) -> dict[str, Param]:
    """Validated when the run is created (the UI form, the API, `dags test -c`)."""
    return {
        "tables": Param(list(tables), type="array", items={"type": "string", "enum": list(tables)}, minItems=1,
                        uniqueItems=True, title="Tables", description="Tables to replay (default: all)"),
        "mode": Param("reprocess", type="string", enum=list(REPLAY_MODES), title="Mode",
                      description="reprocess: read the landing files in the window again (replacing their bronze "
                                  "rows) and apply them; rebuild: recompute silver, then gold, from all of bronze"),
        **window_params("reprocessed"),
        "max_quarantined": Param(None, type=["null", "string"], pattern="^\\d+(\\.\\d+)?%?$", title="Max quarantined",
                                 description="this replay only: the share of a batch that may be quarantined "
                                             "(e.g. 20%), over tables.yaml; empty: as configured"),
    }


def check_replay(params: dict[str, Any], known: Sequence[str]) -> dict[str, Any]:
    """What JSON schema cannot say: the window's order, a window only with reprocess. Raises with the
    param's name; returns the replay's plan."""
    from spark_jobs.landing import LandingWindow

    unknown = [t for t in params["tables"] if t not in known]
    if unknown:
        raise AirflowFailException(f"param tables: unknown table(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if params["mode"] not in REPLAY_MODES:
        raise AirflowFailException(f"param mode: {params['mode']!r} is not one of {', '.join(REPLAY_MODES)}")
    try:
        window = LandingWindow.parse(params.get("since"), params.get("until"))
    except ValueError as exc:
        raise AirflowFailException(f"param {exc}") from None
    if params.get("max_quarantined"):
        from spark_jobs.errors import ConfigError
        from spark_jobs.quality.config import parse_share

        try:
            parse_share(params["max_quarantined"], "param max_quarantined")
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
    if params["mode"] == "rebuild" and (window.since_ms or window.until_ms):
        raise AirflowFailException("param since/until: a rebuild recomputes from all of bronze; a window is for reprocess")
    return {"tables": list(params["tables"]), "mode": params["mode"], "window": window.describe()}


def landing_window(context: Any) -> tuple[int | None, int | None]:
    """A backfill run takes the files that landed in its data interval; any run may name a window in its
    params (`since`, `until`); other runs take every file not yet in bronze."""
    from spark_jobs.landing import LandingWindow

    params = context["params"]
    if params.get("since") or params.get("until"):
        window = LandingWindow.parse(params.get("since"), params.get("until"))
        return window.since_ms, window.until_ms
    run = context["dag_run"]
    if str(getattr(run.run_type, "value", run.run_type)) == "backfill":
        start, end = context["data_interval_start"], context["data_interval_end"]
        return int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    return None, None


def landing_window_args(context: Any) -> list[str]:
    """The run's landing window (landing_window) as the job's --since/--until: [] when the run has none."""
    import datetime as dt

    def iso(ms: int | None) -> str:
        return "" if ms is None else (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)).isoformat()

    since_ms, until_ms = landing_window(context)
    return [] if since_ms is None and until_ms is None else ["--since", iso(since_ms), "--until", iso(until_ms)]
