"""The users' own expectations (tables.yaml `expectations:`), checked against GX itself and, for those
whose action is `quarantine`, turned into the rows that fail them.

GX validates a frame and counts what fails; it has no public call that hands back the failing rows of a
Spark frame (its COMPLETE result format collects their indexes to the driver and into the stored result).
So the rows are found with GX's own per-row condition (the `<map metric>.condition` metric every
row-level expectation is built on) evaluated on the frame, as GX evaluates it when it counts them: the
same filters (row_condition, ignore_row_if) and the same verdict per row."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.errors import ConfigError
from spark_jobs.quality.expectations import QUARANTINE, UserExpectation

# map expectations whose verdict on a row depends on the other rows of the frame: quarantining by them
# would depend on how the landing files happened to be batched
_ACROSS_ROWS = ("unique", "increasing", "decreasing", "z_score", "outliers")
DOMAIN_COLUMNS = ("column", "column_A", "column_B", "column_list")


def _class(user: UserExpectation) -> type:
    import great_expectations.expectations as gxe

    cls = getattr(gxe, "".join(part.title() for part in user.type.split("_")), None)
    if cls is None or not isinstance(cls, type):
        raise ConfigError(f"{user.where}: unknown expectation {user.type!r}; GX's are listed at "
                          "https://greatexpectations.io/expectations")
    return cls


def is_row_level(cls: type) -> bool:
    """GX map expectations judge each row; those in _ACROSS_ROWS judge it against the others."""
    from great_expectations.expectations.expectation import (
        ColumnMapExpectation,
        ColumnPairMapExpectation,
        MulticolumnMapExpectation,
    )

    if not issubclass(cls, ColumnMapExpectation | ColumnPairMapExpectation | MulticolumnMapExpectation):
        return False
    metric = str(getattr(cls, "map_metric", ""))
    return metric.endswith("unique_within_record") or not any(word in metric for word in _ACROSS_ROWS)


def build(user: UserExpectation, **extra: Any) -> Any:
    """The GX expectation, or a ConfigError naming the table (or model) and the expectation."""
    cls = _class(user)
    if user.action == QUARANTINE and not is_row_level(cls):
        raise ConfigError(f"{user.where}: expectation {user.type!r} is not row-level, so it cannot quarantine rows; "
                          "use action warn or fail")
    try:
        return cls(**user.kwargs, **({"description": user.description} if user.description else {}), **extra)
    except Exception as exc:  # pydantic's ValidationError: GX's own account of the bad argument
        detail = " ".join(str(exc).split())
        raise ConfigError(f"{user.where}: expectation {user.type!r} has bad arguments {user.kwargs}: {detail}") from None


def validate(expectations: tuple[UserExpectation, ...]) -> None:
    for user in expectations:
        build(user)


def validate_actions(actions: tuple[str, ...], where: str) -> None:
    """The GX Checkpoint actions a table's gates run (`quality.actions`), checked by GX's own parser."""
    import great_expectations as gx

    try:
        gx.Checkpoint(name="check", validation_definitions=[], actions=[json.loads(a) for a in actions])
    except Exception as exc:  # GX's account of the bad action (an unknown type, a missing field)
        raise ConfigError(f"{where}: bad entry in quality.actions: {' '.join(str(exc).split())}") from None


def named_columns(user: UserExpectation) -> list[str]:
    """The columns an expectation names."""
    named = [user.kwargs[k] for k in DOMAIN_COLUMNS if k in user.kwargs]
    return [c for v in named for c in (v if isinstance(v, list) else [v])]


def check_columns(frame: DataFrame, expectations: tuple[UserExpectation, ...], what: str) -> None:
    """Every column an expectation names is one of the frame's, or a ConfigError saying which are there."""
    error = columns_error(frame.columns, expectations, what)
    if error is not None:
        raise error


def columns_error(columns: Iterable[str], expectations: tuple[UserExpectation, ...], what: str) -> ConfigError | None:
    """`check_columns`' ConfigError for a frame of `columns`, or None when every named column is one of them."""
    present = set(columns)
    for user in expectations:
        missing = [c for c in named_columns(user) if c not in present]
        if missing:
            shown = ", ".join(sorted(c for c in present if not c.startswith("_")))
            return ConfigError(f"{user.where}: expectation {user.label} names column(s) {', '.join(missing)} "
                               f"not in {what} ({shown})")
    return None


def violations(frame: DataFrame, expectations: tuple[UserExpectation, ...], id_column: str) -> DataFrame | None:
    """(`id_column`, reason) of each row of `frame` that fails a `quarantine` expectation, the first it fails
    in declared order; None when none quarantines. Lazy: one Spark job when read."""
    from great_expectations.execution_engine import SparkDFExecutionEngine
    from great_expectations.execution_engine.sparkdf_batch_data import SparkDFBatchData
    from great_expectations.validator.metric_configuration import MetricConfiguration
    from great_expectations.validator.metrics_calculator import MetricsCalculator

    quarantining = [u for u in expectations if u.action == QUARANTINE]
    if not quarantining:
        return None
    engine = SparkDFExecutionEngine(spark=frame.sparkSession, persist=False)
    engine.load_batch_data("rows", SparkDFBatchData(engine, frame))
    metrics = MetricsCalculator(execution_engine=engine, show_progress_bars=False)
    parts = []
    for order, user in enumerate(quarantining):
        expectation = build(user)
        counted = expectation.get_validation_dependencies(execution_engine=engine).get_metric_configuration(
            f"{expectation.map_metric}.unexpected_count")
        condition, compute_domain, _ = metrics.get_metric(MetricConfiguration(
            f"{expectation.map_metric}.condition", counted.metric_domain_kwargs, counted.metric_value_kwargs))
        # GX counts a row as unexpected where the condition holds on its domain (row_condition applied)
        failing = engine.get_domain_records(compute_domain).where(condition)
        parts.append(failing.select(id_column, F.lit(order).alias("_order"), F.lit(user.reason()).alias("reason")))
    first = reduce(DataFrame.unionByName, parts).groupBy(id_column).agg(F.min(F.struct("_order", "reason")).alias("_f"))
    return first.select(id_column, F.col("_f.reason").alias("reason"))
