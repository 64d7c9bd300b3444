"""The GX objects a gate validates with, made once per process and kept while they stay the same.

A table's Data Context, and per audit frame its data source, asset, batch definition, suite, validation
definition and Checkpoint, are what a gate needs before it validates anything. Making them took about 1 s of
a warm 1k-event batch's 2.3 s of gates (measured with cProfile: each data source change serialises GX's whole
project configuration as YAML, each suite, definition and Checkpoint is written to its store). The pipeline
service runs every batch of a table in one process, so they are made on a table's first gate and then reused
while the frame's checks, result format and actions are the same; a changed check makes (and stores) its
frame's objects anew. GX keeps no such cache itself: `add_or_update` writes every time.

Kept per lake folder and Spark application (GX's Spark data source holds the session it first saw), at most
MAX_PROJECTS tables at once, least recently used dropped first. One gate at a time uses a project (its lock):
a table's steps are serialised by its writer lock already, so the lock is seldom waited on."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.lake import Lake
from spark_jobs.logs import logger
from spark_jobs.quality import docs_assets
from spark_jobs.stopwatch import in_gx

log = logger(__name__)

MAX_PROJECTS = 1024  # a whole database's tables: a smaller cache would make each of them anew every cycle
LAKE_BACKEND = {"class_name": "LakeStoreBackend", "module_name": "spark_jobs.quality.gx_store"}
# where a frame is validated: on Spark (a user's expectations on the batch's rows), or with pandas (the audit's row)
SPARK, AUDIT = "spark", "audit"
_SOURCES = {SPARK: "lake", AUDIT: "audit"}


def context(lake: Lake, table: str) -> Any:
    """A new GX context for the table. Its configuration is built from the registry (nothing of it is kept in a
    project file a killed run could leave half-written); suites, validation results and Data Docs are files
    under `_state/gx/<table>/gx` and the reports, each written atomically (gx_store)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        FilesystemStoreBackendDefaults,
        ProgressBarsConfig,
    )

    from spark_jobs.quality.docs_views import SECTION_VIEWS, CachedIndexPageView, view

    defaults = FilesystemStoreBackendDefaults(root_directory=lake.gx_stores(table))
    for name, store in defaults.stores.items():
        backend: dict[str, Any] = store["store_backend"]  # type: ignore[index,assignment]
        backend.update(LAKE_BACKEND)
        if name == defaults.validation_results_store_name:  # what Data Docs render: source values escaped
            backend["class_name"] = "ValidationResultsStoreBackend"
    docs_dir = lake.data_docs(table)
    site: Any = {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "store_backend": {**LAKE_BACKEND, "class_name": "DataDocsStoreBackend", "base_directory": docs_dir},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder", "view": view(CachedIndexPageView)},
        "site_section_builders": SECTION_VIEWS,
    }
    config = DataContextConfig(store_backend_defaults=defaults, data_docs_sites={"reports": site},
                               progress_bars=ProgressBarsConfig(globally=False))
    return gx.get_context(project_config=config, mode="ephemeral")


@dataclass(frozen=True)
class FrameValidation:
    """What a frame's Checkpoint is made from: its name (`<table>.<layer>.<frame>`), where it is validated, its
    suite (made only when the checkpoint is), the result format and the table's notification actions (JSON)."""

    name: str
    where: str
    identity: str  # the checks, as text: equal for equal checks
    suite: Callable[[str], Any]  # the suite of the checks, under the name given
    result_format: dict[str, Any]
    actions: tuple[str, ...]

    @property
    def bound(self) -> str:
        """The name of its suite, validation definition and Checkpoint. Each is bound to its data source: one per
        path a frame may take, so a Checkpoint never loads one that names another source's asset."""
        return f"{self.name}.{self.where}"

    @property
    def key(self) -> str:
        return json.dumps([self.identity, self.result_format, self.actions], sort_keys=True)


@dataclass
class Project:
    """One table's GX context and the Checkpoints made in it so far."""

    context: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    checkpoints: dict[str, tuple[str, Any]] = field(default_factory=dict)  # bound name -> (key, Checkpoint)

    def checkpoint(self, frame: FrameValidation) -> Any:
        """The frame's Checkpoint: the one made before for the same checks, else a new one, stored (its suite
        replaces the stored one of that name, which a Checkpoint made before no longer matches: it is dropped)."""
        key, made = self.checkpoints.get(frame.bound, ("", None))
        if made is None or key != frame.key:
            made = self._make(frame)
            self.checkpoints[frame.bound] = (frame.key, made)
        return made

    def validate(self, frame: FrameValidation, df: Any, run_id: Any, parameters: dict[str, Any] | None = None
                 ) -> tuple[Any, Any]:
        """Run the frame's Checkpoint on `df` (with its suite's `parameters`): (its result's id, the outcome). Objects
        its stores lost since they were made (the lake's folder deleted under a running service) are made and stored
        again first."""
        from great_expectations.exceptions.resource_freshness import (
            ResourceFreshnessAggregateError,
            ResourceFreshnessError,
        )

        run = {"batch_parameters": {"dataframe": df}, "run_id": run_id, "expectation_parameters": parameters}
        with in_gx():
            try:
                outcome = self.checkpoint(frame).run(**run)
            except (ResourceFreshnessAggregateError, ResourceFreshnessError):  # GX checks them before it validates
                del self.checkpoints[frame.bound]
                outcome = self.checkpoint(frame).run(**run)
        return next(iter(outcome.run_results.items()))

    def build_docs(self, validated: list[Any] | None, site: str) -> None:
        """The Data Docs pages of the `validated` results (None: of every result its store holds), and the site's
        index. Pages are the gate's report, not its verdict: without the assets (said once at the run's start,
        cli.run) none is built, and a build that fails (a store's error) is logged with its cause, failing no table."""
        if docs_assets.not_fetched():
            return
        try:
            with in_gx():
                self.context.build_data_docs(site_names=["reports"], resource_identifiers=validated)
        except Exception as exc:  # GX wraps a store's failure in its own errors: any of them is only the pages'
            log.warning(f"Data Docs of {site} not built: {type(exc).__name__}: {exc}; the gate's verdict stands")

    def _source(self, where: str) -> Any:
        """The data source, added once: adding it again would replace it, and the assets the checkpoints made
        before are bound to with it."""
        sources = self.context.data_sources
        name = _SOURCES[where]
        if name in sources.all():
            return sources.get(name)
        return (sources.add_spark if where == SPARK else sources.add_pandas)(name=name)

    def _make(self, frame: FrameValidation) -> Any:
        import great_expectations as gx
        from great_expectations.checkpoint import UpdateDataDocsAction

        source = self._source(frame.where)
        asset = next((a for a in source.assets if a.name == frame.name), None) or source.add_dataframe_asset(name=frame.name)
        batch = next((b for b in asset.batch_definitions if b.name == "batch"), None)
        batch = batch or asset.add_batch_definition_whole_dataframe("batch")
        bound = frame.bound
        suite = self.context.suites.add_or_update(frame.suite(bound))
        definition = self.context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=bound, data=batch, suite=suite))
        # Data Docs: a notification's link needs the page the checkpoint's own action writes; without notifications,
        # the gate's pages and the index are written once per gate (each build also renders the site's index page)
        docs_action = [UpdateDataDocsAction(name="data_docs", site_names=["reports"])] \
            if frame.actions and not docs_assets.not_fetched() else []
        return self.context.checkpoints.add_or_update(gx.Checkpoint(
            name=bound, validation_definitions=[definition], actions=[*docs_action, *map(json.loads, frame.actions)],
            result_format=frame.result_format))


_projects: OrderedDict[tuple[str, str], Project] = OrderedDict()
_projects_lock = threading.Lock()


def project(lake: Lake, table: str, spark_app: str) -> Project:
    """The table's project in this process (made on its first gate), for the Spark application `spark_app`."""
    key = (lake.gx_stores(table), spark_app)  # the table's Data Docs folder lies in the same lake: named by it too
    with _projects_lock:
        found = _projects.get(key)
        if found is not None:
            _projects.move_to_end(key)
            return found
    made = Project(context(lake, table))
    with _projects_lock:
        found = _projects.setdefault(key, made)
        _projects.move_to_end(key)
        while len(_projects) > MAX_PROJECTS:
            _projects.popitem(last=False)
    return found
