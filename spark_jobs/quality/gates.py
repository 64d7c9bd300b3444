"""Great Expectations gates between layers (GX 1.x).

A gate validates the batch's audit (quality/audit.py: each check's tally over the layer's rows, counted in the
layer's own Spark aggregation, and the batch's figures) as one row, and a user's expectations (tables.yaml) on
the batch's rows on Spark, each check with its action: `warn` reports, `quarantine` has already moved the
failing rows aside (the job did, with the expectation as reason), `fail` fails the gate. The gate also fails
when more of the batch was quarantined than the table allows. Results go to GX Data Docs under
`<lake>/reports/data_docs/<table>/`; a failed gate raises `GateFailed` with one line naming the table, the
layer, the expectations and counts. Each table has its own GX project under `<lake>/_state/gx/<table>`, so
tables validated in parallel never write the same GX files (docs/architecture.md, "Gates"). The tables of a
shared pass are gated on their audits together, a row each, in one validation of the layer's pass project
(`run_audit_gates`: `<layer>-pass`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from pyspark.sql import DataFrame

from spark_jobs.errors import GateFailed
from spark_jobs.lake import Lake
from spark_jobs.quality import gx_project
from spark_jobs.quality.audit import Audit
from spark_jobs.quality.expectations import (
    EXPECTATIONS,
    FAIL,
    QUARANTINE,
    WARN,
    Quality,
    UserExpectation,
)
from spark_jobs.quality.findings import Finding, GateResult
from spark_jobs.registry import GoldModel, TableConfig

# GX phones home by default; this pipeline runs offline and must not try.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

BETWEEN = "expect_column_values_to_be_between"
# the frame name of the audit's one row
AUDIT = "audit"


@dataclass(frozen=True)
class Check:
    """One expectation on one frame (the audit's row, or a user's expectation on the batch's rows): its name,
    the GX class (snake case, as GX reports it) with its arguments, and the action a failure takes."""

    name: str
    frame: str
    type: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    action: str = FAIL
    description: str | None = None  # what Data Docs say the check means, in plain words

    def label(self) -> str:
        if self.frame == AUDIT:
            return self.name
        arg = self.kwargs.get("column") or self.kwargs.get("column_list") or self.kwargs.get("column_A")
        shown = ",".join(arg) if isinstance(arg, list) else arg
        return f"{self.name}({shown})" if shown else self.name


def _on_audit(quality: Quality, name: str, column: str, **bounds: Any) -> Check:
    """A built-in check on the audit's row: `column` (a tally's failures, or a figure) within `bounds`."""
    return Check(name, AUDIT, BETWEEN, {"column": column, **bounds}, quality.action(name), EXPECTATIONS[name].doc)


def builtin(quality: Quality, layer: str, bounds: dict[str, dict[str, Any]] | None = None) -> list[Check]:
    """The layer's built-in checks, in their records' order (quality/expectations.py): a check on rows passes
    when none of its rows fails it, a check on figures when its figure is within its `bounds` (from the table's
    settings; a check without them is not configured here and not run)."""
    bounds = bounds or {}
    checks = []
    for e in EXPECTATIONS.values():
        if layer in e.layers and e.flag is not None:
            checks.append(_on_audit(quality, e.name, e.name, min_value=0, max_value=0))
        elif layer in e.layers and e.figure is not None and e.name in bounds:
            checks.append(_on_audit(quality, e.name, e.figure, **bounds[e.name]))
    return checks


def user_checks(expectations: tuple[UserExpectation, ...], frame: str) -> list[Check]:
    """The user's own expectations (tables.yaml), each on `frame` under its GX name."""
    return [Check(u.type, frame, u.type, u.kwargs, u.action, u.description) for u in expectations]


def max_quarantined(quality: Quality) -> Check:
    """The quarantine circuit breaker on the batch's figures: the share quarantined at most the table's
    limit, checked only when at least `min_quarantined_to_fail` records were (GX's row condition on the
    audit's one row: below that count the check has nothing to judge, so a few bad records never trip it)."""
    return Check("max_quarantined", AUDIT, BETWEEN, {
        "column": "quarantined_share", "min_value": 0, "max_value": quality.max_quarantined,
        "row_condition": f"quarantined >= {quality.min_quarantined_to_fail}", "condition_parser": "pandas"}, FAIL,
        f"at most {quality.max_quarantined:.2%} of the batch is quarantined, once {quality.min_quarantined_to_fail} "
        "or more records are (fewer never stop the table)")


def bronze_checks(table: TableConfig) -> list[Check]:
    q = table.quality
    return [*builtin(q, "bronze"), max_quarantined(q), *user_checks(table.layer_expectations("bronze"), "raw")]


def silver_checks(table: TableConfig) -> list[Check]:
    q = table.quality
    return [*builtin(q, "silver", {"deletes_reconcile": {"min_value": 0, "max_value": 0}}), max_quarantined(q),
            *user_checks(table.layer_expectations("silver"), "upserts")]


def gold_checks(model: GoldModel) -> list[Check]:
    q = model.quality
    low, high = model.row_count
    bounds: dict[str, dict[str, Any]] = {"row_count": {"min_value": low, "max_value": high}}
    if model.freshness_s is not None:
        bounds["freshness"] = {"max_value": model.freshness_s}
    checks = builtin(q, "gold", bounds)
    if any(u.action == QUARANTINE for u in model.expectations):
        checks.append(max_quarantined(q))
    return [*checks, *user_checks(model.expectations, "model")]


def may_refuse(checks: list[Check], rows: set[str]) -> bool:
    """Is there a `fail` check on any of these rows (so silver tallies them before publishing)?"""
    return any(c.action == FAIL and c.name in EXPECTATIONS and EXPECTATIONS[c.name].rows in rows for c in checks)


def refuses(audit: Audit, checks: list[Check]) -> bool:
    """Does a `fail` check on rows fail on the audit's tallies (silver: before anything is published)?"""
    return any(c.action == FAIL and c.name in audit.tallies and audit.tallies[c.name].failed for c in checks)


def rebuild_data_docs(lake: Lake, table: str) -> None:
    """The table's Data Docs from the validation results its store holds (after maintenance removed old ones)."""
    gx_project.Project(gx_project.context(lake, table)).build_docs(None, table)


def _audit_values(audit: Audit) -> dict[str, Any]:
    """The audit as the one row GX validates with pandas: each tally's failures under its check's name, then
    the figures. A lag that is not known (no source time in the batch) is infinitely old, so a freshness
    check fails on it."""
    figures = {k: (float("inf") if k == "lag_s" and v is None else v) for k, v in asdict(audit.figures).items()}
    assert not set(figures) & set(audit.tallies), "a check is named like a figure"
    return {**{name: t.failed for name, t in audit.tallies.items()}, **figures}


def _measured(check: Check, values: dict[str, Any]) -> bool:
    """Does the audit hold what the check reads? A check on rows none of this gate's frames held has no tally,
    a check on a figure not measured in this batch no value: neither is run."""
    return values.get(check.kwargs["column"]) is not None


def _shown(check: Check, audit: Audit) -> str:
    """The figures a check on them read, for the finding: `0.5 (max 0.05), 3 record(s) (fails from 2)`."""
    figures = asdict(audit.figures)
    figure = check.kwargs["column"]
    if figure == "deletes_unaccounted":
        return f"{figures[figure]} of {figures['deletes_received']} deletes received not accounted for"
    shown = f"{figures[figure]}"
    if check.kwargs.get("max_value") is not None:
        shown += f" (max {check.kwargs['max_value']})"
    if check.name == "max_quarantined":
        least = check.kwargs["row_condition"].rsplit(" ", 1)[1]
        shown += f", {figures['quarantined']} record(s) (fails from {least})"
    return shown


# GX severities shown in Data Docs for each action
_SEVERITY = {FAIL: "critical", QUARANTINE: "warning", WARN: "info"}


def run_gate(audit: Audit, frames: dict[str, DataFrame], table: str, layer: str, checks: list[Check], lake: Lake, *,
             run_name: str, raise_on_failure: bool = True, actions: tuple[str, ...] = ()) -> GateResult:
    """Validate the audit's row and each frame of a user's expectations against their checks, through a GX
    Checkpoint each, whose actions update Data Docs (and run the table's notification `actions`), and return the
    verdict; raise GateFailed when a `fail` check fails (unless told not to: the caller then raises after
    writing its evidence). Checks on what this gate was not given are not run.

    A Checkpoint hands all its validation definitions the same batch parameters, and each frame is its own
    dataframe: one Checkpoint per frame. They (and the context) are made on a table's first gate in the process
    and reused while the checks are the same (quality/gx_project.py)."""
    import pandas as pd
    from great_expectations.core.run_identifier import RunIdentifier
    from pyspark.sql import SparkSession

    values = _audit_values(audit)
    inputs: dict[str, Any] = {AUDIT: pd.DataFrame([values]), **frames}
    # the process's Spark application, whether or not this gate has frames on Spark: one project per table
    spark_app = SparkSession.active().sparkContext.applicationId
    project = gx_project.project(lake, table, spark_app)
    run_id = RunIdentifier(run_name=run_name)  # the pipeline's run: GX's results and pages name the run they gated
    findings: list[Finding] = []
    validated = []
    with project.lock:
        for frame, df in inputs.items():
            frame_checks = [c for c in checks if c.frame == frame and (frame != AUDIT or _measured(c, values))]
            if not frame_checks:
                continue
            result_id, outcome = project.validate(gx_project.FrameValidation(
                f"{table}.{layer}.{frame}", gx_project.AUDIT if frame == AUDIT else gx_project.SPARK, repr(frame_checks),
                partial(_suite, checks=frame_checks), {"result_format": "BASIC"}, actions), df, run_id)
            validated.append(result_id)
            findings += _findings(outcome.results, frame_checks, audit if frame == AUDIT else None)
        if validated and not actions:
            project.build_docs(validated, table)
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


def _pass_suite(name: str, checks: list[Check]) -> Any:
    """A pass's suite: the checks, on a row per table, and first that the frame holds a row for each table the pass
    gates and no other (the page names them, and a table whose row were lost would fail, not pass unchecked)."""
    import great_expectations.expectations as gxe
    from great_expectations.expectations.metadata_types import FailureSeverity

    from spark_jobs.quality.docs_views import PASS_TABLES, TABLE

    suite = _suite(name, checks)
    suite.add_expectation(gxe.ExpectColumnDistinctValuesToEqualSet(
        column=TABLE, value_set={"$PARAMETER": PASS_TABLES}, severity=FailureSeverity(_SEVERITY[FAIL]), meta={PASS_TABLES: True},
        description="the pass gates each of its tables on its own row"))
    return suite


def _findings(results: Any, checks: list[Check], audit: Audit | None) -> list[Finding]:
    """One finding per check, in the checks' order, from GX's expectation results; on the audit's row (`audit`
    given) a check on rows shows its tally, a check on figures the figures themselves."""
    findings = []
    for r in sorted(results, key=lambda r: r.expectation_config.meta["n"]):
        check, result = checks[r.expectation_config.meta["n"]], r.result or {}
        if audit is not None:
            findings.append(_audit_finding(check, audit, bool(r.success)))
            continue
        findings.append(Finding(check.label(), check.action, bool(r.success), result.get("unexpected_count"),
                                result.get("element_count"), result.get("observed_value")))
    return findings


def _audit_finding(check: Check, audit: Audit, success: bool) -> Finding:
    """A check on the audit's row: a check on rows shows its tally, a check on figures the figures themselves."""
    tally = audit.tallies.get(check.name)
    if tally:
        return Finding(check.label(), check.action, success, tally.failed, tally.applies)
    return Finding(check.label(), check.action, success, None, None, _shown(check, audit))


@dataclass(frozen=True)
class AuditGate:
    """One table's gate on its audit alone (no frames of a user's expectations): what a pass asks of each table
    before it goes on, and answers for them all together (`answer_gates`)."""

    table: str
    layer: str
    audit: Audit
    checks: list[Check]
    lake: Lake
    run_name: str  # the pipeline's run
    actions: tuple[str, ...] = ()  # the table's notification actions (JSON): run by its own Checkpoint

    def answer_alone(self) -> GateResult:
        return run_gate(self.audit, {}, self.table, self.layer, self.checks, self.lake, run_name=self.run_name,
                        raise_on_failure=False, actions=self.actions)


def answer_gates(asked: dict[str, AuditGate], run_name: str) -> dict[str, GateResult]:
    """Each asking table's verdict (by table; none raises): one GX validation for the tables of a layer (`run_audit_gates`),
    each alone where its notification actions are its own Checkpoint's."""
    verdicts = {name: gate.answer_alone() for name, gate in asked.items() if gate.actions}
    layers: dict[str, list[AuditGate]] = {}
    for gate in asked.values():
        if not gate.actions:
            layers.setdefault(gate.layer, []).append(gate)
    for layer, gates in layers.items():
        verdicts |= run_audit_gates(gates, layer, gates[0].lake, run_name)
    return verdicts


PASS_LAYERS = ("bronze", "silver", "gold")  # the layers whose passes gate their tables (a run's models) together


def pass_site(layer: str) -> str:
    """The GX project and Data Docs site of a layer's passes: a name no table or model has (theirs have no '-')."""
    return f"{layer}-pass"


def run_audit_gates(gates: list[AuditGate], layer: str, lake: Lake, run_name: str) -> dict[str, GateResult]:
    """Many tables' gates on their audits, by table, in one GX validation of the layer's suite `<layer>.audit`, where
    each alone costs one: a frame with a row per table, `table` its unexpected-index column, so GX's result names each
    failing table and each table's verdict comes from its own row (a value not measured for a table is null there: GX
    skips it, and it is no finding of that table's). Tables whose settings differ share the suite: each of their
    checks holds for its own tables' rows (`_restricted`). One Data Docs page, under the layer's pass site; GX's run is
    `run_name` (the pipeline's run). Nothing raises for a failing table: its caller decides (`GateResult.success`)."""
    import pandas as pd
    from great_expectations.core.run_identifier import RunIdentifier
    from pyspark.sql import SparkSession

    from spark_jobs.quality.docs_views import PASS_TABLES, TABLE, table_passed

    site = pass_site(layer)
    project = gx_project.project(lake, site, SparkSession.active().sparkContext.applicationId)
    ordered = sorted(gates, key=lambda g: g.table)  # the page's rows in the tables' order
    values = {gate.table: _audit_values(gate.audit) for gate in ordered}
    groups: dict[str, list[AuditGate]] = {}
    for gate in ordered:
        groups.setdefault(repr([c for c in gate.checks if c.frame == AUDIT]), []).append(gate)
    checks: list[tuple[Check, list[AuditGate]]] = []  # each of the suite's checks, and the tables it holds for
    for members in groups.values():
        checks += [(check, members) for check in members[0].checks
                   if check.frame == AUDIT and any(_measured(check, values[g.table]) for g in members)]
    found: dict[str, list[tuple[int, Finding]]] = {gate.table: [] for gate in gates}
    suited = [_restricted(check, members, len(groups) > 1, list(values)) for check, members in checks]
    if checks:  # none measured for any of the tables: nothing to validate, no page
        with project.lock:
            result_id, outcome = project.validate(gx_project.FrameValidation(
                f"{layer}.{AUDIT}", gx_project.AUDIT, repr(suited), partial(_pass_suite, checks=suited),
                {"result_format": "COMPLETE", "unexpected_index_column_names": [TABLE]}, ()),
                pd.DataFrame([{TABLE: table, **v} for table, v in values.items()]), run_id=RunIdentifier(run_name=run_name),
                parameters={PASS_TABLES: list(values)})
            whole = all(r.success for r in outcome.results if (r.expectation_config.meta or {}).get(PASS_TABLES))
            for r in outcome.results:
                if "n" not in (r.expectation_config.meta or {}):
                    continue
                n = r.expectation_config.meta["n"]
                check, members = checks[n]
                for gate in members:
                    if _measured(check, values[gate.table]):
                        success = whole and table_passed(r, gate.table)  # a frame not whole fails every table
                        found[gate.table].append((n, _audit_finding(check, gate.audit, success)))
            project.build_docs([result_id], site)
    docs = f"{lake.data_docs(site)}/index.html"
    shown = docs if lake.files.exists(docs) else None
    return {table: GateResult(table, layer, [f for _, f in sorted(findings, key=lambda x: x[0])], shown)
            for table, findings in found.items()}


def _restricted(check: Check, members: list[AuditGate], several: bool, tables: list[str]) -> Check:
    """The check as the pass's suite holds it: on the rows of `members`' tables alone when the pass's tables do not
    all share their checks (a row condition on the frame's table column, beside the check's own; said by the
    tables it leaves out when they are fewer, as when a few of a database's tables have settings of their own)."""
    from spark_jobs.quality.docs_views import TABLE

    if not several:
        return check
    own, others = sorted(g.table for g in members), sorted(set(tables) - {g.table for g in members})
    on_tables = f"{TABLE} not in {others!r}" if len(others) < len(own) else f"{TABLE} in {own!r}"
    condition = check.kwargs.get("row_condition")
    return replace(check, kwargs={**check.kwargs, "condition_parser": "pandas",
                                  "row_condition": f"({on_tables}) and ({condition})" if condition else on_tables})
