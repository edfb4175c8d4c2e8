"""Where a training runs: a declared choice, made by the job and passed down to
``ray_trainer.train_on_ray``.

- ``WorkerGroup``: Ray Train's worker group (a controller and ``num_workers`` worker processes,
  started for this training): data-parallel ranks, any node of any cluster, restarts on any
  node from the latest checkpoint in the run's storage.
- ``WarmHost``: one of the job's warm hosts (``augsbert_ray.workers``), in Ray Train's local
  mode: one worker on the driver's machine whose process and imports are already there
  (``training.warm_fit``), with the same checkpoints and restarts.

How the pairs reach the workers is the same for both (``training.ingest``): a table of at
most ``stream_above_rows`` rows whole through the object store (files or a Ray Data dataset
that small read into one), anything larger staged beside the run, each worker reading its own batches' rows from it
(the warm host in-process, through the same reader).

Both run the same training function on the same config and return a ``Trained``; what
happens around them (errors recorded by a worker, exporting the model) is the caller's and
is the same for both. ``choose_executor`` is the rule, as a function of its inputs; the job's
context (``context.JobContext.training_executor``) applies it with the job's hosts, and a
training outside a job runs in a worker group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from augsbert_ray.training.ingest import STREAM_ABOVE_ROWS
from augsbert_ray.workers import HostPool, Placement, training_on_host


@dataclass(frozen=True)
class Trained:
    """A finished training: the metrics rank 0 reported last (None where a worker recorded a
    permanent error instead), its final checkpoint (``ray.train.Checkpoint``, or None) and the
    file system Ray Train kept it on (``local``, ``s3``...)."""

    metrics: dict | None
    checkpoint: Any
    filesystem: str


class Executor(Protocol):
    """Runs ``train_fn(config)`` on ``resources`` with checkpoints under ``storage/run``.

    Raises:
        ray.train.TrainingFailedError: a worker group's restarts exhausted.
        training.warm_fit.RestartsExhausted: a warm host's restarts exhausted.
    """

    name: str
    stream_above_rows: int  # a larger table is staged and streamed (training.ingest)

    def fit(self, train_fn: Callable[[dict], None], config: dict, resources, storage: str, run: str,
            what: str) -> Trained: ...


# Ray Train's default helpers that a run of ours does not need (by class name: an internal API
# that may change; a name that no longer matches only keeps that helper, as before):
# - the datasets callback starts a DatasetManager actor for each run, and our runs pass Ray Train
#   no datasets (the pairs travel in the object store, or are read from a staged file:
#   training.ingest says why not through get_dataset_shard);
# - the placement-group cleaner is a detached actor that removes the run's placement group if
#   its controller dies without cleaning up. On a cluster of one node, the driver's (a local
#   Ray, or a single-machine cluster), the job's placement groups go with the job, which such a
#   failure ends (train_on_ray raises).
# Each is a process that imports Ray Train first. A tiny model's 6-step run took 28.3 CPU-s of
# a 2-core machine with them and 23.4 without (medians, benchmarks/train_overhead.py).
_UNUSED_WITHOUT_DATASETS = "DatasetsCallback"
_UNUSED_ON_ONE_NODE = "PlacementGroupCleanerCallback"
_trainer_cls = None


def trainer_class():
    """``TorchTrainer`` without the default helpers a run of ours does not use (see above), and
    without a Ctrl-C handler of its own (``runtime.ray_private.lean_torch_trainer``)."""
    global _trainer_cls
    if _trainer_cls is None:
        from augsbert_ray.runtime import driver_is_the_only_node
        from augsbert_ray.runtime.ray_private import lean_torch_trainer

        def unused(trainer) -> set[str]:
            out = set() if trainer.datasets else {_UNUSED_WITHOUT_DATASETS}
            return out | ({_UNUSED_ON_ONE_NODE} if driver_is_the_only_node() else set())

        _trainer_cls = lean_torch_trainer(unused)
    return _trainer_cls


@dataclass(frozen=True)
class WorkerGroup:
    """Ray Train's worker group (see the module)."""

    name = "worker group"
    stream_above_rows: int = STREAM_ABOVE_ROWS

    def fit(self, train_fn, config: dict, resources, storage: str, run: str, what: str) -> Trained:
        from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

        from augsbert_ray.runtime import train_log_level

        trainer = trainer_class()(
            train_fn,
            train_loop_config=config,
            scaling_config=ScalingConfig(
                num_workers=resources.num_workers,
                use_gpu=resources.use_gpu,
                resources_per_worker={"CPU": resources.cpus_per_worker},
            ),
            run_config=RunConfig(
                name=run,
                storage_path=storage,
                failure_config=FailureConfig(max_failures=resources.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=2),  # the latest two training states
                # WARNING unless verbose: no "Checkpoint successfully created" per checkpoint nor
                # worker-group start-up lines on the console (Ray Train's session files keep them).
                logging_config=LoggingConfig(log_level=train_log_level()),
            ),
        )
        result = trainer.fit()
        # Where Ray Train kept the run ("local", "s3", "gcs", ...): checkpoints go straight there.
        return Trained(result.metrics, result.checkpoint, result.filesystem.type_name)


@dataclass(frozen=True)
class WarmHost:
    """One of ``hosts``, in Ray Train's local mode (see the module)."""

    hosts: HostPool
    name = "warm host"
    stream_above_rows: int = STREAM_ABOVE_ROWS

    def fit(self, train_fn, config: dict, resources, storage: str, run: str, what: str) -> Trained:
        from ray.train import Checkpoint

        from augsbert_ray.training.warm_fit import fit_on_host

        metrics, folder = fit_on_host(self.hosts, train_fn, config, run=run, storage=storage,
                                      cpus=resources.cpus_per_worker, gpus=1 if resources.use_gpu else 0,
                                      max_failures=resources.max_failures, what=what)
        return Trained(metrics, Checkpoint.from_directory(folder) if folder else None, "local")


def choose_executor(hosts: HostPool | None, num_workers: int, use_gpu: bool, storage: str) -> Executor:
    """A warm host of ``hosts`` where one fits the training (``workers.training_on_host``: one
    worker on the driver's machine, checkpoints on its disk, at most one GPU there), else a
    worker group; a worker group without hosts (a training outside a job)."""
    if hosts is None or num_workers != 1:
        return WorkerGroup()
    import ray

    from augsbert_ray.rundir import is_uri
    from augsbert_ray.runtime import driver_is_the_only_node

    single = driver_is_the_only_node()
    placement = Placement(num_workers=num_workers, use_gpu=use_gpu, pool_open=True, single_node=single,
                          local_storage=not is_uri(storage),
                          node_gpus=float(ray.cluster_resources().get("GPU", 0)) if single else 0.0)
    return WarmHost(hosts) if training_on_host(placement) else WorkerGroup()
