"""A full disk (``ENOSPC``, injected) is one error naming the path, leaves nothing half-written
that a re-run would take for done, and the re-run after space is freed completes. The trainings'
checkpoints and exports: ``training/test_resume_total.py``; a stage's marker: ``test_runner.py``."""

from __future__ import annotations

import errno
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from augsbert_ray.errors import DiskFullError, as_disk_full, is_disk_full
from augsbert_ray.labeling.shards import ShardStore
from augsbert_ray.rundir import write_table


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _part_then_full(table, where, **kwargs):
    """``pq.write_table`` on a disk that fills up after the first bytes."""
    with open(where, "wb") as f:
        f.write(b"PAR1")
    _full()


def test_the_forms_a_full_disk_takes_are_recognised_and_named():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device", "/r/x"))
    assert as_disk_full(OSError(errno.ENOSPC, "No space left on device", "/r/x")).path == "/r/x"
    copy = shutil.Error([("/a/w.bin", "/r/m/w.bin", "[Errno 28] No space left on device")])
    assert as_disk_full(copy).path == "/r/m/w.bin"
    torch_save = RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 4288 vs 4176")
    assert is_disk_full(torch_save) and is_disk_full(RuntimeError("PytorchStreamWriter failed: file write failed"))
    assert not is_disk_full(OSError(errno.ECONNRESET, "Connection reset")) and as_disk_full(ValueError("x")) is None


def test_a_labelled_shard_is_committed_whole_or_not_at_all(tmp_path, monkeypatch):
    store = ShardStore(tmp_path / "shards")
    table = pa.table({"id1": [1, 2], "label": [0.5, 0.25]})
    with monkeypatch.context() as m:
        m.setattr(pq, "write_table", _part_then_full)
        with pytest.raises(DiskFullError, match="no space left on device while writing .*part-000004.parquet"):
            store.commit(4, table, "digest")
    assert not list(store.root.rglob("*part-000004*")) and not store.done(4, "digest")
    store.commit(4, table, "digest")  # space freed
    assert store.done(4, "digest") and store.read(4).equals(table)


def test_a_run_directory_table_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(pq, "write_table", _part_then_full)
        with pytest.raises(DiskFullError, match="silver.parquet"):
            write_table(tmp_path / "silver.parquet", pa.table({"x": [1]}))
    assert list(tmp_path.iterdir()) == []


def test_the_cli_names_a_full_disk_in_one_line(monkeypatch, capsys):
    from augsbert_ray import cli, report

    def full(run_dir):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/metrics.json")

    monkeypatch.setattr(report, "show_run", full)
    assert cli.main(["report", "/runs/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [("augsbert: error: no space left on device while writing /runs/x/metrics.json: free some space and "
                    "run again (a re-run resumes from what was written whole)")]
