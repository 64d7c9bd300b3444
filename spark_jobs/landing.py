"""Listing landing files written by the Kafka Connect S3 sink (DESIGN 3.1)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

JSON_EXTENSIONS = (".json", ".json.gz")
PARQUET_EXTENSIONS = (".snappy.parquet", ".gz.parquet", ".parquet")


@dataclass(frozen=True)
class LandingFile:
    path: str  # relative to the landing root: topics/<topic>/.../<file>
    size: int
    modified_ms: int

    @property
    def kind(self) -> str:
        if self.path.endswith(JSON_EXTENSIONS):
            return "json"
        if self.path.endswith(PARQUET_EXTENSIONS):
            return "parquet"
        return "unsupported"


def list_topic(landing: str, topic: str) -> list[LandingFile]:
    """Every data file under <landing>/topics/<topic>/, both partitioner layouts, sorted by path.
    Names starting with '.' or '_' are writer temp/marker files, not data."""
    if "://" in landing:
        raise NotImplementedError(f"landing {landing}: only local paths are read by this version")
    root = Path(landing)
    base = root / "topics" / topic
    if not base.is_dir():
        return []
    files = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        for name in filenames:
            if name.startswith((".", "_")):
                continue
            full = Path(dirpath) / name
            stat = full.stat()
            files.append(LandingFile(full.relative_to(root).as_posix(), stat.st_size, int(stat.st_mtime * 1000)))
    return sorted(files, key=lambda f: f.path)
