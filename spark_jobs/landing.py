"""Landing files written by the Kafka Connect S3 sink (DESIGN 3.1), on a local path or `s3://bucket/prefix`:
one listing code path over two stores, and staging of S3 files to a local folder for Spark.

S3 credentials and endpoint come from boto3's usual sources (AWS_* environment, profiles, instance
roles); the Airflow tasks turn the `aws_default` connection into those (spark_jobs.orchestration)."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

JSON_EXTENSIONS = (".json", ".json.gz")
PARQUET_EXTENSIONS = (".snappy.parquet", ".gz.parquet", ".parquet")


@dataclass(frozen=True)
class LandingFile:
    path: str  # relative to the landing root: topics/<topic>/.../<file>
    size: int
    modified_ms: int  # the landing time: when the sink wrote the file (S3 LastModified, local mtime)

    @property
    def kind(self) -> str:
        if self.path.endswith(JSON_EXTENSIONS):
            return "json"
        if self.path.endswith(PARQUET_EXTENSIONS):
            return "parquet"
        return "unsupported"


@dataclass(frozen=True)
class LandingWindow:
    """Landing times [since, until) in epoch milliseconds; None is unbounded."""

    since_ms: int | None = None
    until_ms: int | None = None

    def __contains__(self, f: LandingFile) -> bool:
        return ((self.since_ms is None or f.modified_ms >= self.since_ms)
                and (self.until_ms is None or f.modified_ms < self.until_ms))

    @classmethod
    def parse(cls, since: str | None, until: str | None) -> LandingWindow:
        """From ISO 8601 timestamps (naive ones are UTC); raises ValueError naming the bad bound."""
        bounds: list[int | None] = []
        for name, value in (("since", since), ("until", until)):
            if value in (None, ""):
                bounds.append(None)
                continue
            try:
                moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"{name}: {value!r} is not an ISO 8601 date or timestamp") from None
            moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
            bounds.append(int(moment.timestamp() * 1000))
        if bounds[0] is not None and bounds[1] is not None and bounds[0] >= bounds[1]:
            raise ValueError(f"since ({since}) must be before until ({until})")
        return cls(bounds[0], bounds[1])

    def describe(self) -> str:
        def iso(ms: int | None) -> str:
            return "..." if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()
        return f"[{iso(self.since_ms)}, {iso(self.until_ms)})"


class Store(Protocol):
    def walk(self, prefix: str) -> Iterator[tuple[str, int, int]]: ...  # (path under the root, size, modified_ms)


class LocalStore:
    def __init__(self, root: str):
        self.root = Path(root)

    def walk(self, prefix: str) -> Iterator[tuple[str, int, int]]:
        base = self.root / prefix
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
            for name in filenames:
                full = Path(dirpath) / name
                stat = full.stat()
                yield full.relative_to(self.root).as_posix(), stat.st_size, int(stat.st_mtime * 1000)


class S3Store:
    def __init__(self, uri: str, client: Any = None):
        parsed = urlparse(uri)
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        if client is None:
            import boto3

            client = boto3.client("s3")
        self.client = client

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def walk(self, prefix: str) -> Iterator[tuple[str, int, int]]:
        start = len(self.prefix) + 1 if self.prefix else 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix) + "/"):
            for obj in page.get("Contents", []):
                if any(part.startswith((".", "_")) for part in obj["Key"][start:].split("/")[:-1]):
                    continue  # temp/marker folders, as os.walk skips locally
                yield obj["Key"][start:], int(obj["Size"]), int(obj["LastModified"].timestamp() * 1000)

    def download(self, path: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self._key(path), str(dest))


def is_remote(landing: str) -> bool:
    return landing.startswith("s3://")


def open_store(landing: str, s3_client: Any = None) -> Store:
    if is_remote(landing):
        return S3Store(landing, s3_client)
    if "://" in landing and not landing.startswith("file://"):
        raise ValueError(f"landing {landing}: use a local path or s3://bucket/prefix")
    return LocalStore(landing.removeprefix("file://"))


def list_topic(landing: str, topic: str, s3_client: Any = None) -> list[LandingFile]:
    """Every data file under <landing>/topics/<topic>/, both partitioner layouts, sorted by path.
    Names starting with '.' or '_' are writer temp/marker files, not data."""
    files = [LandingFile(path, size, modified) for path, size, modified in
             open_store(landing, s3_client).walk(f"topics/{topic}")
             if not path.rsplit("/", 1)[-1].startswith((".", "_"))]
    return sorted(files, key=lambda f: f.path)


def stage(landing: str, files: list[LandingFile], dest: Path, s3_client: Any = None) -> str:
    """A local landing root holding `files` under their landing paths: the landing itself when local, else
    a copy in `dest` (Spark on the embedded default has no S3 filesystem)."""
    if not is_remote(landing):
        return landing
    store = S3Store(landing, s3_client)
    for f in files:
        store.download(f.path, dest / f.path)
    return str(dest)
