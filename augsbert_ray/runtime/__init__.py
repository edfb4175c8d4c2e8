"""The only package that starts or connects to Ray, and decides resources from the cluster.

- ``cluster``: ``start_ray`` / ``stop_ray`` (the only ``ray.init``);
- ``state``: what ``start_ray`` changed in this process, for ``stop_ray`` to put back;
- ``output``: what Ray may print (``quiet_ray_output``, ``train_log_level``);
- ``isolation``: a job kept to its own cluster (loopback only, pinned ``RAY_ADDRESS``);
- ``reaping``: the processes a local Ray leaves behind, killed (psutil);
- ``resources``: whether work fits the cluster, CPUs per worker, task and block helpers.
"""

from augsbert_ray.runtime.cluster import (LOCAL_TRAIN_ENV_DEFAULTS, TRAIN_ENV_DEFAULTS, ClusterResources,
                                          local_ray_options, start_ray, stop_ray)
from augsbert_ray.runtime.isolation import pin_worker_to_cluster
from augsbert_ray.runtime.output import LOG_FORMAT, RAY_LOGGERS, quiet_ray_output, restore_ray_output, train_log_level
from augsbert_ray.runtime.resources import (dataset_of_blocks, driver_is_the_only_node, fits, node_capacities,
                                            per_worker_cpus, remote_call, require_resources)

__all__ = ["ClusterResources", "LOCAL_TRAIN_ENV_DEFAULTS", "LOG_FORMAT", "RAY_LOGGERS", "TRAIN_ENV_DEFAULTS",
           "dataset_of_blocks", "driver_is_the_only_node", "fits", "local_ray_options", "node_capacities",
           "per_worker_cpus", "pin_worker_to_cluster", "quiet_ray_output", "remote_call", "require_resources",
           "restore_ray_output", "start_ray", "stop_ray", "train_log_level"]
