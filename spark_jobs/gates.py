"""Great Expectations gates between layers (GX 1.x on Spark DataFrames).

A gate validates a DataFrame against the layer's suite, publishes the result to GX Data Docs under
`<lake>/reports/data_docs/<table>/`, and raises `GateFailed` with one line naming the table, the layer,
the expectation and the counts when any expectation fails. Each table has its own GX project under
`<lake>/_state/gx/<table>`, so tables validated in parallel never write the same GX files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from spark_jobs.config import GoldModel, TableConfig

# GX phones home by default; this pipeline runs offline and must not try.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@dataclass(frozen=True)
class Check:
    """One expectation: the GX class name (snake case, as GX reports it) and its arguments."""

    type: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        arg = self.kwargs.get("column") or self.kwargs.get("column_list") or self.kwargs.get("min_value")
        shown = ",".join(arg) if isinstance(arg, list) else arg
        return f"{self.type}({shown})" if shown is not None else self.type


def _key_checks(keys: tuple[str, ...]) -> list[Check]:
    return [Check("expect_column_values_to_not_be_null", {"column": k}) for k in keys]


def _unique(keys: tuple[str, ...]) -> Check:
    if len(keys) == 1:
        return Check("expect_column_values_to_be_unique", {"column": keys[0]})
    return Check("expect_compound_columns_to_be_unique", {"column_list": list(keys)})


def bronze_checks(table: TableConfig) -> list[Check]:
    """Bronze batch, key columns extracted: every change event has its key (truncates carry none) and
    a known op."""
    not_truncate = {"row_condition": "op <> 't'", "condition_parser": "spark"}
    keys = [Check("expect_column_values_to_not_be_null", {"column": k, **not_truncate}) for k in table.keys]
    return keys + [Check("expect_column_values_to_be_in_set", {"column": "op", "value_set": list("cudrt")})]


def silver_checks(table: TableConfig) -> list[Check]:
    return _key_checks(table.keys) + [_unique(table.keys)]


def gold_checks(model: GoldModel) -> list[Check]:
    return _key_checks(model.keys) + [_unique(model.keys), Check("expect_table_row_count_to_be_between", {"min_value": 1})]


@dataclass
class Finding:
    check: str
    success: bool
    unexpected: int | None
    total: int | None
    observed: Any = None


@dataclass
class GateResult:
    table: str
    layer: str
    success: bool
    findings: list[Finding]
    docs: str | None

    def verdict(self) -> str:
        return "passed" if self.success else "failed"

    def failure_line(self) -> str:
        bad = [f for f in self.findings if not f.success]
        parts = []
        for f in bad:
            counts = f"observed={f.observed}" if f.unexpected is None else f"unexpected={f.unexpected} of {f.total}"
            parts.append(f"expectation={f.check} {counts}")
        return f"gate failed: table={self.table} layer={self.layer} " + "; ".join(parts)


class GateFailed(RuntimeError):
    def __init__(self, result: GateResult):
        super().__init__(result.failure_line())
        self.result = result


def _context(lake: str, table: str) -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    root = Path(lake) / "_state" / "gx" / table
    context = gx.get_context(mode="file", project_root_dir=str(root))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    docs_dir = Path(lake) / "reports" / "data_docs" / table
    site: Any = {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }
    sites = context.variables.data_docs_sites or {}
    if sites.get("reports") != site or len(sites) != 1:
        for name in list(sites):
            context.delete_data_docs_site(name)
        context.add_data_docs_site(site_name="reports", site_config=site)
    return context


def run_gate(df: DataFrame, table: str, layer: str, checks: list[Check], lake: str) -> GateResult:
    """Validate `df`; publish Data Docs; raise GateFailed when any check fails."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    context = _context(lake, table)
    name = f"{table}.{layer}"
    source = context.data_sources.add_or_update_spark(name="lake")
    asset = next((a for a in source.assets if a.name == name), None) or source.add_dataframe_asset(name=name)
    batch = next((b for b in asset.batch_definitions if b.name == "batch"), None)
    batch = batch or asset.add_batch_definition_whole_dataframe("batch")
    suite = gx.ExpectationSuite(name=name)
    for check in checks:
        cls = getattr(gxe, "".join(part.title() for part in check.type.split("_")))
        suite.add_expectation(cls(**check.kwargs))
    suite = context.suites.add_or_update(suite)
    definition = context.validation_definitions.add_or_update(gx.ValidationDefinition(name=name, data=batch, suite=suite))
    checkpoint = context.checkpoints.add_or_update(gx.Checkpoint(
        name=name, validation_definitions=[definition], result_format={"result_format": "SUMMARY"},
        actions=[gx.checkpoint.UpdateDataDocsAction(name="publish_reports", site_names=["reports"])]))
    outcome = checkpoint.run(batch_parameters={"dataframe": df})
    findings = []
    for run in outcome.run_results.values():
        for r in run.results:
            result = r.result or {}
            kwargs = {k: v for k, v in r.expectation_config.kwargs.items() if k != "batch_id"}
            label = Check(r.expectation_config.type, kwargs).label()
            findings.append(Finding(label, bool(r.success), result.get("unexpected_count"),
                                    result.get("element_count"), result.get("observed_value")))
    docs = Path(lake) / "reports" / "data_docs" / table / "index.html"
    gate = GateResult(table, layer, bool(outcome.success), findings, str(docs) if docs.exists() else None)
    if not gate.success:
        raise GateFailed(gate)
    return gate
