"""The engine a job writes with, as CDC_DELTA_ENGINE names it (docs/architecture.md, "Delta engines"). Apart from
the engines' shared contract (spark_jobs.delta), which both engines import."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.delta import DeltaEngine


def make_engine(spark: SparkSession | None, choice: str | None = None) -> DeltaEngine:
    """The engine CDC_DELTA_ENGINE names; delta-rs needs no session (maintenance runs without Spark)."""
    from spark_jobs.settings import settings

    choice = choice or settings().delta_engine
    if choice == "delta-rs":
        from spark_jobs.delta.delta_rs import DeltaRsEngine

        return DeltaRsEngine()
    if choice == "delta-spark":
        from spark_jobs.delta.delta_spark import DeltaSparkEngine

        if spark is None:
            raise ValueError("delta-spark needs a Spark session")
        return DeltaSparkEngine(spark)
    raise ValueError(f"CDC_DELTA_ENGINE must be delta-rs or delta-spark, got {choice!r}")
