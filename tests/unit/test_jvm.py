"""The pinned JVM jars: a missing one is an error naming its coordinate, never a silent fallback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs import jvm
from spark_jobs.errors import ConfigError
from tests.support import subprocess_env

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


def test_the_resolvers_output_goes_to_its_log_not_the_terminal(tmp_path, capfd):
    """What a process started inside writes (the JVM's Ivy lines) lands in the log, and the terminal gets its streams
    back after, a failure or not."""
    log = tmp_path / "resolve.log"
    with pytest.raises(RuntimeError), jvm._output_to(log):
        subprocess.run(["sh", "-c", "echo ':: resolving dependencies'; echo 'host not found' >&2"], check=True)
        raise RuntimeError("the resolver failed")
    print("after")
    assert log.read_text().splitlines() == [":: resolving dependencies", "host not found"]
    assert capfd.readouterr() == ("after\n", "")


def test_a_local_jvm_finds_the_jars_on_its_class_path_and_copies_none_of_them(spark):
    """spark.jars would copy all of them (672 MB) into every JVM's scratch folder, a local one too, and a JVM killed
    before its shutdown hook leaves the copy behind; a cluster's executors still get them shipped."""
    from pyspark import SparkFiles

    from spark_jobs.session import jar_conf

    assert jar_conf("local[2]") == {"spark.driver.extraClassPath": ":".join(jvm.jars())}
    assert jar_conf("spark://127.0.0.1:7077") == {"spark.jars": ",".join(jvm.jars())}
    assert not list(Path(SparkFiles.getRootDirectory()).iterdir())  # the tests' session is built from jvm_conf
