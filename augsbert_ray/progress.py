"""One progress display for a job: which stage of how many, a bar per stage, and ETAs.

On a terminal it draws with rich: one row per stage (``[3/8] gold_only``), a bar with the
stage's unit (training steps, pairs labelled, sentences searched), its rate, elapsed time
and ETA, and a last row for the whole job. Engine messages print above the rows without
breaking them. Anywhere else (CI, a log file, ``ray job submit``) it writes plain
timestamped lines instead: a line when a stage starts and ends, and a progress line at
most every ``every_s`` seconds per stage::

    12:03:04 [3/8] gold_only  40/120 steps (3.1 steps/s, ETA 0:00:26; job ETA 0:09:40)

With ``log_path``, those same plain lines (dated) are also written to a file, whatever
the terminal shows, so a run directory keeps a readable record of the job.

The job's ETA. Each stage may declare its work before it starts (``plan``): a count of
units (``total`` training steps, pairs to label, sentences to search) or a time
(``estimate_s``). A planned count becomes seconds with what that kind of work cost when
it was last done in this job: a finished stage of the same ``rate_key`` (e.g.
``bi_encoder step``), else of the same unit, gives its seconds per unit inside its loop
(from its first report to its last) plus the rest of its time (start-up, model loading,
evaluation), which the next stage of its kind pays again; without one, the running rate of
a stage now doing that kind of work prices the units alone. The running stage counts its
own remaining units at its own rate. The job ETA is the sum over every stage not finished;
while any stage has no estimate it is shown as a lower bound (``ETA >= 0:09:40``) and the
stages left out are named. ``job_eta()`` returns the figure and its basis (which rate
priced which stage, measured where), which the plain lines print when a stage starts.

Workers in other processes report through ``progress_channel`` (a Ray actor); in the
driver, code reports to a stage directly, e.g. ``progress.stage("silver").advance(512)``.

Example::

    with JobProgress(["cross_encoder", "gold_only", "silver"], log_path=run / "logs/job.log") as p:
        p.plan("gold_only", total=120, unit="steps", rate_key="bi-encoder step")
        p.start_stage("cross_encoder", total=120, unit="steps")
        for _ in range(120):
            p.advance("cross_encoder")
        p.finish_stage("cross_encoder")
        p.finish_stage("gold_only", 0.0, reused=True)   # skipped: complete in an earlier run
        p.message("[silver] 3 of 10 shards labelled by an earlier run")
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from augsbert_ray.messages import EngineFormatter

__all__ = ["DisplayHandler", "JobProgress", "StageProgress", "format_duration"]

PENDING, RUNNING, DONE, REUSED, FAILED, SKIPPED = "pending", "running", "done", "reused", "failed", "skipped"
REUSED_NOTE = "skipped: complete in an earlier run"
BAR_WIDTH = 28


def format_duration(seconds: float | None) -> str:
    """``H:MM:SS`` (as rich and tqdm show durations); ``-:--:--`` when unknown."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "-:--:--"
    s = int(round(max(0.0, seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _singular(unit: str) -> str:
    return unit[:-1] if unit.endswith("s") and len(unit) > 1 else unit


def _format_rate(rate: float | None, unit: str) -> str:
    """``3.1 steps/s``, or ``12.3 s/step`` when slower than one unit a second (tqdm's habit)."""
    if not rate:
        return ""
    if rate >= 1:
        return f"{rate:,.1f} {unit}/s"
    return f"{1 / rate:,.1f} s/{_singular(unit)}"


def _format_count(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


@dataclass
class _Stage:
    name: str
    unit: str = "steps"
    total: float | None = None
    done: float = 0.0
    estimate_s: float | None = None  # declared time of the whole stage, when known
    rate_key: str | None = None  # stages sharing a key share their measured cost per unit
    state: str = PENDING
    started: float | None = None
    ended: float | None = None
    seconds: float | None = None  # as the caller measured it (a reused stage: its earlier run)
    note: str = ""
    # the running rate: work done since the first report, over the time since then
    first_at: float | None = None
    last_at: float | None = None  # when the last report came
    done_at_first: float = 0.0
    last_line: float | None = None  # when the last plain progress line was written

    @property
    def key(self) -> str:
        return self.rate_key or self.unit

    def rate(self, now: float) -> float | None:
        if self.first_at is None or now <= self.first_at or self.done <= self.done_at_first:
            return None
        return (self.done - self.done_at_first) / (now - self.first_at)

    def eta(self, now: float) -> float | None:
        r = self.rate(now)
        if self.total is None or not r:
            return None
        return max(0.0, self.total - self.done) / r


class StageProgress:
    """What code doing one stage's work reports to: ``advance``, ``set_total``, ``update``, ``message``.

    Bound to a stage of a ``JobProgress`` (``JobProgress.stage(name)``) or of a
    ``progress_channel.ProgressHandle`` (``handle.stage(name)``, picklable, for Ray workers).
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
        self._stages: dict[str, _Stage] = {name: _Stage(name) for name in stages}
        # rate key / unit -> (seconds per unit in the stage's loop, seconds of start-up and wrap-up, measured on)
        self._cost: dict[str, tuple[float, float, str]] = {}
        self._deps: dict[str, tuple[str, ...]] = {}  # stage -> the stages it follows (set_graph)
        self._lock = threading.RLock()
        self._out_lock = threading.Lock()  # the queue of lines for above the bars (see _line)
        self._out: list[str] = []
        self._started = clock()
        self._closed = False
        self._log = None
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "a", encoding="utf-8", buffering=1)
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
            s = self._get(name)
            if total is not None:
                s.total = float(total)
            if unit is not None:
                s.unit = unit
            if estimate_s is not None:
                s.estimate_s = float(estimate_s)
            if rate_key is not None:
                s.rate_key = rate_key

    def start_stage(self, name: str, total: float | None = None, unit: str | None = None,
                    estimate_s: float | None = None, rate_key: str | None = None) -> None:
        """Marks a stage as running (``total=None``: its size comes later, by ``set_total``)."""
        with self._lock:
            self.plan(name, total, unit, estimate_s, rate_key)
            s = self._get(name)
            s.state, s.started, s.done, s.first_at, s.last_line = RUNNING, self.clock(), 0.0, None, None
            eta, basis = self.job_eta()
            text = self._eta_text(eta, basis)
            self._line(f"{self._label(s)} started" + (f"; {text} ({self._basis_text(basis)})" if text else ""))
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
            s = self._get(name)
            s.total = float(total)
            if unit is not None:
                s.unit = unit

    def add_total(self, name: str, n: float, unit: str | None = None) -> None:
        with self._lock:
            s = self._get(name)
            self.set_total(name, (s.total or 0.0) + n, unit)

    def finish_stage(self, name: str, seconds: float | None = None, reused: bool = False, note: str = "") -> None:
        """Marks a stage as finished: done now (its bar full), or ``reused`` from an earlier run.

        Args:
            seconds: the stage's time as measured by the caller (default: since ``start_stage``).
            reused: the stage was skipped because an earlier run completed it.
            note: shown beside the stage (default for a reused stage: "skipped: complete in an
                earlier run").
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
                if s.total:
                    self._measure(s)
                    s.done = s.total
                self._line(f"{self._label(s)} done in {format_duration(s.seconds)}" + (f" ({note})" if note else ""))
        self._emit()

    def set_graph(self, deps: dict[str, tuple[str, ...]]) -> None:
        """Which stages follow which (``graph.dependencies``): independent stages run at once, so
        the job's ETA is the longest chain of what is left, not the sum. Without it, stages
        follow each other in their listed order."""
        with self._lock:
            self._deps = {name: tuple(before) for name, before in deps.items()}

    def _measure(self, s: _Stage) -> None:
        """Records what a finished stage's work cost, to price planned stages of its kind: the
        seconds per unit inside its loop (from the first report to the last) and the rest of
        its time (start-up, model loading, evaluation), which the next stage pays again."""
        rate = s.rate(s.last_at) if s.last_at is not None else None
        if rate:
            per = 1.0 / rate
            overhead = max(0.0, s.seconds - s.total * per)
        elif s.seconds > 0:  # a single report: the whole stage, per unit
            per, overhead = s.seconds / s.total, 0.0
        else:
            return
        self._cost[s.key] = (per, overhead, s.name)
        self._cost.setdefault(s.unit, self._cost[s.key])

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
        """Seconds left in the job and the basis of the figure.

        Returns:
            ``(seconds, basis)``: seconds is the longest chain, through the job's graph
            (``set_graph``), of the estimates of the stages not finished (None when no stage
            has one); basis holds ``"rates"`` (stage -> the rate
            that priced it and where it was measured) and ``"unestimated"`` (stages without
            an estimate, so the figure is then a lower bound).
        """
        with self._lock:
            now = self.clock()
            known, rates, unestimated, left_s = False, {}, [], {}
            for s in self._stages.values():
                if s.state in (DONE, REUSED, FAILED, SKIPPED):
                    continue
                eta = s.eta(now) if s.state == RUNNING else None
                left = None if s.total is None else max(0.0, s.total - s.done)
                if eta is not None:
                    rates[s.name] = f"{_format_rate(s.rate(now), s.unit)} now"
                elif left is not None and (s.key in self._cost or s.unit in self._cost):
                    per, overhead, where = self._cost.get(s.key) or self._cost[s.unit]
                    if s.state == RUNNING and s.started is not None:  # part of the start-up is behind it
                        overhead = max(0.0, overhead - (now - s.started))
                    eta = left * per + overhead
                    rates[s.name] = (f"{_format_rate(1 / per, s.unit)}"
                                     + (f" + {format_duration(overhead)} start-up" if overhead >= 1 else "")
                                     + f" in {where}")
                elif left is not None and self._running_rate(s, now) is not None:
                    r = self._running_rate(s, now)
                    eta = left / r.rate(now)
                    rates[s.name] = f"{_format_rate(r.rate(now), s.unit)} in {r.name} so far"
                elif s.estimate_s is not None:
                    elapsed = now - s.started if s.state == RUNNING and s.started is not None else 0.0
                    eta = max(0.0, s.estimate_s - elapsed)
                    rates[s.name] = "as declared"
                if eta is None:
                    unestimated.append(s.name)
                else:
                    left_s[s.name], known = eta, True
            return (self._longest_chain(left_s) if known else None), {"rates": rates, "unestimated": unestimated}

    def _longest_chain(self, left_s: dict[str, float]) -> float:
        from augsbert_ray.graph import critical_path

        names = list(self._stages)
        # a stage outside the graph (or with no graph at all) follows every stage listed before it
        deps = {n: tuple(d for d in self._deps[n] if d in self._stages) if n in self._deps else tuple(names[:i])
                for i, n in enumerate(names)}
        return critical_path(deps, left_s)

    def _running_rate(self, s: _Stage, now: float) -> _Stage | None:
        """Another running stage whose rate prices ``s``: same rate key, else same unit."""
        others = [r for r in self._stages.values() if r.state == RUNNING and r is not s and r.rate(now)]
        return next((r for r in others if r.key == s.key), None) or next((r for r in others if r.unit == s.unit), None)

    @staticmethod
    def _eta_text(eta: float | None, basis: dict) -> str:
        """``job ETA 0:09:40``; ``job ETA >= 0:09:40`` while some stage has no estimate; "" when unknown."""
        if eta is None or (basis["unestimated"] and eta < 1):
            return ""
        return f"job ETA {'>= ' if basis['unestimated'] else ''}{format_duration(eta)}"

    @staticmethod
    def _basis_text(basis: dict) -> str:
        parts = [f"{name} at {how}" for name, how in basis["rates"].items()]
        if basis["unestimated"]:
            parts.append(f"not yet estimated: {', '.join(basis['unestimated'])}")
        return "; ".join(parts)

    # -- internals ---------------------------------------------------------------------------
    def _get(self, name: str) -> _Stage:
        if name not in self._stages:
            self._stages[name] = _Stage(name)
        return self._stages[name]

    def _index(self, s: _Stage) -> int:
        return list(self._stages).index(s.name) + 1

    def _label(self, s: _Stage) -> str:
        return f"[{self._index(s)}/{len(self._stages)}] {s.name}"

    def _move(self, s: _Stage, done: float) -> None:
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

    def _progress_line(self, s: _Stage, now: float) -> None:
        amount = f"{_format_count(s.done)}/{_format_count(s.total)}" if s.total is not None else _format_count(s.done)
        details = [x for x in (_format_rate(s.rate(now), s.unit),
                               f"ETA {format_duration(s.eta(now))}" if s.eta(now) is not None else "") if x]
        eta, basis = self.job_eta()
        if self._eta_text(eta, basis):
            details.append(self._eta_text(eta, basis))
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
        if self._log is not None and not self._log.closed:
            self._log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.clock()))} {line}\n")

    def _render(self):
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        self._fit_width()
        with self._lock:
            now = self.clock()
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True)  # state mark
            grid.add_column(no_wrap=True)  # [i/n] stage
            bar_width = self._bar_width()
            grid.add_column(no_wrap=True, width=bar_width)
            grid.add_column(no_wrap=True, overflow="ellipsis")  # amount, rate, times
            marks = {PENDING: " ", RUNNING: "…", DONE: "✓", REUSED: "↷", FAILED: "✗", SKIPPED: "-"}
            for s in self._stages.values():
                style = {PENDING: "dim", REUSED: "dim", SKIPPED: "dim", FAILED: "red"}.get(s.state, "")
                label = Text(self._label(s), style=style)
                if s.state in (PENDING, REUSED, SKIPPED):
                    grid.add_row(marks[s.state], label, "", Text(s.note or "waiting", style="dim"))
                    continue
                if s.total:
                    bar = ProgressBar(total=s.total, completed=min(s.done, s.total), width=bar_width)
                elif s.state == RUNNING:  # its size is not known yet
                    bar = ProgressBar(total=None, width=bar_width, pulse=True, animation_time=now)
                else:
                    bar = ProgressBar(total=1, completed=1, width=bar_width)
                amount = (f"{_format_count(s.done)}/{_format_count(s.total)} {s.unit}" if s.total is not None
                          else (f"{_format_count(s.done)} {s.unit}" if s.done else ""))
                if s.state == RUNNING:
                    eta = s.eta(now)
                    # the ETA first: on a narrow terminal the end of the line is cut
                    parts = [amount, f"ETA {format_duration(eta)}" if eta is not None else "",
                             _format_rate(s.rate(now), s.unit), f"{format_duration(now - s.started)} elapsed"]
                else:
                    parts = [amount, f"done in {format_duration(s.seconds or 0.0)}" if s.state == DONE else s.note]
                grid.add_row(marks[s.state], label, bar, Text("  ".join(p for p in parts if p), style=style))
            finished = sum(s.state in (DONE, REUSED) for s in self._stages.values())
            eta, basis = self.job_eta()
            parts = [f"{finished}/{len(self._stages)} stages"]
            if self._eta_text(eta, basis):
                parts.append(self._eta_text(eta, basis)[len("job "):]
                             + (f" ({len(basis['unestimated'])} stage(s) not yet estimated)"
                                if basis["unestimated"] else ""))
            elif basis["unestimated"]:
                parts.append(f"ETA not yet known ({len(basis['unestimated'])} stage(s) not yet estimated)")
            parts.append(f"{format_duration(now - self._started)} elapsed")
            grid.add_row("", Text("job", style="bold"), ProgressBar(total=len(self._stages), completed=finished,
                                                                    width=bar_width), "  ".join(parts))
            return grid

    def _bar_width(self) -> int:
        """28 columns, narrower on a narrow terminal (down to 10), so the figures fit."""
        label = max(len(self._label(s)) for s in self._stages.values())
        width = self._live.console.width if self._live is not None else 120
        return max(10, min(BAR_WIDTH, width - label - 60))

    def _fit_width(self) -> None:
        """Follows the terminal's width (rich would ask the process's own stdout, which may be a file)."""
        try:
            self._live.console.width = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            pass


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
