"""The engine's messages: Python ``logging`` under one package logger, ``augsbert_ray``.

Every module logs to its own logger (``logging.getLogger(__name__)``). An engine line names
what it is about in brackets (``[silver] 3/10 shards labelled``): INFO lines are for the
person running the job, WARNING lines too (shown as written when they carry such a tag,
else as ``[augsbert] WARNING: ...``), DEBUG lines are kept in the job's log file only.
``api.run`` and ``augsbert run`` show them on the job's display (``progress.DisplayHandler``);
a Python user routes them with the standard configuration, e.g.::

    import logging
    logging.basicConfig(level=logging.INFO, format="%(message)s")

``prefixed`` marks the lines of a piece of work (the autopilot's trial runs: ``[auto] ...``);
the handlers here (``EngineFormatter``) put the mark in front of each line.
"""

from __future__ import annotations

import contextvars
import logging
import re
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["ENGINE", "EngineFormatter", "LineHandler", "engine_text", "handled_by", "lines_to", "prefixed"]

ENGINE = "augsbert_ray"  # the package logger: every module's logger is below it
_TAG = re.compile(r"^\[[^\]\s][^\]]*\] ")
_PREFIX: contextvars.ContextVar[str] = contextvars.ContextVar("augsbert_ray_line_prefix", default="")


@contextmanager
def prefixed(prefix: str) -> Iterator[None]:
    """Lines logged in this context (this thread) start with ``prefix`` (after any outer one)."""
    token = _PREFIX.set(_PREFIX.get() + prefix)
    try:
        yield
    finally:
        _PREFIX.reset(token)


def current_prefix() -> str:
    """The prefix of lines logged here now (``prefixed``), for work handed to another thread."""
    return _PREFIX.get()


def engine_text(record: logging.LogRecord) -> str:
    """The line a person sees for ``record``: its message, ``[augsbert] LEVEL: `` in front of
    a warning that names nothing in brackets, and the prefix of the context it was logged in."""
    text = record.getMessage()
    if record.levelno >= logging.WARNING and not _TAG.match(text):
        text = f"[augsbert] {record.levelname}: {text}"
    prefix = getattr(record, "line_prefix", None)
    return (_PREFIX.get() if prefix is None else prefix) + text


class EngineFormatter(logging.Formatter):
    """Formats a record as the engine's line (``engine_text``)."""

    def format(self, record: logging.LogRecord) -> str:
        return engine_text(record)


class LineHandler(logging.Handler):
    """Passes each record's engine line to ``on_line`` (a display, a worker's report channel, a list).

    Args:
        on_line: receives the formatted line.
        level: the least level passed on (default INFO: DEBUG lines are for log files).
    """

    def __init__(self, on_line: Callable[[str], None], level: int = logging.INFO):
        super().__init__(level)
        self.on_line = on_line
        self.setFormatter(EngineFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.on_line(self.format(record))
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


@contextmanager
def handled_by(handler: logging.Handler, level: int = logging.INFO) -> Iterator[logging.Handler]:
    """Adds ``handler`` to the package logger while the context lasts, the logger's level
    lowered to ``level`` meanwhile where it was higher or unset (Python's default passes only
    warnings)."""
    engine = logging.getLogger(ENGINE)
    was = engine.level
    engine.addHandler(handler)
    if was == logging.NOTSET or was > level:
        engine.setLevel(level)
    try:
        yield handler
    finally:
        engine.removeHandler(handler)
        engine.setLevel(was)


def lines_to(on_line: Callable[[str], None], level: int = logging.INFO):
    """Sends the engine's lines to ``on_line`` while the context lasts (``LineHandler``)::

        with lines_to(lines.append):
            run_job(cfg)
    """
    return handled_by(LineHandler(on_line, level), level)
