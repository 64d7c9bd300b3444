"""The triggers: the deferrable landing sensor's (lists the landing on the triggerer, holding no worker slot), the
landing queue's (an asset watcher: a landed file starts cdc_bronze) and the service job's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from cdc_airflow.hooks import pending_by_table, s3_client, s3_settings
from spark_jobs.landing import is_remote
from spark_jobs.storage import is_s3

if TYPE_CHECKING:
    from spark_jobs.service_client import JobStatus


class LandingTrigger(BaseTrigger):
    """Runs on the triggerer: lists the landing until files that bronze has not taken are there for any of the
    tables (name -> topic; or `wait_s` has passed), then hands each such table's paths back to the sensor."""

    def __init__(self, *, landing: str, lake: str, tables: dict[str, str], since_ms: int | None,
                 until_ms: int | None, wait_s: float, poke_s: float, aws_conn_id: str):
        super().__init__()
        self.landing, self.lake, self.tables = landing, lake, dict(tables)
        self.since_ms, self.until_ms, self.wait_s, self.poke_s, self.aws_conn_id = since_ms, until_ms, wait_s, poke_s, aws_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"landing": self.landing, "lake": self.lake, "tables": self.tables,
                 "since_ms": self.since_ms, "until_ms": self.until_ms, "wait_s": self.wait_s, "poke_s": self.poke_s,
                 "aws_conn_id": self.aws_conn_id})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from asgiref.sync import sync_to_async

        deadline = time.monotonic() + self.wait_s
        try:
            # connections are read through Airflow's own (synchronous) channel, once
            settings = await sync_to_async(s3_settings)(self.aws_conn_id) if is_remote(self.landing) or is_s3(self.lake) else None
            client = await asyncio.to_thread(s3_client, settings)  # one client for every poll
            while True:
                files = await asyncio.to_thread(pending_by_table, self.landing, self.lake, self.tables,
                                                self.since_ms, self.until_ms, client, settings)
                if files or time.monotonic() >= deadline:
                    yield TriggerEvent({"files": files})
                    return
                await asyncio.sleep(self.poke_s)
        except Exception as exc:  # the sensor turns it into the task's failure, with the cause
            yield TriggerEvent({"error": f"{type(exc).__name__}: {exc}"})


def landed_keys(body: str, landing: str) -> list[str]:
    """The object keys of an S3 event notification's ObjectCreated records under the landing's topics (keys come
    URL-encoded); [] for anything else on the queue (S3's test event, other prefixes, other events, other shapes)."""
    import json
    from urllib.parse import unquote_plus

    from spark_jobs.storage import split_s3

    bucket = split_s3(landing)[0]
    topics = _topics_prefix(landing)
    keys = []
    try:
        for record in json.loads(body).get("Records") or []:
            if str(record.get("eventName", "")).startswith("ObjectCreated") and \
                    record["s3"]["bucket"]["name"] == bucket:
                key = unquote_plus(str(record["s3"]["object"]["key"]))
                keys += [key] if key.startswith(topics) else []
    except (ValueError, AttributeError, TypeError, KeyError):  # not a notification of S3's shape
        return []
    return keys


def _topics_prefix(landing: str) -> str:
    """Where the landing's topics are in its bucket: `<prefix>/topics/`."""
    from spark_jobs.storage import split_s3

    return f"{split_s3(landing)[1].rstrip('/')}/topics/".lstrip("/")


def landed_topic(key: str, landing: str) -> str:
    """The topic of a landed object key (`<prefix>/topics/<topic>/...`, as landed_keys returns them)."""
    return key.removeprefix(_topics_prefix(landing)).split("/", 1)[0]


SETTLE_S, SETTLE_MAX_S = 0.1, 5.0  # the landing queue's: a burst of notifications (a flush's uploads) is one event


class LandingQueueTrigger(BaseEventTrigger):
    """An asset watcher's trigger (cdc_layers: cdc_bronze's schedule with CDC_LANDING_QUEUE): long-polls the SQS
    queue that receives the landing bucket's object-created notifications, deletes what it received, and fires
    once notifications name landing files (the keys in the event; the run's sensor lists what bronze has not
    taken). Written here, not the Amazon provider's SqsSensorTrigger: that one needs aiobotocore, whose releases
    pin a botocore older than the one this project's boto3 needs. A notification lost here (deleted, then the
    triggerer dies) loses no file: the schedule's runs list the landing."""

    def __init__(self, *, queue_url: str, landing: str, aws_conn_id: str, wait_s: int = 20, retry_s: float = 30.0):
        super().__init__()
        self.queue_url, self.landing, self.aws_conn_id, self.wait_s, self.retry_s = \
            queue_url, landing, aws_conn_id, wait_s, retry_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"queue_url": self.queue_url, "landing": self.landing, "aws_conn_id": self.aws_conn_id,
                 "wait_s": self.wait_s, "retry_s": self.retry_s})

    def _receive(self, client: Any) -> list[str]:
        """One long poll (up to `wait_s`), then short polls SETTLE_S apart while notifications keep coming (up to
        SETTLE_MAX_S): the landed keys they brought; every message they brought is deleted. A sink's flush lands a
        file per table and partition within moments: one event for them all starts one run, where an event per file
        started runs that found their files taken, each still task starts, and each holding back the next landing's
        run (cdc_bronze runs one at a time)."""
        keys: list[str] = []
        wait, settled_by = self.wait_s, time.monotonic() + SETTLE_MAX_S
        while True:
            messages = client.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                              WaitTimeSeconds=wait).get("Messages", [])
            if messages:
                client.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)])
            keys += [key for m in messages for key in landed_keys(m.get("Body", ""), self.landing)]
            if not messages or time.monotonic() >= settled_by:
                return keys
            wait = 0
            time.sleep(SETTLE_S)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import boto3
        from asgiref.sync import sync_to_async

        settings = await sync_to_async(s3_settings)(self.aws_conn_id)
        client = await asyncio.to_thread(boto3.client, "sqs", **settings)
        while True:
            try:
                keys = await asyncio.to_thread(self._receive, client)
            except Exception as exc:  # the queue unreachable: said in the triggerer's log; the schedule still runs
                self.log.error("landing queue %s: %s: %s; trying again in %.0fs", self.queue_url,
                               type(exc).__name__, exc, self.retry_s)
                await asyncio.sleep(self.retry_s)
                continue
            if keys:
                yield TriggerEvent({"landed": len(keys), "keys": sorted(keys)[:100],
                                    "topics": sorted({landed_topic(key, self.landing) for key in keys})})
                return


def job_ended(status: JobStatus) -> dict[str, Any]:
    """How a service job ended, as `CdcSparkJob.execute_complete` takes it (the trigger's event, or the task's own
    wait)."""
    return {"exit_code": status.exit_code, "cause": status.cause, "seconds": status.seconds}


class ServiceJobTrigger(BaseTrigger):
    """Runs on the triggerer while the pipeline service computes a task's job (spark_jobs/service.py) that outlasted
    the task's wait on its worker: polls it, copies its new log lines into the task's log as they come, and hands
    back how the job ended."""

    def __init__(self, *, conn_id: str, job_id: str, poll_s: float = 1.0, offset: int = 0):
        super().__init__()
        self.conn_id, self.job_id, self.poll_s, self.offset = conn_id, job_id, poll_s, offset

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"conn_id": self.conn_id, "job_id": self.job_id, "poll_s": self.poll_s, "offset": self.offset})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from asgiref.sync import sync_to_async

        from cdc_airflow.service_hook import PipelineServiceHook
        from spark_jobs.service_client import ServiceError

        service = PipelineServiceHook(self.conn_id)
        try:  # the service's address and secret, through Airflow's own (synchronous) channel, once
            await sync_to_async(service.get_conn)()
        except Exception as exc:
            yield TriggerEvent({"error": f"pipeline service connection {self.conn_id!r}: {type(exc).__name__}: {exc}"})
            return
        offset, unreachable_since = self.offset, None  # the log up to `offset` is in the task's already
        while True:
            try:
                status = await asyncio.to_thread(service.poll, self.job_id, offset)
            except ServiceError as exc:
                # a service restarting comes back within a minute; a job it forgot (it restarted) never does
                unreachable_since = unreachable_since or time.monotonic()
                if exc.permanent or time.monotonic() - unreachable_since > 120:
                    yield TriggerEvent({"error": str(exc)})
                    return
                await asyncio.sleep(self.poll_s * 5)
                continue
            unreachable_since = None
            for line in status.log.splitlines():
                self.log.info("%s", line)
            offset = status.offset
            if status.done:
                yield TriggerEvent(job_ended(status))
                return
            await asyncio.sleep(self.poll_s)
