"""Time a job spends in Great Expectations (its validations and Data Docs builds: quality/gx_project.py), summed over
the threads it runs its tables in: the pipeline service reports it with the job, and the bench its share of a cycle
(issue 56's target: at most a tenth)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class Spent:
    """Seconds spent, added to from any thread."""

    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, seconds: float) -> None:
        with self.lock:
            self.seconds += seconds


# a job's Spent: the threads that run its tables copy its context (steps.each_table), and with it the same object
_spent: ContextVar[Spent | None] = ContextVar("cdc_gx_spent", default=None)


@contextmanager
def counting() -> Iterator[Spent]:
    """What `in_gx` times in this context, and in the threads that copy it, summed."""
    spent = Spent()
    token = _spent.set(spent)
    try:
        yield spent
    finally:
        _spent.reset(token)


@contextmanager
def in_gx() -> Iterator[None]:
    """Time this block as Great Expectations' (counted when a job is `counting`)."""
    started = time.monotonic()
    try:
        yield
    finally:
        spent = _spent.get()
        if spent is not None:
            spent.add(time.monotonic() - started)
