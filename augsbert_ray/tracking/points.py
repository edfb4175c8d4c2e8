"""Training points: a training's loss and learning rate at a logged step, carried by log records.

The training loop logs its progress line with the point attached (``extra={POINT: ...}``). In
a Ray worker, ``PointHandler`` sends the points to the job's progress channel beside the lines
(``ProgressHandle.point``); the driver replays each as a DEBUG record with the point attached
(``progress_channel.apply_events``), which a ``tracking.JobTracker`` receives as a logging handler.
"""

from __future__ import annotations

import logging
from typing import Any

POINT = "train_point"  # the log record's attribute: {"model", "step", "epoch", "loss", "lr"}


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
