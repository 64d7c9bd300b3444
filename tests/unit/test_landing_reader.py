"""JSON-lines landing files read line by line and split across Spark tasks (layers/landing_reader.py): whatever the
split points, every line comes back once, numbered as it stands in its file, byte for byte, against a reference
that reads the whole file in Python."""

from __future__ import annotations

import base64
import gzip
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.landing import LandingFile, line_too_large
from spark_jobs.layers.landing_reader import read_landing

MAX_LINE = 40
LINE = st.one_of(
    st.text(alphabet="ab{}\":, é\u00e9\u20ac", max_size=30),  # UTF-8, some multi-byte
    st.just(""),  # blank lines stay
    st.text(alphabet="xy", min_size=MAX_LINE + 1, max_size=MAX_LINE + 20),  # too large: an excerpt and the problem
).map(str.encode) | st.sampled_from([b"caf\xe9", b"\xff\xfe{}", b"ok\xc3"])  # bytes that are not UTF-8
FILE = st.tuples(st.booleans(), st.lists(st.tuples(LINE, st.booleans()), max_size=25), st.booleans())


def reference(data: bytes) -> list[tuple[int, str, str | None]]:
    """What a line of a file is, from its bytes: split at LF, the last LF ends the file, the CR of CRLF and the BOM
    opening the file dropped; UTF-8 text, or its bytes as base64 when it is not UTF-8."""
    chunks = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    if chunks[-1] == b"":
        chunks.pop()
    lines = []
    for number, chunk in enumerate(chunks, start=1):
        chunk = chunk.removesuffix(b"\r")
        if len(chunk) > MAX_LINE:
            lines.append((number, chunk[:1024].decode("utf-8", "replace"), line_too_large(len(chunk), MAX_LINE)))
            continue
        try:
            lines.append((number, chunk.decode("utf-8"), None))
        except UnicodeDecodeError as exc:
            lines.append((number, base64.b64encode(chunk).decode(), f"invalid_utf8: byte {exc.start} is not UTF-8; "
                                                                   "the line's bytes are kept as base64 in _raw"))
    return lines


@pytest.fixture()
def tiny_splits(spark, monkeypatch):
    """Blocks of 64 bytes: every file of more than one line is read by several tasks, lines across block ends."""
    monkeypatch.setenv("CDC_MAX_LINE_BYTES", str(MAX_LINE))
    old = {k: spark.conf.get(k) for k in ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")}
    spark.conf.set("spark.sql.files.maxPartitionBytes", "64")
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    yield spark
    for key, value in old.items():
        spark.conf.set(key, value)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(files=st.lists(FILE, min_size=1, max_size=4))
def test_lines_read_in_any_split_are_the_files_lines_in_order(tiny_splits, tmp_path_factory, files):
    folder = tmp_path_factory.mktemp("landing")
    landing: dict[str, LandingFile] = {}
    expected = set()
    for index, (bom, lines, final_newline) in enumerate(files):
        data = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(text + (b"\r" if crlf else b"") for text, crlf in lines)
        data += b"\n" if final_newline and lines else b""
        path = folder / f"t+0+{index:010d}.json"
        path.write_bytes(data)
        landing[str(path)] = LandingFile(f"topics/t/partition=0/{path.name}", len(data), 0)
        expected |= {(landing[str(path)].path, *line) for line in reference(data)}
    got, unreadable = read_landing(tiny_splits, landing, list(landing.values()), "json")
    assert unreadable == {}
    rows = [(r["_source_file"], r["_line"], r["_raw"], r["_line_problem"]) for r in got.collect()]
    assert sorted(rows, key=str) == sorted(expected, key=str) and len(rows) == len(expected)


def test_a_gzip_file_over_the_limit_is_set_aside_whole_and_a_cut_one_gives_no_line(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_MAX_GZIP_BYTES", "200")
    whole = gzip.compress(b"".join(b'{"n": %d}\n' % n for n in range(300)))
    small = gzip.compress(b'{"n": 1}\n{"n": 2}\n')
    files = {"big.json.gz": whole, "cut.json.gz": whole[:150], "small.json.gz": small}
    landing = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        landing[str(tmp_path / name)] = LandingFile(f"topics/t/partition=0/{name}", len(data), 0)
    got, unreadable = read_landing(spark, landing, list(landing.values()), "json")
    assert sorted((f.path.rsplit("/", 1)[1], reason) for f, reason in unreadable.items()) == [
        ("big.json.gz", f"file_too_large: big.json.gz: {len(whole)} bytes of gzip, over CDC_MAX_GZIP_BYTES (200); a gzip "
                        "file cannot be split, so one task would read it all: land it uncompressed or in smaller files, "
                        "or raise the limit and reprocess it"),
        ("cut.json.gz", "unreadable_file: cut.json.gz: Compressed file ended before the end-of-stream marker was reached")]
    assert sorted((r["_source_file"].rsplit("/", 1)[1], r["_line"], r["_raw"]) for r in got.collect()) == [
        ("small.json.gz", 1, '{"n": 1}'), ("small.json.gz", 2, '{"n": 2}')]
    assert Path(tmp_path / "cut.json.gz").exists()  # set aside, never altered
