"""What a layer step did, typed: the CLI prints it on one line, the reports publish it as JSON, tests
read its fields. Unset figures (None) are left out of both."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from spark_jobs.quality.findings import GateResult

Counts = dict[str, int]


@dataclass(kw_only=True)
class LayerSummary:
    table: str  # the table, or the gold model
    layer: str
    batch_id: str
    # the outcome, shown after the layer's own figures
    gate: str | None = None  # passed | passed-with-warnings | failed | skipped (...) | error
    warnings: int | None = None
    checks: list[dict[str, Any]] | None = None
    docs: str | None = None
    version: int | None = None  # the table's Delta version after the step
    seconds: float | None = None
    error: str | None = None

    def record_gate(self, result: GateResult) -> None:
        self.gate, self.warnings, self.checks, self.docs = result.verdict(), result.warnings(), result.as_dict(), result.docs

    # figures of the layer reported after the gate's outcome (the CLI line keeps the order it always had)
    AFTER_GATE: ClassVar[tuple[str, ...]] = ()

    def as_dict(self) -> dict[str, Any]:
        """Identity, the layer's figures, then the outcome; unset ones left out."""
        base = [f.name for f in fields(LayerSummary)]
        own = [f.name for f in fields(self) if f.name not in base]
        order = [*base[:3], *[n for n in own if n not in self.AFTER_GATE], *base[3:7], *self.AFTER_GATE, *base[7:]]
        return {name: getattr(self, name) for name in order if getattr(self, name) is not None}


@dataclass(kw_only=True)
class BronzeSummary(LayerSummary):
    layer: str = "bronze"
    files: int | None = None
    recovered_files: int | None = None  # logged now: an earlier run committed them to bronze, then died
    mode: str | None = None  # reprocess; None: incremental
    lines: int | None = None
    events: int | None = None
    tombstones: int | None = None
    tombstones_matched: int | None = None
    tombstones_unmatched: int | None = None
    tombstones_matched_late: int | None = None
    quarantined: Counts | None = None  # by reason
    quarantined_share: float | None = None
    empty_files: int | None = None
    lag_s: float | None = None
    newest_change_ms: int | None = None  # the source time of the batch's newest change (lag_s is now less it)
    flagged: Counts | None = None  # events kept in the batch that fail a warn/fail expectation
    waiting_for_keys: int | None = None  # files left for a later run: their key file has not landed (record_keys)

    AFTER_GATE = ("tombstones_matched_late",)

    def absorb(self, part: BronzeSummary) -> None:
        """Adds a committed batch of a backlog's files: counts summed, the newest lag, the worst verdict; the
        gate's checks shown are the last batch's. The quarantined share is the caller's to set."""
        for name in ("lines", "events", "tombstones", "tombstones_matched", "tombstones_unmatched",
                     "tombstones_matched_late", "empty_files", "warnings"):
            setattr(self, name, (getattr(self, name) or 0) + (getattr(part, name) or 0))
        for name in ("quarantined", "flagged"):
            merged = dict(getattr(self, name) or {})
            for reason, n in (getattr(part, name) or {}).items():
                merged[reason] = merged.get(reason, 0) + n
            setattr(self, name, merged or None)
        self.lag_s = min((v for v in (self.lag_s, part.lag_s) if v is not None), default=None)
        self.newest_change_ms = max((v for v in (self.newest_change_ms, part.newest_change_ms) if v is not None),
                                    default=None)
        self.gate = part.gate if self.gate in (None, "passed") else self.gate
        self.checks, self.docs, self.version = part.checks, part.docs, part.version


@dataclass(kw_only=True)
class SilverSummary(LayerSummary):
    layer: str = "silver"
    mode: str | None = None  # rebuild; None: incremental
    bronze_version: int | None = None  # the bronze version applied
    events: int | None = None
    duplicates_dropped: int | None = None
    superseded_in_batch: int | None = None
    stale_ignored: int | None = None
    ties: int | None = None
    truncates: int | None = None
    quarantined: Counts | None = None
    quarantined_share: float | None = None
    lag_s: float | None = None
    newest_change_ms: int | None = None  # the source time of the batch's newest change (lag_s is now less it)
    inserted: int | None = None
    updated: int | None = None
    deleted: int | None = None
    tombstones_expired: int | None = None
    deletes: Counts | None = None  # where each delete went (layers/silver_plan.delete_outcome_counts)
    history_rows: int | None = None
    recovered_commits: int | None = None  # applied by an interrupted run, counted here
    widened: list[str] | None = None  # columns whose source type widened, silver's tables widened with them
    lineage: dict[str, list[str]] | None = None  # each column -> the bronze fields it is made from (lineage.py)

    AFTER_GATE = ("recovered_commits", "bronze_version")

    def add_recovered(self, recovered: Counts) -> None:
        """What an interrupted run applied of these events counts in this run's figures."""
        for figure, value in recovered.items():
            setattr(self, figure, (getattr(self, figure) or 0) + value)


@dataclass(kw_only=True)
class GoldSummary(LayerSummary):
    layer: str = "gold"
    sources: list[str] = field(default_factory=list)
    rows: int | None = None
    quarantined: Counts | None = None  # rows a `quarantine` expectation kept out of the published table
    quarantined_share: float | None = None
    lag_s: float | None = None
    newest_change_ms: int | None = None  # the source time of the batch's newest change (lag_s is now less it)
    # sources read at a transaction watermark (layers/transactions.py)
    transaction_files: int | None = None  # transaction-topic files taken by this refresh
    transactions_ended: int | None = None  # END events new to the transaction log
    transactions_quarantined: int | None = None
    transaction_watermark: str | None = None  # the newest transaction shown ("none": snapshot rows only)
    transactions_waiting: int | None = None  # ended transactions after it, not shown yet
    waiting_for: str | None = None  # the first of them, and what its sources lack of it
    # that one's END id beside an event's whose transaction no END names: the ids do not match (transactions.py)
    transaction_ids_unmatched: str | None = None
    lineage: dict[str, list[str]] | None = None  # each column -> the `table.column`s it is computed from (lineage.py)
    # "incremental" (silver's changes moved the groups they touched: layers/gold_plan.py), or "full (<why>)"
    refresh: str | None = None
    # the refresh (or, for a retry, an earlier try of its run) published a new version: what announces the model's
    # asset (a refresh that found nothing new publishes none)
    published: bool | None = None
    changes: int | None = None  # silver rows an incremental refresh read (a change feed's rows, an update's two)
    groups_changed: int | None = None  # groups an incremental refresh wrote (updated, added or deleted)
