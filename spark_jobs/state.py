"""The pipeline's own state outside Delta's commits: the ingest log (which landing files bronze has taken,
read without Spark for the sensor), the writer lock per table (a file lock, or a lease on S3), and batch ids."""

from __future__ import annotations

import contextvars
import datetime as dt
import fcntl
import json
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from spark_jobs.delta.reads import read_columns
from spark_jobs.errors import ConfigError, TableBusy
from spark_jobs.lake import Lake
from spark_jobs.landing import LandingFile, LandingWindow, folder_of, list_topic
from spark_jobs.logs import logger
from spark_jobs.settings import environ, settings

log = logger(__name__)


def new_batch_id() -> str:
    """Sortable by time, unique across concurrent runs."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(2)


def transactions_name(topic: str) -> str:
    """The name a connector's transaction topic's ingest log, landing marks, quarantine and writer lock go under
    (layers/transactions.py); a table's name never has a dot."""
    return f"transactions.{topic}"


def ingest_log(lake: Lake, table: str, columns: list[str], env: Mapping[str, str] = environ) -> dict[str, list[Any]]:
    """Columns of the ingest log (which landing files bronze took, in which bronze version), read without
    Spark: the sensor calls this. `env` holds an S3 lake's AWS_* settings (spark_jobs/storage.py)."""
    return read_columns(lake.ingest_log(table), columns, env) or {c: [] for c in columns}


def ingested_files(lake: Lake, table: str, env: Mapping[str, str] = environ) -> set[str]:
    """Landing files already in bronze."""
    return set(ingest_log(lake, table, ["file"], env)["file"])


def pending_files(landing: str, lake: Lake, table: str, topic: str, window: LandingWindow | None = None,
                  s3_client: Any = None, env: Mapping[str, str] = environ) -> list[LandingFile]:
    """Landing files of the topic in the landing-time window that bronze has not taken yet; the listing
    starts after the table's landing marks. `s3_client` (the landing's) also reads an S3 lake's marks."""
    marks = read_marks(lake, table, s3_client if lake.on_s3 else None)
    listed = list_topic(landing, topic, s3_client, marks)
    done, window = ingested_files(lake, table, env) if listed else set(), window or LandingWindow()
    return [f for f in listed if f.path not in done and f in window]


SINK_NAME = re.compile(r"\+\d+\+\d{10,}\.[^/]+$")


def read_marks(lake: Lake, table: str, s3_client: Any = None) -> dict[str, str]:
    """The table's landing marks: per landing folder, the last file (by name, which the S3 sink orders by
    offset) that bronze has taken with every file before it. Nothing at or before a mark is ever pending."""
    from spark_jobs.storage import S3Files

    files = S3Files(s3_client) if s3_client is not None else lake.files
    data = files.read(lake.landing_marks(table))
    return {} if data is None else dict(json.loads(data))


def repair_marks(landing: str, lake: Lake, table: str, topic: str) -> list[str]:
    """The marks recomputed from a full listing (maintenance, daily): returns the files that landed late under
    a name before their folder's mark, which the sensor's listings skip; from now on they are listed."""
    marks, listed = read_marks(lake, table), list_topic(landing, topic)
    taken = ingested_files(lake, table)
    late = [f.path for f in listed if f.path not in taken and f.path <= marks.get(folder_of(f.path), "")]
    advance_marks(lake, table, {}, listed, taken)
    return late


def advance_marks(lake: Lake, table: str, marks: dict[str, str], listed: list[LandingFile], taken: set[str]) -> None:
    """Moves each folder's mark from `marks` (those the listing started after; {} for a full listing, which
    computes them afresh) over the listed files that are taken, up to the first one that is not (a file a
    window left for later keeps every later file listed). Written under the table's writer lock."""
    moved = dict(marks)
    stopped: set[str] = set()
    for f in sorted(listed, key=lambda f: f.path):
        folder = folder_of(f.path)
        if folder in stopped or f.path <= moved.get(folder, ""):
            continue
        # only the sink's names (<topic>+<partition>+<zero-padded start offset>) promise that a later file
        # sorts after every earlier one: a folder of other names is always listed in full
        if f.path in taken and SINK_NAME.search(f.path):
            moved[folder] = f.path
        else:
            stopped.add(folder)
    if moved != read_marks(lake, table):
        lake.files.write(lake.landing_marks(table), json.dumps(moved, indent=1, sort_keys=True))


@contextmanager
def writer_lock(lake: Lake, name: str, holder: str, timeout_s: float | None = None) -> Iterator[None]:
    """One writer per table (all its layers: they share quarantine and state) or gold model, whoever
    starts it: Airflow DAGs, replays or the CLI. Waits up to CDC_LOCK_TIMEOUT seconds (default 900) for the
    other writer. An OS file lock on a filesystem lake, so a killed run releases it; a lease on S3."""
    timeout_s = settings().lock_timeout if timeout_s is None else timeout_s
    about = f"run {holder}, pid {os.getpid()}, host {process_space()}, since {dt.datetime.now(dt.UTC).isoformat()}"
    lock = _s3_lease if lake.on_s3 else _file_lock
    with lock(lake.lock(name), name, about, timeout_s):
        yield


def check_lock_timeout(lake: Lake) -> None:
    """A lease left by a killed writer on another host lapses after LEASE_S unchanged: a waiter giving up sooner
    could never take it over, so a shorter CDC_LOCK_TIMEOUT is refused before any work."""
    timeout_s = settings().lock_timeout
    if lake.on_s3 and timeout_s < LEASE_S:
        raise ConfigError(f"CDC_LOCK_TIMEOUT={timeout_s:g} is shorter than the lease of an S3 lake's writer lock "
                          f"({LEASE_S:g} s): a lock left by a killed run could never be taken over; set it to at least "
                          f"{LEASE_S:g}")


def _waiting(name: str, holder: str, timeout_s: float) -> None:
    log.info(f"waiting for the writer lock of {name}, held by {holder or 'another run'}; up to {timeout_s:.0f}s "
             "(CDC_LOCK_TIMEOUT)")


_HOLDER = re.compile(r"^run \S+, pid (\d+), host ([^,\s]+),")


@lru_cache(maxsize=1)
def process_space() -> str:
    """Where a pid names the same process as here: the host's name, the machine's boot and this process's pid
    namespace (Linux: every container has its own, whatever hostname compose gives it), e.g.
    `pipeline-service@1b2c3d4e.4026532201`. A name alone let a live holder in another container with the same hostname
    be taken for dead, its pid not found here."""
    name = socket.gethostname()
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().split("-")[0]
        return f"{name}@{boot}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # not Linux: the host's name is all there is
        return name


def _holder_is_gone(about: str) -> bool:
    """Whether a lease's holder is provably dead: a process of this pid namespace (`process_space`) whose pid no longer
    exists. (A holder elsewhere cannot be checked from here: its lease lapses once left unrenewed for LEASE_S.)"""
    match = _HOLDER.match(about)
    if match is None or match[2] != process_space():
        return False
    try:
        os.kill(int(match[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


@contextmanager
def _file_lock(path: str, name: str, about: str, timeout_s: float) -> Iterator[None]:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline, said = time.monotonic() + timeout_s, False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    handle.seek(0)
                    _waiting(name, handle.read().strip(), timeout_s)
                    said = True
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    raise TableBusy(f"{name} is being written by another run ({handle.read().strip() or 'unknown'}); "
                                    f"waited {timeout_s:.0f}s") from None
                time.sleep(0.5)
        handle.seek(0)
        handle.truncate()
        handle.write(about + "\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


LEASE_S = 60.0  # an S3 lock object left unchanged this long belongs to a dead run; holders renew it 3 times as often


@contextmanager
def _s3_lease(path: str, name: str, about: str, timeout_s: float) -> Iterator[None]:
    """The lock as an S3 object created with If-None-Match (one creator wins), renewed by its holder with
    If-Match, deleted on release. A killed holder stops renewing: a waiter that has seen the same version
    of the object for a whole lease, by its own clock (no clocks are compared), takes it over with If-Match,
    so of several waiters one wins."""
    from spark_jobs.storage import S3Files

    files, deadline, seen, said = S3Files(), time.monotonic() + timeout_s, None, False
    while True:
        tag = files.create(path, about.encode())
        if tag is None:
            current = files.get(path)
            held_by = current.data.decode().strip() if current else ""
            if current is not None and not said:
                _waiting(name, held_by, timeout_s)
                said = True
            if current is not None and (seen is None or seen[0] != current.tag):
                seen = (current.tag, time.monotonic())
            if current is not None and seen is not None and (time.monotonic() - seen[1] >= LEASE_S
                                                             or _holder_is_gone(held_by)):
                tag = files.replace(path, f"{about}, took over from: {held_by}".encode(), current.tag)
            if tag is None and time.monotonic() >= deadline:
                if current is None:
                    holder = "just released"
                else:
                    holder = f"{held_by}; its lease unchanged for {time.monotonic() - seen[1]:.0f}s of {LEASE_S:.0f}s" \
                        if seen else held_by
                raise TableBusy(f"{name} is being written by another run ({holder}); waited {timeout_s:.0f}s")
        if tag is not None:
            break
        time.sleep(0.5)
    held, stop, lost = [tag], threading.Event(), threading.Event()

    def renew() -> None:
        renewed_at = time.monotonic()
        while not stop.wait(LEASE_S / 3):
            try:
                renewed = files.replace(path, f"{about}, renewed {dt.datetime.now(dt.UTC).isoformat()}".encode(), held[0])
            except Exception:  # an S3 error: try again at the next tick while the lease lasts, then give it up
                if time.monotonic() - renewed_at < LEASE_S:
                    continue
                renewed = None
            if renewed is None:
                lost.set()
                return
            held[0], renewed_at = renewed, time.monotonic()

    # in the job's context: a service job's S3 settings are its own (spark_jobs/settings.py, job_environment)
    renewer = threading.Thread(target=contextvars.copy_context().run, args=(renew,), name=f"lease-{name}", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
        if not lost.is_set() and not files.delete(path, held[0]):
            lost.set()
    if lost.is_set():  # another run took the table over while this one wrote: its writes may have interleaved
        raise TableBusy(f"{name}: this run's writer lock lapsed (not renewed within {LEASE_S:.0f}s) and another "
                        "run took it over; check the table's Delta history before the next run")
