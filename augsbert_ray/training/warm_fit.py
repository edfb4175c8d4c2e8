"""Training on a warm host (``augsbert_ray.workers``): Ray Train's local mode, with the
checkpoints and restarts a worker group would give.

Local mode (``ScalingConfig(num_workers=0)``) runs the training function in the calling
process and keeps what it reports in memory: it writes no checkpoint to storage, resumes
nothing and retries nothing (``failure_config`` is not used). So here the training function
writes each checkpoint under the run's folder in Ray Train's storage itself (complete, then
renamed into place, the latest two kept), a new attempt resumes from the latest one found
there, and the driver restarts a failed attempt on a new host, up to ``training.max_failures``
times, as Ray Train restarts a worker group.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from augsbert_ray import signals
from augsbert_ray.errors import DiskFullError

CHECKPOINT_PREFIX = "checkpoint_"
KEEP = 2  # the latest two training states, as the worker group's CheckpointConfig keeps


def checkpoints_newest_first(run_dir: str | os.PathLike, state_file: str) -> list[Path]:
    """The checkpoints holding ``state_file`` under a run's folder (this module's, or ones that
    Ray Train's worker group wrote there), the newest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if (p / state_file).is_file()]
    return sorted(found, key=lambda p: (p / state_file).stat().st_mtime_ns, reverse=True)


def latest_checkpoint(run_dir: str | os.PathLike, state_file: str) -> Path | None:
    """The newest checkpoint holding ``state_file`` under a run's folder, or None."""
    return next(iter(checkpoints_newest_first(run_dir, state_file)), None)


def persist_checkpoint(write, run_dir: str | os.PathLike, step: int) -> Path:
    """Writes a checkpoint (``write(directory)``) into ``run_dir`` and keeps the latest ``KEEP``.

    The checkpoint is written in a hidden folder and renamed into place, so a process killed
    mid-write leaves no checkpoint that a resume could take for complete.
    """
    run_dir = Path(run_dir)
    final = run_dir / f"{CHECKPOINT_PREFIX}{step:09d}"
    tmp = run_dir / f".{final.name}.writing"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk: give back what the partial write took
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    ours = sorted(p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if p.name[len(CHECKPOINT_PREFIX):].isdigit())
    for old in ours[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def fit_in_process(train_fn, config: dict, run: str, storage: str) -> dict:
    """Runs ``train_fn(config)`` through Ray Train's local mode in this process (the host's).

    Returns:
        ``{"metrics": the last metrics reported, "checkpoint": the last checkpoint's folder}``.
    """
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(train_fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=0),
                           run_config=RunConfig(name=run, storage_path=storage))
    result = trainer.fit()
    return {"metrics": result.metrics, "checkpoint": result.checkpoint.path if result.checkpoint else None}


def fit_on_host(pool, train_fn, config: dict, *, run: str, storage: str, cpus: float, gpus: float,
                max_failures: int, what: str) -> tuple[dict, str]:
    """Trains on one of ``pool``'s hosts, restarting a failed attempt on a new host.

    Args:
        pool: the job's ``workers.HostPool``.
        train_fn: the training function (takes ``config``).
        config: its config; ``checkpoint_dir`` and ``device`` are added here.
        run, storage: the run's name and Ray Train's storage (a local path): checkpoints go
            to ``storage/run``, where a worker group's would.
        cpus, gpus: reserved while the host trains.
        max_failures: attempts after the first that a transient failure may take.
        what: the settings that size the work, for an error about resources.

    Returns:
        (the metrics reported last, the final checkpoint's folder); the metrics have
        ``host_start_seconds`` when this training was the first work of a new host.

    Raises:
        RestartsExhausted: a transient failure with no restart left (``cause`` says what).
    """
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    config = {**config, "checkpoint_dir": str(Path(storage) / run), "device": "cuda:0" if gpus else "cpu"}
    failures = 0
    # A loop by hand, not a retry helper (tenacity) or Ray's task retries: each attempt takes a new
    # host from the pool, and a stop or a full disk ends the retries with its own error.
    while True:
        try:
            with pool.acquire(cpus, gpus, what) as host:
                out = ray.get(host.call.remote(fit_in_process, train_fn, config, run, storage, trim=True))
                started = pool.start_seconds(host)
            metrics = out["metrics"]  # None when the training recorded a permanent error (the caller raises it)
            if started is not None and metrics is not None:
                metrics = {**metrics, "host_start_seconds": started}
            return metrics, out["checkpoint"]
        except (RayActorError, RayTaskError) as e:  # the host died, or the training raised
            if signals.stopping():  # the job is stopping (its Ray with it): no new attempt
                raise signals.Interrupted(signals.received()) from None
            if isinstance(_cause(e), DiskFullError):  # a new host would meet the same full disk
                raise _cause(e) from None
            failures += 1
            if failures > max_failures:
                raise RestartsExhausted(_cause(e)) from None


def _cause(error: BaseException) -> BaseException:
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


class RestartsExhausted(Exception):
    """A warm host's training failed with no restart left; ``cause`` is the last failure."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause
