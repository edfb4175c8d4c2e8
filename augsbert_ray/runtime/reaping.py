"""The processes a local Ray leaves behind, found and killed with psutil.

A process is held as a ``psutil.Process``, which knows its start time: one that ended and
whose id was reused is never taken for it, so it is never killed by mistake.
"""

from __future__ import annotations

import logging
import time

import psutil

log = logging.getLogger(__name__)


def descendants(root: int) -> list[psutil.Process]:
    """Every descendant of process ``root`` (empty if ``root`` is gone)."""
    try:
        return psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []


def alive(process: psutil.Process) -> bool:
    """Whether ``process`` (the same one, not a reuse of its id) still runs; a zombie does not."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_leftovers(processes: list[psutil.Process], grace_s: float, what: str, *, terminate: bool = False) -> None:
    """Waits up to ``grace_s`` seconds for ``processes`` to end, then kills those still alive.

    Args:
        processes: found (``descendants``) before they were asked to stop.
        grace_s: how long they have to end on their own.
        what: whose processes they are, for the log.
        terminate: first send each one still alive SIGTERM, for processes that would otherwise
            only notice on their next poll that their parent is gone.
    """
    # Polled rather than psutil.wait_procs: that waits out the whole grace for a zombie that
    # is not this process's child, and a zombie has ended.
    deadline = time.monotonic() + grace_s
    left = [p for p in processes if alive(p)]
    for process in left if terminate else []:
        try:
            process.terminate()  # psutil checks that the id still names the same process
        except psutil.Error:
            pass
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    for process in left:
        try:
            process.kill()  # psutil checks that the id still names the same process
            log.debug("killed %s, left running by the local Ray of %s", process.pid, what)
        except psutil.Error:
            pass
