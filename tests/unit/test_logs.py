"""The jobs' lines through `logging` (spark_jobs/logs.py): by level to the standard streams, CDC_LOG_LEVEL keeping
the lines at or above it, and in the pipeline service each job's lines in that job's log alone."""

from __future__ import annotations

import io
import logging
import threading

import pytest

from spark_jobs import cli, logs, service
from spark_jobs.service_client import JobRequest
from spark_jobs.state import writer_lock


@pytest.fixture(autouse=True)
def standard_streams():
    """Each test starts, and leaves the process, as the command line sets it up: StandardStreams at INFO."""
    logs.use_handler(logs.StandardStreams())
    logs.set_level("INFO")
    yield
    logs.use_handler(logs.StandardStreams())
    logs.set_level("INFO")


def test_report_lines_go_to_standard_output_and_problems_to_standard_error(capsys):
    log = logs.logger("spark_jobs.layers.bronze")
    assert log.name == "cdc.layers.bronze"
    log.info("bronze customers: batch 1/2 committed")
    log.warning("bronze: a shared pass over 2 tables failed, each reads its own files")
    log.error("gate failed: table=orders")
    out, err = capsys.readouterr()
    assert out == "bronze customers: batch 1/2 committed\n"
    assert err == ("bronze: a shared pass over 2 tables failed, each reads its own files\n"
                   "gate failed: table=orders\n")


def test_the_log_level_keeps_the_lines_at_or_above_it(tmp_path, capsys, monkeypatch):
    from spark_jobs.lake import Lake

    lake = Lake(str(tmp_path))
    logs.set_level("WARNING")
    with writer_lock(lake, "orders", "first"), pytest.raises(Exception, match="being written by another run"):
        with writer_lock(lake, "orders", "second", timeout_s=0.2):  # its "waiting for the writer lock" line is INFO
            pass
    logs.logger(__name__).warning("still said")
    assert capsys.readouterr() == ("", "still said\n")
    # the command line takes the level from CDC_LOG_LEVEL, and refuses one that is not a level
    monkeypatch.setenv("CDC_LOG_LEVEL", "LOUD")
    assert cli.main(["status", "--config", str(tmp_path / "none.yaml"), "--lake", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "config error: CDC_LOG_LEVEL='LOUD': choose from DEBUG, INFO, WARNING, ERROR\n"
    monkeypatch.setenv("CDC_LOG_LEVEL", "ERROR")
    cli.main(["status", "--config", str(tmp_path / "none.yaml"), "--lake", str(tmp_path)])
    assert logging.getLogger(logs.ROOT).level == logging.ERROR


def test_in_the_service_each_jobs_lines_go_to_its_own_log(monkeypatch):
    """Two jobs log at once on their threads: each log holds its own lines, the service's output neither."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)  # the service's own streams
    monkeypatch.setattr("sys.stderr", err)
    logs.use_handler(service._JobLog())
    log = logs.logger("spark_jobs.steps")
    jobs = {name: service._Job(id=name, request=JobRequest()) for name in ("first", "second")}
    both_started = threading.Barrier(2)

    def work(job: service._Job) -> None:
        service._current_job.set(job)
        both_started.wait(timeout=10)
        for number in range(50):
            log.info(f"{job.id} line {number}")
        log.warning(f"{job.id} warned")

    threads = [threading.Thread(target=work, args=(job,)) for job in jobs.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    log.info("the service's own line")
    log.error("the service's own error")
    for name, job in jobs.items():
        assert job.status(0).log.splitlines() == [*(f"{name} line {n}" for n in range(50)), f"{name} warned"]
    assert (out.getvalue(), err.getvalue()) == ("the service's own line\n", "the service's own error\n")
