"""Where a training runs is a declared choice (``training.executors.choose_executor``), made by
the job's context and passed down, never read from global state: a warm host for one worker on
the driver's machine with checkpoints on its disk and at most one GPU there, a Ray Train worker
group for everything else and for a training outside a job."""

from __future__ import annotations

import pytest

from augsbert_ray import runtime
from augsbert_ray.context import JobContext
from augsbert_ray.training.executors import WarmHost, WorkerGroup, choose_executor
from augsbert_ray.workers import HostPool


@pytest.fixture
def cluster(monkeypatch):
    """A fake cluster: whether the driver's machine is its only node, and its GPUs."""
    import ray

    state = {"single": True, "gpus": 0.0}
    monkeypatch.setattr(runtime, "driver_is_the_only_node", lambda: state["single"])
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": state["gpus"]})
    return state


def test_one_worker_on_the_drivers_machine_trains_on_a_warm_host(cluster):
    hosts = HostPool()  # starts nothing until work acquires a host
    assert choose_executor(hosts, 1, False, "/runs/x/ray") == WarmHost(hosts)
    cluster["gpus"] = 1.0
    assert choose_executor(hosts, 1, True, "/runs/x/ray") == WarmHost(hosts)  # the node's one GPU


@pytest.mark.parametrize("why", ["no hosts", "data-parallel", "remote storage", "several GPUs", "multi-node"])
def test_everything_else_trains_in_a_worker_group(cluster, why):
    hosts, workers, gpu, storage = HostPool(), 1, False, "/runs/x/ray"
    if why == "no hosts":
        hosts = None  # a training outside a job
    elif why == "data-parallel":
        workers = 2
    elif why == "remote storage":
        storage = "s3://bucket/runs/x/ray"  # a host writes its checkpoints itself, to local disk
    elif why == "several GPUs":
        cluster["gpus"], gpu = 2.0, True  # a host trains on the node's first device only
    else:
        cluster["single"] = False
    assert choose_executor(hosts, workers, gpu, storage) == WorkerGroup()


def test_the_jobs_context_chooses_with_its_own_hosts_and_none_before_ray_starts(cluster):
    ctx = JobContext(start=lambda: "a cluster")
    assert ctx.training_executor(1, False, "/runs/x/ray") == WorkerGroup()  # not started: no hosts
    assert ctx.hosts_serving() is None
    ctx.ensure_started()
    try:
        assert ctx.cluster == "a cluster" and ctx.ensure_started() == "a cluster"  # started once
        assert ctx.training_executor(1, False, "/runs/x/ray") == WarmHost(ctx.hosts)
        assert ctx.hosts_serving() is ctx.hosts
        cluster["gpus"] = 2.0  # scoring and sampling place work on every GPU's node: no hosts
        assert ctx.hosts_serving() is None
    finally:
        ctx.close()
    assert ctx.hosts is None and ctx.training_executor(1, False, "/runs/x/ray") == WorkerGroup()
