"""The job log (``<run dir>/logs/job.log``): every engine line and plain progress line, dated,
whatever the terminal shows, so a run directory keeps a readable record of the job."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable


class JobLog:
    """Appends dated lines to ``path`` (its folder made if needed), each written through at once.

    Args:
        path: the log file.
        clock: the time source (seconds since the epoch) of the dates.
    """

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self._file = open(path, "a", encoding="utf-8", buffering=1)

    def write(self, line: str) -> None:
        """``2026-11-27 16:58:43 line``; nothing once closed."""
        if not self._file.closed:
            self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.clock()))} {line}\n")

    def close(self) -> None:
        self._file.close()
