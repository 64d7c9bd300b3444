"""The benchmark's floor restates silver's merge conditions and the snapshot markers (it must not import pyspark,
whose import would count in its time). `make bench` refuses to run when they drift apart; checked here too, so the
drift fails the change that makes it, not the next benchmark run."""

from __future__ import annotations

from tests.benchmarks.harness import check_floor_restates_the_pipeline


def test_the_floor_restates_silvers_merge_conditions() -> None:
    check_floor_restates_the_pipeline()
