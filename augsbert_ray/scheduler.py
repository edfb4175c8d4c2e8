"""Runs callables as a graph: each once its predecessors are done and it fits in the cluster.

``run`` walks the graph with ``graphlib.TopologicalSorter`` and runs each node's callable in a
thread of its own (a ``concurrent.futures.Future``), starting ready nodes in the graph's order
within the CPUs and GPUs the cluster has free (``graph.admit``). It emits an ``Event`` as a
node starts and as it ends, in the scheduling thread; the runner subscribes to them (the
report so far after each stage), and the stages' own events (``runner``) feed the display.
Nothing here knows about stages: the tests drive it with plain callables.
"""

from __future__ import annotations

import concurrent.futures as cf
import graphlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from augsbert_ray import graph
from augsbert_ray.graph import Demand


@dataclass(frozen=True)
class Event:
    """A node (a stage) started or ended.

    Attributes:
        kind: ``"start"`` or ``"end"``.
        name: the node's name.
        seconds: (end) how long it ran.
        result: (end) what its callable returned.
        error: (end) what its callable raised, if it did.
        reused: (end) an earlier run had done the work; nothing ran.
        one_off_s: (end) of ``seconds``, what the job paid once (a warm host's start).
    """

    kind: str
    name: str
    seconds: float = 0.0
    result: Any = None
    error: BaseException | None = None
    reused: bool = False
    one_off_s: float = 0.0


def run(deps: Mapping[str, Sequence[str]], work: Callable[[str], Any], *,
        demand: Callable[[str], Demand] = lambda name: Demand(),
        capacity: Callable[[], Demand | None] = lambda: None,
        before_start: Callable[[str], None] | None = None,
        on_event: Callable[[Event], None] | None = None,
        poll_s: float = 0.5) -> dict[str, Any]:
    """Runs ``work(name)`` for every node of ``deps`` once the nodes it follows are done.

    Args:
        deps: node -> the nodes it follows (``graph.dependencies``); its order is the order in
            which ready nodes start.
        work: a node's callable, run in a thread of its own.
        demand: what a ready node would occupy (asked whenever it could start).
        capacity: the cluster's resources, None while unknown (``graph.admit``).
        before_start: called in this thread just before a node starts (e.g. to start Ray here,
            where signal handlers can be set).
        on_event: called in this thread with each node's start and end.
        poll_s: how often this thread wakes while waiting, so that Ctrl-C reaches it.

    Returns:
        node -> what its callable returned.

    Raises:
        the first error a callable raised, once the nodes running beside it have ended; no
        node starts after it.
    """
    order = {name: i for i, name in enumerate(deps)}
    sorter = graphlib.TopologicalSorter({name: tuple(before) for name, before in deps.items()})
    sorter.prepare()
    emit = on_event or (lambda event: None)
    waiting: list[str] = []
    running: dict[cf.Future, str] = {}
    held: dict[str, Demand] = {}
    started: dict[str, float] = {}
    results: dict[str, Any] = {}
    error: BaseException | None = None
    while True:
        if error is None:
            waiting = sorted(set(waiting) | set(sorter.get_ready()), key=order.__getitem__)
            need = {name: demand(name) for name in waiting}
            for name in graph.admit(waiting, list(held.values()), need, capacity()):
                if before_start is not None:
                    before_start(name)
                waiting.remove(name)
                held[name] = need[name]
                started[name] = time.perf_counter()
                emit(Event("start", name))
                running[_spawn(work, name)] = name
        if not running:
            break
        finished, _ = cf.wait(running, timeout=poll_s, return_when=cf.FIRST_COMPLETED)
        for future in sorted(finished, key=lambda f: order[running[f]]):
            name = running.pop(future)
            del held[name]
            seconds = time.perf_counter() - started[name]
            exc = future.exception()
            if exc is not None:
                error = error or exc
                emit(Event("end", name, seconds, error=exc))
                continue
            results[name] = future.result()
            sorter.done(name)
            emit(Event("end", name, seconds, result=results[name]))
    if error is not None:
        raise error
    return results


def _spawn(fn: Callable[[str], Any], name: str) -> cf.Future:
    # A daemon thread, not a ThreadPoolExecutor's: the executor's threads are joined at exit, so a
    # stopped job's process would wait for a stage still unwinding instead of ending.
    future: cf.Future = cf.Future()
    future.set_running_or_notify_cancel()

    def body() -> None:
        try:
            future.set_result(fn(name))
        except BaseException as e:  # noqa: BLE001 - handed to the scheduling thread, which raises it
            future.set_exception(e)

    threading.Thread(target=body, name=f"stage-{name}", daemon=True).start()
    return future
