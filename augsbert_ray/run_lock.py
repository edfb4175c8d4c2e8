"""One run at a time in a run directory.

``augsbert run`` holds an exclusive lock (``filelock``'s ``flock``) on ``.augsbert.lock`` in the
run directory's local root (the directory itself, or for a storage URI its local staging copy)
for as long as the job runs, and writes its host and process id into the file. A second run into the
same directory is refused at once, naming them. The operating system releases the lock when
the process ends, however it ends, so a run that was killed leaves no stale lock: the next
run takes it over.

``augsbert label`` and ``augsbert bench`` claim their output folder the same way, so that two of
them never write one folder at once.

The lock covers the processes of one host (and of hosts sharing the run root on a file
system with working ``flock``). Two hosts staging the same storage URI each have their own
staging copy, so each its own lock.

Claiming the lock also creates the run directory, so a directory that cannot be created
or written (a file in the way, a read-only or pseudo file system, a name too long) is
refused here, before anything else is written; a run that ends with nothing in the
directory but the lock removes the lock and the directories it created.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

import filelock

from augsbert_ray.errors import AugSBERTError

__all__ = ["LOCK_NAME", "RunDirBusy", "RunDirUnusable", "RunLock", "holder", "live_run"]

LOCK_NAME = ".augsbert.lock"


class RunDirBusy(AugSBERTError):
    """Another live run holds the run directory."""


class RunDirUnusable(AugSBERTError):
    """The run directory cannot be created or written."""


def holder(root: str | os.PathLike) -> dict:
    """What the lock file of a run root says about its holder (``host``, ``pid``,
    ``started``); empty when it says nothing readable."""
    try:
        record = json.loads((Path(root) / LOCK_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def live_run(root: str | os.PathLike) -> str | None:
    """Which live run holds the run root's lock now (``run PID on host H, started T``), or
    None when none does (no run, or one that ended however it ended)."""
    # A shared flock by hand: a read-only look, where filelock would create the file and take it.
    try:
        fd = os.open(Path(root) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe(holder(root))
    except OSError:
        return None
    finally:
        os.close(fd)  # also gives up the shared lock, if taken
    return None


def _describe(who: dict) -> str:
    if not who.get("pid"):
        return "another run (just starting)"
    return f"run {who['pid']} on host {who.get('host', '?')}" + (f", started {who['started']}" if who.get("started")
                                                                 else "")


def _exists(path: Path) -> bool:
    """``path.exists()``, False where the path cannot even be looked up (a name too long):
    creating it then says why."""
    try:
        return path.exists()
    except OSError:
        return False


def _write_holder(fd: int) -> None:
    """The lock file's record of its holder, written through the held descriptor."""
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(record) + "\n").encode())


class RunLock:
    """The exclusive claim of one run on its run directory's local root (a context manager).

    Args:
        root: the run directory's local root (``rundir.local_root``).
        shown: how to name the run directory in messages (its URI, or the path as given).
        what: what the folder is, for messages (``augsbert label`` claims its ``--out`` the same way).
        advice: what to do when another run holds it.

    Raises (on enter):
        RunDirBusy: a live run holds it (naming its host and process id).
        RunDirUnusable: it cannot be created or written (naming the path and why).
    """

    def __init__(self, root: str | os.PathLike, shown: str | None = None, what: str = "run directory",
                 advice: str = "one run at a time can use a run directory: wait for it to end (or stop it), or give "
                               "this job another run_dir or name"):
        self.root = Path(root)
        self.shown = shown or str(root)
        self.what, self.advice = what, advice
        self._lock: filelock.BaseFileLock | None = None
        self._created: list[Path] = []

    def __enter__(self) -> "RunLock":
        self._make_root()
        # Not re-entrant within a process and never a soft lock: a second claim, from this process
        # or another, is refused; the holder's record is written once the lock is held.
        lock = filelock.FileLock(str(self.root / LOCK_NAME), timeout=0, is_singleton=False, thread_local=False,
                                 fallback_to_soft=False, on_acquired=_write_holder)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise RunDirBusy(self._busy_message()) from None
        except OSError as e:
            self._remove_created()
            raise RunDirUnusable(f"{self.what} {self.shown}: cannot write in {self.root}: {e.strerror or e}") from None
        self._lock = lock
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Gives the lock up; a run root left holding only the lock is removed (with the
        directories this run created)."""
        if self._lock is None:
            return
        try:
            if self.root.is_dir() and [p.name for p in self.root.iterdir()] == [LOCK_NAME]:
                (self.root / LOCK_NAME).unlink()  # still held: a run waiting on this file starts again on a new one
                self._remove_created()
        except OSError:
            pass
        finally:
            self._lock.release()
            self._lock = None

    def _busy_message(self) -> str:
        return f"{self.what} {self.shown} is in use by {_describe(holder(self.root))}; {self.advice}"

    def _make_root(self) -> None:
        missing = []
        folder = self.root
        while not _exists(folder) and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        if _exists(folder) and not folder.is_dir():
            raise RunDirUnusable(f"{self.what} {self.shown}: {folder} is a file, not a directory")
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir():
                    self._remove_created()
                    raise RunDirUnusable(f"{self.what} {self.shown}: {path} is a file, not a directory") from None
            except OSError as e:
                self._remove_created()
                raise RunDirUnusable(f"{self.what} {self.shown}: cannot create {path}: {e.strerror or e}") from None
            else:
                self._created.append(path)

    def _remove_created(self) -> None:
        for path in reversed(self._created):
            try:
                path.rmdir()
            except OSError:
                break
        self._created.clear()
