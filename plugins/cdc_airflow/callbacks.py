"""The DAGs' failure hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spark_jobs.settings import settings


def on_failure(context: Any) -> None:
    """The DAGs' on_failure_callback: logs the failed task's cause in one line, then calls the hook named
    by CDC_ON_FAILURE_CALLBACK (`module:function`, given the context) to page or post where you want."""
    ti = context.get("ti") or context.get("task_instance")
    cause = str(context.get("exception") or "").strip().splitlines()
    print(f"cdc task failed: dag={getattr(ti, 'dag_id', '?')} task={getattr(ti, 'task_id', '?')} "
          f"run={context.get('run_id')} cause={cause[0] if cause else 'unknown'}", flush=True)
    target = settings().on_failure_callback
    if target:
        import importlib

        module, _, name = target.partition(":")
        hook: Callable[[Any], None] = getattr(importlib.import_module(module), name)
        hook(context)
