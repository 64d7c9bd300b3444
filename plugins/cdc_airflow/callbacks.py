"""The DAGs' alerting: a failed task and a run past its deadline, told through Airflow's own Notifiers.

- every failure is logged in one line (`on_failure`), then sent by the notifiers the deployment configures by
  connection: CDC_ALERT_SMTP_CONN_ID (an Airflow SMTP connection) and CDC_ALERT_TO mail it through the SMTP
  provider's SmtpNotifier; CDC_ON_FAILURE_CALLBACK (`module:function`) stays as a hook for anything else;
- every run carries a Deadline alert (CDC_RUN_DEADLINE seconds after it was queued, 0 for none): a run still
  going then, a hung job or a queue that never drains, is mailed the same way (or logged by the triggerer).

Values are escaped in the mail's HTML: a failure's cause can quote a source value."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from spark_jobs.settings import settings

FAILURE_SUBJECT = "CDC task failed: {{ ti.dag_id }}.{{ ti.task_id }}"
FAILURE_HTML = ("<p>Task <b>{{ ti.task_id | e }}</b> of DAG <b>{{ ti.dag_id | e }}</b>, run {{ run_id | e }}, failed "
                "(try {{ ti.try_number }}).</p><p>{{ exception | string | e }}</p>")
DEADLINE_SUBJECT = "CDC run past its deadline: {{ dag_run.dag_id }}"
DEADLINE_HTML = ("<p>Run {{ dag_run.dag_run_id | e }} of DAG <b>{{ dag_run.dag_id | e }}</b> (queued at "
                 "{{ dag_run.queued_at | e }}) had not finished by its deadline, {{ deadline.deadline_time | e }}.</p>")

log = logging.getLogger(__name__)


def on_failure(context: Any) -> None:
    """Logs the failed task's cause in one line, then calls the hook named by CDC_ON_FAILURE_CALLBACK
    (`module:function`, given the context), if any."""
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


def _mail(subject: str, html: str) -> dict[str, Any] | None:
    """SmtpNotifier's arguments for the configured connection and addresses, or None when mail is not set up."""
    env = settings()
    if not env.alert_smtp_conn_id:
        return None
    to = [address.strip() for address in env.alert_to.split(",") if address.strip()]
    if not to:
        from spark_jobs.errors import ConfigError

        raise ConfigError("CDC_ALERT_SMTP_CONN_ID is set: set CDC_ALERT_TO to the addresses to mail")
    return {"smtp_conn_id": env.alert_smtp_conn_id, "to": to, "subject": subject, "html_content": html}


def failure_callbacks() -> list[Any]:
    """The tasks' on_failure_callback: the one-line log and hook, then the configured notifiers."""
    mail = _mail(FAILURE_SUBJECT, FAILURE_HTML)
    if mail is None:
        return [on_failure]
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    return [on_failure, SmtpNotifier(**mail)]


async def deadline_missed(context: dict[str, Any], **_: Any) -> None:
    """A missed deadline when no notifier is configured: one line in the triggerer's log."""
    run = context.get("dag_run") or {}
    log.warning("cdc run past its deadline: dag=%s run=%s queued_at=%s deadline=%s", run.get("dag_id"),
                run.get("dag_run_id"), run.get("queued_at"), (context.get("deadline") or {}).get("deadline_time"))


def _in_dags_test() -> bool:
    """Whether this process is `airflow dags test` (the demo's runner): Airflow 3.3.2 fails such a run at its end
    when its DAG has a deadline, a run that succeeded (apache/airflow#73428, fix open in #73430); a deadline has
    no scheduler to watch it there anyway."""
    import sys

    return sys.argv[1:3] == ["dags", "test"]


def run_deadline() -> Any:
    """The DAGs' Deadline alert: CDC_RUN_DEADLINE seconds after a run is queued (None when 0). Its callback runs in
    the triggerer: the SMTP notifier when mail is set up, else `deadline_missed`."""
    seconds = settings().run_deadline
    if seconds <= 0 or _in_dags_test():
        return None
    # public in airflow.sdk; the Task SDK's __init__.pyi, which type checkers read, does not list them yet
    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference  # type: ignore[attr-defined]

    mail = _mail(DEADLINE_SUBJECT, DEADLINE_HTML)
    if mail is None:
        callback = AsyncCallback(deadline_missed)
    else:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        callback = AsyncCallback(SmtpNotifier, kwargs=mail)
    return DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=dt.timedelta(seconds=seconds),
                         callback=callback, name="cdc_run_deadline")
