"""Great Expectations gates between layers (GX 1.x on Spark DataFrames).

A gate validates one or two audit frames (the batch's events with per-row flags, the merged rows of
its keys, a gold model's rows) and the batch's figures (quarantined share, delete reconciliation,
lag) against the expectations of quality/expectations.py,
each with its action: `warn` reports, `quarantine` has already moved the failing rows aside (the job
did, with the expectation as reason), `fail` fails the gate. The gate also fails when more of the batch
was quarantined than the table allows. Results go to GX Data Docs under `<lake>/reports/data_docs/<table>/`;
a failed gate raises `GateFailed` with one line naming the table, the layer, the expectations and counts.
Each table has its own GX project under `<lake>/_state/gx/<table>`, so tables validated in parallel never
write the same GX files. A small audit frame holding only the gate's own checks is validated with pandas
after one Spark job brings its columns over (docs/architecture.md, "Gates").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from pyspark.sql import DataFrame

from spark_jobs.errors import GateFailed
from spark_jobs.lake import Lake
from spark_jobs.quality import gx_project
from spark_jobs.quality.expectations import (
    EXPECTATIONS,
    FAIL,
    POST,
    QUARANTINE,
    WARN,
    Quality,
    UserExpectation,
    flag_expectations,
)
from spark_jobs.quality.findings import Finding, GateResult
from spark_jobs.registry import GoldModel, TableConfig

# GX phones home by default; this pipeline runs offline and must not try.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

NOT_NULL, IN_SET = "expect_column_values_to_not_be_null", "expect_column_values_to_be_in_set"
BETWEEN, EQUAL = "expect_column_values_to_be_between", "expect_column_pair_values_to_be_equal"
# checks on the batch's figures (a few numbers) are evaluated here, not by a Spark job per number
FIGURES = "figures"
# An audit frame with only the gate's own checks and at most this many rows is validated on the driver:
# its columns come over in one Spark job (GX on Spark runs one per column, and one per row condition).
# Larger frames, and frames with a user's expectations (written for Spark's types and SQL), stay on Spark.
LOCAL_ROWS = 100_000
# the gate's own row conditions in Spark SQL, and the same in pandas' query syntax for local frames
LOCAL_CONDITIONS = {"op IN ('c', 'u', 'r')": 'op in ["c", "u", "r"]', "op = 'd'": 'op == "d"'}


@dataclass(frozen=True)
class Check:
    """One expectation on one audit frame: its registry name, the GX class (snake case, as GX reports it)
    with its arguments, and the action a failure takes."""

    name: str
    frame: str
    type: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    action: str = FAIL
    description: str | None = None  # what Data Docs say the check means, in plain words

    def columns(self) -> set[str]:
        """The frame's columns the check reads."""
        named = {self.kwargs[k] for k in ("column", "column_A", "column_B") if k in self.kwargs}
        condition = {"op"} if self.kwargs.get("row_condition") in LOCAL_CONDITIONS else set()
        return named | set(self.kwargs.get("column_list", [])) | condition

    def runs_locally(self) -> bool:
        """The gate's own check (a user's is written for Spark), with no row condition or one known in pandas' syntax."""
        condition = self.kwargs.get("row_condition")
        return self.name in EXPECTATIONS and (condition is None or condition in LOCAL_CONDITIONS)

    def local(self) -> Check:
        """The check on a pandas frame: its row condition in pandas' syntax."""
        condition = self.kwargs.get("row_condition")
        if condition is None:
            return self
        return replace(self, kwargs={**self.kwargs, "row_condition": LOCAL_CONDITIONS[condition],
                                     "condition_parser": "pandas"})

    def label(self) -> str:
        if self.frame == FIGURES:  # the finding shows the figures themselves
            return self.name
        arg = self.kwargs.get("column") or self.kwargs.get("column_list") or self.kwargs.get("column_A")
        shown = ",".join(arg) if isinstance(arg, list) else arg
        return f"{self.name}({shown})" if shown and not str(shown).startswith("_") else self.name


def _with(quality: Quality, name: str, frame: str, type_: str, **kwargs: Any) -> Check:
    return Check(name, frame, type_, kwargs, quality.action(name), EXPECTATIONS[name].doc)


def user_checks(expectations: tuple[UserExpectation, ...], frame: str) -> list[Check]:
    """The user's own expectations (tables.yaml), each on `frame` under its GX name."""
    return [Check(u.type, frame, u.type, u.kwargs, u.action, u.description) for u in expectations]


def _flag(quality: Quality, name: str, frame: str, column: str) -> Check:
    """A check the job computed per row as a boolean column (null where it does not apply)."""
    return _with(quality, name, frame, IN_SET, column=column, value_set=[True])


def _flags(quality: Quality, layer: str) -> list[Check]:
    """The layer's expectations on per-row flags (quality/expectations.py), one check each."""
    return [_flag(quality, e.name, e.frame or "", e.column or "") for e in flag_expectations(layer)]


def before_publishing(checks: list[Check]) -> list[Check]:
    """The checks silver runs on a batch before writing it; the rest need the published result."""
    return [c for c in checks if c.name not in EXPECTATIONS or EXPECTATIONS[c.name].phase != POST]


def _keys(quality: Quality, frame: str, keys: tuple[str, ...]) -> list[Check]:
    unique = (_with(quality, "key_unique", frame, "expect_column_values_to_be_unique", column=keys[0]) if len(keys) == 1
              else _with(quality, "key_unique", frame, "expect_compound_columns_to_be_unique", column_list=list(keys)))
    return [*[_with(quality, "key_not_null", frame, NOT_NULL, column=k) for k in keys], unique]


def max_quarantined(quality: Quality) -> Check:
    """The quarantine circuit breaker on the batch's figures: the share quarantined at most the table's
    limit, checked only when at least `min_quarantined_to_fail` records were (GX's row condition on the
    figures' one row: below that count the check has nothing to judge, so a few bad records never trip it)."""
    return Check("max_quarantined", FIGURES, BETWEEN, {
        "column": "quarantined_share", "min_value": 0, "max_value": quality.max_quarantined,
        "row_condition": f"quarantined >= {quality.min_quarantined_to_fail}", "condition_parser": "pandas"}, FAIL,
        f"at most {quality.max_quarantined:.2%} of the batch is quarantined, once {quality.min_quarantined_to_fail} "
        "or more records are (fewer never stop the table)")


def bronze_checks(table: TableConfig) -> list[Check]:
    """Frame `events`: change events (op, key columns, `_deleted_flag_agrees`) and tombstone lines
    (`_follows_delete`); figures: quarantined_share."""
    q = table.quality
    return [
        *[_with(q, "event_has_key", "events", NOT_NULL, column=k, row_condition="op IN ('c', 'u', 'r')",
                condition_parser="spark") for k in table.keys],
        *[_with(q, "delete_has_key", "events", NOT_NULL, column=k, row_condition="op = 'd'", condition_parser="spark")
          for k in table.keys],
        *_flags(q, "bronze"),
        max_quarantined(q),
        *user_checks(table.layer_expectations("bronze"), "raw"),
    ]


def silver_checks(table: TableConfig) -> list[Check]:
    """Frames: `events` (`_seq_present`, `_no_tie` per row event; `_not_live_after` per delete), `rows`
    (the merged table's rows of the batch's keys); figures: quarantined_share, deletes_received,
    deletes_accounted."""
    q = table.quality
    return [
        *_flags(q, "silver"),
        *_keys(q, "rows", table.keys),
        _with(q, "deletes_reconcile", FIGURES, EQUAL,
              column_A="deletes_received", column_B="deletes_accounted"),
        max_quarantined(q),
        *user_checks(table.layer_expectations("silver"), "upserts"),
    ]


def gold_checks(model: GoldModel) -> list[Check]:
    """Frames: `model` (the refreshed rows), `references` (`_found` per reference and row, null-free
    values only); figures: lag_s, the age of the newest source change."""
    q = model.quality
    low, high = model.row_count
    checks = [*_keys(q, "model", model.keys),
              _with(q, "row_count", "model", "expect_table_row_count_to_be_between", min_value=low, max_value=high)]
    if model.references:
        checks += _flags(q, "gold")
    if model.freshness_s is not None:
        checks.append(_with(q, "freshness", FIGURES, BETWEEN, column="lag_s", max_value=model.freshness_s))
    if any(u.action == QUARANTINE for u in model.expectations):
        checks.append(max_quarantined(q))
    return [*checks, *user_checks(model.expectations, "model")]


def rebuild_data_docs(lake: Lake, table: str) -> None:
    """The table's Data Docs from the validation results its store holds (after maintenance removed old ones)."""
    gx_project.context(lake, table).build_data_docs(site_names=["reports"])


def _figures_frame(figures: dict[str, Any]) -> Any:
    """The batch's figures as the one row GX validates with pandas (a few numbers: no Spark job). A lag that
    is not known (no source time in the batch) is infinitely old, so a freshness check fails on it."""
    import pandas as pd

    return pd.DataFrame([{k: (float("inf") if k == "lag_s" and v is None else v) for k, v in figures.items()}])


def _shown(check: Check, figures: dict[str, Any]) -> str:
    """The figures a check on them read, for the finding: `0.5 (max 0.05), 3 record(s) (fails from 2)`."""
    if check.type == EQUAL:
        a, b = check.kwargs["column_A"], check.kwargs["column_B"]
        return f"{a}={figures[a]}, {b}={figures[b]}"
    shown = f"{figures[check.kwargs['column']]}"
    if check.kwargs.get("max_value") is not None:
        shown += f" (max {check.kwargs['max_value']})"
    if check.name == "max_quarantined":
        least = check.kwargs["row_condition"].rsplit(" ", 1)[1]
        shown += f", {figures['quarantined']} record(s) (fails from {least})"
    return shown


def _local_frame(df: DataFrame, checks: list[Check]) -> Any:
    """The columns the checks read as a pandas frame (one Spark job), when every check is the gate's own and
    the frame has at most LOCAL_ROWS rows; None otherwise."""
    if not all(c.runs_locally() for c in checks):
        return None
    columns = sorted(set().union(*(c.columns() for c in checks)))
    rows = df.select(*columns).limit(LOCAL_ROWS + 1).toArrow() if columns else None
    if rows is None or rows.num_rows > LOCAL_ROWS:
        return None
    return rows.to_pandas()


def _result_format(checks: list[Check]) -> dict[str, Any]:
    """BASIC has the counts the gate reports (SUMMARY adds value-count tables, a Spark job per expectation).
    Its sample of unexpected values costs a Spark job per expectation too; on flags (always False) and
    null checks (always null) the sample says nothing, so a frame with only those asks for none."""
    telling = [c for c in checks if not (c.type == NOT_NULL or (c.type == IN_SET and c.kwargs.get("value_set") == [True]))]
    return {"result_format": "BASIC", **({} if telling else {"partial_unexpected_count": 0})}


# GX severities shown in Data Docs for each action
_SEVERITY = {FAIL: "critical", QUARANTINE: "warning", WARN: "info"}


def run_gate(frames: dict[str, DataFrame], table: str, layer: str, checks: list[Check], lake: Lake,
             raise_on_failure: bool = True, figures: dict[str, Any] | None = None,
             actions: tuple[str, ...] = ()) -> GateResult:
    """Validate each frame against its checks (and `figures` against theirs) through a GX Checkpoint per
    frame, whose actions update Data Docs (and run the table's notification `actions`), and return the
    verdict; raise GateFailed when a `fail` check fails (unless told not to: the caller then raises after
    writing its evidence). Checks on frames not given are not run.

    One Checkpoint per frame, not one per gate: a Checkpoint hands all its validation definitions the same
    batch parameters, and each frame of a gate is its own dataframe. The Checkpoints (and the context) are made
    on a table's first gate in the process and reused while the checks are the same (quality/gx_project.py)."""
    from great_expectations.core.run_identifier import RunIdentifier

    inputs: dict[str, Any] = dict(frames)
    if figures is not None:
        inputs[FIGURES] = _figures_frame(figures)
    spark_app = next((df.sparkSession.sparkContext.applicationId for df in frames.values()), "")
    project = gx_project.project(lake, table, spark_app)
    run_id = RunIdentifier(run_name=f"{table}.{layer}")
    findings: list[Finding] = []
    validated = []
    with project.lock:
        for frame, df in inputs.items():
            frame_checks = [c for c in checks if c.frame == frame]
            if not frame_checks:
                continue
            where = gx_project.FIGURES if frame == FIGURES else gx_project.SPARK
            if where == gx_project.SPARK and (local := _local_frame(df, frame_checks)) is not None:
                df, frame_checks, where = local, [c.local() for c in frame_checks], gx_project.LOCAL
            name = f"{table}.{layer}.{frame}"
            result_id, outcome = project.validate(gx_project.FrameValidation(
                name, where, repr(frame_checks), partial(_suite, checks=frame_checks), _result_format(frame_checks),
                actions), df, run_id)
            validated.append(result_id)
            findings += _findings(outcome.results, frame_checks, (figures or {}) if frame == FIGURES else None)
        if validated and not actions:
            project.context.build_data_docs(site_names=["reports"], resource_identifiers=validated)
    docs = f"{lake.data_docs(table)}/index.html"
    gate = GateResult(table, layer, findings, docs if lake.files.exists(docs) else None)
    if raise_on_failure and not gate.success:
        raise GateFailed(gate)
    return gate


def _suite(name: str, checks: list[Check]) -> Any:
    """The frame's GX suite: one expectation per check, which its meta names (`n`: its place in `checks`)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    suite = gx.ExpectationSuite(name=name)
    for n, check in enumerate(checks):
        cls = getattr(gxe, "".join(part.title() for part in check.type.split("_")))
        described = {"description": check.description} if check.description else {}
        suite.add_expectation(cls(**check.kwargs, **described, severity=_SEVERITY[check.action],
                                  meta={"check": check.name, "action": check.action, "n": n}))
    return suite


def _findings(results: Any, checks: list[Check], figures: dict[str, Any] | None) -> list[Finding]:
    """One finding per check, in the checks' order, from GX's expectation results; on the figures frame
    (`figures` given) each finding shows the figures themselves."""
    findings = []
    for r in sorted(results, key=lambda r: r.expectation_config.meta["n"]):
        check, result = checks[r.expectation_config.meta["n"]], r.result or {}
        if figures is not None:
            findings.append(Finding(check.label(), check.action, bool(r.success), None, None, _shown(check, figures)))
            continue
        # flags are null where they do not apply: count the rows they apply to
        total = result.get("element_count")
        if total is not None and check.type == IN_SET:
            total -= result.get("missing_count") or 0
        findings.append(Finding(check.label(), check.action, bool(r.success), result.get("unexpected_count"),
                                total, result.get("observed_value")))
    return findings
