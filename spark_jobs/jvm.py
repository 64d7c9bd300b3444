"""The JVM artifacts the pipeline needs beside pyspark's own jars, pinned by exact Maven coordinate, and
where they live once fetched (docs/architecture.md, "JVM dependencies").

`make jars` resolves them once with Spark's own resolver (`spark.jars.packages` into a project-local
Ivy directory); from then on every session, spark-submit task, Spark Connect server and the compose
Spark image loads the same files, offline. A missing file is an error naming its coordinate, never a
silent fallback to running without it.

Pure Python: the DAGs import this while parsing (the spark-submit tasks pass `jars`)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spark_jobs.errors import ConfigError
from spark_jobs.settings import resolve, settings

# What the pipeline asks for: Delta 4.4 built for Spark 4.2 (Scala 2.13), hadoop-aws matching the Hadoop
# client pyspark 4.2.0 ships (hadoop-client-api-3.5.0), spark-avro of the same Spark.
PACKAGES = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    "org.apache.hadoop:hadoop-aws:3.5.0",
    "org.apache.spark:spark-avro_2.13:4.2.0",
)

# Delta 4.4's kernel asks for older copies of libraries pyspark 4.2.0 already ships newer (Hadoop 3.4.2's
# client, Jackson 2.13, Parquet 1.16, log4j ...). Spark's own jars come first on its class path, so those
# copies would only be fetched, shipped to every executor and shadowed: they are left out.
IN_SPARK = (
    "com.fasterxml.jackson.core:jackson-annotations",
    "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-databind",
    "com.github.luben:zstd-jni",
    "com.google.code.findbugs:jsr305",
    "commons-pool:commons-pool",
    "io.airlift:aircompressor",
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.logging.log4j:log4j-api",
    "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl",
    "org.apache.parquet:parquet-column",
    "org.apache.parquet:parquet-common",
    "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures",
    "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-jackson",
    "org.locationtech.jts:jts-core",
    "org.roaringbitmap:RoaringBitmap",
    "org.roaringbitmap:shims",
    "org.scala-lang.modules:scala-parallel-collections_2.13",
    "org.slf4j:slf4j-api",
    "org.tukaani:xz",
    "org.xerial.snappy:snappy-java",
)

# Everything those resolve to, transitive dependencies included (what the resolver must find, exactly):
# a changed pom upstream or a new package above fails `make jars` instead of loading something unpinned.
RESOLVED = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    "io.delta:delta-storage:4.4.0",
    "io.delta:delta-kernel-api:4.4.0",
    "io.delta:delta-kernel-defaults:4.4.0",
    "io.delta:delta-kernel-unitycatalog:4.4.0",
    "io.unitycatalog:unitycatalog-client:0.6.0",
    "io.unitycatalog:unitycatalog-hadoop:0.6.0",
    "com.fasterxml.jackson.datatype:jackson-datatype-jdk8:2.13.5",
    "org.apache.hadoop:hadoop-aws:3.5.0",
    "software.amazon.awssdk:bundle:2.35.4",
    "software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1",
    "org.wildfly.openssl:wildfly-openssl:2.2.5.Final",
    "org.apache.spark:spark-avro_2.13:4.2.0",
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


@contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """This process's standard output and error, and those of the processes it starts (the JVM), into `log`: a
    redirect of the descriptors themselves, which the JVM inherits (sys.stdout would only catch Python's)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("wb") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


def fetch() -> list[str]:
    """Resolve PACKAGES into the project's Ivy directory with Spark's own resolver, then check that it found
    exactly RESOLVED. Returns the jars' paths."""
    from pyspark.sql import SparkSession

    ivy = ivy_dir()
    ivy.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(ivy / "jars", ignore_errors=True)  # the resolver only adds: a former pin's jars would stay
    builder = (SparkSession.builder.master("local[1]").appName("cdc-jars")
               .config("spark.jars.packages", ",".join(PACKAGES)).config("spark.jars.excludes", ",".join(IN_SPARK))
               .config("spark.jars.ivy", str(ivy))
               .config("spark.ui.enabled", "false"))
    log = ivy / "resolve.log"
    print(f"resolving {len(PACKAGES)} packages from Maven Central (the resolver's output: {log})", flush=True)
    try:
        with _output_to(log):  # Ivy writes about 150 lines, its proxy and host warnings among them: kept in the log
            builder.getOrCreate().stop()
    except Exception as exc:  # the JVM exits before the session exists; its log names the coordinate
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
        # Ivy's summary names each coordinate it could not resolve (`:: group#artifact;version: not found`); the
        # repositories it could not reach (spark-packages, a proxy) are warnings it lists before it
        said = "; ".join(dict.fromkeys(line.removeprefix(":: ") for line in lines
                                       if line.startswith(":: ") and line.endswith(("not found", "FAILED")))) \
            or next((line for line in reversed(lines) if "Exception" in line), "nothing it said failed")
        raise ConfigError(f"could not resolve {', '.join(PACKAGES)} from Maven Central into {ivy} (the resolver: "
                          f"{said}; all it wrote is in {log}): {exc}") from exc
    found = {p.name for p in (ivy / "jars").glob("*.jar")}
    expected = {jar_file(c).name for c in RESOLVED}
    if found != expected:
        raise ConfigError(f"the resolver found {sorted(found - expected)} beyond the pinned set and lacks "
                          f"{sorted(expected - found)}: update RESOLVED in spark_jobs/jvm.py deliberately")
    return jars()
