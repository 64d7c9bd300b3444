"""The JVM artifacts the pipeline needs beside pyspark's own jars, pinned by exact Maven coordinate, and
where they live once fetched (docs/architecture.md, "JVM dependencies").

`make jars` resolves them once with Spark's own resolver (`spark.jars.packages` into a project-local
Ivy directory); from then on every session, spark-submit task, Spark Connect server and the compose
Spark image loads the same files, offline. A missing file is an error naming its coordinate, never a
silent fallback to running without it.

Pure Python: the DAGs import this while parsing (the spark-submit tasks pass `jars`)."""

from __future__ import annotations

from pathlib import Path

from spark_jobs.errors import ConfigError
from spark_jobs.settings import resolve, settings

# What the pipeline asks for: Delta for pyspark 4.0.1 (Scala 2.13), hadoop-aws matching the Hadoop
# client pyspark 4.0.1 ships (hadoop-client-api-3.4.1), spark-avro of the same Spark.
PACKAGES = (
    "io.delta:delta-spark_2.13:4.0.1",
    "org.apache.hadoop:hadoop-aws:3.4.1",
    "org.apache.spark:spark-avro_2.13:4.0.1",
)

# Everything those resolve to, transitive dependencies included (what the resolver must find, exactly):
# a changed pom upstream or a new package above fails `make jars` instead of loading something unpinned.
RESOLVED = (
    "io.delta:delta-spark_2.13:4.0.1",
    "io.delta:delta-storage:4.0.1",
    "org.antlr:antlr4-runtime:4.13.1",
    "org.scala-lang.modules:scala-parallel-collections_2.13:1.2.0",
    "org.apache.hadoop:hadoop-aws:3.4.1",
    "software.amazon.awssdk:bundle:2.24.6",
    "org.wildfly.openssl:wildfly-openssl:1.1.3.Final",
    "org.apache.spark:spark-avro_2.13:4.0.1",
    "org.tukaani:xz:1.10",
)

# Delta's SQL and catalog: without them a session can read Delta paths but not MERGE, RESTORE or DESCRIBE
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def ivy_dir() -> Path:
    return resolve(settings().jars_dir) / "ivy"


def jar_file(coordinate: str) -> Path:
    """Where Spark's resolver puts a coordinate's jar: <ivy>/jars/<group>_<artifact>-<version>.jar."""
    group, artifact, version = coordinate.split(":")
    return ivy_dir() / "jars" / f"{group}_{artifact}-{version}.jar"


def missing() -> list[str]:
    return [c for c in RESOLVED if not jar_file(c).is_file()]


def jars() -> list[str]:
    """Every pinned jar's path, in a stable order; a ConfigError naming what is missing otherwise."""
    absent = missing()
    if absent:
        raise ConfigError(f"JVM dependencies missing from {ivy_dir() / 'jars'}: {', '.join(absent)}; "
                          "run `make jars` (it needs Maven Central once) or set CDC_JARS_DIR")
    return [str(jar_file(c)) for c in RESOLVED]


def fetch() -> list[str]:
    """Resolve PACKAGES into the project's Ivy directory with Spark's own resolver, then check that it found
    exactly RESOLVED. Returns the jars' paths."""
    from pyspark.sql import SparkSession

    ivy = ivy_dir()
    ivy.mkdir(parents=True, exist_ok=True)
    builder = (SparkSession.builder.master("local[1]").appName("cdc-jars")
               .config("spark.jars.packages", ",".join(PACKAGES)).config("spark.jars.ivy", str(ivy))
               .config("spark.ui.enabled", "false"))
    try:
        builder.getOrCreate().stop()
    except Exception as exc:  # the JVM exits before the session exists; its stderr names the coordinate
        raise ConfigError(f"could not resolve {', '.join(PACKAGES)} from Maven Central into {ivy} "
                          f"(see the resolver's output above): {exc}") from exc
    found = {p.name for p in (ivy / "jars").glob("*.jar")}
    expected = {jar_file(c).name for c in RESOLVED}
    if found != expected:
        raise ConfigError(f"the resolver found {sorted(found - expected)} beyond the pinned set and lacks "
                          f"{sorted(expected - found)}: update RESOLVED in spark_jobs/jvm.py deliberately")
    return jars()
