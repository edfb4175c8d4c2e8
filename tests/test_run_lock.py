"""One run at a time in a run directory (``run_lock``), without Ray."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from augsbert_ray.run_lock import LOCK_NAME, RunDirBusy, RunDirUnusable, RunLock, holder


def test_a_second_claim_is_refused_with_the_holders_host_and_pid(tmp_path):
    root = tmp_path / "runs" / "job"
    with RunLock(root):
        assert holder(root) == {**holder(root), "host": socket.gethostname(), "pid": os.getpid()}
        with pytest.raises(RunDirBusy) as info:
            RunLock(root, shown="runs/job").__enter__()
        assert f"runs/job is in use by run {os.getpid()} on host {socket.gethostname()}" in str(info.value)
        (root / "gold").mkdir()  # the run wrote something: the lock file stays with it
    assert (root / LOCK_NAME).exists()
    with RunLock(root):  # released: the next run takes it
        pass


def test_a_run_that_wrote_nothing_leaves_no_folder(tmp_path):
    (tmp_path / "runs").mkdir()
    with RunLock(tmp_path / "runs" / "a" / "b"):
        pass
    assert list(tmp_path.iterdir()) == [tmp_path / "runs"]  # only what it created is removed
    assert not list((tmp_path / "runs").iterdir())


def test_a_killed_runs_lock_is_taken_over(tmp_path):
    root = tmp_path / "run"
    code = textwrap.dedent(f"""
        import sys, time
        from augsbert_ray.run_lock import RunLock
        lock = RunLock({str(root)!r}).__enter__()
        (lock.root / "gold").mkdir()
        print("held", flush=True)
        with open(lock.root / "gold" / "train.parquet", "wb") as f:  # killed mid-write
            while True:
                f.write(b"x" * 4096)
                f.flush()
                time.sleep(0.01)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"run {proc.pid} on host"):
            RunLock(root).__enter__()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert holder(root)["pid"] == proc.pid  # the file stays; the OS released the lock
    with RunLock(root):
        assert holder(root)["pid"] == os.getpid()


@pytest.mark.parametrize("case", ["file", "file_parent", "proc", "too_long"])
def test_a_run_directory_that_cannot_be_made_is_refused_and_nothing_is_left(tmp_path, case):
    (tmp_path / "afile").write_text("x")
    root = {"file": tmp_path / "afile", "file_parent": tmp_path / "afile" / "run",
            "proc": "/proc/augsbert-no-such/run", "too_long": tmp_path / "runs" / ("a" * 300)}[case]
    with pytest.raises(RunDirUnusable) as info:
        RunLock(root, shown="the-run").__enter__()
    reason = {"file": "is a file, not a directory", "file_parent": "is a file, not a directory",
              "proc": "cannot create", "too_long": "File name too long"}[case]
    assert "run directory the-run: " in str(info.value) and reason in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
