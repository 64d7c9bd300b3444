"""The command line's arguments (`python -m spark_jobs ...`), apart from what the commands do (spark_jobs.cli), so
that the service's client (spark_jobs.service_client) can read a task's arguments as the command line would
without importing the commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from spark_jobs.settings import settings

DESCRIPTION = """`python -m spark_jobs run|generate|status|maintain|serve|service-credentials|spark-ui-token|buckets`
(or `cdc-pipeline ...`): the same code path the DAG tasks run (docs/architecture.md, "Command line").

Exit 0 on success; 1 when a gate fails or input cannot be processed; 2 on bad arguments or config; 75 when what
the run needs (a Spark master, a store) did not answer or went away: a retry may mend it.
Failures print one line naming the table, the layer and the reason (CDC_DEBUG=1 adds the traceback)."""

LAYERS = ("bronze", "silver", "gold")
MODES = ("incremental", "reprocess", "rebuild", "skip")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _mix(value: str) -> tuple[int, int, int]:
    parts = _csv(value)
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or sum(int(p) for p in parts) != 100:
        raise argparse.ArgumentTypeError("three whole percentages adding up to 100, e.g. 20,70,10")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _phases(value: str) -> frozenset[int]:
    parts = _csv(value)
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError("phase numbers, e.g. 0 or 1,2 (0: the snapshot)")
    return frozenset(int(p) for p in parts)


def _ends_at(value: str) -> int | None:
    """`--ends-at`: epoch milliseconds, or None for the generator's fixed start."""
    import datetime as dt

    if value == "fixed":
        return None
    if value == "now":
        return int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError("now, fixed or an ISO-8601 time, e.g. 2026-12-01T09:30:00Z") from None
    return int((at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp() * 1000)


def _file_list(value: str) -> frozenset[str]:
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    try:
        paths = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not a JSON list of landing paths: {exc}") from None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise argparse.ArgumentTypeError("not a JSON list of landing paths")
    from spark_jobs.landing import check_landing_path

    try:
        return frozenset(map(check_landing_path, paths))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_id(value: str) -> str:
    from spark_jobs.lake import check_run_id

    try:
        return check_run_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def version() -> str:
    """The project's version and the versions of what it runs on (the installed distributions', read from their
    metadata: nothing is imported), as a bug report needs them."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from spark_jobs.jvm import PACKAGES

    def of(distribution: str) -> str:
        try:
            return installed(distribution)
        except PackageNotFoundError:
            return "not installed"

    delta_jar = next(c for c in PACKAGES if c.startswith("io.delta:")).rsplit(":", 1)[1]
    return (f"cdc-medallion {of('cdc-medallion')} (pyspark {of('pyspark')}, delta-spark {delta_jar}, deltalake "
            f"{of('deltalake')}, great-expectations {of('great-expectations')}, apache-airflow {of('apache-airflow')})")


class _Version(argparse.Action):
    """argparse's own version action reads its text when the parser is made (every run) and wraps it."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version())
        parser.exit()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs", description=DESCRIPTION)
    p.add_argument("--version", action=_Version, nargs=0, help="print the versions and exit")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_run, _status, _maintain, _serve, _setup, _generate):
        add(sub)
    return p


def _where(command: Any, landing: bool, lake: bool = True) -> None:
    """The registry, the landing and the lake a command works on: each defaults to its CDC_* setting, as the
    service and the DAGs read them."""
    current = settings()
    command.add_argument("--config", default=current.config, help="the table registry (default: CDC_CONFIG)")
    if landing:
        command.add_argument("--landing", default=current.landing_uri,
                             help="landing root: a path or s3://bucket/prefix (default: CDC_LANDING_URI)")
    if lake:
        command.add_argument("--lake", default=current.lake_uri,
                             help="lake root: a path or s3://bucket/prefix (default: CDC_LAKE_URI)")


def _run(sub: Any) -> None:
    """`run`: what a layer task runs."""
    run = sub.add_parser("run", help="ingest landing files into bronze, merge silver, refresh gold")
    _where(run, landing=True)
    run.add_argument("--tables", type=_csv, default=None, help="comma-separated table names (default: all)")
    run.add_argument("--layers", type=_csv, default=list(LAYERS), help="comma-separated: bronze,silver,gold")
    run.add_argument("--models", type=_csv, default=None,
                     help="gold models to refresh (default: every model reading one of the tables)")
    run.add_argument("--run-id", type=_run_id, default=None, help="batch id recorded in every row and report (default: new)")
    run.add_argument("--mode", choices=MODES, default="incremental",
                     help="incremental: new landing files and bronze rows; reprocess: read the landing files in the "
                          "window again, replacing their bronze rows, and apply them; rebuild: recompute silver from "
                          "all of bronze, then gold (bronze is left alone); skip: set the --files aside unread (each "
                          "is logged as taken and quarantined whole with --reason; a later reprocess reads it again)")
    run.add_argument("--since", default=None, help="landing time (ISO 8601, UTC if naive) from which files are taken")
    run.add_argument("--until", default=None, help="landing time before which files are taken")
    run.add_argument("--files", type=_file_list, default=None,
                     help="exactly these landing files (JSON list of landing paths, or @file holding one)")
    run.add_argument("--reason", default="set aside by hand", help="with --mode skip: why, kept in the quarantine")
    run.add_argument("--max-quarantined", default=None,
                     help="this run only: the share of a batch that may be quarantined (e.g. 20%%), over tables.yaml")


def _status(sub: Any) -> None:
    """`status`: where each table stands."""
    status = sub.add_parser("status", help="per table and layer: rows, latest gate verdict, lag, pending files, last "
                                           "success; where things are")
    _where(status, landing=False)
    status.add_argument("--landing", default=None, help="landing root: also count the files bronze has not taken")
    status.add_argument("--json", action="store_true", help="per table: pending files, rows, verdicts, last success, "
                                                            "lag, as JSON")
    status.add_argument("--require-tables", action="store_true",
                        help="exit 1 unless every layer holds non-empty tables and an HTML report exists")


def _maintain(sub: Any) -> None:
    """`maintain`: Delta's upkeep and the reports' retention."""
    upkeep = sub.add_parser("maintain", help="compact, checkpoint and vacuum the tables; drop reports and GX results "
                                             "past their retention (tables.yaml `maintenance:`)")
    _where(upkeep, landing=False)
    upkeep.add_argument("--landing", default=None, help="landing root: also recompute each table's landing marks "
                                                        "from a full listing")
    upkeep.add_argument("--tables", type=_csv, default=None, help="comma-separated table names")
    upkeep.add_argument("--models", type=_csv, default=None, help="comma-separated gold models")
    upkeep.add_argument("--reports", action="store_true", help="expire the run reports (lake-wide)")
    upkeep.add_argument("--run-id", type=_run_id, default=None)


def _serve(sub: Any) -> None:
    """`serve` and `service-credentials`: the pipeline service."""
    service = sub.add_parser("serve", help="run the pipeline service: run and maintain jobs submitted over HTTP, with Spark, "
                                           "Delta and Great Expectations loaded once (CDC_SERVICE_CONN_ID)")
    service.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    service.add_argument("--port", type=int, default=8790, help="0: any free port (printed)")
    service.add_argument("--workers", type=int, default=2, help="jobs run at the same time (one Spark session)")
    service.add_argument("--connection-file", default=None,
                         help="write the service's Airflow connection (address and secret, mode 600) here once it takes "
                              "jobs (default: CDC_SERVICE_CONNECTION_FILE)")
    service.add_argument("--tls-cert", default=None, help="serve HTTPS with this certificate (PEM); required beyond loopback")
    service.add_argument("--tls-key", default=None, help="the certificate's private key (PEM)")
    service.add_argument("--allow-host", action="append", default=[],
                         help="another name clients reach the service by (the Host header they send); repeatable")
    service.add_argument("--token-file", default=None, help="the secret callers must send, read from this file "
                                                           "(instead of CDC_SERVICE_TOKEN)")
    creds = sub.add_parser("service-credentials", help="make the pipeline service's secret, TLS key and self-signed "
                                                      "certificate once, and its Airflow connection (a deployment's "
                                                      "first start: docker-compose.yaml)")
    creds.add_argument("--dir", required=True, help="where they go (each file readable by this user only)")
    creds.add_argument("--host", required=True, help="the name clients reach the service by (in the certificate)")
    creds.add_argument("--port", type=int, required=True)
    creds.add_argument("--conn-id", default="cdc_service", help="the Airflow connection's id")
    creds.add_argument("--ca-file", default=None, help="also copy the certificate here, and have the connection trust "
                                                     "this copy: the callers' path, apart from the secret and the key")
    ui = sub.add_parser("spark-ui-token", help="print a bearer token for the pipeline service's Spark UI (on with "
                                               "CDC_SPARK_UI=true), made from the secret in its connection file")
    ui.add_argument("--connection-file", default=settings().service_connection_file,
                    help="the service's Airflow connection (its address and secret), as `serve` writes it")


def _setup(sub: Any) -> None:
    """What a machine or a deployment sets up once: the assets, the jars, the buckets."""
    sub.add_parser("assets", help="fetch the pinned styles and scripts of GX Data Docs from the npm registry once "
                                  "(`make assets`), so Data Docs render offline")
    sub.add_parser("jars", help="fetch the pinned JVM jars (Delta, hadoop-aws, spark-avro) into CDC_JARS_DIR once "
                                "(`make jars`); offline afterwards")
    buckets = sub.add_parser("buckets", help="create the S3 buckets of the landing and the lake unless they exist "
                                             "(a deployment's first start)")
    buckets.add_argument("--landing", default=settings().landing_uri)
    buckets.add_argument("--lake", default=settings().lake_uri)


def _generate(sub: Any) -> None:
    """`generate`: sample Debezium files."""
    gen = sub.add_parser("generate", help="write sample Debezium change files in the S3 sink layout")
    _where(gen, landing=True, lake=False)
    gen.add_argument("--tables", type=_csv, default=None)
    gen.add_argument("--rows", type=int, default=200, help="snapshot rows per table")
    gen.add_argument("--changes", type=int, default=400, help="change events per table after the snapshot")
    gen.add_argument("--seed", type=int, default=7)
    gen.add_argument("--records-per-file", type=int, default=250, help="the sink's flush.size")
    gen.add_argument("--partitions", type=int, default=2, help="Kafka partitions per topic")
    gen.add_argument("--compress", action="store_true", help="write .json.gz files (Avro: deflate blocks)")
    gen.add_argument("--format", choices=("json", "avro"), default="json",
                     help="json: the JSON converter's records; avro: the S3 sink's AvroFormat (.avro)")
    gen.add_argument("--batches", type=int, default=0,
                     help="land the snapshot first, then the changes in this many batches of files (0: all at once)")
    gen.add_argument("--redeliver", type=float, default=0.0, help="share of change events delivered twice")
    gen.add_argument("--shuffle", action="store_true", help="change events land in random order within a batch")
    gen.add_argument("--mix", type=_mix, default=(20, 70, 10), help="percent of changes that insert,update,delete")
    gen.add_argument("--phases", type=_phases, default=None,
                     help="land only these phases, e.g. 0 (the snapshot) or 1,2 (change batches of --batches); a later "
                          "call with the same options lands the others at the offsets they would have had")
    gen.add_argument("--ends-at", type=_ends_at, default="now", dest="ends_ms",
                     help="the source time of the newest commit: now (the default, so lags read as a live source's "
                          "would), an ISO-8601 time, or 'fixed' (2023-11-14, the same files at every call)")
