"""What the DAG files share: the CDC_* settings resolved, the table registry they name, the assets of
each layer's tables, and the tasks' default arguments."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Asset, AssetAlias

from cdc_airflow.callbacks import failure_callbacks
from cdc_airflow.operators import PassOutlets
from spark_jobs.lake import Lake
from spark_jobs.registry import Registry, load_registry
from spark_jobs.settings import resolve, resolve_uri, settings


@dataclass(frozen=True)
class Wiring:
    """The CDC_* environment, resolved, and the table registry it names (docs/architecture.md, "Environment")."""

    config: str
    landing: str
    lake: str
    registry: Registry
    sensor_timeout_s: float
    sensor_poke_s: float
    landing_queue: str  # "" when landings are not notified (spark_jobs.settings, CDC_LANDING_QUEUE)
    aws_conn_id: str
    bronze_interval: dt.timedelta  # cdc_bronze's schedule and a backfill run's data interval

    def cli_args(self, *selection: str) -> list[str]:
        return ["--config", self.config, "--landing", self.landing, "--lake", self.lake, *selection]

    def maintain_args(self, *selection: str) -> list[str]:
        return ["--config", self.config, "--lake", self.lake, "--landing", self.landing, *selection]

    def pools(self) -> dict[str, str]:
        """One Airflow pool of one slot per gold model, every task refreshing it in that pool: a second refresh (a
        replay's beside an asset-triggered one) waits in Airflow's queue, holding no worker slot. Tables need none:
        each table is written by passes over many tables, kept apart by the lake's writer lock of each table."""
        return {gold_pool(m): f"one writer at a time of gold model {m}" for m in self.registry.gold}

    def asset(self, layer: str, name: str) -> Asset:
        """A table (or gold model) of a layer; its URI is the Delta table's location."""
        return Asset(name=f"cdc.{layer}.{name}", uri=Lake(self.lake).table_uri(layer, name), group="cdc")

    def advanced(self, layer: str) -> AssetAlias:
        """What a pass task of a layer declares as its outlet: it resolves to the assets of the tables it advanced."""
        return AssetAlias(name=f"cdc.{layer}.advanced", group="cdc")

    def pass_outlets(self, layer: str) -> PassOutlets:
        """A pass task's per-table assets of `layer`, and what each table's step reads (cdc_airflow.operators)."""
        tables = list(self.registry.tables)
        return PassOutlets(layer, self.lake, self.advanced(layer), {t: self.asset(layer, t) for t in tables},
                           {t: self.reads(layer, t) for t in tables})

    def gold_outlets(self, model: str) -> PassOutlets:
        """A gold model's task's: its asset, through the alias, only when its refresh published a new version (a
        DAG scheduled on the model's asset does not run for a refresh that found nothing new)."""
        return PassOutlets("gold", self.lake, self.advanced("gold"), {model: self.asset("gold", model)},
                           {model: self.reads("gold", model)})

    def landing_asset(self, table: str) -> Asset:
        """A table's landing folder (what bronze reads): an input in lineage, no DAG is scheduled by it."""
        root = self.landing if "://" in self.landing else f"file://{self.landing}"
        return Asset(name=f"cdc.landing.{table}", uri=f"{root}/topics/{self.registry.tables[table].topic}", group="cdc")

    def landing_notified(self) -> Asset:
        """Files landed, as the landing bucket's notifications on CDC_LANDING_QUEUE tell it: the triggerer watches
        the queue (cdc_airflow.triggers.LandingQueueTrigger), and each batch of notifications is an asset event."""
        from airflow.sdk import AssetWatcher

        from cdc_airflow.triggers import LandingQueueTrigger

        root = self.landing if "://" in self.landing else f"file://{self.landing}"
        trigger = LandingQueueTrigger(queue_url=self.landing_queue, landing=self.landing, aws_conn_id=self.aws_conn_id)
        return Asset(name="cdc.landing.notified", uri=f"{root}/topics", group="cdc",
                     watchers=[AssetWatcher(name="cdc_landing_queue", trigger=trigger)])

    def reads(self, layer: str, name: str) -> list[Asset]:
        """What a layer's task of a table (or gold model) reads, as assets: its lineage inputs (OpenLineage)."""
        if layer == "bronze":
            return [self.landing_asset(name)]
        if layer == "silver":
            return [self.asset("bronze", name)]
        return [self.asset("silver", source) for source in self.registry.gold[name].sources]


def gold_pool(model: str) -> str:
    return f"cdc_gold_{model}"


def wiring() -> Wiring:
    env = settings()
    config = str(resolve(env.config))
    return Wiring(config, resolve_uri(env.landing_uri), resolve_uri(env.lake_uri), load_registry(config),
                  env.sensor_timeout, env.sensor_poke_interval, env.landing_queue, env.aws_conn_id,
                  dt.timedelta(minutes=env.bronze_interval_minutes))


def default_args(**extra: Any) -> dict[str, Any]:
    """Retries with exponential backoff (CdcSparkJob retries only transient failures), a timeout per
    task, and the failure log and notifiers (cdc_airflow.callbacks)."""
    return {"owner": "data-engineering", "retries": 3, "retry_delay": dt.timedelta(seconds=settings().retry_delay),
            "retry_exponential_backoff": True, "max_retry_delay": dt.timedelta(minutes=10),
            "execution_timeout": dt.timedelta(hours=1), "on_failure_callback": failure_callbacks(), **extra}
