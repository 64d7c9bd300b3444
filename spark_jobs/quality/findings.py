"""What a gate found: one Finding per check, and the gate's GateResult (its verdict and failure line). Plain data,
apart from the gate that makes them (spark_jobs.quality.gates), so the failures (spark_jobs.errors) and the
summaries (spark_jobs.layers.summary) can name them without importing the gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_jobs.quality.expectations import FAIL, QUARANTINE


@dataclass
class Finding:
    check: str
    action: str
    success: bool
    unexpected: int | None
    total: int | None
    observed: Any = None

    def counts(self) -> str:
        if self.unexpected is None:
            return f"observed={self.observed}"
        return f"unexpected={self.unexpected} of {self.total}"


@dataclass
class GateResult:
    table: str
    layer: str
    findings: list[Finding]
    docs: str | None

    @property
    def success(self) -> bool:
        return all(f.success for f in self.findings if f.action == FAIL)

    def warnings(self) -> int:
        """Findings that failed without failing the gate (warn, or quarantine with rows moved aside)."""
        return sum(1 for f in self.findings if not f.success and f.action != FAIL)

    def verdict(self) -> str:
        return "failed" if not self.success else "passed" if not self.warnings() else "passed-with-warnings"

    def failure_line(self) -> str:
        parts = [f"expectation={f.check} {f.counts()}" for f in self.findings if f.action == FAIL and not f.success]
        if any(f.check == "max_quarantined" and not f.success for f in self.findings):  # quarantined by what
            parts += [f"quarantined by {f.check} {f.counts()}" for f in self.findings
                      if f.action == QUARANTINE and not f.success]
        return f"gate failed: table={self.table} layer={self.layer} " + "; ".join(parts)

    def as_dict(self) -> list[dict[str, Any]]:
        return [{"expectation": f.check, "action": f.action, "success": f.success, "unexpected": f.unexpected,
                 "total": f.total, "observed": f.observed} for f in self.findings]
