"""Ctrl-C and SIGTERM end a job the same way wherever they arrive.

``augsbert run`` handles SIGINT and SIGTERM itself for as long as the job runs
(``handled``): the first signal raises ``Interrupted`` in the main thread, which unwinds
through the job's clean-up (the copies of models it unpacked, the local Ray it started,
its run-directory lock) to the CLI, which prints one ``augsbert: interrupted`` line and
exits with 128 + the signal's number (130, 143). Libraries that install their own handlers
(``ray.init`` for SIGTERM, Ray Train and Ray Tune for SIGINT) would otherwise decide how
the job ends; ``runtime.start_ray`` puts these handlers back after ``ray.init`` and keeps
Ray Train's and Ray Tune's off.

A second signal while the job is already unwinding is ignored, so that the clean-up
finishes; a third ends the process at once (``os._exit``), for a clean-up that hangs.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

__all__ = ["Interrupted", "handled", "install", "exit_status", "stopping"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []


class Interrupted(KeyboardInterrupt):
    """The job was stopped by a signal (a ``KeyboardInterrupt``, so code that stops on
    Ctrl-C stops on SIGTERM too).

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(exc: BaseException) -> int:
    """The exit status of a job stopped by ``exc`` (130 for Ctrl-C, 143 for SIGTERM): the
    first signal the job received, as code on the way (Ray's ``ray.get``) may turn
    ``Interrupted`` into a plain ``KeyboardInterrupt``."""
    if _received:
        return 128 + _received[0]
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _on_signal(signum, frame):
    _received.append(signum)
    if len(_received) == 1:
        raise Interrupted(signum)
    if len(_received) >= 3:
        print("augsbert: interrupted three times; exiting without finishing the clean-up", file=sys.stderr)
        os._exit(128 + signum)
    # The second: the job is already unwinding; let it finish.


def install() -> None:
    """Makes SIGINT and SIGTERM raise ``Interrupted`` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, _on_signal)


@contextmanager
def handled():
    """SIGINT and SIGTERM raise ``Interrupted`` inside the block; the handlers before it are
    restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _received.clear()
    install()
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        # _received is kept for exit_status, until the next handled block.


def received() -> int:
    """The first signal the job received (SIGINT when none was)."""
    return _received[0] if _received else signal.SIGINT


def stopping() -> bool:
    """Whether the job received SIGINT or SIGTERM and is unwinding: work still under way in
    another thread (a stage) starts nothing new, no retry included."""
    return bool(_received)


def active() -> bool:
    """Whether ``handled`` is in force (so ``runtime.start_ray`` should keep it so)."""
    return signal.getsignal(signal.SIGTERM) is _on_signal or signal.getsignal(signal.SIGINT) is _on_signal
