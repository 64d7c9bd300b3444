"""Landing files written by the Kafka Connect S3 sink (docs/architecture.md, "Landing layout"), on a local path or `s3://bucket/prefix`:
one listing code path over two stores, and where Spark reads each file.

S3 credentials and endpoint come from the AWS_* settings (spark_jobs/storage.py), else boto3's usual
sources (profiles, instance roles); the Airflow tasks turn the `aws_default` connection into those
(cdc_airflow.hooks)."""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import os
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from spark_jobs.errors import LandingChanged

JSON_EXTENSIONS = (".json", ".json.gz")
PARQUET_EXTENSIONS = (".snappy.parquet", ".gz.parquet", ".parquet")
AVRO_EXTENSIONS = (".avro",)


@dataclass(frozen=True)
class LandingFile:
    path: str  # relative to the landing root: topics/<topic>/.../<file>
    size: int
    modified_ms: int  # the landing time: when the sink wrote the file (S3 LastModified, local mtime)
    problem: str | None = None  # why the file cannot be opened (a dangling link, a link loop), found when listing
    # the S3 sink's file of these records' Kafka keys (store.kafka.keys=true, JSON), when listed beside it
    keys_file: LandingFile | None = field(default=None, compare=False)

    @property
    def kind(self) -> str:
        if self.path.endswith(JSON_EXTENSIONS):
            return "json"
        if self.path.endswith(PARQUET_EXTENSIONS):
            return "parquet"
        if self.path.endswith(AVRO_EXTENSIONS):
            return "avro"
        return "unsupported"


def check_landing_path(path: str) -> str:
    """A landing file as the sensor names it (relative to the landing root, `topics/<topic>/...`), or ValueError:
    nothing named to bronze may lie outside the landing root."""
    parts = path.split("/") if isinstance(path, str) else []
    if (len(parts) < 3 or parts[0] != "topics" or any(p in ("", ".", "..") for p in parts)
            or "\\" in path or "\0" in path or ":" in parts[0]):
        raise ValueError(f"landing file {path!r}: a path relative to the landing root, topics/<topic>/.../<file>, "
                         "without '.' or '..' parts")
    return path


def in_topic(path: str, topic: str) -> bool:
    """Is the landing file (a path as the sensor names it) one of the topic's?"""
    return path.startswith(f"topics/{topic}/")


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
    # (path under the root, size, modified_ms, problem opening it or None); a folder's files after its mark only
    def walk(self, prefix: str, marks: Mapping[str, str]) -> Iterator[tuple[str, int, int, str | None]]: ...


def folder_of(path: str) -> str:
    return path.rsplit("/", 1)[0]


def _after_mark(path: str, marks: Mapping[str, str]) -> bool:
    mark = marks.get(folder_of(path))
    return mark is None or path > mark


OUTSIDE_LANDING = "not read: it resolves outside the landing root (a link)"


class LocalStore:
    def __init__(self, root: str):
        self.root = Path(root)

    def walk(self, prefix: str, marks: Mapping[str, str]) -> Iterator[tuple[str, int, int, str | None]]:
        """Files that resolve outside the landing root (a link planted under it) are listed with their problem, to be
        quarantined by name and never opened: the landing root is what the operator handed the pipeline to read."""
        base, root = self.root / prefix, self.root.resolve()
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
            for name in filenames:
                full = Path(dirpath) / name
                relative = full.relative_to(self.root).as_posix()
                if not _after_mark(relative, marks):
                    continue
                try:
                    stat = full.stat()
                except OSError as exc:  # a dangling link or a link loop: listed, to be quarantined by name
                    yield relative, 0, int(full.lstat().st_mtime * 1000), f"cannot open: {exc.strerror}"
                    continue
                if not full.resolve().is_relative_to(root):
                    yield relative, 0, int(full.lstat().st_mtime * 1000), OUTSIDE_LANDING
                    continue
                yield relative, stat.st_size, int(stat.st_mtime * 1000), None


class S3Store:
    def __init__(self, uri: str, client: Any = None):
        parsed = urlparse(uri)
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        if client is None:
            from spark_jobs.storage import s3_client

            client = s3_client()
        self.client = client

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def walk(self, prefix: str, marks: Mapping[str, str]) -> Iterator[tuple[str, int, int, str | None]]:
        """Each folder under `prefix` listed from after its mark (S3 lists keys in order: StartAfter skips what
        is marked without listing it); folders without a mark (time-based layouts nest) in full."""
        top = self._key(prefix) + "/"
        paginator = self.client.get_paginator("list_objects_v2")
        folders, loose = [], []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=top, Delimiter="/"):
            folders += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
            loose += page.get("Contents", [])
        yield from self._objects(loose, marks)
        for folder in folders:
            mark = marks.get(self._relative(folder.rstrip("/")))
            pages = paginator.paginate(Bucket=self.bucket, Prefix=folder, **({"StartAfter": self._key(mark)} if mark else {}))
            yield from self._objects([obj for page in pages for obj in page.get("Contents", [])], marks)

    def _relative(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    def _objects(self, objects: list[dict[str, Any]], marks: Mapping[str, str]) -> Iterator[tuple[str, int, int, str | None]]:
        for obj in objects:
            path = self._relative(obj["Key"])
            if any(part.startswith((".", "_")) for part in path.split("/")[:-1]) or not _after_mark(path, marks):
                continue  # temp/marker folders, as os.walk skips locally
            yield path, int(obj["Size"]), int(obj["LastModified"].timestamp() * 1000), None

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


# The S3 sink's names: <topic>+<partition>+<start offset>, then the value file's extension, or `.keys` or `.headers`
# and that file's own (store.kafka.keys / store.kafka.headers: each line the key or headers of the value's line)
_SINK_NAME = re.compile(r"^(.*\+[0-9]+\+[0-9]+)(\.(keys|headers))?\.[^/]*$")
KEY_EXTENSIONS = (".keys.json", ".keys.json.gz")


def list_topic(landing: str, topic: str, s3_client: Any = None, marks: Mapping[str, str] | None = None) -> list[LandingFile]:
    """Every data file under <landing>/topics/<topic>/, both partitioner layouts, sorted by path; with `marks`
    (folder -> the last file of it bronze has taken with every file before it), only those after their
    folder's mark: the sink names files by offset, so listing costs what is new, not the topic's history.
    Names starting with '.' or '_' are writer temp/marker files, not data; the sink's key and header files are
    not data either: a value file names its JSON key file (`keys_file`) when that is listed too."""
    listed = [(path, size, modified, problem) for path, size, modified, problem in
              open_store(landing, s3_client).walk(f"topics/{topic}", marks or {})
              if not path.rsplit("/", 1)[-1].startswith((".", "_"))]
    # (the file's sink name without extensions, whether it is a key or header file) for the sink's names
    names = {path: (m.group(1), m.group(3)) for path, *_ in listed if (m := _SINK_NAME.match(path))}
    keys = {names[path][0]: LandingFile(path, size, modified, problem) for path, size, modified, problem in listed
            if path in names and names[path][1] == "keys" and path.endswith(KEY_EXTENSIONS)}
    files = [LandingFile(path, size, modified, problem, keys.get(names[path][0]) if path in names else None)
             for path, size, modified, problem in listed if path not in names or names[path][1] is None]
    return sorted(files, key=lambda f: f.path)


def staged_name(index: int, f: LandingFile) -> str:
    """A staged file's name: its number and its extension only."""
    ext = next((e for e in (*JSON_EXTENSIONS, *PARQUET_EXTENSIONS, *AVRO_EXTENSIONS) if f.path.endswith(e)), "")
    return f"{index:07d}{ext}"


# Spark takes paths as Hadoop paths and glob patterns, and names files by their URL-encoded URI: a name
# holding `*`, `?`, `[`, `{`, `\\`, `:`, a space or `%` would be expanded, refused or renamed. The S3 sink's
# own names (topic+partition+offset.ext under topic and partition folders) are read where they are on S3.
_LITERAL_PATH = re.compile(r"[A-Za-z0-9._+=/-]+")


def spark_paths(landing: str, files: list[LandingFile], staging: str) -> dict[str, LandingFile]:
    """Where Spark reads each of `files`, mapped back to the landing file it is. On S3 the landing file itself
    (`s3a://`, so a cluster's executors read it there), or for a name Spark cannot take literally a copy in `staging`
    (a prefix of the lake) under a safe name (`staged_name`). A local file is opened here, and kept only when what is
    open is a regular file inside the landing root (`open_inside`), then staged from that descriptor: hard-linked
    into `staging` (copied where it cannot be), so what Spark reads is the file that was checked, whatever the landing
    holds by then (a link swapped in after the listing was read from outside the root). Files that cannot be opened
    are left out."""
    from spark_jobs.storage import is_s3, s3_client, split_s3

    paths, client, store = {}, None, None
    for index, f in enumerate(files):
        if f.problem:
            continue
        source = landing_uri(landing, f)
        target = f"{staging}/{staged_name(index, f)}"
        if is_s3(source) and _LITERAL_PATH.fullmatch(source.split("://", 1)[-1]):  # the landing's own root counts too
            paths[source] = f
            continue
        if is_s3(staging):
            bucket, key = split_s3(target)
            client = client or s3_client()
            if is_s3(source):
                from_bucket, from_key = split_s3(source)
                client.copy({"Bucket": from_bucket, "Key": from_key}, bucket, key)
            else:
                with open_inside(landing, source) as handle:
                    client.upload_fileobj(handle, bucket, key)
        else:
            Path(staging).mkdir(parents=True, exist_ok=True)
            if is_s3(source):
                store = store or S3Store(landing)
                store.download(f.path, Path(target))
            else:
                with open_inside(landing, source) as handle:
                    _stage(handle, source, Path(target))
        paths[target] = f
    return paths


def open_inside(landing: str, path: str) -> Any:
    """The local landing file at `path`, open for reading, when what is open is a regular file that lies inside
    the landing root: judged by the descriptor's own path, which no later change of the folders alters (a link within
    the root is read as its file, as the listing lists it); LandingChanged otherwise."""
    import stat

    root = Path(landing.removeprefix("file://")).resolve()
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise LandingChanged(f"landing file {path} is not a file to read ({exc.strerror}): changed since it was "
                             "listed") from exc
    handle = os.fdopen(descriptor, "rb")
    opened = Path(f"/proc/self/fd/{descriptor}")
    where = Path(os.readlink(opened)) if opened.is_symlink() else Path(path).resolve()
    if not stat.S_ISREG(os.fstat(descriptor).st_mode) or not where.is_relative_to(root):
        handle.close()
        raise LandingChanged(f"landing file {path} now resolves to {where}, outside the landing root, or is not a "
                             "file: changed since it was listed")
    return handle


def _stage(handle: Any, source: str, target: Path) -> None:
    """The open file at `target` too: a hard link to it (the same file, no copy), else a copy of its bytes. The link is
    made to the name the descriptor has (a descriptor's /proc link itself cannot be linked across mounts), so it counts
    only when it is the very file open (device and inode): a name swapped in between is LandingChanged."""
    import shutil

    try:
        os.link(os.readlink(f"/proc/self/fd/{handle.fileno()}"), target, follow_symlinks=False)
    except OSError:  # another filesystem, links of others' files not allowed (fs.protected_hardlinks), no /proc
        with target.open("wb") as copy:
            shutil.copyfileobj(handle, copy, 2**20)
        return
    opened, linked = os.fstat(handle.fileno()), os.lstat(target)
    if (opened.st_dev, opened.st_ino) != (linked.st_dev, linked.st_ino):
        target.unlink()
        raise LandingChanged(f"landing file {source} was replaced while it was staged: changed since it was listed")


def landing_uri(landing: str, f: LandingFile) -> str:
    """The file's full location: `s3a://bucket/key` (hadoop-aws' filesystem, which Spark reads with) or an
    absolute path."""
    if is_remote(landing):
        return "s3a://" + landing.removeprefix("s3://").rstrip("/") + "/" + f.path
    return os.path.abspath(os.path.join(landing.removeprefix("file://"), f.path))


def read_problem(path: str) -> str | None:
    """Why a landing file cannot be read whole, in words (`Not a gzipped file`, `Compressed file ended before the
    end-of-stream marker was reached`), or None: read (and decompressed) as a stream, in constant memory."""
    return _read_through(path)[1]


def _read_through(path: str) -> tuple[bytes, str | None]:
    """The first bytes of a file's content and why it cannot be read to its end (None: it can), read as a stream."""
    from spark_jobs.storage import open_input

    try:
        with open_input(path) as handle:
            stream = gzip.GzipFile(fileobj=handle) if path.endswith(".gz") else handle
            head = chunk = stream.read(2**20)
            while chunk:
                chunk = stream.read(2**20)
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        return b"", str(exc) or type(exc).__name__
    return head[:4], None


def landing_read_problem(path: str) -> str | None:
    """Why a landing file Spark read no line from cannot be read, or None when it holds no line (only the
    byte-order mark the reader drops). A file that reads here and has lines is not quarantined: Spark's failure
    was something else, and the batch fails with it."""
    head, problem = _read_through(path)
    if problem is None and head not in (b"", b"\xef\xbb\xbf"):
        raise RuntimeError(f"Spark read no text from {path}, which reads here: refusing to quarantine a readable file")
    return problem


EXCERPT_BYTES = 1024  # what a quarantine row keeps of a line too large to parse (the whole line stays in its file)


def exact_line(chunk: bytes, max_line_bytes: int) -> tuple[str, str | None]:
    """(text, problem) of a line holding bytes that are not UTF-8, byte for byte as it stands in its file (without
    the CR of a CRLF; Hadoop's line reader drops the byte-order mark opening a file): its bytes as base64 with the
    problem `invalid_utf8`, or an excerpt when it is too large to keep."""
    chunk = chunk.removesuffix(b"\r")
    if len(chunk) > max_line_bytes:
        return chunk[:EXCERPT_BYTES].decode("utf-8", "replace"), line_too_large(len(chunk), max_line_bytes)
    try:
        return chunk.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return (base64.b64encode(chunk).decode("ascii"),
                f"invalid_utf8: byte {exc.start} is not UTF-8; the line's bytes are kept as base64 in _raw")


def file_too_large(name: str, size: int, limit: int) -> str:
    return (f"file_too_large: {name}: {size} bytes of gzip, over CDC_MAX_GZIP_BYTES ({limit}); a gzip file cannot be "
            "split, so one task would read it all: land it uncompressed or in smaller files, or raise the limit and "
            "reprocess it")


def line_too_large(size: int | str, limit: int) -> str:
    return f"line_too_large: {size} bytes (max {limit}, CDC_MAX_LINE_BYTES); the line stays whole in its landing file"
