"""Training points: a training's loss and learning rate at a logged step, carried by log records.

The training loop logs its progress line with the point attached (``extra={POINT: ...}``). In
a Ray worker, ``PointHandler`` sends the points to the job's progress channel beside the lines
(``ProgressHandle.point``); the driver hands each to the receivers open in its process
(``deliver``: a job's ``tracking.JobTracker``) and logs it as a DEBUG line for the job log
(``progress_channel.apply_events``). Handing them over directly, not through a logging handler,
leaves the engine logger's level as the job found it.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

POINT = "train_point"  # the log record's attribute: {"model", "step", "epoch", "loss", "lr"}

_receivers: list[Callable[[dict], None]] = []
_lock = threading.Lock()


@contextmanager
def receiving(receiver: Callable[[dict], None]) -> Iterator[None]:
    """``receiver`` gets every training point this process is handed while the context lasts."""
    with _lock:
        _receivers.append(receiver)
    try:
        yield
    finally:
        with _lock:
            _receivers.remove(receiver)


def deliver(point: dict) -> None:
    """Hands a training point to the receivers open in this process (none: it goes nowhere)."""
    with _lock:
        receivers = list(_receivers)
    for receiver in receivers:
        receiver(point)


def point_of(record: logging.LogRecord) -> dict[str, Any] | None:
    """The training point a log record carries, if any."""
    value = getattr(record, POINT, None)
    return value if isinstance(value, dict) else None


class PointHandler(logging.Handler):
    """Sends the training points of the records it sees to ``progress`` (its ``point`` method)."""

    def __init__(self, progress, level: int = logging.INFO):
        super().__init__(level)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        point = point_of(record)
        if point is None:
            return
        try:
            self.progress.point(point)
        except Exception:  # noqa: BLE001 - tracking must never stop a training
            self.handleError(record)
