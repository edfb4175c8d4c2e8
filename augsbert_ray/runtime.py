"""The only module that starts or connects to Ray, and decides resources from the cluster."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterResources:
    cpus: float
    gpus: float
    nodes: int = 1
    memory_gb: float = 0.0
    object_store_gb: float = 0.0
    logs: str | None = None  # where Ray writes this session's logs (on the head node)
    dashboard: str | None = None

    def describe(self) -> str:
        return (f"{self.nodes} node(s), {self.cpus:g} CPUs, {self.gpus:g} GPUs, {self.memory_gb:.1f} GiB memory, "
                f"{self.object_store_gb:.1f} GiB object store")


# Fixed costs of a stage on a small machine: Ray Train's controller polls its workers every
# 2 s (so a training stage ends up to 2 s after its last step; 0.5 s costs nothing measurable),
# and on one machine no node is ever drained, so the preemption watcher (an actor, so a new
# process, per training run) has nothing to watch. Users' own settings of these win.
TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
LOCAL_TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def local_ray_options(num_cpus: int | None = None) -> dict:
    """``ray.init`` arguments for a Ray started inside this process.

    Ray keeps at most as many idle worker processes as the node has CPUs and kills the rest
    after a second; each training run's actors count against that, so on a small machine the
    warm worker that scored the last model is gone by the next evaluation, which then pays
    about 10 s of imports again. A few more idle workers (each holds its imports, a few
    hundred MB) keep them warm.
    """
    cpus = num_cpus or os.cpu_count() or 1
    return {"num_cpus": cpus, "_system_config": {"num_workers_soft_limit": int(cpus) + 4}}


def start_ray(address: str | None = None, num_cpus: int | None = None,
              env_vars: dict[str, str] | None = None) -> ClusterResources:
    """Connects to a Ray cluster, or starts a local one inside this process.

    Args:
        address: a cluster address ("auto", "host:6379", "ray://..."); None falls back to the
            ``RAY_ADDRESS`` environment variable, then to a new local Ray.
        num_cpus: CPUs of a local Ray (ignored when connecting); None uses every core.
        env_vars: environment variables for the driver and every worker of this job (through
            its runtime environment; not applied when Ray is already initialised).

    Returns:
        The CPUs and GPUs the cluster has.
    """
    import ray

    ctx = None
    os.environ.update(env_vars or {})
    runtime_env = {"env_vars": dict(env_vars)} if env_vars else None
    for key, value in TRAIN_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            ctx = ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
        else:
            for key, value in LOCAL_TRAIN_ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
            # The dashboard (bound to 127.0.0.1) serves the State API that Ray Train relies on.
            ctx = ray.init(**local_ray_options(num_cpus), dashboard_host="127.0.0.1", log_to_driver=True,
                           runtime_env=runtime_env)
    session = (ctx.address_info.get("session_dir") if ctx is not None else None)
    res = ray.cluster_resources()
    gib = 1024**3
    return ClusterResources(
        cpus=float(res.get("CPU", 0)), gpus=float(res.get("GPU", 0)),
        nodes=sum(1 for n in ray.nodes() if n.get("Alive")),
        memory_gb=float(res.get("memory", 0)) / gib, object_store_gb=float(res.get("object_store_memory", 0)) / gib,
        logs=os.path.join(session, "logs") if session else None,
        dashboard=(ctx.dashboard_url or None) if ctx is not None else None,
    )


def per_worker_cpus(configured: float | None, total_cpus: float, workers: int) -> float:
    """CPUs for each of ``workers`` parallel workers: as configured, else an equal share."""
    if configured is not None:
        return configured
    return max(1.0, float(int(total_cpus // max(1, workers))))


def remote_call(fn, *args, num_cpus: float = 1, num_gpus: float = 0, **kwargs):
    """Runs ``fn(*args, **kwargs)`` as a Ray task with the given resources and waits for it."""
    import ray

    return ray.get(ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(fn).remote(*args, **kwargs))


def dataset_of_blocks(table, rows_per_block: int):
    """A Ray Dataset of ``table`` cut into blocks of ``rows_per_block`` rows.

    Ray Data hands whole blocks to actors, and ``from_arrow`` makes one block of one
    table, so without this cut every actor of a pool but one would sit idle.
    """
    import ray

    blocks = [table.slice(i, rows_per_block) for i in range(0, table.num_rows, rows_per_block)] or [table]
    return ray.data.from_arrow(blocks)
