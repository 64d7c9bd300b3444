"""Airflow 3 plugin: the pipeline's data-quality reports inside the Airflow UI.

A FastAPI app mounted on the API server at /cdc-reports serves `<lake>/reports/` (the run history, each
run's report, GX Data Docs) from a folder, or from S3 with the `aws_default` connection's credentials,
and a menu entry ("CDC data quality") shows it inside the UI; a second ("CDC status") shows where every table
stands, rendered per request. Every request goes through Airflow's own
authentication (the UI's JWT cookie or a bearer token) and needs the permission to view plugins; without
a session the browser is sent to Airflow's login page. Paths are resolved inside the reports folder and
cannot leave it.
"""

from __future__ import annotations

import mimetypes
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, RedirectResponse, Response

from cdc_airflow.hooks import s3_client, s3_settings
from spark_jobs.lake import Lake
from spark_jobs.quality.docs_assets import VENDOR, vendored_files
from spark_jobs.settings import resolve_uri, settings
from spark_jobs.storage import S3Files

PREFIX = "/cdc-reports"
app = FastAPI(title="CDC data-quality reports", docs_url=None, redoc_url=None, openapi_url=None)

# The reports are served from Airflow's own origin, so a page must never act as the user there. Every value from
# the source is escaped before a page is written (spark_jobs/report.py; GX's results: quality/gx_store.py); the
# policy is the second wall: no inline code runs, and scripts load only from the vendored files (VENDOR), which are
# served from the installed package, never from the lake, so whoever can write to the lake cannot add code (GX's
# pages keep only the scripts its templates write: quality/docs_assets.py). Nothing is fetched or posted.
VENDOR_PATH = f"data_docs/{VENDOR}/"
STATUS = "status"  # the page rendered per request (where every table stands now), not a file of the lake


def policy(request: Request) -> str:
    """The page's Content-Security-Policy: its scripts from VENDOR_PATH on this origin alone (a path needs the
    origin: 'self' takes none), as the browser addressed it (Airflow may sit under a base path or behind a proxy)."""
    mounted_at = request.scope.get("root_path", "")  # where Airflow mounted this app: /cdc-reports, under any base path
    scripts = f"{request.url.scheme}://{request.url.netloc}{mounted_at.rstrip('/')}/{VENDOR_PATH}"
    return (f"default-src 'none'; script-src {scripts}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "font-src 'self' data:; connect-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'; "
            "object-src 'none'")


def reports_lake() -> Lake:
    """The lake of `CDC_LAKE_URI`, read per request so a changed environment needs no restart."""
    return Lake(resolve_uri(settings().lake_uri))


async def _authorized(request: Request) -> Response | None:
    """None when the caller may read reports; else the response to send (login redirect or 403)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import get_user

    auth = request.headers.get("authorization", "")
    bearer: Any = None
    if auth.lower().startswith("bearer "):
        from fastapi.security import HTTPAuthorizationCredentials

        bearer = HTTPAuthorizationCredentials(scheme="Bearer", credentials=auth.split(" ", 1)[1])
    try:
        user = await get_user(request, None, bearer)
    except HTTPException as exc:
        if exc.status_code in (401, 403) and "text/html" in request.headers.get("accept", ""):
            login = get_auth_manager().get_url_login()
            sep = "&" if "?" in login else "?"
            return RedirectResponse(f"{login}{sep}next={quote(str(request.url), safe='')}", status_code=307)
        return Response(exc.detail, status_code=exc.status_code)
    if not get_auth_manager().is_authorized_view(access_view=AccessView.PLUGINS, user=user):
        return Response("not allowed to view plugins", status_code=403)
    return None


@app.get("/{path:path}", include_in_schema=False)
async def serve(path: str, request: Request) -> Response:
    refused = await _authorized(request)
    if refused is not None:
        return refused
    lake = reports_lake()
    if path == STATUS:
        response = await run_in_threadpool(_status_page, lake)
    elif path.startswith(VENDOR_PATH):
        response = _serve_vendored(path.removeprefix(VENDOR_PATH))
    elif not lake.on_s3:
        response = _serve_folder(Path(lake.reports), path)
    else:
        response = _serve_s3(S3Files(s3_client(s3_settings(settings().aws_conn_id))), lake.reports, path)
    response.headers["Content-Security-Policy"] = policy(request)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def _status_page(lake: Lake) -> Response:
    """Where every table stands, now: the same `lake_status` as `python -m spark_jobs status` (Delta logs and the event
    log, no Spark), in a worker thread: it reads every table's log."""
    from spark_jobs.registry import load_registry
    from spark_jobs.report import render_status
    from spark_jobs.status import lake_status

    state = lake_status(load_registry(settings().config), lake, None)
    return Response(render_status(state), media_type="text/html", headers={"Cache-Control": "no-store"})


@cache
def _vendored() -> dict[str, bytes]:
    return vendored_files()


def _serve_vendored(inside: str) -> Response:
    """A vendored file, from the package: the lake's copy (for pages opened from disk) is never served. No redirect
    either: a browser checks a script's path against the policy only before redirects."""
    data = _vendored().get(inside)
    if data is None:
        return Response("not found", status_code=404)
    return Response(data, media_type=mimetypes.guess_type(inside)[0] or "application/octet-stream")


def _serve_folder(reports: Path, path: str) -> Response:
    root = reports.resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root):  # `..`, absolute paths and symlinks out of the folder
        return Response("not found", status_code=404)
    if target.is_dir():
        if path and not path.endswith("/"):  # relative links inside the page need the trailing slash
            return RedirectResponse(f"{PREFIX}/{path}/", status_code=307)
        target = target / "index.html"
    if not target.is_file():
        return _missing(path)
    return FileResponse(target)


def _serve_s3(files: S3Files, base: str, path: str) -> Response:
    """The same from an S3 lake: keys under `reports/`, a "folder" being its index.html."""
    if any(part in ("..", ".") for part in path.split("/")):
        return Response("not found", status_code=404)
    data = files.read(f"{base}/{path}{'index.html' if path == '' or path.endswith('/') else ''}")
    if data is None and path and not path.endswith("/") and files.exists(f"{base}/{path}/index.html"):
        return RedirectResponse(f"{PREFIX}/{path}/", status_code=307)
    if data is None:
        return _missing(path)
    kind = mimetypes.guess_type(path or "index.html")[0] if not path.endswith("/") else "text/html"
    return Response(data, media_type=kind or "application/octet-stream")


def _missing(path: str) -> Response:
    if not path:
        return Response("<p>No pipeline run has published a report yet.</p>", media_type="text/html")
    if path.startswith("runs/") and path.endswith("/index.html"):  # the DAG run tab of a run with no report
        return Response("<p>This DAG run has published no CDC report (it took nothing new, or it is not a "
                        "pipeline run).</p>", media_type="text/html", status_code=404)
    return Response("not found", status_code=404)


class CdcReportsPlugin(AirflowPlugin):
    name = "cdc_reports"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "CDC data-quality reports"}]
    # the menu entry, and a tab on every DAG run page with the report of that run (the pipeline's runs are
    # reported under their Airflow run id; the UI puts the run's id in place of {RUN_ID})
    external_views = [{"name": "CDC status", "href": f"{PREFIX}/{STATUS}", "destination": "nav", "category": "browse",
                       "url_route": "cdc-status"},
                      {"name": "CDC data quality", "href": f"{PREFIX}/", "destination": "nav", "category": "browse",
                       "url_route": "cdc-reports"},
                      {"name": "Data quality", "href": f"{PREFIX}/runs/{{RUN_ID}}/index.html", "destination": "dag_run",
                       "url_route": "cdc-run-report"}]
