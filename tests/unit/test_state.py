"""The writer lock on a filesystem lake (an OS file lock): a waiter says at once whom it waits for."""

from __future__ import annotations

import pytest

from spark_jobs.errors import TableBusy
from spark_jobs.lake import Lake
from spark_jobs.state import writer_lock


def test_a_waiter_says_at_once_whose_lock_it_waits_for(tmp_path, capsys):
    lake = Lake(str(tmp_path))
    with writer_lock(lake, "orders", "first"):
        with pytest.raises(TableBusy, match=r"orders is being written by another run \(run first, pid \d+"):
            with writer_lock(lake, "orders", "second", timeout_s=0.6):
                pass
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith("waiting for the writer lock of orders, held by run first, pid ")
    with writer_lock(lake, "orders", "third", timeout_s=0.1):  # released with its holder: no wait, nothing said
        pass
    assert capsys.readouterr().out == ""
