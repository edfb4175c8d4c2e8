"""Progress from Ray workers to the driver's display: a small actor, a handle, a drain thread.

Training steps happen in Ray Train workers and Tune trials, labelling and queries in Ray
Data actors: none of them can draw on the driver's terminal. ``progress_channel`` starts
a ``ProgressSink`` (an async actor with no CPU, on the driver's node) and a driver thread
that drains it into a ``JobProgress``; it yields a ``ProgressHandle``, which pickles into
any task, actor or train loop. Workers' messages are logged on the driver (this module's
logger, under the engine's: ``messages``), where the display's logging handler shows them.

Workers call the handle fire-and-forget: counts are added up in the worker and sent at
most every ``flush_s`` seconds (or on ``flush()``, and at once for messages) with a
``.remote()`` call whose result is never awaited, so reporting never blocks training, and
a dead sink costs nothing but the lost counts. Code that takes an optional
``progress: StageProgress | None`` does nothing when it is None::

    with JobProgress(stages) as display, progress_channel(display) as handle:
        train_on_ray(..., progress=handle.stage("gold_only"))

    # in a worker
    progress.set_total(trainer.total, unit="steps")
    progress.advance(1)            # after each step; sent in batches
    progress.message("[gold_only] epoch 1/4 step 12/120 loss 0.0312")
    progress.flush()               # before a long pause or the end
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from augsbert_ray.progress import StageProgress
from augsbert_ray.tracking.points import deliver

__all__ = ["ProgressSink", "ProgressHandle", "ProgressChannel", "Uncounted", "progress_channel", "apply_events"]

log = logging.getLogger(__name__)


class ProgressSink:
    """Ray actor (async): collects workers' progress events until the driver drains them."""

    def __init__(self):
        self._events: list = []
        self._ready = asyncio.Event()

    async def push(self, events: list) -> None:
        self._events.extend(events)
        self._ready.set()

    async def drain(self, wait_s: float = 1.0) -> list:
        """The events pushed since the last drain, waiting up to ``wait_s`` for the first."""
        if not self._events:
            try:
                await asyncio.wait_for(self._ready.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        events, self._events = self._events, []
        self._ready.clear()
        return events


class ProgressHandle:
    """What workers report to (picklable): ``advance``, ``set_total``, ``update``, ``message``.

    The methods take the stage's name first; ``stage(name)`` binds one, for code that
    takes a ``StageProgress``. Events are batched in the calling process and sent at most
    every ``flush_s`` seconds; ``message`` and ``flush`` send at once.
    """

    def __init__(self, sink, flush_s: float = 0.5):
        self._sink, self.flush_s = sink, flush_s
        self._reset()

    def _reset(self) -> None:
        self._events: list = []
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # the batch stays with the process that made it
        return {"sink": self._sink, "flush_s": self.flush_s}

    def __setstate__(self, state: dict) -> None:
        self._sink, self.flush_s = state["sink"], state["flush_s"]
        self._reset()

    def stage(self, name: str) -> StageProgress:
        return StageProgress(self, name)

    def advance(self, stage: str, n: float = 1) -> None:
        with self._lock:
            last = self._events[-1] if self._events else None
            if last is not None and last[0] == "advance" and last[1] == stage:
                self._events[-1] = ("advance", stage, last[2] + n)
            else:
                self._events.append(("advance", stage, n))
        self._flush_if_due()

    def set_total(self, stage: str, total: float, unit: str | None = None) -> None:
        self._add(("total", stage, total, unit))

    def add_total(self, stage: str, n: float, unit: str | None = None) -> None:
        self._add(("add_total", stage, n, unit))

    def update(self, stage: str, done: float) -> None:
        with self._lock:  # only the latest position of a run of updates matters
            if self._events and self._events[-1][:2] == ("update", stage):
                self._events.pop()
            self._events.append(("update", stage, done))
        self._flush_if_due()

    def message(self, line: str) -> None:
        self._add(("message", line))
        self.flush()

    def point(self, stage: str, point: dict) -> None:
        """A training's loss and learning rate at a logged step (``tracking.points``), sent with the
        next batch: the driver logs it for a tracking run."""
        self._add(("point", stage, point))

    def flush(self) -> None:
        """Sends the batched events now (fire-and-forget)."""
        with self._lock:
            events, self._events = self._events, []
            self._last = time.monotonic()
        if events:
            try:
                self._sink.push.remote(events)
            except Exception:  # noqa: BLE001 - progress must never stop the work it reports
                pass

    def _add(self, event: tuple) -> None:
        with self._lock:
            self._events.append(event)
        self._flush_if_due()

    def _flush_if_due(self) -> None:
        if time.monotonic() - self._last >= self.flush_s:
            self.flush()


class Uncounted:
    """Where a channel's counts go when the job has no display: nowhere (messages and training
    points are logged all the same, ``apply_events``)."""

    def advance(self, stage: str, n: float = 1) -> None:
        pass

    def set_total(self, stage: str, total: float, unit: str | None = None) -> None:
        pass

    def add_total(self, stage: str, n: float, unit: str | None = None) -> None:
        pass

    def update(self, stage: str, done: float) -> None:
        pass


def apply_events(progress, events: list) -> None:
    """Replays drained events on a ``JobProgress``; messages are logged (see the module)."""
    for event in events:
        kind = event[0]
        if kind == "advance":
            progress.advance(event[1], event[2])
        elif kind == "total":
            progress.set_total(event[1], event[2], unit=event[3])
        elif kind == "add_total":
            progress.add_total(event[1], event[2], unit=event[3])
        elif kind == "update":
            progress.update(event[1], event[2])
        elif kind == "message":
            log.info("%s", event[1])
        elif kind == "point":
            point = {**event[2], "stage": event[1]}
            deliver(point)
            log.debug("[%s] %s step %s: loss %s, learning rate %s", event[1], point.get("model"), point.get("step"),
                      point.get("loss"), point.get("lr"))


class ProgressChannel:
    """A ``ProgressSink`` and the driver thread that drains it into ``progress``.

    Args:
        progress: a ``JobProgress`` (or anything with its reporting methods).
        poll_s: the longest the drain thread waits for events before looking again.

    Attributes:
        handle: the ``ProgressHandle`` to give to workers.

    ``close()`` drains what has arrived and removes the actor. Requires a connected Ray
    (``runtime.start_ray``). As a context manager it yields the handle.
    """

    def __init__(self, progress, poll_s: float = 0.5):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.progress, self.poll_s = progress, poll_s
        self._sink = ray.remote(ProgressSink).options(
            num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True),
        ).remote()
        self.handle = ProgressHandle(self._sink)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="augsbert-progress", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        import ray

        while True:
            stopping = self._stop.is_set()  # drain once more after the stop, then end
            try:
                apply_events(self.progress, ray.get(self._sink.drain.remote(0.0 if stopping else self.poll_s)))
            except Exception:  # noqa: BLE001 - a lost sink ends the channel, not the job
                return
            if stopping:
                return

    def close(self) -> None:
        import ray

        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self.poll_s + 5)
        try:
            ray.kill(self._sink)
        except Exception:  # noqa: BLE001 - Ray may be gone already
            pass

    def __enter__(self) -> ProgressHandle:
        return self.handle

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


def progress_channel(progress, poll_s: float = 0.5) -> ProgressChannel:
    """Starts a ``ProgressChannel`` into ``progress``: ``with progress_channel(display) as handle: ...``."""
    return ProgressChannel(progress, poll_s)
