from pathlib import Path

import pytest

from spark_jobs.landing import list_topic
from tests.support import s3_environment, upload_landing


def test_lists_both_partitioner_layouts_and_skips_marker_files(tmp_path):
    topic = tmp_path / "topics" / "db.s.t"
    files = {
        "partition=0/db.s.t+0+0000000000.json": "a",
        "partition=1/db.s.t+1+0000000000.json.gz": "bb",
        "year=2024/month=05/day=01/hour=13/db.s.t+0+0000000007.snappy.parquet": "ccc",
        "partition=0/_SUCCESS": "",
        "partition=0/.db.s.t+0+0000000009.json.tmp": "",
        "_temporary/0/db.s.t+0+0000000010.json": "",
    }
    for name, text in files.items():
        (topic / name).parent.mkdir(parents=True, exist_ok=True)
        (topic / name).write_text(text)
    (tmp_path / "topics" / "db.s.other" / "partition=0").mkdir(parents=True)
    (tmp_path / "topics" / "db.s.other" / "partition=0" / "x.json").write_text("{}")
    got = [(f.path, f.size, f.kind) for f in list_topic(str(tmp_path), "db.s.t")]
    assert got == [
        ("topics/db.s.t/partition=0/db.s.t+0+0000000000.json", 1, "json"),
        ("topics/db.s.t/partition=1/db.s.t+1+0000000000.json.gz", 2, "json"),
        ("topics/db.s.t/year=2024/month=05/day=01/hour=13/db.s.t+0+0000000007.snappy.parquet", 3, "parquet"),
    ]
    assert list_topic(str(tmp_path), "db.s.none") == []


def test_the_sinks_key_and_header_files_are_not_data_and_a_value_file_names_its_json_key_file(tmp_path):
    topic = tmp_path / "topics" / "db.s.t" / "partition=0"
    topic.mkdir(parents=True)
    for name in ("db.s.t+0+0000000000.json", "db.s.t+0+0000000000.keys.json", "db.s.t+0+0000000000.headers.json",
                 "db.s.t+0+0000000005.avro", "db.s.t+0+0000000005.keys.json.gz", "db.s.t+0+0000000009.json",
                 "db.s.t+0+0000000012.parquet", "db.s.t+0+0000000012.keys.avro", "export.keys.json"):
        (topic / name).write_text("x")
    got = [(f.path.rsplit("/", 1)[1], f.keys_file and f.keys_file.path.rsplit("/", 1)[1])
           for f in list_topic(str(tmp_path), "db.s.t")]
    assert got == [("db.s.t+0+0000000000.json", "db.s.t+0+0000000000.keys.json"),
                   ("db.s.t+0+0000000005.avro", "db.s.t+0+0000000005.keys.json.gz"),
                   ("db.s.t+0+0000000009.json", None),  # its keys have not landed yet
                   ("db.s.t+0+0000000012.parquet", None),  # Avro keys are not read: only JSON key files
                   ("export.keys.json", None)]  # not the sink's name: data like any other file
    keys = list_topic(str(tmp_path), "db.s.t")[0].keys_file
    assert keys is not None and keys.size == 1  # listed like a data file: its size bounds a gzip key file's read


SINK = {  # a sink's folders: names ordered by start offset; a time-based layout nests
    "partition=0/db.s.t+0+0000000000.json": "a", "partition=0/db.s.t+0+0000000004.json": "b",
    "partition=0/db.s.t+0+0000000008.json": "c", "partition=1/db.s.t+1+0000000000.json": "d",
    "partition=1/db.s.t+1+0000000003.json": "e",
    "year=2024/month=05/day=01/hour=13/db.s.t+0+0000000007.json": "f",
    "other/export-b.json": "g",  # not a sink's name: never marked, always listed
}


def write_sink(root, names=SINK):
    for name, text in names.items():
        path = root / "topics" / "db.s.t" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def paths(files):
    return [f.path.removeprefix("topics/db.s.t/") for f in files]


def test_marks_move_over_taken_files_up_to_the_first_one_not_taken(tmp_path):
    from spark_jobs.lake import Lake
    from spark_jobs.state import advance_marks, read_marks

    write_sink(tmp_path / "landing")
    lake = Lake(str(tmp_path / "lake"))
    listed = list_topic(str(tmp_path / "landing"), "db.s.t")
    # partition 0's middle file is left for later (a backfill window took the others): its mark stops before it
    taken = {f.path for f in listed} - {"topics/db.s.t/partition=0/db.s.t+0+0000000004.json"}
    advance_marks(lake, "t", {}, listed, taken)
    marks = read_marks(lake, "t")
    assert marks == {"topics/db.s.t/partition=0": "topics/db.s.t/partition=0/db.s.t+0+0000000000.json",
                     "topics/db.s.t/partition=1": "topics/db.s.t/partition=1/db.s.t+1+0000000003.json",
                     "topics/db.s.t/year=2024/month=05/day=01/hour=13":
                         "topics/db.s.t/year=2024/month=05/day=01/hour=13/db.s.t+0+0000000007.json"}
    after = list_topic(str(tmp_path / "landing"), "db.s.t", marks=marks)
    assert paths(after) == ["other/export-b.json", "partition=0/db.s.t+0+0000000004.json",
                            "partition=0/db.s.t+0+0000000008.json"]
    # once the left file is taken, the mark moves over it and over the taken one after it
    advance_marks(lake, "t", marks, after, taken | {f.path for f in after})
    assert paths(list_topic(str(tmp_path / "landing"), "db.s.t", marks=read_marks(lake, "t"))) == [
        "other/export-b.json"]


def test_on_s3_the_listing_starts_after_each_folders_mark(tmp_path, s3_endpoint, monkeypatch):
    import boto3

    for name, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    write_sink(tmp_path / "sink")
    upload_landing(s3_endpoint, tmp_path / "sink", "s3://landing/cdc")
    client = boto3.client("s3")
    requests = []
    client.meta.events.register("before-parameter-build.s3.ListObjectsV2",
                                lambda params, **_: requests.append({k: params.get(k) for k in ("Prefix", "StartAfter")}))
    marks = {"topics/db.s.t/partition=0": "topics/db.s.t/partition=0/db.s.t+0+0000000004.json"}
    listed = list_topic("s3://landing/cdc", "db.s.t", client, marks)
    assert paths(listed) == ["other/export-b.json", "partition=0/db.s.t+0+0000000008.json",
                             "partition=1/db.s.t+1+0000000000.json", "partition=1/db.s.t+1+0000000003.json",
                             "year=2024/month=05/day=01/hour=13/db.s.t+0+0000000007.json"]
    assert {"Prefix": "cdc/topics/db.s.t/partition=0/",
            "StartAfter": "cdc/topics/db.s.t/partition=0/db.s.t+0+0000000004.json"} in requests
    assert list_topic("s3://landing/cdc", "db.s.t", client) == list_topic("s3://landing/cdc", "db.s.t", client, {})
    assert len(list_topic("s3://landing/cdc", "db.s.t", client)) == len(SINK)


def test_a_file_landing_late_under_a_marked_name_is_found_by_the_repair_and_listed_again(tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    from spark_jobs.lake import Lake
    from spark_jobs.state import advance_marks, read_marks, repair_marks

    write_sink(tmp_path / "landing")
    lake = Lake(str(tmp_path / "lake"))
    listed = list_topic(str(tmp_path / "landing"), "db.s.t")
    taken = {f.path for f in listed}
    write_deltalake(lake.ingest_log("t"), pa.table({"file": sorted(taken)}))  # bronze took every file
    advance_marks(lake, "t", {}, listed, taken)
    late = "topics/db.s.t/partition=0/db.s.t+0+0000000002.json"  # lands after +...08 was taken, under an earlier name
    write_sink(tmp_path / "landing", {late.removeprefix("topics/db.s.t/"): "x"})
    assert late not in [f.path for f in list_topic(str(tmp_path / "landing"), "db.s.t", marks=read_marks(lake, "t"))]
    assert repair_marks(str(tmp_path / "landing"), lake, "t", "db.s.t") == [late]
    assert read_marks(lake, "t")["topics/db.s.t/partition=0"] == "topics/db.s.t/partition=0/db.s.t+0+0000000000.json"
    assert late in [f.path for f in list_topic(str(tmp_path / "landing"), "db.s.t", marks=read_marks(lake, "t"))]


def test_a_file_turned_into_a_link_after_its_listing_is_never_staged_and_a_file_is_staged_as_itself(tmp_path):
    """Spark reads what spark_paths stages, never the landing path itself: a local file is opened, and staged only when
    what is open lies inside the landing root, hard-linked into the staging folder (the same file, the bytes the
    listing saw). Swapped for a link out of the root after the listing: LandingChanged, a retryable failure (the next
    listing quarantines the link by name), and nothing of the other file is staged; for a link within the root, that
    file, as the listing would list it."""
    from spark_jobs.errors import LandingChanged, is_transient
    from spark_jobs.landing import spark_paths

    landing, outside = tmp_path / "landing", tmp_path / "secret.json"
    outside.write_text("the outside file\n")
    folder = landing / "topics" / "db.s.t" / "partition=0"
    folder.mkdir(parents=True)
    kept, swapped = folder / "db.s.t+0+0000000000.json", folder / "db.s.t+0+0000000001.json"
    kept.write_text("kept\n")
    swapped.write_text("swapped\n")
    files = list_topic(str(landing), "db.s.t")
    staged = spark_paths(str(landing), files[:1], str(tmp_path / "staging"))
    (path, landed), = staged.items()
    assert landed.path == "topics/db.s.t/partition=0/db.s.t+0+0000000000.json"
    assert Path(path).read_text() == "kept\n" and Path(path).stat().st_ino == kept.stat().st_ino
    swapped.unlink()
    swapped.symlink_to(outside)
    with pytest.raises(LandingChanged, match="changed since it was listed") as changed:
        spark_paths(str(landing), files[1:], str(tmp_path / "staging-2"))
    assert is_transient(changed.value)
    assert all(p.read_text() != outside.read_text() for p in (tmp_path / "staging-2").glob("*"))
    swapped.unlink()
    swapped.symlink_to(kept)  # within the root
    (path, _), = spark_paths(str(landing), files[1:], str(tmp_path / "staging-3")).items()
    assert Path(path).read_text() == "kept\n" and Path(path).stat().st_ino == kept.stat().st_ino
