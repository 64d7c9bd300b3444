"""The expectations every gate runs: one record each, with what a failure does by default.

A check on the batch's rows is its record alone: its `flag`, a Spark SQL expression over one set of the layer's
audited rows (`rows`) that is true where a row passes, false where it fails and null where the check does not
apply. From the records come the columns the layer's audit aggregates (quality/audit.py, one Spark job per gate),
the GX suite the gate validates on that one aggregated row (quality/gates.py), the refusal of a batch before
anything is published, and, for bronze's row-level checks, the quarantine reason (`detail`: its variable tail).
A check on the batch's figures (`figure`) reads a field of quality.audit.Figures; its bounds come from the
table's settings in gates.py.

The rows each layer audits, and the columns their flags may read:
- bronze `events`: every change event and tombstone line of the batch (`op`, `_missing_key`: the key columns
  absent from the key image, `_flat_op`/`_flat_deleted`: a flattened record's `__op`/`__deleted`,
  `_follows_delete` on tombstones);
- silver `events`: the typed row events (`op`, `_seq`, `_variants`: the distinct contents sharing the event's key
  and position, null without either); `deletes`: each delete received (`_seq`, `_live_seq`: its key's live
  position after the merge); `rows`: the merged rows of the batch's keys;
- gold `rows`: the model's rows; `references`: one per reference and row (`_found`).
Frames with the table's key columns also carry `_key` (null when a key column is) and `_key_rows` (rows with
that key).

Pure Python: the registry validates tables.yaml against these names without importing Spark or GX."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

WARN, QUARANTINE, FAIL = "warn", "quarantine", "fail"
ACTIONS = (WARN, QUARANTINE, FAIL)
PRE, POST = "pre", "post"  # validated before anything is published, or on the published result
DEFAULT_MAX_QUARANTINED = 0.05
# a single bad event never stops a table: in a small batch it alone is over any share (1 of 16 is 6.25%)
DEFAULT_MIN_QUARANTINED_TO_FAIL = 2


@dataclass(frozen=True)
class Expectation:
    """A named check. Row-level checks may `quarantine` the rows that fail it (the rest go on); any check
    may `warn` (report only) or `fail` (the gate fails).

    A check on rows has `rows` (which audited rows) and `flag` (see the module's doc); a check on the batch's
    figures has `figure` instead. `phase` says whether silver runs it before publishing (a failure writes
    nothing but the quarantine) or after (a failure restores every table)."""

    name: str
    layers: tuple[str, ...]
    action: str  # the default
    row_level: bool
    doc: str
    rows: str | None = None
    flag: str | None = None
    detail: str | None = None  # a row-level check's quarantine reason after `<name>: ` (Spark SQL)
    figure: str | None = None
    phase: str = PRE

    @property
    def actions(self) -> tuple[str, ...]:
        return ACTIONS if self.row_level else (WARN, FAIL)


EXPECTATIONS = {e.name: e for e in (
    Expectation("event_has_key", ("bronze",), QUARANTINE, True,
                "every insert, update and snapshot event carries its key columns in `after`",
                "events", "CASE WHEN op IN ('c', 'u', 'r') THEN _missing_key = '' END", "_missing_key"),
    Expectation("delete_has_key", ("bronze",), QUARANTINE, True, "every delete carries its key columns in `before`",
                "events", "CASE WHEN op = 'd' THEN _missing_key = '' END", "_missing_key"),
    Expectation("deleted_flag_matches_op", ("bronze",), QUARANTINE, True,
                "in flattened records, `__deleted` agrees with `__op` (true exactly for deletes)",
                "events", "(lower(_flat_deleted) = 'true') = (_flat_op = 'd')",
                "concat('__deleted disagrees with __op=', op)"),
    Expectation("tombstone_follows_delete", ("bronze",), WARN, False,
                "every Kafka tombstone line follows a delete at the previous offset of its partition",
                "events", "_follows_delete"),
    Expectation("sequence_present", ("silver",), QUARANTINE, True, "every event has a log position to be ordered by",
                "events", "_seq IS NOT NULL"),
    Expectation("sequence_increasing", ("silver",), WARN, False,
                "per key, positions strictly increase after ordering: two different events never share one (a tie)",
                "events", "_variants = 1"),
    Expectation("key_not_null", ("silver", "gold"), FAIL, False, "primary key columns are never null",
                "rows", "_key IS NOT NULL", phase=POST),
    Expectation("key_unique", ("silver", "gold"), FAIL, False, "the primary key is unique",
                "rows", "_key_rows = 1", phase=POST),
    Expectation("deleted_keys_not_live", ("silver",), FAIL, False,
                "after the merge, no key deleted in the batch is live unless re-created at a later position",
                "deletes", "_live_seq IS NULL OR _live_seq > _seq", phase=POST),
    Expectation("deletes_reconcile", ("silver",), FAIL, False,
                "deletes received = rows removed + deletes of absent keys + stale + superseded in the batch",
                figure="deletes_unaccounted", phase=POST),
    Expectation("row_count", ("gold",), FAIL, False, "the model's row count is within its configured bounds",
                figure="rows"),
    Expectation("references", ("gold",), FAIL, False, "every configured reference finds its row in silver",
                "references", "_found"),
    Expectation("freshness", ("gold",), FAIL, False,
                "the newest source change is at most the configured lag old (only checked when configured)",
                figure="lag_s"),
)}


def row_checks(layer: str) -> frozenset[str]:
    """The layer's row-level expectations: the ones that can quarantine rows."""
    return frozenset(n for n, e in EXPECTATIONS.items() if e.row_level and layer in e.layers)


def flagged(layer: str, rows: str | None = None) -> list[Expectation]:
    """The layer's expectations on rows (on `rows` only, when given), in the order they are reported."""
    return [e for e in EXPECTATIONS.values()
            if layer in e.layers and e.flag is not None and (rows is None or e.rows == rows)]


def row_failure_sql(layer: str) -> str:
    """`<expectation>: <detail>` for the first row-level expectation of `layer` a row fails, else null (SQL)."""
    cases = [f"WHEN NOT ({e.flag}) THEN concat('{e.name}: ', {e.detail or repr('')})"
             for e in flagged(layer) if e.row_level]
    return f"CASE {' '.join(cases)} END" if cases else "CAST(NULL AS STRING)"


@dataclass(frozen=True)
class Quality:
    """Gate settings of one table or gold model: the quarantine circuit breaker (the gate fails when more
    than `max_quarantined` of a batch is quarantined and that is at least `min_quarantined_to_fail`
    records) and per-expectation actions that override the defaults."""

    max_quarantined: float = DEFAULT_MAX_QUARANTINED
    overrides: tuple[tuple[str, str], ...] = ()
    min_quarantined_to_fail: int = DEFAULT_MIN_QUARANTINED_TO_FAIL
    # GX Checkpoint actions run after each of the gate's validations besides the Data Docs update (e.g.
    # `{type: slack, slack_webhook: ..., notify_on: failure}`), each as JSON
    actions: tuple[str, ...] = ()

    def breaker_trips(self, quarantined: int, share: float) -> bool:
        return quarantined >= self.min_quarantined_to_fail and share > self.max_quarantined

    def action(self, name: str) -> str:
        return dict(self.overrides).get(name, EXPECTATIONS[name].action)


BRONZE, SILVER, GOLD = "bronze", "silver", "gold"


@dataclass(frozen=True)
class UserExpectation:
    """A GX 1.x expectation a user declared in tables.yaml for a table's silver rows or a gold model's rows:
    its snake_case name (`expect_column_values_to_be_between`), its arguments, the action a failure takes
    and an optional description shown in Data Docs. The registry checks the shape without importing GX;
    `quality.user_expectations.validate` checks the name and arguments against GX itself."""

    type: str
    arguments: str  # the arguments as canonical JSON (the record stays hashable and comparable)
    action: str
    where: str  # "table 'customers'" or "gold model 'x'", for error messages
    description: str | None = None
    layer: str = SILVER  # a table's: silver (its typed rows) or bronze (its raw change events)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(json.loads(self.arguments))

    @property
    def label(self) -> str:
        """How findings and quarantine reasons name it: `expect_column_values_to_be_between(fico)`."""
        kwargs = self.kwargs
        column = kwargs.get("column") or kwargs.get("column_list") or [
            kwargs[k] for k in ("column_A", "column_B") if k in kwargs]
        shown = ",".join(map(str, column)) if isinstance(column, list) else column
        return f"{self.type}({shown})" if shown else self.type

    def reason(self) -> str:
        """The quarantine reason of a row that fails it: the expectation with its arguments."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if k not in ("column", "column_A", "column_B",
                                                                               "column_list"))
        return f"expectation: {self.label}" + (f" {args}" if args else "")
