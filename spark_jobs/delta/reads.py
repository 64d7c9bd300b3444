"""Reads of a Delta table on the driver, without Spark and without a JVM: its log's figures, its rows as Arrow, SQL over
it. The one place a Delta table is opened outside the engines' own writes (the sensor, status, the event log,
maintenance's figures, the silver pass). Nothing heavy at module level: the DAG processor imports this."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from spark_jobs.settings import environ
from spark_jobs.storage import arrow_path, arrow_s3, delta_storage_options, is_s3

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from spark_jobs.delta import NewFiles


def open_table(path: str, version: int | None = None, env: Mapping[str, str] = environ,
               options: dict[str, str] | None = None) -> DeltaTable | None:
    """The table at `path` (at `version`; None: its newest), with the lake's storage settings (`options`, else those
    `env` gives: local, or S3 from AWS_*); None when there is no table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path, version=version,
                          storage_options=options if options is not None else delta_storage_options(path, env))
    except TableNotFoundError:
        return None


def current(path: str, options: dict[str, str] | None = None) -> tuple[int, str] | None:
    """The table's version and schema (as JSON), from one read of its log; None when there is no table."""
    table = open_table(path, options=options)
    return None if table is None else (table.version(), table.schema().to_json())


# the commits after which a file added since a version holds exactly its rows, deletion vectors on or not: a write
# adds files, maintenance rewrites rows already there (without their deleted rows). A delete, update or merge, or a
# write over a predicate (replaceWhere: bronze's reprocess), may mark rows of a file deleted instead
_ADDING = {"WRITE", "STREAMING UPDATE", "CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES"}


def new_files(path: str, after: int, options: dict[str, str] | None = None) -> NewFiles | None:
    """The files of the table's current version that were not there at version `after` (-1: none was), from its log,
    as both engines list them for a reader of only its new rows (the silver pass); None when it has nothing newer, or
    new rows a plain Parquet read would get wrong: a reader feature besides deletion vectors, or deletion vectors
    and a commit since `after` that may have marked rows deleted (delta-spark's tables have them on)."""
    from spark_jobs.delta import NewFiles, table_files
    from spark_jobs.delta.features import unplain_features

    table = open_table(path, options=options)
    if table is None or table.version() <= after:
        return None
    unplain = unplain_features(table)
    if unplain and (unplain != ["deletionVectors"] or not _added_only(table, after)):
        return None
    before = open_table(path, after, options=options) if after >= 0 else None
    known = set(table_files(before)) if before is not None else set()
    actions = table.get_add_actions(flatten=True)  # a file's name (a UUID's) is unique in its table
    names = [p.rsplit("/", 1)[-1] for p in actions.column("path").to_pylist()]
    stats = dict(zip(names, zip(actions.column("size_bytes").to_pylist(), actions.column("num_records").to_pylist(),
                                strict=True), strict=True))
    new = tuple(f for f in table_files(table) if f not in known)
    added = [stats[f.rsplit("/", 1)[-1]] for f in new]
    rows = [r for _, r in added]
    return NewFiles(table.version(), new, table.schema().to_json(), sum(size for size, _ in added),
                    None if None in rows else sum(rows))


def _added_only(table: DeltaTable, after: int) -> bool:
    """Did every commit since `after` only add files or keep the table, as its log still holds them all?"""
    commits = [c for c in table.history(table.version() - after) if c["version"] > after]
    return len(commits) == table.version() - after and all(map(_marks_no_row, commits))


def _marks_no_row(commit: dict[str, Any]) -> bool:
    """Can the commit not have marked rows of a file deleted (`_ADDING`, but a write over a predicate)?"""
    over_predicate = commit.get("operation") == "WRITE" and "predicate" in (commit.get("operationParameters") or {})
    return commit.get("operation") in _ADDING and not over_predicate


def query_table(path: str, sql: str, env: Mapping[str, str] = environ) -> dict[str, list[Any]] | None:
    """`sql` over the table (named `t`), through delta-rs' DataFusion, as columns; None when there is no table."""
    from spark_jobs.delta.features import query

    table = open_table(path, env=env)
    return None if table is None else query(table, sql)


def row_count(path: str) -> int | None:
    """Rows in a Delta table from its file statistics (no data read, no JVM); None when absent."""
    from spark_jobs.delta.features import query, unplain_features

    table = open_table(path)
    if table is None:
        return None
    if unplain_features(table):  # statistics count rows a deletion vector has deleted
        return int(query(table, "SELECT COUNT(*) AS n FROM t")["n"][0])
    actions = table.get_add_actions(flatten=True)
    return sum(v for v in actions.column("num_records").to_pylist() if v is not None)


def snapshot_files(path: str) -> tuple[int, list[int]] | None:
    """The version and the sizes of the snapshot's data files, from the log (no data read); None when absent."""
    table = open_table(path)
    if table is None:
        return None
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    return table.version(), [int(s) for s in sizes]


def read_columns(path: str, columns: list[str] | None = None,
                 env: Mapping[str, str] = environ) -> dict[str, list[Any]] | None:
    """A Delta table's columns (all when None) as Python values (`read_arrow`); None when the table is absent."""
    table = read_arrow(path, columns, env)
    return None if table is None else table.to_pydict()


def read_arrow(path: str, columns: list[str] | None = None, env: Mapping[str, str] = environ,
               where: Callable[[pa.Schema], pc.Expression] | None = None,
               options: dict[str, str] | None = None) -> pa.Table | None:
    """A Delta table's columns (all when None), read without Spark and without delta-rs' dataset readers: pyarrow over
    the snapshot's files, or delta-rs' DataFusion provider where deletion vectors make a plain Parquet read wrong.
    None when the table is absent. `env` holds an S3 lake's AWS_* settings (spark_jobs/storage.py; `options`, an
    engine's own). `where` makes, from the schema read (of `columns`, strings as strings), the filter its rows must
    pass: applied to each batch as the files are read, so that memory holds the rows kept, not the table (a big silver
    table's keys, of which a batch touches a few)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from spark_jobs.delta import table_files
    from spark_jobs.delta.features import query_batches, unplain_features

    table = open_table(path, env=env, options=options)
    if table is None:
        return None
    # filtered batch by batch, as strings: delta-rs writes them as views, which Arrow's filter and comparisons do not
    # take (nor the statistics a dataset's own filter prunes files by)
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if unplain_features(table):  # deletion vectors, column mapping: DataFusion's provider honours them
        named = ", ".join('"' + c.replace('"', '""') + '"' for c in columns) if columns else "*"
        reader = query_batches(table, f"SELECT {named} FROM t")
        viewless = pa.schema([f.with_type(plain.get(f.type, f.type)) for f in reader.schema])
        kept = where(viewless) if where is not None else None
        return pa.Table.from_batches([b.cast(viewless) if kept is None else b.cast(viewless).filter(kept)
                                      for b in reader], viewless)
    files = table_files(table)
    if not files:
        schema = pa.schema(table.schema().to_arrow())
        return schema.empty_table().select(columns) if columns else schema.empty_table()
    filesystem = arrow_s3(env) if is_s3(path) else None
    dataset = ds.dataset([arrow_path(f) for f in files], format="parquet", filesystem=filesystem)
    partitions = set(table.metadata().partition_columns) & set(columns or table.schema().to_arrow().names)
    if where is None and not partitions:
        return dataset.to_table(columns=columns)
    stored = [f for f in dataset.schema if (not columns or f.name in columns) and f.name not in partitions]
    parted = [f for f in pa.schema(table.schema().to_arrow()) if f.name in partitions]
    schema = pa.schema([f.with_type(plain.get(f.type, f.type)) for f in (*stored, *parted)])
    keep = where(schema) if where is not None else None
    read = [f.name for f in stored]
    if not partitions:  # the dataset's own batches, read ahead across its files
        batches = (b.cast(schema) for b in dataset.to_batches(columns=read))
    else:  # a partition column is in no file: its value is the file's, in the table's log
        values, file_of = partition_values(table, files), {arrow_path(f): f for f in files}
        batches = (pa.RecordBatch.from_arrays(
            [*b.columns, *[pa.array([values[file_of[fragment.path]][f.name]] * b.num_rows, f.type) for f in parted]],
            names=[*read, *[f.name for f in parted]]).cast(schema)
            for fragment in dataset.get_fragments() for b in fragment.to_batches(columns=read))
    # each batch filtered as it is read: memory holds the rows kept
    return pa.Table.from_batches([b if keep is None else b.filter(keep) for b in batches], schema)


def partition_values(table: DeltaTable, files: list[str]) -> dict[str, dict[str, Any]]:
    """Each of the table's data files (`files`, as delta.table_files names them) with its partition columns' values,
    typed, as its log's add action holds them (not parsed from the file's path: the protocol does not promise it)."""
    import pyarrow as pa

    added = pa.table(table.get_add_actions(flatten=True))
    names = [c.removeprefix("partition.") for c in added.column_names if c.startswith("partition.")]
    by_path = {unquote(p): row for p, row in zip(added.column("path").to_pylist(), added.select(
        [f"partition.{n}" for n in names]).rename_columns(names).to_pylist(), strict=True)}
    root = len(unquote(table.table_uri.removeprefix("file://").rstrip("/") + "/"))
    return {f: by_path[f[root:]] if f[root:] in by_path else by_path[f] for f in files}
