"""The freshness watchdog's check: the age of the newest source change a table's layer holds, against its
configured freshness, whether or not anything ran (cdc_freshness)."""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from spark_jobs.settings import settings
from spark_jobs.storage import is_s3


class FreshnessCheck(BaseOperator):
    """Fails, naming the table, when the newest source change its layer holds (as of its last successful run,
    aged since) is older than `freshness_s`, or when the layer never succeeded. A connector that stopped
    sending leaves every layer DAG idle and green; this fails, and the DAGs' failure hook alerts."""

    ui_color = "#fde2c8"

    def __init__(self, *, name: str, layer: str, freshness_s: int, lake: str, aws_conn_id: str | None = None,
                 **kwargs: Any):
        kwargs.setdefault("retries", 0)  # the next scheduled check is the retry
        super().__init__(**kwargs)
        self.name, self.layer, self.freshness_s, self.lake = name, layer, freshness_s, lake
        self.aws_conn_id = aws_conn_id or settings().aws_conn_id

    def execute(self, context: Any) -> float:
        from spark_jobs.lake import Lake
        from spark_jobs.report import human_seconds
        from spark_jobs.status import layer_status

        if is_s3(self.lake):  # this task's own process: the lake's reads take the connection's keys from it
            from cdc_airflow.hooks import s3_environment, s3_settings

            os.environ.update(s3_environment(s3_settings(self.aws_conn_id)))
        status = layer_status(Lake(self.lake), self.name, self.layer)
        where, limit = f"table={self.name} layer={self.layer}", human_seconds(self.freshness_s)
        if status.lag_s is None:
            raise AirflowFailException(f"{where}: no successful run holds a source change yet "
                                       f"(newest verdict: {status.last_verdict}); freshness {limit}")
        if status.lag_s > self.freshness_s:
            raise AirflowFailException(f"{where}: newest source change {human_seconds(status.lag_s)} old, over its "
                                       f"freshness of {limit} (last success {status.last_success}, newest verdict "
                                       f"{status.last_verdict})")
        self.log.info("%s: newest source change %s old, within %s", where, human_seconds(status.lag_s), limit)
        return status.lag_s
