"""The pinned JVM jars: a missing one is an error naming its coordinate, never a silent fallback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs import jvm
from spark_jobs.errors import ConfigError
from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parents[2]


def test_every_pinned_jar_is_present_after_make_jars_and_a_missing_one_is_named(tmp_path, monkeypatch):
    assert jvm.missing() == []
    assert [Path(p).name for p in jvm.jars()] == [jvm.jar_file(c).name for c in jvm.RESOLVED]
    assert set(jvm.PACKAGES) <= set(jvm.RESOLVED)
    monkeypatch.setenv("CDC_JARS_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="missing from .*: io.delta:delta-spark_4.2_2.13:4.4.0, io.delta:delta-storage:4.4.0"):
        jvm.jars()


def test_a_coordinate_that_cannot_be_resolved_fails_naming_it(tmp_path):
    script = ("import sys; from spark_jobs import jvm, cli; jvm.PACKAGES = ('io.delta:delta-spark_2.13:0.0.404',); "
              "sys.exit(cli.main(['jars']))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=subprocess_env(CDC_JARS_DIR=str(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "io.delta#delta-spark_2.13;0.0.404: not found" in done.stdout + done.stderr  # the resolver's own words
    assert done.stderr.strip().splitlines()[-1].startswith(
        "config error: could not resolve io.delta:delta-spark_2.13:0.0.404 from Maven Central")
