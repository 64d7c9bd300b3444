"""The pipeline service's warm-up (spark_jobs/warm_up.py) runs in a folder of its own and leaves nothing: the run it
asks for names only that folder's registry, landing and lake, and a run that fails stops the start with its code.
tests/airflow/test_service.py holds a real service's warm-up."""

from __future__ import annotations

import pytest
import yaml

from spark_jobs.generate import PROFILES
from spark_jobs.warm_up import SAMPLES, warm_up


def test_the_run_reads_and_writes_only_its_own_folder_which_is_then_gone(tmp_path):
    asked: list[list[str]] = []

    def run_job(argv: list[str]) -> int:
        options = dict(zip(argv[1::2], argv[2::2], strict=False))
        folder = tmp_path / next(p.name for p in tmp_path.iterdir())
        assert {options["--config"], options["--landing"], options["--lake"]} == {
            str(folder / "tables.yaml"), str(folder / "landing"), str(folder / "lake")}
        registry = yaml.safe_load((folder / "tables.yaml").read_text())["tables"]
        assert {name: (t["topic"], t["keys"]) for name, t in registry.items()} == {
            "warm_actor": ("pagila.public.actor", ["actor_id"]),
            "warm_customers": ("burst.burst_bank.customers", ["custkey"]),
            "warm_products": ("dbserver1.inventory.products", ["id"])}
        assert all(list(PROFILES[t["topic"]].keys) == t["keys"] for t in registry.values())
        topics = {p.name for p in (folder / "landing" / "topics").iterdir()}
        assert topics == set(SAMPLES.values())
        asked.append(argv)
        return 0

    assert warm_up(run_job, tmp_path) >= 0
    assert len(asked) == 1 and asked[0][0] == "run" and asked[0][-2:] == ["--layers", "bronze,silver"]
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_stops_the_start_and_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="warm-up run exited 1"):
        warm_up(lambda argv: 1, tmp_path)
    assert list(tmp_path.iterdir()) == []
