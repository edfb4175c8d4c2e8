import pyarrow as pa

from augsbert_ray.rundir import RunDir, fingerprint, table_fingerprint


def test_fingerprint_is_stable_and_sensitive():
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_table_fingerprint_tracks_content():
    t = pa.table({"x": [1, 2, 3]})
    assert table_fingerprint(t) == table_fingerprint(pa.table({"x": [1, 2, 3]}))
    assert table_fingerprint(t) != table_fingerprint(pa.table({"x": [1, 2, 4]}))


def test_stage_markers(tmp_path):
    rd = RunDir(tmp_path / "run")
    assert rd.completed("s", "fp1") is None
    rd.mark_completed("s", "fp1", {"n": 3})
    assert rd.completed("s", "fp1") == {"n": 3}
    assert rd.completed("s", "fp2") is None  # changed inputs invalidate the stage
    assert not list(rd.path("stages").glob(".*tmp"))  # written atomically


def test_tables_roundtrip(tmp_path):
    rd = RunDir(tmp_path)
    t = pa.table({"a": ["x", "y"]})
    rd.write_table("sub/t.parquet", t)
    assert rd.read_table("sub/t.parquet").equals(t)
