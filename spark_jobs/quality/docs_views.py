"""GX's Data Docs page views with their Jinja templates compiled once per process, and a pass's validation page with
a row per table and its verdict.

GX builds a new Jinja environment for every Data Docs build, which compiles its page templates again
each time: measured on a warm 1k-event batch, 66 compilations and about 0.7 s of its two gates' 1.2 s
of Data Docs. Jinja's own bytecode cache keeps the compiled templates (it checks each template's source
checksum, so an upgraded GX never gets stale code); GX has no setting for it, so these views install
it. Jinja ships file and memcached caches only: the pipeline service is one long-lived process, so the
cache is a dict here."""

from __future__ import annotations

from typing import Any

from great_expectations.render.components import RenderedSectionContent, RenderedTableContent
from great_expectations.render.renderer.page_renderer import ValidationResultsPageRenderer
from great_expectations.render.view import DefaultJinjaIndexPageView, DefaultJinjaPageView
from jinja2 import BytecodeCache
from jinja2.bccache import Bucket

from spark_jobs.quality.findings import Finding, GateResult

# the suite parameter (and the meta marking the expectation) a pass's validation names its tables by
# (quality/gates.py, run_audit_gates), and its frame's column naming each table's row
PASS_TABLES, TABLE = "pass_tables", "table"


class _InMemoryBytecodeCache(BytecodeCache):
    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


# every GX view builds its environment with the same options, so they can share compiled templates
_TEMPLATES = _InMemoryBytecodeCache()


class CachedPageView(DefaultJinjaPageView):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = _TEMPLATES


class CachedIndexPageView(DefaultJinjaIndexPageView):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = _TEMPLATES


def view(cls: type) -> dict[str, str]:
    """A view's GX configuration."""
    return {"module_name": cls.__module__, "class_name": cls.__name__}


class PassResultsPageRenderer(ValidationResultsPageRenderer):
    """GX's validation page; a pass's (its expectation on the frame's tables names them) opens with a row per table and
    its verdict, from the same results as its gate's (`table_passed`, findings.GateResult). GX itself lists only the
    failing rows, under each check."""

    def _collect_rendered_document_content_sections(self, validation_results: Any, *args: Any) -> Any:
        sections = super()._collect_rendered_document_content_sections(validation_results, *args)
        tables = next((r.expectation_config.kwargs.get("value_set") for r in validation_results.results
                       if (r.expectation_config.meta or {}).get(PASS_TABLES)), None)
        if tables:
            sections.insert(1, RenderedSectionContent(section_name="Tables", content_blocks=[_verdicts(
                validation_results.results, tables)]))
        return sections


def table_passed(result: Any, table: str) -> bool:
    """Did `table`'s row of a pass's frame pass the check of GX's expectation `result`? It failed when GX names it among
    the unexpected rows, and every table failed when the check raised (GX names none)."""
    failing = {row.get(TABLE) for row in (result.result or {}).get("unexpected_index_list") or []}
    return bool(result.success) or (bool(failing) and table not in failing)


def _verdicts(results: Any, tables: list[str]) -> RenderedTableContent:
    found: dict[str, list[Finding]] = {table: [] for table in tables}
    for r in results:
        meta = r.expectation_config.meta or {}
        if "check" not in meta:
            continue
        for table, findings in found.items():
            findings.append(Finding(meta["check"], meta["action"], table_passed(r, table), None, None))
    rows = [[table, GateResult(table, "", findings, None).verdict(),
             ", ".join(f.check for f in findings if not f.success) or "-"] for table, findings in found.items()]
    return RenderedTableContent(content_block_type="table", header_row=["Table", "Verdict", "Checks it failed"],
                                table=rows, styling={"classes": ["col-12", "table-responsive"],
                                                     "body": {"classes": ["table", "table-sm"]}})


# the views of a Data Docs site's sections (SiteBuilder's `site_section_builders`, merged into GX's defaults)
SECTION_VIEWS: dict[str, Any] = {section: {"view": view(CachedPageView)}
                                 for section in ("expectations", "validations", "profiling")}
SECTION_VIEWS["validations"]["renderer"] = view(PassResultsPageRenderer)
