"""Landing files read into Spark as lines (JSON, gzip) or records (Parquet, Avro), each with its file and line;
files that cannot be read come back apart with the reason, to be quarantined whole."""

from __future__ import annotations

import re
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_jobs.debezium import avro, envelope, types
from spark_jobs.landing import LandingFile, exact_line, file_too_large, landing_read_problem, read_problem
from spark_jobs.layers.common import checkpoint, lookup
from spark_jobs.settings import settings
from spark_jobs.sql_text import sql
from spark_jobs.storage import open_input

# a location without its scheme and leading slashes: Spark names a file `file:/x`, `file:///x` or `s3a://b/k`
_SCHEME = "^[A-Za-z][A-Za-z0-9+.-]*:/*|^/+"


def _staged_to_landing(spark: SparkSession, staged: dict[str, LandingFile], read: DataFrame) -> DataFrame:
    """Spark names each file by the URI it read: `_source_file`, the landing path it stands for, replaces it."""
    mapping = spark.createDataFrame([(re.sub(_SCHEME, "", path), f.path) for path, f in staged.items()],
                                    "_staged STRING, _source_file STRING")
    named = read.withColumn("_staged", F.regexp_replace("_uri", _SCHEME, "")).drop("_uri")
    return named.join(F.broadcast(mapping), "_staged").drop("_staged")


def _parquet_rows(path: str) -> int | None:
    """Records in a Parquet landing file from its footer; None when it is not a readable Parquet file."""
    import pyarrow.parquet as pq

    try:
        with open_input(path) as handle:
            return int(pq.read_metadata(handle).num_rows)
    except (OSError, ValueError):
        return None


def read_landing(spark: SparkSession, staged: dict[str, LandingFile], files: list[LandingFile],
                 fmt: str = "auto", together: bool = False) -> tuple[DataFrame, dict[LandingFile, str]]:
    """Landing files as lines: (_source_file, _line, _raw, _line_problem, _typed_schema), checkpointed.
    JSON files (plain or gzip) give one row per text line; Parquet and Avro files one row per record, as its
    JSON text, with `_typed_schema` holding the record's column types. `staged` maps the paths Spark reads to the
    landing files (landing.spark_paths). `together`: a small batch, its JSON lines read into one partition
    (layers/common.py, checkpoint).

    Files that cannot be read are returned apart with the reason, to be quarantined whole while the rest
    of the batch goes on: not of the table's format (unsupported_file), or unreadable_file (cannot be
    opened, not valid gzip, Parquet or Avro, cut short). Lines of a file holding bytes that are not UTF-8 are
    read again byte for byte: Spark's line split would replace those bytes."""
    wanted = {"auto": ("json", "parquet", "avro"), "json": ("json",), "json-flat": ("json",), "parquet": ("parquet",),
              "avro": ("avro",)}[fmt]
    by_kind: dict[str, dict[str, LandingFile]] = {"json": {}, "parquet": {}, "avro": {}}
    for path, f in staged.items():
        if f.kind in wanted:
            by_kind[f.kind][path] = f
    unreadable = {f: f"unsupported_file: {_name(f)}" for f in files if f.kind not in wanted}
    unreadable |= {f: f"unreadable_file: {_name(f)}: {f.problem}" for f in files if f.problem and f.kind in wanted}
    parts = []
    if by_kind["json"]:
        lines, broken = _json_lines(spark, by_kind["json"], together)
        unreadable |= broken
        if lines is not None:
            parts.append(lines.withColumn("_typed_schema", F.lit(None).cast("string")))
    parquet_rows = {path: _parquet_rows(path) for path, f in by_kind["parquet"].items() if f.size}
    unreadable |= {by_kind["parquet"][path]: f"unreadable_file: {_name(by_kind['parquet'][path])}: not a valid Parquet file"
                   for path, rows in parquet_rows.items() if rows is None}
    readable_parquet = {path: f for path, f in by_kind["parquet"].items() if parquet_rows.get(path)}
    if readable_parquet:
        records = spark.read.option("mergeSchema", "true").option("ignoreCorruptFiles", "true").parquet(*readable_parquet)
        typed = types.envelope_from_spark(envelope.parquet_image_type(records.schema))
        lined = records.select("*", (F.col("_metadata.row_index") + 1).alias("_line"))
        part, broken = _typed_records(spark, readable_parquet, parquet_rows, lined, records.columns, F.lit(typed))
        parts.append(part)
        unreadable |= broken
    for group, expected in _avro_groups(by_kind["avro"], unreadable).items():
        records = spark.read.format("avro").option("ignoreCorruptFiles", "true").load(list(group))
        typed = avro.typed_envelope(next(iter(expected.values())).schema, envelope.parquet_image_type(records.schema))
        # Avro has no row index: a file's records in order are its splits by start offset, each read in order
        order = Window.partitionBy("_metadata.file_path").orderBy(F.input_file_block_start(), F.monotonically_increasing_id())
        lined = records.select("*", F.row_number().over(order).cast("long").alias("_line"))
        part, broken = _typed_records(spark, {p: by_kind["avro"][p] for p in group},
                                      {p: a.records for p, a in expected.items()}, lined, records.columns, F.lit(typed))
        parts.append(part)
        unreadable |= broken
    if not parts:
        return spark.createDataFrame(
            [], "_source_file STRING, _line BIGINT, _raw STRING, _line_problem STRING, _typed_schema STRING"), unreadable
    return reduce(DataFrame.unionByName, parts), unreadable


def with_record_keys(spark: SparkSession, lines: DataFrame, staged_keys: dict[str, LandingFile],
                     together: bool) -> tuple[DataFrame, dict[LandingFile, str]]:
    """Adds `_record_key` to each line: the line at the same place in its value file's key file (the S3 sink's
    store.kafka.keys: one key per record, in order). `staged_keys` maps where Spark reads each key file to the
    value file it serves. A value file whose key file cannot be read is returned apart, to be quarantined whole."""
    key_files = {path: f.keys_file for path, f in staged_keys.items() if f.keys_file}
    read, broken = _json_lines(spark, key_files, together) if key_files else (None, {})
    value_of_key = {f.keys_file.path: f for f in staged_keys.values() if f.keys_file}
    unreadable = {value_of_key[k.path]: f"unreadable_file: {_name(value_of_key[k.path])}: its key file {_name(k)}: {reason}"
                  for k, reason in broken.items()}
    if read is None:
        return lines.withColumn("_record_key", F.lit(None).cast("string")), unreadable
    value_of = F.create_map(*[F.lit(x) for key_path, f in value_of_key.items() for x in (key_path, f.path)])
    record_keys = read.select(value_of[F.col("_source_file")].alias("_source_file"), "_line",
                              F.when(F.col("_line_problem").isNull(), F.col("_raw")).alias("_record_key"))
    kept = lines.where(~F.col("_source_file").isin([f.path for f in unreadable])) if unreadable else lines
    return kept.join(record_keys, ["_source_file", "_line"], "left"), unreadable


def _typed_records(spark: SparkSession, files: dict[str, LandingFile], expected: dict[str, int | None],
                   lined: DataFrame, columns: list[str], typed: Column) -> tuple[DataFrame, dict[LandingFile, str]]:
    """Records of typed files (Parquet, Avro) as lines: each record's JSON text, numbered `_line` in its file.
    As with JSON, a file that breaks while being read is not fatal: it gives fewer records than its footer
    or block headers count, and is then quarantined whole."""
    record = F.struct(*[F.col(f"`{c}`") for c in columns])
    rows = lined.select(F.col("_metadata.file_path").alias("_uri"), "_line", F.to_json(record, types.JSON_OPTIONS).alias("_raw"))
    rows = _staged_to_landing(spark, files, rows).localCheckpoint()
    read = {r["_source_file"]: r["n"] for r in rows.groupBy("_source_file").agg(F.count(F.lit(1)).alias("n")).collect()}
    short = {f: (read.get(f.path, 0), expected[path]) for path, f in files.items() if read.get(f.path, 0) != expected[path]}
    broken = {f: f"unreadable_file: {_name(f)}: corrupt, {got} of {want} records readable" for f, (got, want) in short.items()}
    return rows.where(~F.col("_source_file").isin([f.path for f in short])).select(
        "_source_file", "_line", "_raw", F.lit(None).cast("string").alias("_line_problem"),
        typed.alias("_typed_schema")), broken


def _avro_groups(staged: dict[str, LandingFile],
                 unreadable: dict[LandingFile, str]) -> dict[tuple[str, ...], dict[str, avro.AvroFile]]:
    """Readable, non-empty Avro files grouped by writer schema (spark-avro reads one schema per load);
    files that are not whole Avro files go to `unreadable`."""
    groups: dict[str, dict[str, avro.AvroFile]] = {}
    for path, f in staged.items():
        if not f.size or f.problem:
            continue
        header = avro.read_header(path)
        if header is None:
            unreadable[f] = f"unreadable_file: {_name(f)}: not a valid Avro file"
        elif header.records:
            groups.setdefault(header.schema, {})[path] = header
    return {tuple(sorted(members)): members for members in groups.values()}


def _name(f: LandingFile) -> str:
    return f.path.rsplit("/", 1)[-1]


def _numbered(spark: SparkSession, scan: DataFrame, numbering: list[tuple[str, int, int, int, str]],
              together: bool) -> DataFrame:
    """The scan's lines as (`_source_file`, `_line`, `_text`): each line's number in its file from its block's
    (`numbering`: uri, block start, the block's first row id, lines in the file's blocks before it, the file)."""
    # a small batch's few blocks: literal lookups, where a broadcast of the mapping is a Spark job; over thousands
    # of blocks a lookup in a literal map (a scan of its entries, per line) costs more than a join
    if together:
        shift = lookup({f"{uri} {block}": before + 1 - first for uri, block, first, before, _ in numbering},
                       "concat_ws(' ', _uri, CAST(_block AS STRING))")
        return scan.select(lookup({uri: path for uri, _, _, _, path in numbering}, "_uri").alias("_source_file"),
                           (sql("_row") + shift).alias("_line"), sql("_text"))
    mapping = spark.createDataFrame(numbering, "_uri STRING, _block BIGINT, _first BIGINT, _before BIGINT, "
                                               "_source_file STRING")
    return scan.join(F.broadcast(mapping), ["_uri", "_block"]).select(
        "_source_file", (F.col("_row") - F.col("_first") + F.col("_before") + 1).alias("_line"), "_text")


def _json_lines(spark: SparkSession, staged: dict[str, LandingFile],
                together: bool) -> tuple[DataFrame | None, dict[LandingFile, str]]:
    """JSON-lines files as lines, numbered in their file; read line by line and split across tasks, so memory
    follows the longest line, not the largest file.

    Spark's reader splits a plain file into blocks read by separate tasks and numbers nothing: each line gets its
    block's start and its position in its task (monotonically_increasing_id, consecutive within a block), the scan
    is checkpointed so those stay fixed, and one aggregation counts each block's lines, from which a line's number
    in its file follows. A gzip file cannot be split (one task reads it all): one past CDC_MAX_GZIP_BYTES is set
    aside whole, and each is first read through here as a stream, so that one cut short or not gzip at all is
    quarantined whole before Spark reads anything. Spark then reads without ignoring faults (ignoreCorruptFiles
    would keep the lines before a fault and drop the rest unseen): a read that fails fails the batch, for a retry.
    Only a file gone since it was listed gives no line; it is quarantined with the reason found here."""
    limit, max_line = settings().max_gzip_bytes, settings().max_line_bytes
    unreadable: dict[LandingFile, str] = {}
    openable = {path: f for path, f in staged.items() if not f.problem}  # the rest were set aside when listed
    for path, f in openable.items():
        if path.endswith(".gz") and f.size > limit:
            unreadable[f] = file_too_large(_name(f), f.size, limit)
        elif path.endswith(".gz") and (problem := read_problem(path)) is not None:
            unreadable[f] = f"unreadable_file: {_name(f)}: {problem}"
    readable = {path: f for path, f in openable.items() if f not in unreadable}
    if not readable:
        return None, unreadable
    scan = spark.read.option("lineSep", "\n").option("ignoreMissingFiles", "true").text(list(readable)).select(
        *[sql(text) for text in ("_metadata.file_path AS _uri", "_metadata.file_block_start AS _block",
                                 "monotonically_increasing_id() AS _row", "value AS _text")])
    scan = checkpoint(scan, together)
    blocks = scan.groupBy(sql("_uri"), sql("_block")).agg(*[sql(text) for text in (
        "count(1) AS lines", "min(_row) AS first", "min(is_valid_utf8(_text)) AS utf8")]).collect()
    by_uri = {re.sub(_SCHEME, "", path): f for path, f in readable.items()}
    numbering: list[tuple[str, int, int, int, str]] = []
    counted: dict[LandingFile, int] = {}
    invalid = False
    for block in sorted(blocks, key=lambda b: (b["_uri"], b["_block"])):
        f = by_uri[re.sub(_SCHEME, "", block["_uri"])]
        numbering.append((block["_uri"], block["_block"], block["first"], counted.get(f, 0), f.path))
        counted[f] = counted.get(f, 0) + block["lines"]
        invalid = invalid or not block["utf8"]
    for path, f in readable.items():
        if f.size and f not in counted and (problem := landing_read_problem(path)) is not None:
            unreadable[f] = f"unreadable_file: {_name(f)}: {problem}"
    if not numbering:
        return None, unreadable
    numbered = _numbered(spark, scan, numbering, together)
    utf8 = sql("is_valid_utf8(_text)")
    lines = envelope.line_fields(numbered.where(utf8) if invalid else numbered, max_line)
    if not invalid:
        return lines, unreadable
    # lines with bytes that are not UTF-8 (rare: a file in another encoding) are kept byte for byte, in Python
    exact = F.udf(lambda data: exact_line(bytes(data), max_line), "_raw STRING, _line_problem STRING")(
        F.col("_text").cast("binary"))
    kept = numbered.where(~utf8).select("_source_file", F.col("_line").cast("long"), exact.alias("_exact")).select(
        "_source_file", "_line", "_exact._raw", "_exact._line_problem")
    return lines.unionByName(kept).localCheckpoint(), unreadable
