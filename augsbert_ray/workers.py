"""Warm worker hosts: resident Ray actors that train and score one stage after another.

A fresh Ray Train run starts a controller and a worker group, new processes that import torch
and transformers before the first step. A host is started once per job (when the first stage
needs one) and kept until the job ends (the job's ``context.JobContext`` owns the pool and
hands it to the stages), so its imports, tokenizers and CUDA context carry from one stage to
the next; training runs in it through Ray Train's local mode (``ScalingConfig(num_workers=0)``,
see ``training.executors`` and ``training.warm_fit``).

A host reserves nothing itself (``num_cpus=0``): while it works, the pool holds a placement
group of the work's resources, so the cluster's scheduler accounts for it exactly as it does
for a Ray Train worker, and an idle host blocks no other stage's actors. Two stages working at
once each get a host of their own: an idle host is reused, and a new one is started only when
every host is busy and the reservation for the new work could be placed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

# Ray sets CUDA_VISIBLE_DEVICES to "" in an actor that asks for no GPU; a host asks for none
# (its placement group does), so on a node with GPUs it keeps the node's devices visible.
_KEEP_GPUS = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}


def _host_options(node_gpus: float) -> dict:
    """The host actor's options. Without GPUs it takes the job's runtime environment as it is,
    so that Ray can hand it one of the idle worker processes it keeps started; an actor with an
    environment of its own waits for a new process."""
    options = {"num_cpus": 0, "max_restarts": 0}
    if node_gpus:
        options["runtime_env"] = {"env_vars": _KEEP_GPUS}
    return options


@dataclass(frozen=True)
class Placement:
    """What decides where a training runs (see ``training_on_host``)."""

    num_workers: int
    use_gpu: bool
    pool_open: bool  # a job's runner opened the pool
    single_node: bool  # the cluster is the driver's machine alone
    local_storage: bool  # checkpoints go to a local path (not a URI)
    node_gpus: float  # GPUs of that machine


def training_on_host(p: Placement) -> bool:
    """Whether a training runs on a warm host (Ray Train's local mode) or a new worker group.

    A host fits one worker on the driver's own machine, within a job: data-parallel runs
    (``training.num_workers > 1``), multi-node clusters and remote addresses keep Ray Train's
    worker group, which places workers and restarts them on any node. A host writes checkpoints
    itself, so only to a local storage; with a GPU, only on a machine of one GPU (the host
    trains on the node's first device).
    """
    if not (p.pool_open and p.single_node and p.local_storage) or p.num_workers != 1:
        return False
    return not p.use_gpu or p.node_gpus == 1


# What a host imports once, for every stage it serves: the training stack, transformers' model
# loading (most of a first model's load is importing it), sentence-transformers (every job's
# bi-encoder and evaluations) and Ray Train's TorchTrainer.
WARM_IMPORTS = ("torch", "transformers", "transformers.modeling_utils", "sentence_transformers", "ray.train.torch")


class _Host:
    """The resident process: imports the training stack once, then runs what it is handed."""

    def __init__(self):
        import importlib

        for module in WARM_IMPORTS:
            importlib.import_module(module)
        self._ready_at = time.time()

    def pid(self) -> int:
        return os.getpid()

    def ready_at(self) -> float:
        """When the host had its imports (``time.time()``; hosts run on the driver's machine)."""
        return self._ready_at

    def call(self, fn, *args, threads: int = 0, trim: bool = False, **kwargs):
        """``fn(*args, **kwargs)`` here; ``threads``: torch's intra-op threads (the CPUs reserved);
        ``trim``: afterwards, hand the C heap's free memory back to the system (``trim_heap``)."""
        if threads:
            import torch

            torch.set_num_threads(threads)
        try:
            return fn(*args, **kwargs)
        finally:
            _free_gpu_cache()
            if trim:
                trim_heap()


def trim_heap() -> None:
    """Returns the free pages of the C heap to the system (glibc's ``malloc_trim``; nothing
    elsewhere). What a finished training or scoring freed stays in glibc's arenas otherwise, and
    an idle host would hold it through the rest of the job, such as a long labelling in an actor
    pool. It takes milliseconds, so it follows whole pieces of work, not each labelled shard."""
    import ctypes

    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the C library this Python runs on
    except OSError:
        trim = None
    if trim is not None:
        trim(0)


def _free_gpu_cache() -> None:
    """Hands the GPU memory torch cached for finished work back to the device, for other processes."""
    import gc
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


class HostPool:
    """The job's warm hosts, handed out one piece of work at a time (``acquire``)."""

    def __init__(self):
        self._idle: list = []
        self._busy: list = []
        self._lock = threading.Lock()
        self.started = 0  # hosts started over the pool's life (a killed host is replaced)
        self._created: dict = {}  # a host whose first work has not ended -> when it was created (time.time())

    @contextlib.contextmanager
    def acquire(self, cpus: float, gpus: float, what: str):
        """A host for one piece of work, with ``cpus`` and ``gpus`` reserved while it runs.

        Raises:
            AugSBERTError: the cluster cannot ever place the reservation (``what`` names the settings).
        """
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        from augsbert_ray.runtime import require_resources

        require_resources([{"CPU": cpus, "GPU": gpus}], what)
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        group = placement_group([bundle], strategy="STRICT_PACK")
        try:
            ray.get(group.ready())  # waits while other work holds the resources
            host = self._take()
            try:
                yield host
            except BaseException:
                self._drop(host)  # a host that failed (or was interrupted) is not handed out again
                raise
            self._give_back(host)
        finally:
            remove_placement_group(group)

    def _take(self):
        import ray

        with self._lock:
            host = self._idle.pop() if self._idle else None
            if host is None:
                host = ray.remote(**_host_options(ray.cluster_resources().get("GPU", 0)))(_Host).remote()
                self.started += 1
                self._created[host] = time.time()
            self._busy.append(host)
        return host

    def start_seconds(self, host) -> float | None:
        """How long ``host`` took to start (its process and imports) if the work it is acquired
        for is its first, else None: only the stage that paid for the start reports it."""
        import ray

        with self._lock:
            created = self._created.pop(host, None)
        return None if created is None else max(0.0, ray.get(host.ready_at.remote()) - created)

    def _give_back(self, host) -> None:
        with self._lock:
            self._busy.remove(host)
            self._created.pop(host, None)  # its start belongs to the work that just ended
            self._idle.append(host)

    def _drop(self, host) -> None:
        import ray

        with self._lock:
            if host in self._busy:
                self._busy.remove(host)
            self._created.pop(host, None)
        with contextlib.suppress(Exception):
            ray.kill(host)

    def close(self) -> None:
        """Ends every host (idle or busy)."""
        import ray

        with self._lock:
            hosts, self._idle, self._busy = self._idle + self._busy, [], []
        for host in hosts:
            with contextlib.suppress(Exception):  # Ray may already be down
                ray.kill(host)


def hosts_serve(hosts: HostPool | None) -> bool:
    """Whether work other than training may run on ``hosts``, the job's pool (None outside a
    job): the cluster is the driver's machine with at most one GPU (a host works on the node's
    first device, and tasks or actors place work on any node)."""
    import ray

    from augsbert_ray.runtime import driver_is_the_only_node

    return hosts is not None and driver_is_the_only_node() and ray.cluster_resources().get("GPU", 0) <= 1


def remote_call(hosts: HostPool | None, fn, *args, num_cpus: float = 1, num_gpus: float = 0,
                what: str | None = None, **kwargs):
    """``runtime.remote_call`` on one of ``hosts`` where they serve (``hosts_serve``), so that
    the work pays no process start; a Ray task elsewhere.

    Raises:
        AugSBERTError: the cluster cannot ever place the work (``what`` names the settings).
    """
    import ray

    from augsbert_ray.runtime import remote_call as task_call

    if not hosts_serve(hosts):
        return task_call(fn, *args, num_cpus=num_cpus, num_gpus=num_gpus, what=what, **kwargs)
    with hosts.acquire(num_cpus, num_gpus, what or "work on a warm host") as host:
        return ray.get(host.call.remote(fn, *args, threads=max(1, int(num_cpus)), trim=True, **kwargs))
