import pyarrow as pa

from augsbert_ray.rundir import RunDir, fingerprint, table_fingerprint


def test_fingerprint_is_stable_and_sensitive():
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_table_fingerprint_tracks_content():
    t = pa.table({"x": [1, 2, 3]})
    assert table_fingerprint(t) == table_fingerprint(pa.table({"x": [1, 2, 3]}))
    assert table_fingerprint(t) != table_fingerprint(pa.table({"x": [1, 2, 4]}))


def test_signatures_and_atomic_writes(tmp_path):
    rd = RunDir(tmp_path / "run")
    assert rd.signature("stages/s/x.json") is None
    rd.write_text("stages/s/x.json", "{}")
    rd.write_text("stages/s/sub/y.txt", "abc")
    assert rd.signature("stages/s/x.json") == [1, 2] and rd.signature("stages/s/sub") == [1, 3]
    assert rd.signature("stages/s") == [2, 5]
    assert not list(rd.path("stages").rglob(".*tmp"))  # written atomically


def test_ray_checkpoints_and_indexes_are_not_synced():
    from augsbert_ray.rundir import _synced

    assert _synced("stages/silver/ab12/silver.parquet") and _synced("stages/silver/ab12/shards/part-000001.parquet")
    assert not _synced("stages/augsbert/ab12/ray/train/checkpoint_1/trainer_state.pt")
    assert not _synced("stages/candidates/ab12/index/meta.json")


def test_tables_roundtrip(tmp_path):
    rd = RunDir(tmp_path)
    t = pa.table({"a": ["x", "y"]})
    rd.write_table("sub/t.parquet", t)
    assert rd.read_table("sub/t.parquet").equals(t)


def test_a_storage_scheme_pyarrow_cannot_open_is_refused_at_once():
    import pytest

    from augsbert_ray.errors import AugSBERTError
    from augsbert_ray.rundir import check_storage

    with pytest.raises(AugSBERTError, match=r"run directory foo://bar/run: 'foo://' is not a storage"):
        check_storage("foo://bar/run")


def test_a_storage_that_does_not_answer_is_refused_within_the_timeout(monkeypatch):
    import threading
    import time

    import pyarrow.fs as pafs
    import pytest

    from augsbert_ray.errors import AugSBERTError
    from augsbert_ray.rundir import check_storage

    release = threading.Event()

    class Hanging:
        @staticmethod
        def from_uri(uri):
            release.wait(30)  # a storage client that never answers
            raise OSError("gave up")

    monkeypatch.setattr(pafs, "FileSystem", Hanging)
    t0 = time.monotonic()
    try:
        with pytest.raises(AugSBERTError, match=r"s3://b/run: the storage did not answer within 0.5 s"):
            check_storage("s3://b/run", timeout_s=0.5)
    finally:
        release.set()
    assert time.monotonic() - t0 < 5
