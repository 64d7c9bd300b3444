"""Lake layout (DESIGN 3.5) and the pipeline's own state: the ingest log (which landing files bronze has
taken) and per-layer progress (which bronze version silver has applied)."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.landing import LandingFile, list_topic


@dataclass(frozen=True)
class Lake:
    root: str

    def bronze(self, table: str) -> str:
        return f"{self.root}/bronze/{table}"

    def silver(self, table: str) -> str:
        return f"{self.root}/silver/{table}"

    def gold(self, model: str) -> str:
        return f"{self.root}/gold/{model}"

    def quarantine(self, table: str) -> str:
        return f"{self.root}/quarantine/{table}"

    def ingest_log(self, table: str) -> str:
        return f"{self.root}/_state/ingest_log/{table}"

    def tombstones(self, table: str) -> str:
        return f"{self.root}/_state/tombstones/{table}"

    def history(self, table: str) -> str:
        return f"{self.root}/silver/{table}_history"

    def truncates(self, table: str) -> str:
        return f"{self.root}/_state/truncates/{table}"

    def progress(self, table: str) -> str:
        return f"{self.root}/_state/progress/{table}"

    @property
    def reports(self) -> str:
        return f"{self.root}/reports"


def new_batch_id() -> str:
    """Sortable by time, unique across concurrent runs."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(2)


def ingested_files(lake: Lake, table: str) -> set[str]:
    """Landing files already in bronze, read without Spark (the sensor calls this) and without
    delta-rs' dataset readers: pyarrow.parquet over the log's active files."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        files = DeltaTable(lake.ingest_log(table)).file_uris()
    except TableNotFoundError:
        return set()
    if not files:
        return set()
    return set(pq.read_table([_local(f) for f in files], columns=["file"]).column("file").to_pylist())


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


def pending_files(landing: str, lake: Lake, table: str, topic: str) -> list[LandingFile]:
    done = ingested_files(lake, table)
    return [f for f in list_topic(landing, topic) if f.path not in done]


def ensure_dir(path: str) -> Path:
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p
