"""The lake's layout: every path of a table, its state, locks, GX stores and reports comes from `Lake`
(docs/configuration.md, "Lake layout"), on a local path or s3://bucket/prefix. Pure Python."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_jobs.storage import LocalFiles, S3Files, is_s3, lake_files

if TYPE_CHECKING:
    pass

# A run id names a folder of the reports: a strict name, never a path (Airflow's run ids, `manual__2026-11-25T08:00:00+00:00`,
# and the pipeline's own batch ids fit it; Airflow's default pattern for run ids given by hand is the same set of characters)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.~:+-]{0,199}")


def check_run_id(run_id: str) -> str:
    """The run id itself, or ValueError saying what a run id may hold."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r}: letters, digits and _.~:+- only, starting with a letter or digit, at most "
                         "200 characters")
    return run_id


# what a lake's path (after its scheme) may hold: Spark's file reads take a path as a Hadoop glob and a ':' in it as a
# scheme, and delta-rs decodes a '%' in a table's path (cli.run refuses any other)
LITERAL_LAKE = re.compile(r"[^{}\[\]*?\\%:]+")


@dataclass(frozen=True)
class Lake:
    """Paths in the lake. `staging`, when set, holds silver and its state (ledger, history, truncate log)
    elsewhere: a rebuild computes them there and publishes them when its gate has passed."""

    root: str
    staging: str | None = None

    @property
    def _silver_root(self) -> str:
        return self.staging or self.root

    @property
    def files(self) -> LocalFiles | S3Files:
        """The lake's own files outside Delta (reports, run summaries, GX stores, locks)."""
        return lake_files(self.root)

    @property
    def on_s3(self) -> bool:
        return is_s3(self.root)

    def staged(self, table: str) -> Lake:
        return Lake(self.root, f"{self.root}/_state/rebuild/{table}")

    def bronze(self, table: str) -> str:
        return f"{self.root}/bronze/{table}"

    def silver(self, table: str) -> str:
        return f"{self._silver_root}/silver/{table}"

    def gold(self, model: str) -> str:
        return f"{self.root}/gold/{model}"

    def quarantine(self, table: str) -> str:
        return f"{self.root}/quarantine/{table}"

    def gold_state(self, model: str) -> str:
        """A model kept incrementally: its per-group state (layers/gold_state.py)."""
        return f"{self.root}/_state/gold_state/{model}"

    def gold_inputs(self, model: str) -> str:
        """What the model's published version was computed from (layers/gold.py: unchanged inputs, no refresh)."""
        return f"{self.root}/_state/gold_inputs/{model}.json"

    def ingest_log(self, table: str) -> str:
        return f"{self.root}/_state/ingest_log/{table}"

    def tombstones(self, table: str) -> str:
        return f"{self._silver_root}/_state/tombstones/{table}"

    def history(self, table: str) -> str:
        return f"{self._silver_root}/silver/{table}_history"

    def truncates(self, table: str) -> str:
        return f"{self._silver_root}/_state/truncates/{table}"

    def silver_tables(self, table: str) -> dict[str, str]:
        """The Delta tables a silver step writes, by name: the table, its tombstone ledger, history and truncate log.
        A rebuild stages the four together; a failed gate puts the four back."""
        return {"silver": self.silver(table), "tombstones": self.tombstones(table), "history": self.history(table),
                "truncates": self.truncates(table)}

    def pending_tombstones(self, table: str) -> str:
        """Kafka tombstone lines whose previous record (the delete they follow) has not landed yet."""
        return f"{self.root}/_state/pending_tombstones/{table}"

    @property
    def staging_files(self) -> str:
        """Landing files staged for a bronze run (links or S3 downloads under Spark-safe names)."""
        return f"{self.root}/_state/staging"

    def staged_files(self, table: str, batch_id: str) -> str:
        """Where a bronze run stages the table's files (its next run clears what a killed one left there)."""
        return f"{self.staging_files}/{table}-{batch_id}"

    def landing_marks(self, table: str) -> str:
        """Per landing folder, the last file bronze has taken with every file before it (state.LandingMarks)."""
        return f"{self.root}/_state/landing_marks/{table}.json"

    def transactions(self, topic: str) -> str:
        """A connector's transactions, one row per END event of its transaction topic (layers/transactions.py)."""
        return f"{self.root}/_state/transactions/{topic}"

    def progress(self, table: str) -> str:
        return f"{self.root}/_state/progress/{table}"

    @property
    def reports(self) -> str:
        """The run pages (index.html), each run's summaries and page (runs/<run id>/), GX Data Docs."""
        return f"{self.root}/reports"

    def run_reports(self, run_id: str) -> str:
        return f"{self.reports}/runs/{check_run_id(run_id)}"

    @property
    def runs_reports(self) -> str:
        return f"{self.reports}/runs"

    @property
    def event_log(self) -> str:
        """One row per run, table and layer and per expectation result (spark_jobs/event_log.py)."""
        return f"{self.root}/event_log"

    @property
    def reports_index(self) -> str:
        """The history page: every run, newest first."""
        return f"{self.reports}/index.html"

    def data_docs(self, table: str) -> str:
        """The GX Data Docs site of one table (or gold model); "" for the folder of every site."""
        return f"{self.reports}/data_docs/{table}"

    def gx_stores(self, table: str) -> str:
        """GX's suites and validation results of one table (its own folder: tables validate in parallel)."""
        return f"{self.root}/_state/gx/{table}/gx"

    def lock(self, name: str) -> str:
        """The writer lock of a table (all its layers) or of a gold model (`gold.<model>`)."""
        return f"{self.root}/_state/locks/{name}.lock"

    def table_uri(self, layer: str, name: str) -> str:
        """A layer's table as a URI (an Airflow asset's): file:// for a local lake."""
        location = self.root if "://" in self.root else f"file://{self.root}"
        return f"{location}/{layer}/{name}"
