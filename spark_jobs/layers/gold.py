"""Gold: each model's SQL over silver, gated, then published in one overwrite (docs/architecture.md, "Gold")."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Generator
from dataclasses import dataclass, fields
from functools import partial, reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from spark_jobs.delta import (
    UPKEEP,
    DeltaEngine,
    MergeSpec,
    all_nullable,
    commits_between,
    spark_frame,
    upkeep_only,
)
from spark_jobs.errors import PipelineError
from spark_jobs.lake import Lake
from spark_jobs.layers import gold_state, transactions
from spark_jobs.layers.common import (
    ONE_TASK_ROWS,
    Gate,
    counted_checkpoint,
    lag_seconds,
    one_row,
    settle,
    share,
    write_quarantine,
)
from spark_jobs.layers.common import gate as run_gate
from spark_jobs.layers.gold_plan import (
    JOINED,
    GroupsPlan,
    IncrementalPlan,
    changed_view,
    every_view,
    group_columns,
    groups_plan,
    keyed_view,
    plan,
    source_view,
)
from spark_jobs.layers.summary import GoldSummary
from spark_jobs.lineage import model_lineage
from spark_jobs.quality.audit import Audit, Figures, tally
from spark_jobs.quality.expectations import QUARANTINE, flagged
from spark_jobs.quality.findings import GateResult
from spark_jobs.quality.gates import AUDIT, AuditGate, gold_checks
from spark_jobs.quality.user_expectations import check_columns, violations
from spark_jobs.registry import GoldModel
from spark_jobs.settings import settings
from spark_jobs.state import writer_lock
from spark_jobs.steps import answered_alone


def gold_refresh(spark: SparkSession, engine: DeltaEngine, model: GoldModel, lake: Lake,
                 batch_id: str, landing: str | None = None, gate: Gate | None = None) -> GoldSummary:
    """`gold_step` with its gate answered alone: for a caller refreshing one model itself. `gate`, as silver's
    apply_changes takes it: the gate run in place of GX's, nothing asked."""
    return answered_alone(gold_step(spark, engine, model, lake, batch_id, landing, gate))


def gold_step(spark: SparkSession, engine: DeltaEngine, model: GoldModel, lake: Lake, batch_id: str,
              landing: str | None = None, gate: Gate | None = None) -> Generator[AuditGate, GateResult, GoldSummary]:
    """Run the model's SQL over silver, gate the result, then publish it: write-audit-publish, a failed gate leaves
    gold at its previous version. Plan -> rows by strategy (`_rows`: whole, by its group state, or its touched keys
    computed again) -> gate -> publish, as dbt's incremental materialisation calls one strategy. A gate on the audit
    alone is asked (AuditGate), and a run's models are answered in one GX validation (steps.Steps.run_together), where
    each alone cost one. When nothing it
    reads has changed since the version it published (the same silver versions, model definition and gold version),
    it is not refreshed, unless its result or verdict depends on the clock (see `depends_on_the_clock`).

    Sources whose connector publishes its transactions (`model.at_watermark`) are read as of one transaction
    watermark (layers/transactions.py), after taking the transaction topic's new files from `landing`."""
    ingested = transactions.ingest(spark, engine, lake, landing, model.transactions, batch_id) \
        if model.transactions and landing is not None else None
    planned = incremental_plan(model)
    for table in () if isinstance(planned, str) else planned.tables:
        _record_changes(engine, lake, table, batch_id)
    inputs = refresh_inputs(engine, lake, model)
    gold_version = engine.version(lake.gold(model.name))
    recorded = _published_inputs(lake, model) or {}
    if not depends_on_the_clock(model) and gold_version is not None and recorded.get("gold_version") == gold_version \
            and all(recorded.get(k) == v for k, v in inputs.items()):
        return GoldSummary(table=model.name, batch_id=batch_id, sources=list(model.sources), version=gold_version,
                           gate="skipped (sources unchanged)",
                           transaction_watermark=recorded.get("transaction_watermark"),
                           published=recorded.get("published_by") == batch_id or None)
    sources, mark = _read_sources(spark, engine, lake, model, inputs)
    computed = analyzed(spark, sources, model.sql)[0]  # the model over its sources, as Spark analyzed it (no job)
    refresh = _Refresh(spark, engine, lake, model, batch_id, sources, computed, recorded, inputs, gold_version, gate)
    rows = _rows(refresh, planned)
    summary = _summary(refresh, rows, ingested, mark)
    published = yield from _gated(refresh, rows, summary)
    state_version = _publish(refresh, rows, published, summary)
    # written after the publish: a run dying between the two refreshes again, which is harmless
    # with the watermark it was published at: the newest transaction shown, and its END's offset in the topic; and the
    # run that published the version, whose retry finds its sources unchanged and still says it published
    lake.files.write(lake.gold_inputs(model.name), json.dumps(
        {**inputs, "gold_version": summary.version, "state_version": state_version,
         "newest_change_ms": rows.newest_change_ms, "transaction_watermark": summary.transaction_watermark,
         "transaction_position": mark.position if mark is not None else None,
         "published_by": batch_id if summary.published else recorded.get("published_by")}, sort_keys=True))
    return summary


def _read_sources(spark: SparkSession, engine: DeltaEngine, lake: Lake, model: GoldModel, inputs: dict[str, Any]
                  ) -> tuple[dict[str, DataFrame], transactions.Watermark | None]:
    """Each source's silver at the version `inputs` took, or as of the model's transaction watermark (and that
    watermark) for the sources read at one."""
    consistent = {t.name: t for t in model.at_watermark}
    mark, visible, logs = None, None, {}
    if model.transactions:
        versions = inputs["transaction_versions"]
        logs = transactions.source_logs(spark, engine, lake, list(model.at_watermark), versions)
        mark, visible = transactions.watermark(spark, engine, lake, model.transactions,
                                               versions["transactions"][model.transactions], list(model.at_watermark), logs)
    sources: dict[str, DataFrame] = {}
    for source in model.sources:
        if source in consistent:
            silver = transactions.as_of(consistent[source], logs[source], visible)
        else:
            silver = engine.read(spark, lake.silver(source), version=inputs["silver_versions"][source])
        if silver is None:
            raise PipelineError(model.name, "gold", f"source silver table {source!r} does not exist yet")
        sources[source] = silver
    return sources, mark


@dataclass(frozen=True)
class _Refresh:
    """What a refresh reads: the model, its sources as read, the model over them (analyzed, no job), and what the
    refresh that published `gold_version` recorded (`recorded`) beside what this one read (`inputs`)."""

    spark: SparkSession
    engine: DeltaEngine
    lake: Lake
    model: GoldModel
    batch_id: str
    sources: dict[str, DataFrame]
    computed: DataFrame
    recorded: dict[str, Any]
    inputs: dict[str, Any]
    gold_version: int | None
    gate: Gate | None = None  # runs the model's gate in place of GX's (common.Gate), asked of none


@dataclass(frozen=True)
class _Rows:
    """The model's rows after a refresh (`result`: what the gate sees), how they were made, and what publishing them
    writes: the rows of the keys touched (`changed`, `GONE` = 1: deleted) merged into gold, else `result` written
    whole; the group state moved (`state_moved`, merged) or built whole (`state_built`, written whole)."""

    result: DataFrame
    count: int  # its rows, observed as it was materialised
    refresh: str  # incremental | full (why)
    newest_change_ms: int | None  # the newest source time of a row the model holds
    changed: pa.Table | None = None
    state_moved: pa.Table | None = None
    state_built: DataFrame | None = None
    changes: int | None = None  # the change feed's rows an incremental refresh read
    groups_changed: int | None = None


def _rows(refresh: _Refresh, planned: IncrementalPlan | GroupsPlan | str) -> _Rows:
    """The model's rows by the strategy its plan names: whole, by its group state, or its touched keys again."""
    if isinstance(planned, IncrementalPlan):
        return _by_group_state(refresh, planned)
    if isinstance(planned, GroupsPlan):
        return _by_regrouping(refresh, planned)
    return _whole(refresh, planned)


def _whole(refresh: _Refresh, why: str) -> _Rows:
    return _Rows(*_materialised(refresh.computed), f"full ({why})", _newest(refresh.sources.values()))


def _by_group_state(refresh: _Refresh, planned: IncrementalPlan) -> _Rows:
    """The model's per-group state moved by its source's changes, and the rows of the groups they moved; or, where
    its changes cannot be replayed, the state built from all of silver and every row computed from it."""
    silver, schema = refresh.sources[planned.source], refresh.computed.schema
    found = _moved(refresh, planned)
    if isinstance(found, str):
        built = gold_state.build(silver, planned).localCheckpoint()
        result = _materialised(gold_state.model_rows(built, planned, schema, silver))
        return _Rows(*result, f"full ({found})", _newest(refresh.sources.values()), state_built=built)
    changed = gold_state.model_rows(spark_frame(refresh.spark, found.state), planned, schema, silver).toArrow()
    return _incremental(refresh, changed, found.changes, found.groups, found.newest_change_ms, found.state)


def _by_regrouping(refresh: _Refresh, planned: GroupsPlan) -> _Rows:
    """The model computed again for the keys its sources' changes touched; whole where they cannot be replayed."""
    regrouped = _regrouped(refresh, planned)
    if isinstance(regrouped, str):
        return _whole(refresh, regrouped)
    return _incremental(refresh, regrouped.rows, regrouped.changes, regrouped.rows.num_rows, regrouped.newest_change_ms)


def _incremental(refresh: _Refresh, changed: pa.Table, changes: int, groups: int, newest_change_ms: int | None,
                 state_moved: pa.Table | None = None) -> _Rows:
    published = refresh.engine.read(refresh.spark, refresh.lake.gold(refresh.model.name), version=refresh.gold_version)
    newest = max(filter(None, [refresh.recorded.get("newest_change_ms"), newest_change_ms]), default=None)
    return _Rows(*_patched(refresh.spark, published, changed, refresh.model.keys), "incremental", newest, changed=changed,
                 state_moved=state_moved, changes=changes, groups_changed=groups)


def _materialised(rows: DataFrame) -> tuple[DataFrame, int]:
    """The model's rows materialised, and how many: a model of up to one task's rows in one partition, so that its
    gate's aggregates and windows run in place (common.checkpoint), a Spark job each where each exchange was one."""
    result, count = counted_checkpoint(rows)
    return (result.coalesce(1) if count <= ONE_TASK_ROWS else result), count


def _summary(refresh: _Refresh, rows: _Rows, ingested: transactions.Ingested | None,
             mark: transactions.Watermark | None) -> GoldSummary:
    model, traced = refresh.model, model_lineage(refresh.model.sql)
    summary = GoldSummary(table=model.name, batch_id=refresh.batch_id, sources=list(model.sources),
                          refresh=rows.refresh, changes=rows.changes, groups_changed=rows.groups_changed)
    summary.rows, summary.lag_s = rows.count, lag_seconds(rows.newest_change_ms)
    summary.newest_change_ms = rows.newest_change_ms
    summary.lineage = {c: traced.get(c, []) for c in rows.result.columns}
    if ingested is not None:
        summary.transaction_files, summary.transactions_ended = ingested.files, ingested.ends
        summary.transactions_quarantined = sum(ingested.quarantined.values()) or None
    if mark is not None:
        summary.transaction_watermark, summary.transactions_waiting = mark.transaction or "none", mark.waiting
        summary.waiting_for, summary.transaction_ids_unmatched = mark.blocked_by, mark.ids_unmatched
    return summary


def _gated(refresh: _Refresh, rows: _Rows, summary: GoldSummary) -> Generator[AuditGate, GateResult, DataFrame]:
    """The rows to publish, once the model's gate passed on them (it raises when it fails): those a `quarantine`
    expectation refused are kept aside first, as silver's are. A gate with checks on the model's rows (the user's
    expectations) runs here, its rows validated with its audit; one on the audit alone is asked."""
    model, result, engine, lake = refresh.model, rows.result, refresh.engine, refresh.lake
    check_columns(result, model.expectations, "the model's columns")
    published, quarantine = _quarantine_by_expectations(model, result, refresh.batch_id)
    audited = {"rows": result}
    if model.references:
        audited["references"] = _references(refresh.spark, engine, lake, model, result, refresh.inputs["silver_versions"])
    counted = summary.rows or 0
    figures = Figures(rows=counted, lag_s=summary.lag_s)
    if quarantine is not None:
        summary.quarantined = write_quarantine(engine, lake, model.name, quarantine, "gold", refresh.batch_id)
        figures.quarantined = sum(summary.quarantined.values())
        figures.quarantined_share = summary.quarantined_share = share(figures.quarantined, counted)
    audit, checks = Audit(figures, tally(audited, flagged("gold"), model.keys)), gold_checks(model)
    if refresh.gate is not None or any(c.frame != AUDIT for c in checks):
        check = refresh.gate or partial(run_gate, actions=model.quality.actions)
        check(audit, {"model": result}, model.name, "gold", checks, lake, summary)
    else:
        settle((yield AuditGate(model.name, "gold", audit, checks, lake, refresh.batch_id, model.quality.actions)),
               summary)
    return published


def _publish(refresh: _Refresh, rows: _Rows, published: DataFrame, summary: GoldSummary) -> int | None:
    """Writes the state, then gold (a run dying between the two, or before the inputs are recorded, finds a version
    it did not record and rebuilds both); sets the summary's version. Returns the state's version."""
    engine, lake, model, gold_version = refresh.engine, refresh.lake, refresh.model, refresh.gold_version
    state_path, state_version = lake.gold_state(model.name), None
    if rows.changed is not None:
        if rows.changed.num_rows:
            if rows.state_moved is not None:
                state_keys = tuple(group_columns(len(model.keys)))
                state_version = engine.merge(rows.state_moved, state_path, _rows_merge(state_keys)).version
            summary.version = engine.merge(rows.changed, lake.gold(model.name), _rows_merge(model.keys)).version
        else:  # only what its references read changed: nothing to write
            summary.version = gold_version
            state_version = engine.version(state_path) if rows.state_moved is not None else None
    else:
        if rows.state_built is not None:
            state_version = engine.overwrite(rows.state_built, state_path)
        if model.transactions and _same_rows(published, engine.read(refresh.spark, lake.gold(model.name),
                                                                     version=gold_version)):
            # while its watermark is held, a model at a watermark would publish the same rows again at each refresh
            summary.version, summary.refresh = gold_version, "unchanged (the rows at its watermark are those published)"
        else:
            summary.version = engine.overwrite(published, lake.gold(model.name))
    summary.published = summary.version != gold_version or None
    return state_version


def incremental_plan(model: GoldModel) -> IncrementalPlan | GroupsPlan | str:
    """How the model is kept incrementally (layers/gold_plan.py), or why it is rewritten whole: a per-group state when
    one keeps it, else its rows computed again for the keys the changes touch."""
    if model.transactions:
        return "its sources are read at a transaction watermark"
    if depends_on_the_clock(model):
        return "its rows or its gate depend on the clock"
    if any(u.action == QUARANTINE for u in model.expectations):
        return "a quarantine expectation judges its whole result"
    kept = plan(model.sql, model.keys)
    if isinstance(kept, IncrementalPlan):
        return kept
    regrouped = groups_plan(model.sql, model.keys, view_scope(model))
    if isinstance(regrouped, GroupsPlan) and set(regrouped.tables) - set(model.sources):
        return f"it reads {', '.join(sorted(set(regrouped.tables) - set(model.sources)))}, not among its sources"
    return regrouped if isinstance(regrouped, GroupsPlan) or kept == JOINED else kept


def view_scope(model: GoldModel) -> str:
    """The prefix of the temporary views a refresh of `model` registers (gold_plan.changed_view): its own."""
    return "_cdc_" + hashlib.sha256(model.name.encode()).hexdigest()[:12]


def _record_changes(engine: DeltaEngine, lake: Lake, table: str, batch_id: str) -> None:
    """Silver's change data feed on, for a model kept incrementally: turned on once, under the table's writer lock as
    any commit to it is (a table without it is read whole until then). Looked at first without the lock: a refresh
    never waits on the table's next batch for it."""
    path = lake.silver(table)
    if engine.version(path) is None or engine.changes_recorded(path):
        return
    with writer_lock(lake, table, batch_id):
        engine.record_changes(path)


def _changes_since(refresh: _Refresh, tables: tuple[str, ...], with_state: bool) -> dict[str, DataFrame] | str:
    """The change feed of each of `tables` that changed since the refresh that published the model's gold version
    (its rows with `_change_type`), or why the model is refreshed whole instead."""
    spark, engine, lake, model = refresh.spark, refresh.engine, refresh.lake, refresh.model
    recorded, inputs, gold_version = refresh.recorded, refresh.inputs, refresh.gold_version
    state_version = engine.version(lake.gold_state(model.name)) if with_state else None
    if gold_version is None or (with_state and state_version is None):
        return "first refresh"
    written: list[tuple[str, str, int | None, Any]] = [
        ("gold", lake.gold(model.name), gold_version, recorded.get("gold_version"))]
    if with_state:
        written.append(("its state", lake.gold_state(model.name), state_version, recorded.get("state_version")))
    for name, path, version, was in written:
        if was is None or version is None or was > version or not upkeep_only(engine, path, was, version):
            return f"{name} changed since its last refresh"
    if recorded.get("model") != inputs["model"]:
        return "its definition changed"
    found = {}
    for table in tables:
        after, upto = (recorded.get("silver_versions") or {}).get(table), inputs["silver_versions"][table]
        if after is None or upto is None or upto < after:
            return f"silver {table} was replaced"
        why = _not_replayable(engine, lake.silver(table), table, after, upto)
        if why:
            return why
        if upto > after:
            changes = engine.changes(spark, lake.silver(table), after, upto)
            if changes is None:
                return f"silver {table} kept no change feed since the last refresh"
            found[table] = changes
    return found


def _moved(refresh: _Refresh, planned: IncrementalPlan) -> gold_state.Moved | str:
    """The model's state moved by its source's changes since the refresh that published its gold version, or why it
    is rebuilt from all of silver instead."""
    engine, lake, model, silver = refresh.engine, refresh.lake, refresh.model, refresh.sources[planned.source]
    found = _changes_since(refresh, planned.tables, True)
    if isinstance(found, str):
        return found
    state = engine.read(refresh.spark, lake.gold_state(model.name), version=engine.version(lake.gold_state(model.name)))
    assert state is not None
    # none: only a table its references read changed, and no group moves
    changes = found.get(planned.source, silver.limit(0).withColumn("_change_type", F.lit("insert")))
    return gold_state.move(state, gold_state.signed_changes(changes), silver, planned)


@dataclass(frozen=True)
class Regrouped:
    """A refresh's rows of the model for the keys its changes touched (`GONE` = 1: the key has no row now)."""

    rows: pa.Table
    changes: int  # the change feed's rows, of every source
    newest_change_ms: int | None  # the newest source time of a row they added


def _regrouped(refresh: _Refresh, planned: GroupsPlan) -> Regrouped | str:
    """The model computed again for the keys its sources' changes since the refresh that published its gold version
    touched (gold_plan.GroupsPlan), or why it is computed whole instead."""
    spark, model, sources, schema = refresh.spark, refresh.model, refresh.sources, refresh.computed.schema
    found = _changes_since(refresh, planned.tables, False)
    if isinstance(found, str):
        return found
    scope = view_scope(model)
    views = {changed_view(scope, table): changes for table, changes in found.items()}
    for table in planned.tables:  # its rows now, and those its changes took away: every row a key was reached by
        taken = found[table].where(~F.col("_change_type").isin(*gold_state.ADDED)).drop("_change_type") \
            if table in found else None
        views[every_view(scope, table)] = sources[table] if taken is None \
            else sources[table].unionByName(taken, allowMissingColumns=True)
        views[source_view(scope, table)] = sources[table]
    if not found:  # only a table its references read changed
        # typed as Spark's own Arrow rows are (a timestamp with its zone)
        typed = to_arrow_schema(schema, timezone="UTC")
        return Regrouped(pa.schema([*typed, pa.field(gold_state.GONE, pa.int32())]).empty_table(), 0, None)
    added = [c.select(F.when(F.col("_change_type").isin(*gold_state.ADDED), F.col("_source_ts_ms")).alias("ts"))
             for c in found.values()]
    figures = one_row(reduce(DataFrame.unionByName, added).agg(F.count(F.lit(1)).alias("n"), F.max("ts").alias("ts")))
    named = [f"_k{i}" for i in range(len(model.keys))]
    # the touched keys on the driver (at most the changes' fan-out), made distinct there: a shuffle in Spark is a job
    # of its own
    reached = reduce(DataFrame.unionByName, analyzed(spark, views, *[r.sql for r in planned.reaches
                                                                    if r.table in found])).toArrow()
    reached_keys, seen, first = _grouped(reached, named), set(), []
    for key in reached_keys:
        first.append(key not in seen)
        seen.add(key)
    touched = F.broadcast(spark_frame(spark, reached.filter(pa.array(first, pa.bool_()))))
    for i, reach in enumerate(planned.reaches):
        if reach.keyed_by is not None:
            rows = sources[reach.table]
            views[keyed_view(scope, i)] = rows.join(touched, reduce(Column.__and__, [
                rows[c].eqNullSafe(touched[k]) for c, k in zip(reach.keyed_by, named, strict=True)]), "left_semi")
    again = analyzed(spark, views, planned.keyed_sql)[0].toArrow()
    present = set(_grouped(again, list(model.keys)))
    gone_keys = reached.filter(pa.array([f and key not in present for f, key in zip(first, reached_keys, strict=True)],
                                        pa.bool_()))
    loose = all_nullable(again.schema)  # a deleted key's row has no values
    gone = pa.table({f.name: gone_keys[named[model.keys.index(f.name)]].cast(f.type) if f.name in model.keys
                     else pa.nulls(gone_keys.num_rows, f.type) for f in loose}, schema=loose)
    rows = pa.concat_tables([
        again.cast(loose).append_column(gold_state.GONE, pa.array([0] * again.num_rows, pa.int32())),
        gone.append_column(gold_state.GONE, pa.array([1] * gone.num_rows, pa.int32()))])
    return Regrouped(rows, figures["n"], figures["ts"])


# A Spark session's temporary views are one namespace, and the pipeline service runs jobs side by side in one session:
# a refresh registers the views its SQL reads and has Spark analyze that SQL under this lock, so another job's refresh
# cannot swap a view of the same name in between (an analyzed frame keeps the plans of the views it read).
_VIEWS = threading.Lock()


def analyzed(spark: SparkSession, views: dict[str, DataFrame], *sql: str) -> list[DataFrame]:
    """Each of `sql` as Spark analyzes it (no job) with `views` registered under their names."""
    with _VIEWS:
        for name, frame in views.items():
            frame.createOrReplaceTempView(name)
        return [spark.sql(text) for text in sql]


def _same_rows(rows: DataFrame, published: DataFrame | None) -> bool:
    """The same columns, of the same types, holding the same rows (as many times each)."""
    if published is None or [(f.name, f.dataType) for f in rows.schema] != [(f.name, f.dataType) for f in published.schema]:
        return False
    return rows.exceptAll(published).unionByName(published.exceptAll(rows)).isEmpty()


def _grouped(rows: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    """Each row's values of `columns` as Spark groups them: NULL with NULL, NaN with NaN, -0.0 with 0.0."""
    def grouped(value: Any) -> Any:
        return ("NaN",) if isinstance(value, float) and value != value else value + 0.0 if isinstance(value, float) \
            else value
    return [tuple(grouped(v) for v in row) for row in zip(*(rows[c].to_pylist() for c in columns), strict=True)]


def _patched(spark: SparkSession, published: DataFrame | None, changed_rows: pa.Table, keys: tuple[str, ...]
             ) -> tuple[DataFrame, int]:
    """The model's published rows with the changed groups' rows in place of theirs (`GONE` ones left out): what gold
    will hold, for the gate, and how many they are."""
    assert published is not None
    changed = spark_frame(spark, changed_rows)
    kept = published.join(changed, gold_state.same_keys(keys, published, changed), "left_anti")
    return _materialised(kept.unionByName(changed.where(f"{gold_state.GONE} = 0").drop(gold_state.GONE)))


# what each commit to silver may be for its change feed to be replayed onto a model's state; anything else (a
# rebuild's or a widening's overwrite, a restore) rewrites the model whole
_REPLAYED = {"MERGE", "DELETE", "UPDATE"}
# the rows a commit changed, from its metrics (delta-rs names them in snake case, Delta in camel case); an update
# is two rows of the change feed
_CHANGED_ROWS = {"num_target_rows_inserted": 1, "num_target_rows_updated": 2, "num_target_rows_deleted": 1,
                 "num_deleted_rows": 1, "num_updated_rows": 2, "numTargetRowsInserted": 1, "numTargetRowsUpdated": 2,
                 "numTargetRowsDeleted": 1, "numDeletedRows": 1, "numUpdatedRows": 2}
_WRITTEN_ROWS = ("num_added_rows", "numOutputRows")  # an append's


def _not_replayable(engine: DeltaEngine, path: str, table: str, after: int, upto: int) -> str | None:
    """Why silver's commits after `after` up to `upto` are not replayed onto a model's state, if they are not."""
    commits = commits_between(engine, path, after, upto)
    if commits is None:
        return f"silver {table}'s log no longer holds every commit since the last refresh"
    changed = 0
    for commit in commits:
        operation, parameters = commit.get("operation"), commit.get("operationParameters") or {}
        metrics = commit.get("operationMetrics") or {}
        if operation == "WRITE" and str(parameters.get("mode", "")).strip('"') == "Append":
            changed += sum(int(metrics.get(name, 0)) for name in _WRITTEN_ROWS)
        elif operation in _REPLAYED | UPKEEP:
            changed += sum(int(metrics.get(name, 0)) * weight for name, weight in _CHANGED_ROWS.items())
        else:
            mode = f" {parameters['mode']}" if "mode" in parameters else ""
            return f"silver {table} was rewritten ({operation}{mode}, version {commit['version']})"
    if changed > settings().gold_max_changes:
        return f"{changed} changes to silver {table} since the last refresh, more than CDC_GOLD_MAX_CHANGES"
    return None


def _rows_merge(keys: tuple[str, ...]) -> MergeSpec:
    """A group's new row replaces its old one; a group no row is left in is deleted (keys may be NULL: a group's)."""
    return MergeSpec(keys=keys, delete_when=f"s.{gold_state.GONE} = 1", update_when=f"s.{gold_state.GONE} = 0",
                     insert_when=f"s.{gold_state.GONE} = 0", null_safe=True, marker=gold_state.GONE)



def _newest(sources: Any) -> int | None:
    """The newest source time of a row of the sources (a job each)."""
    newest = None
    for silver in sources:
        source_newest = one_row(silver.agg(F.max("_source_ts_ms").alias("ts")))["ts"]
        newest = source_newest if newest is None or (source_newest or 0) > newest else newest
    return newest


# Spark SQL functions whose value changes from one run to the next on the same data (some also without
# parentheses): a model calling one is refreshed every run. A mention in a comment only costs a refresh.
_CLOCK_OR_CHANCE = re.compile(r"\b(current_date|current_timestamp|localtimestamp|now|curdate|unix_timestamp|"
                              r"rand|randn|random|uuid|shuffle)\b", re.IGNORECASE)


def depends_on_the_clock(model: GoldModel) -> bool:
    """The model's rows or its gate's verdict may differ on unchanged silver: its SQL reads the clock (or
    draws at random), or its freshness is checked."""
    return model.freshness_s is not None or bool(_CLOCK_OR_CHANCE.search(model.sql))


def refresh_inputs(engine: DeltaEngine, lake: Lake, model: GoldModel) -> dict[str, Any]:
    """What a refresh reads: the model's definition (as a digest) and the version of every silver table its
    SQL or references read, taken before reading them (the refresh reads exactly these versions)."""
    definition = {f.name: getattr(model, f.name) for f in fields(model) if f.name not in ("path", "maintenance")}
    digest = hashlib.sha256(json.dumps(definition, sort_keys=True, default=repr).encode()).hexdigest()
    tables = sorted({*model.sources, *(ref.table for ref in model.references)})
    inputs: dict[str, Any] = {"model": digest, "silver_versions": {t: engine.version(lake.silver(t)) for t in tables}}
    if model.transactions:  # what the watermark and the sources read at it come from
        names = sorted(t.name for t in model.at_watermark)
        inputs["transaction_versions"] = {
            "transactions": {model.transactions: engine.version(lake.transactions(model.transactions))},
            "history": {t: engine.version(lake.history(t)) for t in names},
            "truncates": {t: engine.version(lake.truncates(t)) for t in names}}
    return inputs


def _published_inputs(lake: Lake, model: GoldModel) -> dict[str, Any] | None:
    text = lake.files.read(lake.gold_inputs(model.name))
    return None if text is None else dict(json.loads(text))


def _quarantine_by_expectations(model: GoldModel, result: DataFrame, batch_id: str) -> tuple[DataFrame, DataFrame | None]:
    """The model's rows to publish, and those a `quarantine` expectation refused as quarantine rows (the row
    as JSON, the expectation as reason, numbered within this refresh)."""
    if not any(u.action == QUARANTINE for u in model.expectations):
        return result, None
    numbered = result.withColumn(ROW_ID, F.monotonically_increasing_id()).localCheckpoint()
    failing = violations(numbered, model.expectations, ROW_ID)
    assert failing is not None
    failing = failing.localCheckpoint()
    published = numbered.join(failing, ROW_ID, "left_anti").drop(ROW_ID)
    refused = numbered.join(failing, ROW_ID).select(
        F.lit(f"gold/{model.name}/{batch_id}").alias("_source_file"), F.col(ROW_ID).alias("_line"),
        F.to_json(F.struct(*[F.col(c) for c in result.columns])).alias("_raw"), "reason")
    return published.localCheckpoint(), refused


ROW_ID = "_cdc_row_id"


def _references(spark: SparkSession, engine: DeltaEngine, lake: Lake, model: GoldModel, result: DataFrame,
                versions: dict[str, int | None]) -> DataFrame:
    """One row per reference and model row with all its columns set: `_found` when the silver table has
    a row with those values."""
    parts = []
    for ref in model.references:
        target = engine.read(spark, lake.silver(ref.table), version=versions[ref.table])
        values = result.select(*[F.col(c).alias(f"_v{i}") for i, c in enumerate(ref.columns)]).dropna()
        if target is None:
            parts.append(values.select(F.lit(ref.label()).alias("reference"), F.lit(False).alias("_found")))
            continue
        present = target.select(*[F.col(c).alias(f"_v{i}") for i, c in enumerate(ref.to)]).distinct() \
            .withColumn("_present", F.lit(True))
        parts.append(values.join(present, [f"_v{i}" for i in range(len(ref.columns))], "left").select(
            F.lit(ref.label()).alias("reference"), F.coalesce("_present", F.lit(False)).alias("_found")))
    return reduce(DataFrame.unionByName, parts)
