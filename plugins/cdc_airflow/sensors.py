"""The landing sensor: which landing files a bronze run takes (a backfill's data interval, a window in
the params, or every file bronze has not taken), waiting deferred for them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from airflow.exceptions import AirflowException, AirflowSkipException
from airflow.sdk import BaseSensorOperator

from cdc_airflow.hooks import pending_landing_files, s3_client, s3_settings
from cdc_airflow.triggers import LandingTrigger
from spark_jobs.landing import is_remote
from spark_jobs.settings import settings
from spark_jobs.storage import is_s3


def landing_window(context: Any) -> tuple[int | None, int | None]:
    """A backfill run takes the files that landed in its data interval; any run may name a window in its
    params (`since`, `until`); other runs take every file not yet in bronze."""
    from spark_jobs.landing import LandingWindow

    params = context["params"]
    if params.get("since") or params.get("until"):
        window = LandingWindow.parse(params.get("since"), params.get("until"))
        return window.since_ms, window.until_ms
    run = context["dag_run"]
    if str(getattr(run.run_type, "value", run.run_type)) == "backfill":
        start, end = context["data_interval_start"], context["data_interval_end"]
        return int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    return None, None


class LandingSensor(BaseSensorOperator):
    """Waits, deferred (on the triggerer, holding no worker slot), for landing files of one table that
    bronze has not taken, and returns their paths (XCom) for the bronze task to ingest exactly those.
    Skips the table when none arrive in `timeout` seconds; a backfill run does not wait."""

    template_fields: Sequence[str] = ()

    def __init__(self, *, table: str, topic: str, landing: str, lake: str, aws_conn_id: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.table, self.topic, self.landing, self.lake = table, topic, landing, lake
        self.aws_conn_id = aws_conn_id or settings().aws_conn_id

    def execute(self, context: Any) -> list[str]:
        since_ms, until_ms = landing_window(context)
        settings = s3_settings(self.aws_conn_id) if is_remote(self.landing) or is_s3(self.lake) else None
        files = pending_landing_files(self.landing, self.lake, self.table, self.topic, since_ms, until_ms,
                                      s3_client(settings), settings)
        if files or until_ms is not None:  # a closed window gets no new files by waiting
            return self._hand_over(files)
        self.defer(trigger=LandingTrigger(landing=self.landing, lake=self.lake, table=self.table, topic=self.topic,
                                          since_ms=since_ms, until_ms=until_ms, wait_s=float(self.timeout),
                                          poke_s=float(self.poke_interval), aws_conn_id=self.aws_conn_id),
                   method_name="execute_complete", timeout=dt.timedelta(seconds=float(self.timeout) + 300))
        raise AssertionError("defer() raises")  # pragma: no cover

    def execute_complete(self, context: Any, event: dict[str, Any]) -> list[str]:
        if "error" in event:
            raise AirflowException(f"table={self.table} layer=landing: cannot list {self.landing}: {event['error']}")
        return self._hand_over(event["files"])

    def _hand_over(self, files: list[str]) -> list[str]:
        if not files:
            raise AirflowSkipException(f"table={self.table}: no landing files to ingest")
        self.log.info("table=%s: %d landing file(s) for bronze, first %s", self.table, len(files), files[0])
        return files
