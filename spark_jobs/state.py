"""Lake layout (DESIGN 3.5) and the pipeline's own state: the ingest log (which landing files bronze has
taken) and per-layer progress (which bronze version silver has applied)."""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_jobs.landing import LandingFile, LandingWindow, list_topic


@dataclass(frozen=True)
class Lake:
    """Paths in the lake. `staging`, when set, holds silver and its state (ledger, history, truncate log)
    elsewhere: a rebuild computes them there and publishes them when its gate has passed."""

    root: str
    staging: str | None = None

    @property
    def _silver_root(self) -> str:
        return self.staging or self.root

    def staged(self, table: str) -> Lake:
        return Lake(self.root, f"{self.root}/_state/rebuild/{table}")

    def bronze(self, table: str) -> str:
        return f"{self.root}/bronze/{table}"

    def silver(self, table: str) -> str:
        return f"{self._silver_root}/silver/{table}"

    def gold(self, model: str) -> str:
        return f"{self.root}/gold/{model}"

    def quarantine(self, table: str) -> str:
        return f"{self.root}/quarantine/{table}"

    def ingest_log(self, table: str) -> str:
        return f"{self.root}/_state/ingest_log/{table}"

    def tombstones(self, table: str) -> str:
        return f"{self._silver_root}/_state/tombstones/{table}"

    def history(self, table: str) -> str:
        return f"{self._silver_root}/silver/{table}_history"

    def truncates(self, table: str) -> str:
        return f"{self._silver_root}/_state/truncates/{table}"

    def pending_tombstones(self, table: str) -> str:
        """Kafka tombstone lines whose previous record (the delete they follow) has not landed yet."""
        return f"{self.root}/_state/pending_tombstones/{table}"

    @property
    def staging_files(self) -> str:
        """Landing files staged for a bronze run (links or S3 downloads under Spark-safe names)."""
        return f"{self.root}/_state/staging"

    def progress(self, table: str) -> str:
        return f"{self.root}/_state/progress/{table}"

    @property
    def reports(self) -> str:
        return f"{self.root}/reports"


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

    try:
        files = DeltaTable(lake.ingest_log(table)).file_uris()
    except TableNotFoundError:
        files = []
    if not files:
        return {c: [] for c in columns}
    return pq.read_table([_local(f) for f in files], columns=columns).to_pydict()


def ingested_files(lake: Lake, table: str) -> set[str]:
    """Landing files already in bronze."""
    return set(ingest_log(lake, table, ["file"])["file"])


def row_count(path: str) -> int | None:
    """Rows in a Delta table from its file statistics (no data read, no JVM); None when absent."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        actions = DeltaTable(path).get_add_actions(flatten=True)
    except TableNotFoundError:
        return None
    return sum(v for v in actions.column("num_records").to_pylist() if v is not None)


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def pending_files(landing: str, lake: Lake, table: str, topic: str, window: LandingWindow | None = None,
                  s3_client: Any = None) -> list[LandingFile]:
    """Landing files of the topic in the landing-time window that bronze has not taken yet."""
    done, window = ingested_files(lake, table), window or LandingWindow()
    return [f for f in list_topic(landing, topic, s3_client) if f.path not in done and f in window]


class TableBusy(RuntimeError):
    """Another run writes the table: transient, the retry waits its turn."""


@contextmanager
def writer_lock(lake: Lake, name: str, holder: str, timeout_s: float | None = None) -> Iterator[None]:
    """One writer per table (all its layers: they share quarantine and state) or gold model, whoever
    starts it: Airflow DAGs, replays or the CLI. An OS file lock, so a killed run releases it. Waits up
    to CDC_LOCK_TIMEOUT seconds (default 900) for the other writer."""
    timeout_s = float(os.environ.get("CDC_LOCK_TIMEOUT", "900")) if timeout_s is None else timeout_s
    path = ensure_dir(f"{lake.root}/_state/locks") / f"{name}.lock"
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


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write aside, then rename over: a reader (or a run killed mid-write) sees the old file or the new one,
    never a truncated one."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(aside, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(aside, path)


def ensure_dir(path: str) -> Path:
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p
