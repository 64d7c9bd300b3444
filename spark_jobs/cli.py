"""The commands of `python -m spark_jobs` (or `cdc-pipeline`), the code path the DAG tasks run: each command, and
every failure turned into one line and an exit code. Their arguments and the exit codes' meaning are in
spark_jobs.arguments (`--help`)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from spark_jobs.arguments import LAYERS, parser
from spark_jobs.errors import EXIT_TRANSIENT, ConfigError, InfrastructureDown, LayerFailed, storage_failure
from spark_jobs.logs import logger, set_level
from spark_jobs.quality.config import parse_share
from spark_jobs.registry import GoldModel, Registry, TableConfig, load_registry
from spark_jobs.settings import Settings, environ, resolve, resolve_uri, settings
from spark_jobs.steps import Steps

log = logger(__name__)


def _selected(registry: Registry, args: argparse.Namespace) -> tuple[list[TableConfig], list[GoldModel]]:
    tables = registry.select(args.tables)
    bad_layers = [layer for layer in args.layers if layer not in LAYERS]
    if bad_layers:
        raise ConfigError(f"unknown layer(s) {', '.join(bad_layers)}; choose from {', '.join(LAYERS)}")
    models = ([registry.gold[m] for m in args.models if m in registry.gold] if args.models
              else registry.models_reading([t.name for t in tables]))
    if args.models and len(models) != len(args.models):
        raise ConfigError(f"unknown gold model(s) in {args.models}; known: {', '.join(registry.gold)}")
    return tables, models


def run(args: argparse.Namespace) -> int:
    from spark_jobs.delta.engines import make_engine
    from spark_jobs.lake import LITERAL_LAKE, Lake
    from spark_jobs.landing import LandingWindow, in_topic
    from spark_jobs.layers import bronze
    from spark_jobs.quality import docs_assets
    from spark_jobs.quality.user_expectations import validate, validate_actions
    from spark_jobs.run_plan import RunPlan, execute
    from spark_jobs.session import build_session
    from spark_jobs.state import check_lock_timeout, new_batch_id

    tables, models = _selected(load_registry(args.config), args)
    if args.max_quarantined:  # a one-run override: nothing is written back to tables.yaml
        limit = parse_share(args.max_quarantined, "--max-quarantined")
        tables = [replace(t, quality=replace(t.quality, max_quarantined=limit)) for t in tables]
        models = [replace(m, quality=replace(m.quality, max_quarantined=limit)) for m in models]
    if args.mode == "skip" and (args.files is None or args.layers != ["bronze"]):
        raise ConfigError("--mode skip sets landing files aside: it takes --files and --layers bronze")
    if args.files is not None:  # each table takes the named files of its topic: one no table takes would be lost
        unclaimed = sorted(f for f in args.files if not any(in_topic(f, t.topic) for t in tables))
        if unclaimed:
            raise ConfigError(f"{len(unclaimed)} landing file(s) in --files are of no selected table's topic: "
                              f"{', '.join(unclaimed[:5])}")
    # GX checks the user's expectations and actions before any work (and any JVM) starts
    for declared in [*(t.expectations for t in tables), *(m.expectations for m in models)]:
        validate(declared)
    for where, quality in [*((f"table {t.name!r}", t.quality) for t in tables),
                           *((f"gold model {m.name!r}", m.quality) for m in models)]:
        if quality.actions:
            validate_actions(quality.actions, where)
    try:
        window = LandingWindow.parse(args.since, args.until)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    selection = bronze.Selection(window, args.files, reprocess=args.mode == "reprocess")
    landing, lake = resolve_uri(args.landing), Lake(resolve_uri(args.lake))
    if "://" in lake.root and not lake.on_s3:
        raise ConfigError(f"lake {lake.root}: use a filesystem path (local or shared) or s3://bucket/prefix")
    if not LITERAL_LAKE.fullmatch(lake.root.split("://", 1)[-1]):
        raise ConfigError(f"lake {lake.root}: Spark reads a data file's path as a pattern and Hadoop a ':' in it as a "
                          "scheme, delta-rs decodes a '%': a lake's path holds none of {}[]*?\\%:")
    check_lock_timeout(lake)
    plan = RunPlan(tuple(tables), tuple(models), tuple(args.layers), args.mode, landing, lake,
                   args.run_id or new_batch_id(), selection, args.reason)
    started = time.monotonic()
    # Great Expectations takes seconds to import: let that overlap the JVM's start instead of following it
    threading.Thread(target=importlib.import_module, args=("great_expectations",), daemon=True).start()
    spark = build_session(f"cdc-{'-'.join(args.layers)}")
    engine = make_engine(spark)
    ui = spark.sparkContext.uiWebUrl
    log.info(f"run {plan.batch_id}: mode={plan.mode} engine={engine.name} landing={landing} lake={lake.root} "
             f"window={window.describe()} session_s={time.monotonic() - started:.3f} session_ready_at={time.time():.3f}"
             + (f" spark_ui={ui}" if ui else ""))
    no_docs = docs_assets.not_fetched()
    if no_docs:  # the gates and tables go on: their pages are a report, not a verdict (gx_project.Project.build_docs)
        log.warning(f"run {plan.batch_id}: no Data Docs pages are built in this run: {no_docs}")
    with Steps(spark, engine, lake, plan.batch_id) as steps:
        execute(plan, steps)
    return 0


def maintain(args: argparse.Namespace) -> int:
    """Without --tables, --models or --reports: everything (every table, every model, the reports)."""
    from spark_jobs import maintenance
    from spark_jobs.lake import Lake
    from spark_jobs.state import check_lock_timeout, new_batch_id, transactions_name

    registry = load_registry(args.config)
    everything = not (args.tables or args.models or args.reports)
    tables = registry.select(args.tables) if args.tables or everything else []
    models = [registry.gold[m] for m in registry.gold if everything or m in (args.models or [])]
    if args.models and len(models) != len(args.models):
        raise ConfigError(f"unknown gold model(s) in {args.models}; known: {', '.join(registry.gold)}")
    lake, batch_id = Lake(resolve_uri(args.lake)), args.run_id or new_batch_id()
    check_lock_timeout(lake)
    spark = None
    if settings().delta_engine != "delta-rs":  # delta-rs maintains without Spark; delta-spark's commands are jobs
        from spark_jobs.session import build_session

        spark = build_session("cdc-maintain")
    from spark_jobs.delta.engines import make_engine

    engine = make_engine(spark)

    def upkeep(fn: Any) -> Any:
        def step(spark: Any, engine: Any, *fn_args: Any) -> Any:
            summary = fn(engine, *fn_args)
            for delta in summary.tables:
                log.info(f"maintain {summary.table} {maintenance.DeltaUpkeep(**delta).line()}")
            return summary
        return step

    with Steps(spark, engine, lake, batch_id) as steps:
        for table in tables:
            steps.run(table.name, "maintenance", table.name, upkeep(maintenance.maintain_table), lake, table, batch_id,
                      resolve_uri(args.landing) if args.landing else None)
        for model in models:
            steps.run(model.name, "maintenance", f"gold.{model.name}", upkeep(maintenance.maintain_model), lake, model,
                      batch_id)
        for topic in sorted({m.transactions for m in models if m.transactions}):
            name = transactions_name(topic)
            steps.run(name, "maintenance", name, upkeep(maintenance.maintain_transactions), lake, topic,
                      registry.maintenance, batch_id)
        if args.reports or everything:
            expired = maintenance.expire_reports(engine, lake, registry)
            log.info(f"maintain reports: {len(expired)} run report(s) past "
                     f"{registry.maintenance.report_retention_s // 86400} days removed")
        steps.raise_failures()
    return 0


def serve(args: argparse.Namespace) -> int:
    from spark_jobs.service import serve as run_service

    return run_service(main, args.host, args.port, args.workers, args.connection_file, args.tls_cert, args.tls_key,
                       tuple(args.allow_host), args.token_file)


def service_credentials(args: argparse.Namespace) -> int:
    from spark_jobs.service_credentials import ServiceCredentials

    credentials = ServiceCredentials(Path(args.dir), Path(args.ca_file) if args.ca_file else None)
    made = credentials.ensure(args.host, args.port, args.conn_id)
    print(f"pipeline service credentials for {args.host}: {'made' if made else 'kept'}; its Airflow connection "
          f"{args.conn_id} is in {credentials.connection} ({credentials.airflow_import} for `airflow connections "
          "import`)")
    return 0


def spark_ui_token(args: argparse.Namespace) -> int:
    from spark_jobs.service_client import ServiceConnection
    from spark_jobs.service_client import spark_ui_token as token

    print(token(ServiceConnection.from_file(resolve(args.connection_file)).token))
    return 0


def make_buckets(args: argparse.Namespace) -> int:
    from spark_jobs.storage import ensure_bucket, is_s3, split_s3

    for uri in (args.landing, args.lake):
        if not is_s3(uri):
            raise ConfigError(f"{uri} is not an s3:// URI: only S3 buckets are made")
        print(f"bucket {split_s3(uri)[0]}: {'created' if ensure_bucket(uri) else 'exists'}")
    return 0


def fetch_assets(args: argparse.Namespace) -> int:
    from spark_jobs.quality import docs_assets

    fetched = docs_assets.fetch()
    print(f"Data Docs assets {'fetched: ' + ', '.join(fetched) if fetched else 'present'} in {docs_assets.assets_dir()}")
    return 0


def fetch_jars(args: argparse.Namespace) -> int:
    from spark_jobs import jvm

    if not jvm.missing():
        print(f"JVM jars present in {jvm.ivy_dir() / 'jars'}")
        return 0
    for path in jvm.fetch():
        print(path)
    return 0


def generate(args: argparse.Namespace) -> int:
    from spark_jobs.generate import Options
    from spark_jobs.generate import generate as write_files

    registry = load_registry(args.config)
    opts = Options(rows=args.rows, changes=args.changes, seed=args.seed, records_per_file=args.records_per_file,
                   partitions=args.partitions, compress=args.compress, format=args.format, batches=args.batches,
                   redeliver=args.redeliver, shuffle=args.shuffle, mix=args.mix, ends_ms=args.ends_ms,
                   phases=args.phases)
    for t in write_files(registry.select(args.tables), resolve_uri(args.landing), opts):
        print(f"{t.table:<22} topic={t.topic} events={t.events} tombstones={t.tombstones} files={len(t.files)} "
              f"final_rows={len(t.final_rows)}" + (f" batches={len(t.batches) - 1}" if args.batches else ""))
    return 0


def status(args: argparse.Namespace) -> int:
    from spark_jobs.delta.reads import row_count
    from spark_jobs.lake import Lake
    from spark_jobs.quality import docs_assets
    from spark_jobs.report import OLD_LAG_S, human_seconds, lag_text
    from spark_jobs.status import lake_status

    registry = load_registry(args.config)
    lake = Lake(resolve_uri(args.lake))
    state = lake_status(registry, lake, resolve_uri(args.landing) if args.landing else None)
    if args.json:
        print(json.dumps(state.as_dict(), indent=2))
        return 0
    empty = []
    # pending landing files only when the landing was listed (--landing), else the column would be empty on every row
    counted = args.landing is not None
    print(f"{'layer':<11}{'table':<24}{'rows':>8}  {'gate':<21}{'lag':>10}  " + ("pending  " if counted else "")
          + "last success")
    for item in state.tables:
        for layer, s in item.layers.items():
            if not s.rows:
                empty.append(f"{layer}/{item.name}")
            pending = "" if item.pending_files is None or layer != "bronze" else item.pending_files
            print(f"{layer:<11}{item.name:<24}{'-' if s.rows is None else s.rows:>8}  {s.last_verdict or '':<21}"
                  f"{human_seconds(s.lag_s):>10}  " + (f"{pending:>7}  " if counted else "") + (s.last_success or ""))
    for table in registry.tables.values():
        if table.history:
            rows = row_count(lake.history(table.name))
            print(f"{'silver':<11}{table.name + '_history':<24}{'-' if rows is None else rows:>8}")
    for item in state.tables:  # a table or model that never quarantined a record has no quarantine table: no row
        if item.quarantined_rows is not None:
            print(f"{'quarantine':<11}{item.name:<24}{item.quarantined_rows:>8}")
    old = [(s.lag_s, s.newest_change_at, f"{layer}/{item.name}") for item in state.tables
           for layer, s in item.layers.items() if s.lag_s is not None and s.lag_s >= OLD_LAG_S]
    if old:  # a quiet source (or old sample files) more often than a slow pipeline: say what the lag is measured from
        lag, newest, where = max(old)
        print(f"\nlag: now less the source commit time of the newest change a layer holds; {where}'s is "
              f"{lag_text(lag, newest)}")
    index = lake.reports_index
    docs = [p for p in lake.files.list(lake.data_docs("")) if p.count("/") == lake.data_docs("").count("/") + 1
            and p.endswith("/index.html")]
    print(f"\ntables:  {lake.root}/{{bronze,silver,gold,quarantine}}/<table>")
    print(f"reports: {index} (runs), {len(docs)} GX Data Docs sites under {lake.reports}/data_docs/")
    # no pages because their assets were never fetched: a report missing, said why, and no reason to call the lake
    # incomplete (the gates' verdicts and the tables do not depend on it)
    unbuilt = None if docs else docs_assets.not_fetched()
    if unbuilt:
        print(f"Data Docs: none built here: {unbuilt}")
    if args.require_tables and (empty or not lake.files.exists(index) or not (docs or unbuilt)):
        print(f"incomplete lake: empty or missing {', '.join(empty) or 'reports'}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    try:  # the options' defaults and the log's level come from the CDC_* settings
        args = parser().parse_args(argv)
        set_level(settings().log_level)
    except ValueError as exc:  # a setting that is not one (settings.setting_value says which, and what it must be)
        return _failed(f"config error: {exc}", 2)
    commands = {"run": run, "generate": generate, "status": status, "maintain": maintain, "serve": serve,
                "service-credentials": service_credentials, "spark-ui-token": spark_ui_token, "jars": fetch_jars,
                "assets": fetch_assets, "buckets": make_buckets}
    try:
        return commands[args.command](args)
    except ConfigError as exc:
        return _failed(f"config error: {exc}", 2)
    except InfrastructureDown as exc:
        return _failed(f"infrastructure: {exc}", EXIT_TRANSIENT)
    except LayerFailed as exc:
        return _failed(str(exc), EXIT_TRANSIENT if exc.transient else 1)
    except OSError as exc:  # outside every table's step (the run's report, the event log, a listing)
        storage = storage_failure(exc)
        if storage is None:
            raise
        return _failed(f"infrastructure: {storage}", EXIT_TRANSIENT)


def _failed(line: str, code: int) -> int:
    print(line, file=sys.stderr)
    failure_file = environ.get(Settings.variable("failure_file"), "")  # where the Airflow task reads the line from
    if failure_file:
        Path(failure_file).write_text(line + "\n")
    return code
