from spark_jobs.landing import list_topic


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
