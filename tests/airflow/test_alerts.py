"""Alerting through Airflow's Notifiers: a failed task is mailed by the SMTP provider's notifier through the
connection CDC_ALERT_SMTP_CONN_ID names, its cause escaped; every DAG carries the run Deadline alert. (The
deadline's mail, sent by the triggerer, is checked with the real scheduler in test_scheduler.py.)"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from tests.support import smtp_connection, smtp_sink

pytest.importorskip("airflow")


def test_a_failed_task_is_mailed_through_the_smtp_connection_with_its_cause_escaped(monkeypatch):
    from cdc_airflow import callbacks
    from spark_jobs.settings import Settings

    with smtp_sink() as (port, received):
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_ALERTS", smtp_connection(port))
        monkeypatch.setenv(Settings.variable("alert_smtp_conn_id"), "smtp_alerts")
        monkeypatch.setenv(Settings.variable("alert_to"), "ops@example.com, oncall@example.com")
        log_hook, notifier = callbacks.failure_callbacks()
        assert log_hook is callbacks.on_failure
        ti = SimpleNamespace(dag_id="cdc_silver_orders", task_id="silver_merge_orders", try_number=4)
        cause = RuntimeError('table=orders layer=silver: gate failed: <img src=x onerror="alert(1)">')
        notifier({"ti": ti, "task_instance": ti, "run_id": "scheduled__2026-11-25", "exception": cause})
        (message,) = received
    assert message["Subject"] == "CDC task failed: cdc_silver_orders.silver_merge_orders"
    assert message["To"] == "ops@example.com, oncall@example.com" and message["From"] == "cdc@example.com"
    html = next(part.get_payload(decode=True).decode() for part in message.walk()
                if part.get_content_type() == "text/html")
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html and "<img" not in html
    assert "run scheduled__2026-11-25" in html and "(try 4)" in html


def test_without_a_connection_failures_are_logged_only_and_a_half_configured_one_is_refused(monkeypatch):
    from cdc_airflow import callbacks
    from spark_jobs.errors import ConfigError
    from spark_jobs.settings import Settings

    assert callbacks.failure_callbacks() == [callbacks.on_failure]
    monkeypatch.setenv(Settings.variable("alert_smtp_conn_id"), "smtp_alerts")
    with pytest.raises(ConfigError, match="set CDC_ALERT_TO"):
        callbacks.failure_callbacks()


def test_every_run_carries_the_deadline_alert_with_the_notifier_or_the_log(monkeypatch):
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier
    from airflow.sdk.definitions.deadline import DagRunQueuedAtDeadline

    from cdc_airflow import callbacks
    from spark_jobs.settings import Settings

    alert = callbacks.run_deadline()
    assert isinstance(alert.reference, DagRunQueuedAtDeadline) and alert.interval == dt.timedelta(hours=2)
    assert alert.callback.path == "cdc_airflow.callbacks.deadline_missed"
    monkeypatch.setenv(Settings.variable("run_deadline"), "90")
    monkeypatch.setenv(Settings.variable("alert_smtp_conn_id"), "smtp_alerts")
    monkeypatch.setenv(Settings.variable("alert_to"), "ops@example.com")
    alert = callbacks.run_deadline()
    assert alert.interval == dt.timedelta(seconds=90)
    assert alert.callback.path == f"{SmtpNotifier.__module__}.{SmtpNotifier.__name__}"
    assert alert.callback.kwargs["smtp_conn_id"] == "smtp_alerts" and alert.callback.kwargs["to"] == ["ops@example.com"]
    monkeypatch.setenv(Settings.variable("run_deadline"), "0")
    assert callbacks.run_deadline() is None
