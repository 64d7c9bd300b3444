"""The pipeline's own state outside Delta's commits: the ingest log (which landing files bronze has taken,
read without Spark for the sensor), the writer lock per table, and batch ids."""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spark_jobs.errors import TableBusy
from spark_jobs.lake import Lake, ensure_dir
from spark_jobs.landing import LandingFile, LandingWindow, list_topic
from spark_jobs.settings import settings


def new_batch_id() -> str:
    """Sortable by time, unique across concurrent runs."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(2)


def ingest_log(lake: Lake, table: str, columns: list[str]) -> dict[str, list[Any]]:
    """Columns of the ingest log (which landing files bronze took, in which bronze version), read without
    Spark (the sensor calls this) and without delta-rs' dataset readers: pyarrow.parquet over the log's
    active files."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from spark_jobs.delta.features import query, unplain_features

    try:
        log = DeltaTable(lake.ingest_log(table))
    except TableNotFoundError:
        return {c: [] for c in columns}
    if unplain_features(log):
        return query(log, f"SELECT {', '.join(columns)} FROM t")
    files = log.file_uris()
    if not files:
        return {c: [] for c in columns}
    return pq.read_table([_local(f) for f in files], columns=columns).to_pydict()


def ingested_files(lake: Lake, table: str) -> set[str]:
    """Landing files already in bronze."""
    return set(ingest_log(lake, table, ["file"])["file"])


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def pending_files(landing: str, lake: Lake, table: str, topic: str, window: LandingWindow | None = None,
                  s3_client: Any = None) -> list[LandingFile]:
    """Landing files of the topic in the landing-time window that bronze has not taken yet."""
    done, window = ingested_files(lake, table), window or LandingWindow()
    return [f for f in list_topic(landing, topic, s3_client) if f.path not in done and f in window]


@contextmanager
def writer_lock(lake: Lake, name: str, holder: str, timeout_s: float | None = None) -> Iterator[None]:
    """One writer per table (all its layers: they share quarantine and state) or gold model, whoever
    starts it: Airflow DAGs, replays or the CLI. An OS file lock, so a killed run releases it. Waits up
    to CDC_LOCK_TIMEOUT seconds (default 900) for the other writer."""
    timeout_s = settings().lock_timeout if timeout_s is None else timeout_s
    path = Path(lake.lock(name))
    ensure_dir(str(path.parent))
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    raise TableBusy(f"{name} is being written by another run ({handle.read().strip() or 'unknown'}); "
                                    f"waited {timeout_s:.0f}s") from None
                time.sleep(0.5)
        handle.seek(0)
        handle.truncate()
        handle.write(f"run {holder}, pid {os.getpid()}, since {dt.datetime.now(dt.UTC).isoformat()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


