"""The landing sensor: which landing files a bronze run takes (a backfill's data interval, a window in
the params, or every file bronze has not taken), waiting deferred for them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from cdc_airflow.hooks import pending_by_table, s3_client, s3_settings
from cdc_airflow.params import landing_window
from cdc_airflow.triggers import LandingTrigger
from spark_jobs.landing import is_remote
from spark_jobs.settings import settings
from spark_jobs.storage import is_s3


class LandingSensor(BaseSensorOperator):
    """Waits, deferred (on the triggerer, holding no worker slot), for landing files bronze has not taken, of
    any of `tables` (name -> topic), and returns the paths of each table that has some (XCom: {table: paths})
    for its bronze task to ingest exactly those. Skips when none arrive in `timeout` seconds; a backfill run
    and a run a landing notification started (its files are there: a notified file another run took leaves it
    nothing) do not wait. One sensor for every table: an idle table costs no task start (cdc_layers' branch skips its
    bronze task)."""

    template_fields: Sequence[str] = ()

    def __init__(self, *, tables: dict[str, str], landing: str, lake: str, aws_conn_id: str | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.tables, self.landing, self.lake = dict(tables), landing, lake
        self.aws_conn_id = aws_conn_id or settings().aws_conn_id

    def execute(self, context: Any) -> dict[str, list[str]]:
        since_ms, until_ms = landing_window(context)
        settings = s3_settings(self.aws_conn_id) if is_remote(self.landing) or is_s3(self.lake) else None
        files = pending_by_table(self.landing, self.lake, self.tables, since_ms, until_ms, s3_client(settings), settings)
        run = context["dag_run"]
        notified = str(getattr(run.run_type, "value", run.run_type)) == "asset_triggered"
        if files or until_ms is not None or notified:  # a closed window gets no new files by waiting
            return self._hand_over(files)
        self.defer(trigger=LandingTrigger(landing=self.landing, lake=self.lake, tables=self.tables,
                                          since_ms=since_ms, until_ms=until_ms, wait_s=float(self.timeout),
                                          poke_s=float(self.poke_interval), aws_conn_id=self.aws_conn_id),
                   method_name="execute_complete", timeout=dt.timedelta(seconds=float(self.timeout) + 300))
        raise AssertionError("defer() raises")  # pragma: no cover

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, list[str]]:
        if "error" in event:
            raise AirflowException(f"layer=landing: cannot list {self.landing}: {event['error']}")
        return self._hand_over(event["files"])

    def _hand_over(self, files: dict[str, list[str]]) -> dict[str, list[str]]:
        if not files:
            raise AirflowSkipException(f"no landing files to ingest in any of {len(self.tables)} table(s)")
        for table, paths in sorted(files.items()):
            self.log.info("table=%s: %d landing file(s) for bronze, first %s", table, len(paths), paths[0])
        return files
