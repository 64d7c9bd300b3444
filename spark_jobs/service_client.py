"""The pipeline service's client half (spark_jobs/service.py is the server): what a caller may ask of it
(`JobRequest`), where it is and its secret (`ServiceConnection`), and submitting and polling a job. Pure Python
and the standard library: the Airflow plugin imports it on its workers and triggerer."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import os
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, fields
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from spark_jobs.settings import Settings, resolve, resolve_uri, setting_value

COMMANDS = ("run", "maintain")  # what the service runs; the others are a user's own process
# the settings a job may bring (how it runs, never where it reads or writes)
JOB_SETTINGS = ("debug", "delta_engine", "lock_timeout", "bronze_batch_files")
CONN_TYPE = "cdc_pipeline_service"  # the service's Airflow connection type (cdc_airflow.service_hook.PipelineServiceHook)
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")  # a table's or gold model's name in a request


@dataclass
class JobStatus:
    """What a poll returns: the log from the asked offset on, and where the next poll starts."""

    id: str
    state: str  # queued | running | succeeded | failed
    exit_code: int | None = None
    cause: str | None = None  # the job's one-line failure cause (table, layer, reason), as a process writes it
    log: str = ""
    offset: int = 0
    seconds: float | None = None
    spark_jobs: int | None = None  # the Spark jobs the job ran (its job group's), once it ended
    gx_seconds: float | None = None  # its time in Great Expectations' validations and Data Docs, once it ended

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed")


class ServiceError(Exception):
    """The service could not be reached or refused the request: worth a retry unless `permanent`."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent

    @classmethod
    def answered(cls, url: str, status: int, body: str) -> ServiceError:
        """The service's answer other than success: a refusal (4xx) is permanent, the same request would be refused
        again; a busy or failing service (429, 5xx) is worth a retry."""
        permanent = status < 500 and status != HTTPStatus.TOO_MANY_REQUESTS
        return cls(f"pipeline service {url}: HTTP {status}: {body.strip()}", permanent=permanent)


@dataclass(frozen=True)
class JobRequest:
    """What a caller may ask of the service: a `run` or `maintain` of the service's own deployment, narrowed to
    tables, layers, models, a mode and landing-time window, the sensor's landing files and the run id. Validated
    on both sides (`check`); the service builds the command line from it (`argv`)."""

    command: str = "run"
    tables: tuple[str, ...] | None = None
    layers: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None
    mode: str | None = None
    since: str | None = None
    until: str | None = None
    files: tuple[str, ...] | None = None
    run_id: str | None = None
    reason: str | None = None  # with mode skip: why the files were set aside
    max_quarantined: str | None = None
    reports: bool = False  # maintain: expire the run reports
    landing_marks: bool = False  # maintain: recompute the landing marks from a full listing
    settings: tuple[tuple[str, str], ...] = ()  # JOB_SETTINGS only, as (name, value)
    key: str | None = None  # a task's try: the same key submitted again returns the first job

    @classmethod
    def from_argv(cls, argv: list[str], files: list[str] | None = None, job_settings: dict[str, str] | None = None,
                  key: str | None = None) -> JobRequest:
        """The request for `python -m spark_jobs <argv>` as the DAG tasks build it (their --config, --landing and
        --lake are the deployment's, which the service knows itself, and are not sent)."""
        from spark_jobs.arguments import parser

        args = parser().parse_args(argv)
        if args.command not in COMMANDS:
            raise ValueError(f"the service runs {' and '.join(COMMANDS)}, not {args.command!r}")
        listed = sorted(files) if files is not None else sorted(args.files) if getattr(args, "files", None) else None
        def as_tuple(values: Any) -> tuple[str, ...] | None:
            return tuple(values) if values else None

        return cls(command=args.command, tables=as_tuple(args.tables), layers=as_tuple(getattr(args, "layers", None)),
                   models=as_tuple(args.models), mode=getattr(args, "mode", None), since=getattr(args, "since", None),
                   until=getattr(args, "until", None), files=as_tuple(listed), run_id=args.run_id,
                   reason=getattr(args, "reason", None), max_quarantined=getattr(args, "max_quarantined", None),
                   reports=bool(getattr(args, "reports", False)),
                   landing_marks=args.command == "maintain" and args.landing is not None,
                   settings=tuple(sorted((job_settings or {}).items())), key=key).check()

    @classmethod
    def from_json(cls, body: Any) -> JobRequest:
        """A request body, strictly: known fields of the right types only (ValueError or TypeError otherwise)."""
        if not isinstance(body, dict):
            raise TypeError("the request body is a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; a request names only {', '.join(sorted(known))}")
        values: dict[str, Any] = {}
        for name, value in body.items():
            if value is None:
                continue
            if name in ("tables", "layers", "models", "files"):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise TypeError(f"{name}: a list of strings")
                value = tuple(value)
            elif name == "settings":
                if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                    raise TypeError("settings: an object of strings")
                value = tuple(sorted(value.items()))
            elif name in ("reports", "landing_marks"):
                if not isinstance(value, bool):
                    raise TypeError(f"{name}: true or false")
            elif not isinstance(value, str):
                raise TypeError(f"{name}: a string")
            values[name] = value
        return cls(**values).check()

    def as_json(self) -> dict[str, Any]:
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["settings"] = dict(self.settings)
        return {k: list(v) if isinstance(v, tuple) and k != "settings" else v for k, v in body.items()}

    def check(self) -> JobRequest:
        """ValueError naming the first field that is not what a task may ask."""
        from spark_jobs.arguments import LAYERS, MODES
        from spark_jobs.lake import check_run_id
        from spark_jobs.landing import check_landing_path

        if self.command not in COMMANDS:
            raise ValueError(f"the service runs {' and '.join(COMMANDS)}, not {self.command!r}")
        for name in ("tables", "models"):
            bad = [v for v in getattr(self, name) or () if not NAME.fullmatch(v)]
            if bad:
                raise ValueError(f"{name}: {bad[0]!r} is not a table or model name")
        bad_layers = [v for v in self.layers or () if v not in LAYERS]
        if bad_layers:
            raise ValueError(f"layers: {bad_layers[0]!r}; choose from {', '.join(LAYERS)}")
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r}; choose from {', '.join(MODES)}")
        for path in self.files or ():
            check_landing_path(path)
        if self.run_id is not None:
            check_run_id(self.run_id)
        refused = sorted(name for name, _ in self.settings if name not in JOB_SETTINGS)
        if refused:
            raise ValueError(f"settings: {', '.join(refused)} cannot be set per job (only {', '.join(JOB_SETTINGS)})")
        for name, value in self.settings:  # refused here, not when the job's first step reads it
            setting_value(name, value)
        for name in ("since", "until", "reason", "max_quarantined", "key"):
            value = getattr(self, name)
            if value is not None and (len(value) > 500 or "\0" in value):
                raise ValueError(f"{name}: at most 500 characters, no NUL")
        if self.command == "maintain" and (self.layers or self.mode or self.since or self.until or self.files):
            raise ValueError("maintain takes tables, models, reports, landing_marks and run_id only")
        return self

    def argv(self, deployment: Settings, listed_files: Path | None) -> list[str]:
        """The command line of the job, on the service's own registry, landing and lake. Every value goes as
        `--option=value`, so none can be taken for an option of its own."""
        argv = [self.command, f"--config={resolve(deployment.config)}", f"--lake={resolve_uri(deployment.lake_uri)}"]
        if self.command == "run" or self.landing_marks:
            argv.append(f"--landing={resolve_uri(deployment.landing_uri)}")
        for name in ("tables", "layers", "models"):
            if getattr(self, name):
                argv.append(f"--{name}={','.join(getattr(self, name))}")
        for name in ("mode", "since", "until", "run_id", "reason", "max_quarantined"):
            if getattr(self, name) is not None:
                argv.append(f"--{name.replace('_', '-')}={getattr(self, name)}")
        if self.reports:
            argv.append("--reports")
        if listed_files is not None:  # as a file, the way a process gets a long list (spark_jobs.cli, --files @file)
            argv.append(f"--files=@{listed_files}")
        return argv


def ca_file(verify: Any) -> str | None:
    """The CA file in a connection's `verify` extra (the HTTP provider's name: a path, or true for the system's CAs)."""
    return verify if isinstance(verify, str) and verify.lower() not in ("", "true", "false") else None


@dataclass(frozen=True)
class ServiceConnection:
    """Where the service is and its secret, for a caller without Airflow (a script, a healthcheck, the tests; Airflow's
    tasks use cdc_airflow.service_hook): as in the file the service writes at start (`connection_file`), Airflow's JSON
    form of a connection."""

    url: str
    token: str
    ca_file: str | None = None  # the CA that signed the service's TLS certificate, when not a public one

    @classmethod
    def at(cls, scheme: str | None, host: str, port: int, token: str, ca_file: str | None = None) -> ServiceConnection:
        """From a connection's fields (its schema is the URL's scheme, its password the secret)."""
        return cls(f"{scheme or 'http'}://{f'[{host}]' if ':' in host else host}:{port}", token, ca_file)

    @classmethod
    def from_airflow_json(cls, text: str) -> ServiceConnection:
        conn = json.loads(text)
        return cls.at(conn.get("schema"), conn["host"], conn["port"], conn.get("password") or "",
                      ca_file((conn.get("extra") or {}).get("verify")))

    def airflow_json(self) -> str:
        """Airflow's JSON form of the connection (AIRFLOW_CONN_<ID>, or `airflow connections import`): of the
        service's own type (cdc_airflow.service_hook.PipelineServiceHook), the CA file as the HTTP provider's `verify`."""
        url = urlparse(self.url)
        return json.dumps({"conn_type": CONN_TYPE, "host": url.hostname, "port": url.port, "schema": url.scheme,
                           "password": self.token, "description": "the CDC pipeline service (python -m spark_jobs serve)",
                           **({"extra": {"verify": self.ca_file}} if self.ca_file else {})})

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ServiceConnection:
        return cls.from_airflow_json(Path(path).read_text())


def spark_ui_key(secret: str) -> str:
    """The key the service's Spark UI checks its callers' JWS against (session.ui_filter): derived from the service's
    secret (HMAC-SHA256 needs 256 bits), base64url."""
    return base64.urlsafe_b64encode(hashlib.sha256(b"cdc-spark-ui\0" + secret.encode()).digest()).decode().rstrip("=")


def spark_ui_token(secret: str) -> str:
    """A bearer token for the service's Spark UI: a JWS (HS256) of an empty claim set, signed with `spark_ui_key`
    (`Authorization: Bearer <token>` on every request to the UI)."""
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    key = base64.urlsafe_b64decode(spark_ui_key(secret) + "=")
    signed = f"{b64(json.dumps({'alg': 'HS256', 'typ': 'JWT'}).encode())}.{b64(b'{}')}"
    return f"{signed}.{b64(hmac.new(key, signed.encode(), hashlib.sha256).digest())}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not followed: urllib would send the request again, the secret in its Authorization
    header, to wherever the answer points."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


def _request(service: ServiceConnection, path: str, method: str = "GET", body: dict[str, Any] | None = None,
             timeout: float = 30) -> Any:
    url = f"{service.url.rstrip('/')}{path}"
    parsed = urlparse(url)
    if parsed.scheme != "https" and not is_loopback(parsed.hostname or ""):
        raise ServiceError(f"pipeline service {service.url}: the secret goes over https beyond loopback, not "
                           f"{parsed.scheme or 'no scheme'} (the connection's schema)", permanent=True)
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {service.token}"})
    context = ssl.create_default_context(cafile=service.ca_file) if url.startswith("https:") else None
    opener = urllib.request.build_opener(_NoRedirects, urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ServiceError.answered(url, exc.code, exc.read().decode(errors="replace")) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceError(f"pipeline service {url} unreachable: {exc}") from None


def submit(service: ServiceConnection, request: JobRequest) -> str:
    """Queues the job on the service; returns the job's id."""
    return str(_request(service, "/jobs", "POST", request.as_json())["id"])


def health(service: ServiceConnection) -> dict[str, Any]:
    """The service's /health, or ServiceError when it does not answer or its Spark has stopped (a healthcheck's
    test: the address, TLS and secret of `service` are checked on the way)."""
    answer = _request(service, "/health", timeout=10)
    if not answer.get("ok"):
        raise ServiceError(f"pipeline service {service.url}: its Spark has stopped")
    return dict(answer)


def poll(service: ServiceConnection, job_id: str, offset: int = 0) -> JobStatus:
    return JobStatus(**_request(service, f"/jobs/{quote(job_id, safe='')}?offset={offset}"))
