"""A job's stages as a graph: which stage follows which, and which may start now.

The edges come from the stages' declarations: a stage follows the stage that produces each
artifact it declares as an input (``"<stage>/<artifact>"``), and the stages it names in
``Stage.runs_after`` (an order without a data dependency). Inputs no stage of the graph
produces are the caller's to provide (e.g. artifacts an earlier runner found). Everything
here is pure: the scheduler (``scheduler.run``) asks ``admit`` which ready stages to
start whenever one finishes, and the progress display prices the job's remaining time as
the longest path through what is left (``critical_path``).
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Demand:
    """What a running stage occupies of the cluster: CPUs and GPUs (fractions allowed)."""

    cpus: float = 0.0
    gpus: float = 0.0

    def __add__(self, other: "Demand") -> "Demand":
        return Demand(self.cpus + other.cpus, self.gpus + other.gpus)

    def fits(self, free: "Demand") -> bool:
        return self.cpus <= free.cpus + 1e-9 and self.gpus <= free.gpus + 1e-9

    @property
    def light(self) -> bool:
        return self.cpus == 0 and self.gpus == 0


@dataclass(frozen=True)
class Node:
    """One stage as the graph sees it.

    Args:
        name: the stage's name.
        inputs: artifact ids it reads (``"<stage>/<artifact>"``).
        outputs: artifact names it writes.
        after: stages it must follow without reading their outputs.
    """

    name: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    after: tuple[str, ...] = field(default_factory=tuple)


def dependencies(nodes: Sequence[Node]) -> dict[str, tuple[str, ...]]:
    """Each stage's predecessors in the graph (stages outside ``nodes`` are left out).

    Returns:
        stage name -> the names of the stages it follows, in ``nodes``' order.

    Raises:
        ValueError: two stages share a name, or the stages depend on each other in a cycle.
    """
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"stage names repeat: {', '.join(names)}")
    produced = {f"{n.name}/{out}": n.name for n in nodes for out in n.outputs}
    deps = {}
    for n in nodes:
        found = {produced[a] for a in n.inputs if a in produced} | {s for s in n.after if s in names}
        deps[n.name] = tuple(s for s in names if s in found)
    _check_acyclic(deps)
    return deps


def _check_acyclic(deps: Mapping[str, tuple[str, ...]]) -> None:
    # By hand, not graphlib's CycleError: the message names the cycle in the stages' own order.
    state: dict[str, int] = {}  # 1: on the current path, 2: finished

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            raise ValueError(f"stages depend on each other in a cycle: {' -> '.join(cycle)}")
        state[name] = 1
        for d in deps[name]:
            visit(d, path + [name])
        state[name] = 2

    for name in deps:
        visit(name, [])


def upstream(deps: Mapping[str, Iterable[str]], targets: Iterable[str]) -> set[str]:
    """``targets`` and every stage they depend on, directly or not."""
    seen: set[str] = set()
    todo = list(targets)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(deps[name])
    return seen


def ready(deps: Mapping[str, Sequence[str]], done: Iterable[str], started: Iterable[str]) -> list[str]:
    """Stages not started whose predecessors are all done, in the graph's order."""
    done, started = set(done), set(started)
    return [name for name, before in deps.items()
            if name not in started and name not in done and all(d in done for d in before)]


def startable(deps: Mapping[str, Sequence[str]], done: Iterable[str], running: Mapping[str, Demand],
              demand: Mapping[str, Demand], capacity: Demand | None) -> list[str]:
    """The ready stages to start now, in the graph's order, within what the cluster has free.

    Args:
        deps: ``dependencies``' result.
        done: stages finished.
        running: stage -> what it occupies, for stages running now.
        demand: stage -> what it would occupy (stages not named occupy nothing).
        capacity: the cluster's resources; None while unknown (no cluster yet).

    Returns:
        stage names (``admit``).
    """
    return admit(ready(deps, done, running), list(running.values()), demand, capacity)


def admit(ready: Sequence[str], busy: Sequence[Demand], demand: Mapping[str, Demand],
          capacity: Demand | None) -> list[str]:
    """Which of the ``ready`` stages start now, in their order, beside stages occupying ``busy``.

    Args:
        ready: stages whose predecessors are done, in the graph's order.
        busy: what the running stages occupy.
        demand: stage -> what it would occupy (stages not named occupy nothing).
        capacity: the cluster's resources; None while unknown (no cluster yet): then stages
            that occupy anything start one at a time.

    Returns:
        stage names. A stage that needs more than the whole cluster starts when nothing else
        that occupies resources runs (the cluster then queues its work, as it would alone).
    """
    out = []
    busy = list(busy)
    for name in ready:
        need = demand.get(name, Demand())
        heavy = [d for d in busy if not d.light]
        if not need.light:
            if capacity is None:
                if heavy:
                    continue
            else:
                used = sum(heavy, Demand())
                free = Demand(capacity.cpus - used.cpus, capacity.gpus - used.gpus)
                if heavy and not need.fits(free):
                    continue
        out.append(name)
        busy.append(need)
    return out


def critical_path(deps: Mapping[str, Sequence[str]], seconds: Mapping[str, float]) -> float:
    """The job's remaining time when independent stages run at once: the longest chain of
    ``seconds`` (stage -> its remaining time; stages not named take none) through the graph."""
    finish: dict[str, float] = {}
    for name in _topological(deps):
        if name not in deps:  # a predecessor outside the graph: done already
            continue
        start = max((finish.get(d, 0.0) for d in deps[name]), default=0.0)
        finish[name] = start + max(0.0, seconds.get(name, 0.0))
    return max(finish.values(), default=0.0)


def _topological(deps: Mapping[str, Sequence[str]]) -> list[str]:
    try:
        return list(graphlib.TopologicalSorter({name: tuple(before) for name, before in deps.items()}).static_order())
    except graphlib.CycleError as e:
        raise ValueError(f"stages depend on each other in a cycle: {', '.join(e.args[1])}") from None
