"""Ray's own output kept in the run directory, and the few messages that matter translated.

``runtime.start_ray(verbose=False)`` stops most of Ray's noise at its source; what is left
cannot be configured away: the lines Ray forwards from every worker to the driver
(prefixed ``(RayTrainWorker pid=...)``), native warnings from Ray's C++ core (e.g. "Actor
with class name ... has constructor arguments in the object store", printed once per
actor pool), and Ray's error notices ("(raylet) A worker died ..."), which Ray prints
straight to the driver's stdout and stderr. ``RayOutput`` sends the process's stdout and
stderr (file descriptors 1 and 2, so native writes too) to ``<run_dir>/logs/ray.log``
and keeps a handle on the terminal for the progress display. A thread follows the file
and logs (to this module's logger, under the engine's: see ``messages``):

- engine lines printed in workers (``[silver] labelling actor on cpu: bf16, 2 threads``),
  with Ray's prefix removed;
- one engine line for each event a user should know about (``translate``): a worker
  process that died, a task Ray retries, workers killed for lack of memory, objects
  spilled to disk, an actor pool actor that died while starting.

Everything stays in ``ray.log`` as it was written; Ray's session logs (every process's
own files) are where ``ClusterResources.logs`` says. Writing to a file never blocks, and
what a crashing process wrote last is in the file.

Example::

    with RayOutput(run_dir / "logs" / "ray.log") as out:
        with JobProgress(stages, stream=out.terminal) as progress:
            with messages.handled_by(progress.logging_handler()):
                ...
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable

__all__ = ["RayOutput", "translate", "engine_line", "describe_error"]

log = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's prefix of a forwarded worker line: "(MapWorker(MapBatches(PairScorer)) pid=12, ip=10.0.0.2) "
# or "(raylet) ", "(autoscaler +1m2s) "; and its deduplication note at the end.
_PREFIX = re.compile(r"^\((?:(?P<who>.*?) )?pid=(?P<pid>\w+)(?:, ip=[^)\s]+)?\) |^\((?P<sys>raylet|autoscaler[^)]*)\) ")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_ENGINE = re.compile(r"^\[[a-z][a-z0-9_+\-]*\] ")

# (pattern, engine line) for the events a user should hear about; {0}, {1}: the groups.
NOTICES: list[tuple[re.Pattern, Callable[[re.Match], str]]] = [
    (re.compile(r"A worker died or was killed while executing a task.*?Worker PID: (\d+).*?Worker exit type: (\w+)"
                r"(?:.*?Worker exit detail: (.*?)(?:\. |$))?"),
     lambda m: f"[ray] a worker process died (pid {m[1]}, {m[2]}"
               + (f": {m[3][:120]}" if m[3] else "") + "); Ray retries its work where it can"),
    (re.compile(r"Task (\S+) failed\. There are (\d+) retries remaining"),
     lambda m: f"[ray] task {_task_name(m[1])} failed and is retried ({m[2]} retries left)"),
    (re.compile(r"(\d+) worker\(s\) were killed due to the node running low on memory"),
     lambda m: f"[ray] {m[1]} worker(s) were killed because the node ran low on memory; Ray retries their work"),
    (re.compile(r"Spilled (\d+) MiB, (\d+) objects"),  # reported every few seconds while spilling: see REPEAT_S
     lambda m: f"[ray] the object store is full: {m[1]} MiB ({m[2]} objects) spilled to disk so far"),
    (re.compile(r"(\S+): an actor died during initialization and will be replaced"),
     lambda m: f"[ray] {m[1]}: an actor died while starting and is replaced"),
]
REPEAT_S = 60.0  # a kind of notice at most once a minute (a crash loop or spilling repeats every few seconds)


def _task_name(name: str) -> str:
    # "MapWorker(MapBatches(PairScorer)).submit" -> "MapBatches(PairScorer)"
    m = re.fullmatch(r"MapWorker\((.*)\)\.submit", name)
    return m[1] if m else name


def _strip(line: str) -> str:
    return _REPEATED.sub("", _PREFIX.sub("", _ANSI.sub("", line.rstrip("\r\n")), count=1))


def engine_line(line: str) -> str | None:
    """The engine line in a line of Ray's output (Ray's prefix removed), or None."""
    text = _strip(line)
    return text if _ENGINE.match(text) else None


# A line of a Python traceback that names an exception: "RuntimeError: ...", "torch.OutOfMemoryError: ...".
_RAISED = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)(?::|$)")
_WRAPPERS = ("ray.exceptions.", "RayTaskError", "RayActorError", "UserCodeException")


def describe_error(error: BaseException) -> str:
    """An error as one plain line that names its cause.

    Ray wraps what failed in a worker (``RayTaskError(UserCodeException)``) in a message
    that begins with the worker's name in terminal colours and holds the worker's traceback;
    the exception that started it ("RuntimeError: The size of tensor a (2056) must match
    ...") is deep inside. This returns that exception's line, colour codes removed, or the
    error's own first line where no traceback is inside.
    """
    text = _ANSI.sub("", str(error)).strip()
    lines = [line.strip() for line in text.splitlines()]
    # In a chained traceback the first exception printed is the one that started it.
    causes = [line for line in lines if _RAISED.match(line) and not line.startswith(_WRAPPERS)]
    if causes:
        return causes[0]
    first = lines[0] if lines else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def translate(line: str) -> tuple[str, str] | None:
    """``(kind, engine line)`` for a line of Ray's output that reports an event a user should
    know about (see ``NOTICES``), else None."""
    text = _strip(line)
    for i, (pattern, say) in enumerate(NOTICES):
        m = pattern.search(text)
        if m:
            return str(i), say(m)
    return None


class RayOutput:
    """Sends this process's stdout and stderr to ``path`` and follows it (see the module docstring).

    Args:
        path: the log file (appended to).
        poll_s: how often the file is read for new lines.

    Attributes:
        terminal: a text stream on the original stderr (the terminal), for the display.
    """

    def __init__(self, path: str | os.PathLike, poll_s: float = 0.25):
        self.path = Path(path)
        self.poll_s = poll_s
        self.terminal = None
        self._on_line: Callable[[str], None] | None = None
        self._saved: dict[int, int] = {}
        self._streams: tuple = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}  # notices of a kind held back since the last one shown

    def follow(self, on_line: Callable[[str], None]) -> None:
        """Engine lines and translated notices found in the file go to ``on_line`` (by default
        they are logged)."""
        self._on_line = on_line

    def __enter__(self) -> "RayOutput":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self.terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None)
                                  or "utf-8", errors="replace")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        start = os.fstat(fd).st_size
        for target in (1, 2):
            self._saved[target] = os.dup(target)
            os.dup2(fd, target)
        os.close(fd)
        # Python-level writers too, whatever sys.stdout was (a test runner's or a notebook's
        # stream would bypass file descriptors 1 and 2).
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = (open(target, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
                                  for target in (1, 2))
        self._thread = threading.Thread(target=self._follow, args=(start,), name="augsbert-ray-output", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if self._streams:
            captured = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = self._streams
            self._streams = ()
            for stream in captured:
                stream.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for target, saved in self._saved.items():
            os.dup2(saved, target)
            os.close(saved)
        self._saved.clear()
        if self.terminal is not None:
            self.terminal.close()

    def _follow(self, start: int) -> None:
        with open(self.path, "r", encoding="utf-8", errors="replace") as f:
            f.seek(start)
            partial = ""
            while True:
                stopping = self._stop.is_set()  # read once more after the stop, then end
                chunk = f.read()
                if chunk:
                    lines = (partial + chunk).split("\n")
                    partial = lines.pop()
                    for line in lines:
                        self._handle(line)
                if stopping:
                    if partial:
                        self._handle(partial)
                    return
                self._stop.wait(self.poll_s)

    def _handle(self, line: str) -> None:
        try:
            # Only workers' engine lines: this process logs its own where they are made, and
            # a logging handler that writes to stderr would otherwise see its lines come back.
            shown = engine_line(line) if _PREFIX.match(_ANSI.sub("", line)) else None
            if shown is None:
                notice = translate(line)
                if notice is None:
                    return
                kind, shown = notice
                now = time.monotonic()
                if now - self._last.get(kind, -REPEAT_S) < REPEAT_S:
                    self._held[kind] = self._held.get(kind, 0) + 1
                    return
                self._last[kind] = now
                held = self._held.pop(kind, 0)
                if held:
                    shown += f" ({held} more like it in the last {REPEAT_S:.0f} s: see {self.path.name})"
            if self._on_line is not None:
                self._on_line(shown)
            else:
                log.info("%s", shown)
        except Exception:  # noqa: BLE001 - following the log must never stop the job
            pass
