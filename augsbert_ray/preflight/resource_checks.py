"""GPUs a job asks for, checked where they must come from before any work waits on them.

Ray queues a task that asks for a GPU the cluster does not have and waits for ever (or Ray
Train restarts its workers until it gives up). A local run's GPUs are this machine's, known
before Ray starts (``check_local_gpus``, from ``preflight.check_job``); a cluster's are known
once connected, before the first stage that needs Ray runs (``check_cluster_gpus``). As
``runtime.require_resources`` does for each request, the cluster is taken as it is now: an
autoscaling cluster's GPU nodes should be started first.
"""

from __future__ import annotations

import glob
import os
import sys

from augsbert_ray.config import JobConfig
from augsbert_ray.errors import ConfigError


def asked_gpus(cfg: JobConfig) -> list[str]:
    """The settings of a job that require GPUs (``key=value``); empty when it needs none.

    ``sampling.faiss.use_gpu`` is left out: it uses a GPU only where there is one.
    """
    asked = []
    if cfg.training.use_gpu:
        asked.append("training.use_gpu=true")
    for key, value in (("labeling.num_gpus", cfg.labeling.num_gpus),
                       ("sampling.faiss.shard_gpus", cfg.sampling.faiss.shard_gpus),
                       ("seed_search.gpus_per_trial", cfg.seed_search.gpus_per_trial)):
        if value:
            asked.append(f"{key}={value:g}")
    return asked


def runs_locally(cfg: JobConfig) -> bool:
    """The job starts its own Ray on this machine: no ``ray.address`` (``--address``) nor ``RAY_ADDRESS``,
    and no Ray that this process has joined already (``joined_ray``)."""
    return not (cfg.ray.address or os.environ.get("RAY_ADDRESS") or joined_ray())


def joined_ray() -> bool:
    """Whether this process is connected to a Ray already (a script's own ``ray.init``): the job
    then runs on that Ray as it is (``runtime.start_ray``), whose GPUs need not be this machine's."""
    ray = sys.modules.get("ray")  # not imported: not joined (importing Ray costs seconds)
    return ray is not None and ray.is_initialized()


def check_local_gpus(cfg: JobConfig, cuda_available=None) -> None:
    """A local run that asks for GPUs runs on a machine that has one (as torch sees it).

    Args:
        cuda_available: how to ask (default ``gpu_visible``; tests pass another).

    Raises:
        ConfigError: naming the job file and the first setting that asks for a GPU.
    """
    asked = asked_gpus(cfg)
    if not asked or not runs_locally(cfg):
        return
    if cuda_available is None:
        cuda_available = gpu_visible
    if not cuda_available():
        key = asked[0].split("=")[0]
        raise ConfigError(cfg.source, key, f"{' and '.join(asked)} asks for a GPU, but this machine has no GPU that "
                                           "torch can use, and the job starts "
                                           "its own Ray here: set it to false / 0, or give a cluster's address")


def check_local_gpu_request(num_gpus: float, key: str, local: bool, command: str, cuda_available=None) -> None:
    """A command that starts its own Ray here (``local``) and asks ``num_gpus`` GPUs per actor
    runs on a machine that has one: Ray would otherwise queue its actors for ever.

    Raises:
        ConfigError: naming ``key``.
    """
    if not num_gpus or not local:
        return
    if not (cuda_available or gpu_visible)():
        raise ConfigError(key, None, f"{num_gpus:g} asks for a GPU, but this machine has no GPU that torch can use, "
                                     f"and {command} starts its own Ray here: leave it at 0, or give a cluster's "
                                     "address (--address)")


def check_local_cpus(cfg: JobConfig) -> None:
    """A local run's training workers fit in this machine's CPUs (``ray.num_cpus`` or every
    core), as Ray Train would otherwise find once Ray has started.

    Raises:
        ConfigError: naming the job file, ``training.num_workers`` and the CPUs there are.
    """
    if not runs_locally(cfg):
        return
    from augsbert_ray.runtime.resources import per_worker_cpus

    cpus = cfg.ray.num_cpus or os.cpu_count() or 1
    workers = cfg.training.num_workers
    each = per_worker_cpus(cfg.training.cpus_per_worker, cpus, workers)
    if workers * each > cpus:
        raise ConfigError(cfg.source, "training.num_workers",
                          f"{workers} training workers of {each:g} CPUs each (training.cpus_per_worker) need "
                          f"{workers * each:g} CPUs, and the job starts its own Ray here with {cpus} "
                          "(ray.num_cpus, else every core): ask for fewer, or give a cluster's address")


def gpu_visible() -> bool:
    """Whether torch can use a GPU here. On Linux, a machine with no NVIDIA device node, no ROCm
    one and no WSL2 GPU bridge has none, which is known without importing torch (seconds on a
    busy machine)."""
    if (sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*")
            and not any(os.path.exists(p) for p in ("/dev/kfd", "/dev/dxg"))):
        return False
    import torch

    return torch.cuda.is_available()


def check_cluster_gpus(cfg: JobConfig, gpus: float, address: str | None) -> None:
    """A cluster the job connected to has GPUs, if the job asks for them.

    Raises:
        ConfigError: naming the job file, the first setting that asks for a GPU and the cluster.
    """
    asked = asked_gpus(cfg)
    if asked and gpus <= 0:
        key = asked[0].split("=")[0]
        address = address or os.environ.get("RAY_ADDRESS")
        cluster = f"the Ray cluster at {address}" if address else "the Ray cluster this process had joined"
        raise ConfigError(cfg.source, key, f"{' and '.join(asked)} asks for a GPU, but {cluster} has "
                                           "none now: start its GPU nodes first, or set it to false / 0")
