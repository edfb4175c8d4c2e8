"""The job's progress display (``JobProgress``) and what reports to it (``StageProgress``).

On a terminal it draws bars (``render``); anywhere else (CI, a log file, ``ray job submit``) it
writes plain timestamped lines instead: a line when a stage starts and ends, and a progress
line at most every ``every_s`` seconds per stage::

    12:03:04 [3/8] gold_only  40/120 steps (3.1 steps/s, ETA 0:00:26; job ETA 0:09:40)

Engine lines print above the bars without breaking them: the display is the engine's logging
handler (``DisplayHandler``, see ``messages``). With ``log_path``, the same plain lines and
every engine line are also kept in a dated job log (``joblog``). The ETAs are ``eta``'s.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, TextIO

from augsbert_ray.progress.messages import EngineFormatter
from augsbert_ray.progress.eta import (DONE, FAILED, PENDING, REUSED, RUNNING, SKIPPED, JobModel, StageState,
                                       basis_text, eta_text, format_count, format_duration, format_rate)
from augsbert_ray.progress.joblog import JobLog

__all__ = ["DisplayHandler", "JobProgress", "StageProgress", "log_event"]
_log = logging.getLogger("augsbert_ray.runner")  # the lines keep the logger they always had

REUSED_NOTE = "skipped: complete in an earlier run"


class StageProgress:
    """What code doing one stage's work reports to: ``advance``, ``set_total``, ``update``, ``message``.

    Bound to a stage of a ``JobProgress`` (``JobProgress.stage(name)``) or of a
    ``channel.ProgressHandle`` (``handle.stage(name)``, picklable, for Ray workers).
    Modules take an optional ``progress: StageProgress | None`` and skip reporting when None.
    """

    def __init__(self, target, stage: str):
        self.target, self.name = target, stage

    def advance(self, n: float = 1) -> None:
        """``n`` more units of the stage's work are done."""
        self.target.advance(self.name, n)

    def set_total(self, total: float, unit: str | None = None) -> None:
        """The stage's work in all (and its unit, if it changes)."""
        self.target.set_total(self.name, total, unit=unit)

    def add_total(self, n: float, unit: str | None = None) -> None:
        """Adds ``n`` units to the stage's work (a stage made of parts, e.g. BM25 + SS)."""
        self.target.add_total(self.name, n, unit=unit)

    def update(self, done: float) -> None:
        """The stage's position, absolute (e.g. a training step after resuming from a checkpoint)."""
        self.target.update(self.name, done)

    def message(self, line: str) -> None:
        """An engine line, shown above the bars and kept in the job log."""
        self.target.message(line)

    def point(self, point: dict) -> None:
        """A training's loss and learning rate at a logged step (``tracking.points``): through a
        progress channel to the driver, or handed over here for a display in this process."""
        send = getattr(self.target, "point", None)
        if send is not None:
            send(self.name, point)
            return
        from augsbert_ray.tracking.points import deliver

        deliver({**point, "stage": self.name})

    def flush(self) -> None:
        flush = getattr(self.target, "flush", None)
        if flush is not None:
            flush()


class JobProgress:
    """The progress display of one job (see the module docstring).

    Args:
        stages: the job's stages in order; a stage started later that is not listed is
            appended (and the count grows).
        stream: where the display goes (default ``sys.stderr``).
        interactive: bars (True) or plain lines (False); None: bars when ``stream`` is a terminal.
        log_path: a file that receives every message and the plain progress lines, dated.
        every_s: at most one plain progress line per stage this often (seconds).
        clock: the time source (seconds since the epoch), replaceable in tests.
        refresh_per_second: how often the bars are redrawn.
        redirect_std: with bars, also print what Python code writes to ``sys.stdout`` and
            ``sys.stderr`` above them (for a run that shows Ray's own messages; leave it off
            when those streams are being sent elsewhere, as ``ray_logs.RayOutput`` does).
    """

    def __init__(self, stages: list[str], *, stream: TextIO | None = None, interactive: bool | None = None,
                 log_path: str | Path | None = None, every_s: float = 15.0, clock: Callable[[], float] = time.time,
                 refresh_per_second: float = 2.0, redirect_std: bool = False):
        self.stream = stream if stream is not None else sys.stderr
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        self.every_s, self.clock = every_s, clock
        self.model = JobModel(stages)  # the stages' state and the ETA model
        self._stages = self.model.stages
        self._lock = threading.RLock()
        self._out_lock = threading.Lock()  # the queue of lines for above the bars (see _line)
        self._out: list[str] = []
        self._started = clock()
        self._closed = False
        self._log = JobLog(log_path, clock) if log_path is not None else None
        self._live = None
        if self.interactive:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream, force_terminal=True, highlight=False, soft_wrap=False)
            self._live = Live(console=console, get_renderable=self._render, refresh_per_second=refresh_per_second,
                              transient=False, redirect_stdout=redirect_std, redirect_stderr=redirect_std)
            self._live.start()
        self._write_log(f"job of {len(self._stages)} stages: {', '.join(self._stages)}")

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> "JobProgress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            with self._lock:
                for s in self._stages.values():
                    if s.state == RUNNING:
                        s.state, s.ended, s.note = FAILED, self.clock(), f"failed: {type(exc).__name__}"
                        self._write_log(f"{self._label(s)} failed after {format_duration(s.ended - s.started)}: "
                                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                if isinstance(exc, Exception):  # the whole traceback, which the terminal is spared
                    for line in "".join(traceback.format_exception(exc)).rstrip("\n").splitlines():
                        self._write_log(line)
        self.close()

    def close(self) -> None:
        """Draws the final state and stops redrawing; closes the job log. Stages that never
        started are shown as not run."""
        with self._lock:
            if self._closed:
                return
            for s in self._stages.values():
                if s.state == PENDING:
                    s.state, s.note = SKIPPED, "not run"
            self._write_log(f"job ended after {format_duration(self.clock() - self._started)}")
        self._emit()
        with self._lock:
            self._closed = True
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
        if self._log is not None:
            self._log.close()

    # -- what callers report -----------------------------------------------------------------
    def plan(self, name: str, total: float | None = None, unit: str | None = None,
             estimate_s: float | None = None, rate_key: str | None = None) -> None:
        """Declares a stage's work before it starts, for the job's ETA.

        Args:
            total: units of work (steps, pairs, sentences), priced at the measured cost per unit.
            unit: what is counted (shown on the bar).
            estimate_s: the stage's time when known outright (used when ``total`` is not priced).
            rate_key: stages with the same key share their measured cost per unit (default: the unit).
        """
        with self._lock:
            self.model.plan(name, total, unit, estimate_s, rate_key)

    def start_stage(self, name: str, total: float | None = None, unit: str | None = None,
                    estimate_s: float | None = None, rate_key: str | None = None) -> None:
        """Marks a stage as running (``total=None``: its size comes later, by ``set_total``)."""
        with self._lock:
            self.plan(name, total, unit, estimate_s, rate_key)
            s = self._get(name)
            s.state, s.started, s.done, s.first_at, s.last_line = RUNNING, self.clock(), 0.0, None, None
            eta, basis = self.job_eta()
            text = eta_text(eta, basis)
            self._line(f"{self._label(s)} started" + (f"; {text} ({basis_text(basis)})" if text else ""))
        self._emit()

    def advance(self, name: str, n: float = 1) -> None:
        """``n`` more units of ``name``'s work are done."""
        with self._lock:
            s = self._get(name)
            self._move(s, s.done + n)

    def update(self, name: str, done: float) -> None:
        """Sets how many units of ``name``'s work are done (going back restarts the rate)."""
        with self._lock:
            s = self._get(name)
            if done < s.done:
                s.first_at = None
            self._move(s, float(done))

    def set_total(self, name: str, total: float, unit: str | None = None) -> None:
        with self._lock:
            self.model.set_total(name, total, unit)

    def add_total(self, name: str, n: float, unit: str | None = None) -> None:
        with self._lock:
            s = self._get(name)
            self.set_total(name, (s.total or 0.0) + n, unit)

    def finish_stage(self, name: str, seconds: float | None = None, reused: bool = False, note: str = "",
                     one_off_s: float = 0.0) -> None:
        """Marks a stage as finished: done now (its bar full), or ``reused`` from an earlier run.

        Args:
            seconds: the stage's time as measured by the caller (default: since ``start_stage``).
            reused: the stage was skipped because an earlier run completed it.
            note: shown beside the stage (default for a reused stage: "skipped: complete in an
                earlier run").
            one_off_s: of ``seconds``, what the job paid once (starting a warm host), which the
                next stage of the kind does not pay again (``eta.JobModel.measure``).
        """
        with self._lock:
            s = self._get(name)
            now = self.clock()
            s.ended = now
            if reused:
                s.state, s.note = REUSED, note or REUSED_NOTE
                s.seconds = seconds
                self._line(f"{self._label(s)} {s.note}")
            else:
                s.state, s.note = DONE, note
                s.seconds = seconds if seconds is not None else (now - s.started if s.started is not None else 0.0)
                s.one_off_s = one_off_s
                if s.total:
                    self.model.measure(s)
                    s.done = s.total
                self._line(f"{self._label(s)} done in {format_duration(s.seconds)}" + (f" ({note})" if note else ""))
        self._emit()

    def on_event(self, event) -> None:
        """A stage's start or end (``scheduler.Event``, as the runner emits them) shown."""
        if event.kind == "start":
            self.start_stage(event.name)
        elif event.error is None:
            self.finish_stage(event.name, event.seconds, reused=event.reused, one_off_s=event.one_off_s)

    def set_graph(self, deps: dict[str, tuple[str, ...]]) -> None:
        """Which stages follow which (``graph.dependencies``): independent stages run at once, so
        the job's ETA is the longest chain of what is left, not the sum. Without it, stages
        follow each other in their listed order."""
        with self._lock:
            self.model.set_graph(deps)

    def message(self, line: str) -> None:
        """An engine line: printed above the bars (or as a plain line) and kept in the job log."""
        with self._lock:
            self._line(line)
        self._emit()

    def stage(self, name: str) -> StageProgress:
        """A reporter bound to stage ``name``, for code in this process."""
        return StageProgress(self, name)

    def log_only(self, line: str) -> None:
        """A line for the job log alone (not shown)."""
        with self._lock:
            self._write_log(line)

    def logging_handler(self, level: int = logging.DEBUG,
                        retag: dict[str, tuple[str, str]] | None = None) -> logging.Handler:
        """This display as a ``logging.Handler`` (``DisplayHandler``): INFO and above shown, DEBUG in the job log."""
        return DisplayHandler(self, level, retag)

    # -- estimates ---------------------------------------------------------------------------
    def job_eta(self) -> tuple[float | None, dict]:
        """Seconds left in the job and the basis of the figure (``eta.JobModel.job_eta``)."""
        with self._lock:
            return self.model.job_eta(self.clock())

    # -- internals ---------------------------------------------------------------------------
    def _get(self, name: str) -> StageState:
        return self.model.get(name)

    def _label(self, s: StageState) -> str:
        return self.model.label(s)

    def _move(self, s: StageState, done: float) -> None:
        now = self.clock()
        if s.state == PENDING:  # reported before start_stage: it is running
            s.state, s.started = RUNNING, now
        if s.first_at is None:
            s.first_at, s.done_at_first = now, done
        s.last_at = now
        s.done = done
        if s.last_line is None or now - s.last_line >= self.every_s:
            s.last_line = now
            if s.first_at != now:  # the first report only starts the clock
                self._progress_line(s, now)

    def _progress_line(self, s: StageState, now: float) -> None:
        amount = f"{format_count(s.done)}/{format_count(s.total)}" if s.total is not None else format_count(s.done)
        details = [x for x in (format_rate(s.rate(now), s.unit),
                               f"ETA {format_duration(s.eta(now))}" if s.eta(now) is not None else "") if x]
        eta, basis = self.job_eta()
        if eta_text(eta, basis):
            details.append(eta_text(eta, basis))
        line = f"{self._label(s)}  {amount} {s.unit}" + (f" ({', '.join(details)})" if details else "")
        self._write_log(line)
        if not self.interactive:
            self._write_plain(line)

    def _line(self, line: str) -> None:
        """A line for the terminal (above the bars, or plain) and the job log.

        Above the bars it is only queued here: the caller holds ``self._lock``, and printing
        through rich's ``Live`` takes rich's own lock, which Live's refresh thread holds while
        it calls ``_render``, which takes ``self._lock``: printing here could deadlock. The
        public methods print the queue (``_emit``) once they have released ``self._lock``.
        """
        self._write_log(line)
        if self._live is not None and not self._closed:
            with self._out_lock:
                self._out.append(line)
        else:
            self._write_plain(line)

    def _emit(self) -> None:
        """Prints the queued lines above the bars; never called with ``self._lock`` held."""
        from rich.text import Text

        while True:
            with self._out_lock:
                if not self._out:
                    return
                lines, self._out = self._out, []
            for line in lines:
                if self._live is not None:
                    self._live.console.print(Text(line))
                else:
                    self._write_plain(line)

    def _write_plain(self, line: str) -> None:
        try:
            self.stream.write(f"{time.strftime('%H:%M:%S', time.localtime(self.clock()))} {line}\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal must not stop the job
            pass

    def _write_log(self, line: str) -> None:
        if self._log is not None:
            self._log.write(line)

    def _render(self):
        from augsbert_ray.progress.render import render

        self._fit_width()
        width = self._live.console.width if self._live is not None else 120  # rich draws once while it starts
        with self._lock:
            return render(self.model, self.clock(), self._started, width)

    def _fit_width(self) -> None:
        """Follows the terminal's width (rich would ask the process's own stdout, which may be a file)."""
        try:
            self._live.console.width = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            pass


def log_event(event) -> None:
    """A stage's start or end (``scheduler.Event``) as a log line, where a job has no display."""
    if event.kind == "start":
        _log.info(f"[{event.name}] started")
    elif event.error is not None:
        return
    elif event.reused:
        _log.info(f"[{event.name}] complete in an earlier run; skipped")
    else:
        _log.info(f"[{event.name}] done in {event.seconds:.1f}s")


class DisplayHandler(logging.Handler):
    """The job's display as a ``logging.Handler`` (see ``messages``): INFO and above are shown as
    engine lines (above the bars, or as plain lines) and kept in the job log; DEBUG is kept in
    the job log only, as ``[logger name] message``.

    Args:
        progress: the ``JobProgress`` that shows the lines.
        level: the least level handled.
        retag: a logger (and those below it) -> (a tag, the tag its lines are shown with):
            ``augsbert label`` runs the silver stage's labelling,
            ``{"augsbert_ray.labeling": ("[silver]", "[label]")}``.
    """

    def __init__(self, progress: JobProgress, level: int = logging.DEBUG,
                 retag: dict[str, tuple[str, str]] | None = None):
        super().__init__(level)
        self.progress, self.retag = progress, dict(retag or {})
        self.setFormatter(EngineFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno >= logging.INFO:
                line = self.format(record)
                for name, (tag, shown) in self.retag.items():
                    if record.name == name or record.name.startswith(name + "."):
                        line = line.replace(tag, shown, 1)
                self.progress.message(line)
            else:
                self.progress.log_only(f"[{record.name}] {record.getMessage()}")
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)
