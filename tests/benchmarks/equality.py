"""The equality check beside every benchmark figure: the project's silver equals the floor's and the
generator's final state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

KEYS = ("actor_id",)  # the benchmark table's (pagila actor)


def read_table(path: Path, keys: tuple[str, ...] = KEYS) -> Any:
    """A Delta table as one Arrow table, sorted by key: pyarrow.parquet on its file list (the project's safe
    read path: no delta-rs dataset reader), or DataFusion where deletion vectors make that wrong."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from spark_jobs.delta.features import query, unplain_features

    delta = DeltaTable(str(path))
    if unplain_features(delta):
        table = pa.table(query(delta, "SELECT * FROM t"))
    else:
        table = pq.read_table([u.removeprefix("file://") for u in delta.file_uris()])
    plain = pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f for f in table.schema])
    return table.cast(plain).sort_by([(k, "ascending") for k in keys])


def check_equal(project_silver: Path, floor_silver: Path | None, generated: Any, snapshot: bool = False,
                profile: Any = None) -> None:
    """Silver equals the floor's (source columns, op, position) and the generator's final state (or, with
    `snapshot`, the state its snapshot read); `profile` is the generator's source profile when its topic is
    not a sample topic's."""
    from spark_jobs.generate import PROFILES

    project = read_table(project_silver)
    columns = [c for c in project.column_names if not c.startswith("_") or c in ("_op", "_seq", "_source_ts_ms")]
    if floor_silver is not None:
        floor = read_table(floor_silver)
        if not project.select(columns).equals(floor.select(columns).cast(project.select(columns).schema)):
            raise AssertionError(f"silver differs from the floor's: {project.num_rows} rows against {floor.num_rows}")
    columns_out = (profile or PROFILES[generated.topic]).columns  # without the envelope, silver keeps the JSON values
    state = generated.snapshot_rows if snapshot else generated.final_rows
    expected = {k: {c.name: c.encode(row[c.name]) for c in columns_out} for k, row in state.items()}
    got = {tuple(r[k] for k in KEYS): r for r in project.select([c.name for c in columns_out]).to_pylist()}
    if got != expected:
        raise AssertionError(f"silver differs from the source's {'snapshot' if snapshot else 'final state'} "
                             f"({len(got)} rows against {len(state)})")


def check_gold_by_last_name(project_gold: Path, floor_silver: Path) -> None:
    """The benchmark's gold model (actors_by_last_name: actors and newest last_update per last name) equals
    the same aggregation of the floor's silver."""
    import pyarrow as pa

    silver = read_table(floor_silver)
    expected = silver.group_by("last_name").aggregate([("actor_id", "count"), ("last_update", "max")]).rename_columns(
        ["last_name", "actors", "last_update"])
    got = read_table(project_gold, ("last_name",)).select(["last_name", "actors", "last_update"])
    expected = expected.select(got.column_names).cast(got.schema).sort_by("last_name")
    if not got.equals(pa.table(expected)):
        raise AssertionError(f"gold differs from the model over the floor's silver: {got.num_rows} rows against "
                             f"{expected.num_rows}")
