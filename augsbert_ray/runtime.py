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


def start_ray(address: str | None = None, num_cpus: int | None = None) -> ClusterResources:
    """Connects to a Ray cluster, or starts a local one inside this process.

    Args:
        address: a cluster address ("auto", "host:6379", "ray://..."); None falls back to the
            ``RAY_ADDRESS`` environment variable, then to a new local Ray.
        num_cpus: CPUs of a local Ray (ignored when connecting); None uses every core.

    Returns:
        The CPUs and GPUs the cluster has.
    """
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            ray.init(address=address, log_to_driver=True)
        else:
            # The dashboard (bound to 127.0.0.1) serves the State API that Ray Train relies on.
            ray.init(num_cpus=num_cpus or os.cpu_count(), dashboard_host="127.0.0.1", log_to_driver=True)
    res = ray.cluster_resources()
    return ClusterResources(cpus=float(res.get("CPU", 0)), gpus=float(res.get("GPU", 0)))


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
