"""The scheduler on plain callables: order, admission within the cluster, events, errors."""

from __future__ import annotations

import threading
import time

import pytest

from augsbert_ray import scheduler
from augsbert_ray.graph import Demand


def test_each_node_runs_after_its_predecessors_and_emits_a_start_and_an_end():
    deps = {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}
    events = []
    seen = []
    lock = threading.Lock()

    def work(name):
        with lock:
            seen.append(name)
        return name.upper()

    results = scheduler.run(deps, work, on_event=events.append)
    assert results == {"a": "A", "b": "B", "c": "C", "d": "D"}
    assert seen[0] == "a" and seen[-1] == "d"
    for name in deps:
        kinds = [e.kind for e in events if e.name == name]
        assert kinds == ["start", "end"]
    ends = {e.name: e for e in events if e.kind == "end"}
    assert ends["d"].result == "D" and ends["d"].error is None and ends["d"].seconds >= 0
    at = {(e.kind, e.name): i for i, e in enumerate(events)}
    assert at[("end", "a")] < at[("start", "b")] and at[("end", "c")] < at[("start", "d")]


def test_ready_nodes_start_together_and_heavy_ones_only_where_they_fit():
    both = threading.Barrier(2, timeout=10)
    deps = {"x": (), "y": (), "big": ()}
    running, peak = set(), []
    lock = threading.Lock()

    def work(name):
        with lock:
            running.add(name)
            peak.append(set(running))
        if name in ("x", "y"):
            both.wait()  # broken (an error) unless x and y run at once
        with lock:
            running.discard(name)

    demand = {"x": Demand(cpus=1), "y": Demand(cpus=1), "big": Demand(cpus=2)}
    scheduler.run(deps, work, demand=demand.__getitem__, capacity=lambda: Demand(cpus=2))
    # big needs the whole cluster: never beside x or y
    assert all(s == {"big"} for s in peak if "big" in s)


def test_without_a_known_cluster_heavy_nodes_run_one_at_a_time_and_before_start_runs_first():
    deps = {"a": (), "b": ()}
    active, overlaps, calls = [], [], []
    lock = threading.Lock()

    def work(name):
        with lock:
            active.append(name)
            overlaps.append(len(active))
        with lock:
            active.remove(name)

    scheduler.run(deps, work, demand=lambda n: Demand(cpus=1), before_start=calls.append)
    assert max(overlaps) == 1 and calls == ["a", "b"]


def test_the_first_error_is_raised_after_the_running_nodes_end_and_nothing_starts_after_it():
    both = threading.Barrier(2, timeout=10)
    finished = []

    def work(name):
        both.wait() if name in ("a", "b") else None
        if name == "a":
            raise RuntimeError("a failed")
        time.sleep(0.5)  # b, running beside a, ends after a's error: c, which follows b, must not start
        finished.append(name)

    events = []
    with pytest.raises(RuntimeError, match="a failed"):
        scheduler.run({"a": (), "b": (), "c": ("b",)}, work, on_event=events.append)
    assert finished == ["b"]
    assert [e.name for e in events if e.kind == "end" and e.error is not None] == ["a"]
    assert "c" not in {e.name for e in events}
