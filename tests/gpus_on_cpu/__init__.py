"""Test helpers: a local Ray with logical GPUs whose work runs on the CPU, and a record of the
GPUs it reserves while a job runs (tests/test_gpu_placement*.py).

This folder is also put on the Ray workers' ``PYTHONPATH``, so that they import its
``sitecustomize`` (see there); the package never imports it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_WORKERS = {"RayTrainWorker"}  # the actor class of a Ray Train worker group's workers


@contextlib.contextmanager
def ray_with_gpus(gpus: int, cpus: int = 2):
    """A local Ray of ``cpus`` CPUs and ``gpus`` logical GPUs for the block, its workers (and this
    process) running their models on the CPU; the Ray that was running before (the test
    session's) is stopped first and started again after."""
    import ray

    from augsbert_ray.runtime import (
        LOCAL_TRAIN_ENV_DEFAULTS,
        TRAIN_ENV_DEFAULTS,
        local_ray_options,
    )
    from gpus_on_cpu import sitecustomize as on_cpu

    had = ray.is_initialized()
    if had:
        ray.shutdown()
    before = {k: os.environ.get(k) for k in ("PYTHONPATH", on_cpu.ENV)}
    os.environ[on_cpu.ENV] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [before["PYTHONPATH"]])])
    on_cpu.install()
    for key, value in {**TRAIN_ENV_DEFAULTS, **LOCAL_TRAIN_ENV_DEFAULTS}.items():
        os.environ.setdefault(key, value)
    try:
        ray.init(address="local", **local_ray_options(cpus), num_gpus=gpus, include_dashboard=False,
                 log_to_driver=False)
        yield ray
    finally:
        ray.shutdown()
        on_cpu.uninstall()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if had:
            from conftest import _start_local_ray

            _start_local_ray()


@dataclass
class Reservations:
    """What Ray's state said about GPUs while a job ran, sampled every ``every`` seconds: the
    GPUs held (the cluster's less those available) and those in placement groups created; and
    the classes of the actors seen alive (which process trained: a warm host or Ray Train's)."""

    total: float
    held: list[float] = field(default_factory=list)
    in_groups: list[float] = field(default_factory=list)
    actors: set[str] = field(default_factory=set)
    groups: list[list[float]] = field(default_factory=list)  # the GPUs of each group created, per sample

    def sample(self) -> None:
        import ray
        from ray._private import (
            state,  # the actors' table from the GCS (no dashboard here)
        )
        from ray.util import placement_group_table

        available = ray.available_resources().get("GPU", 0.0)  # a resource all taken is left out
        self.held.append(self.total - available)
        groups = sorted(sum(bundle.get("GPU", 0.0) for bundle in group["bundles"].values())
                        for group in placement_group_table().values() if group["state"] == "CREATED")
        self.groups.append([g for g in groups if g])
        self.in_groups.append(sum(groups))
        self.actors.update(a["ActorClassName"] for a in state.actors().values() if a["State"] == "ALIVE")

    def check(self) -> None:
        """Never more GPUs held or grouped than the cluster has, and none less than nothing."""
        assert self.held, "no sample taken"
        assert max(self.held) <= self.total + 1e-9 and min(self.held) >= -1e-9, self.held
        assert max(self.in_groups) <= self.total + 1e-9, self.in_groups


def run_watched(job, timeout_s: float, every: float = 0.2, **kwargs):
    """``augsbert_ray.run(job, **kwargs)`` with Ray's GPU reservations sampled while it runs.

    Returns:
        (the run's metrics, its ``Reservations``).

    Raises:
        AssertionError: the job did not end within ``timeout_s`` (a stall), saying what Ray
            held then; or the job's own error.
    """
    import ray

    import augsbert_ray

    seen = Reservations(total=ray.cluster_resources().get("GPU", 0.0))
    done, out = threading.Event(), {}

    def target():
        try:
            out["metrics"] = augsbert_ray.run(job, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=target, daemon=True, name="job")
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not done.wait(every):
        seen.sample()
        if time.monotonic() > deadline:
            from ray.util import placement_group_table

            pending = [g["bundles"] for g in placement_group_table().values() if g["state"] != "CREATED"]
            raise AssertionError(f"the job stalled: not done after {timeout_s:.0f} s; available "
                                 f"{ray.available_resources()}; placement groups waiting: {pending}")
    if "error" in out:
        raise out["error"]
    return out["metrics"], seen


def write_job(root, model: str, seed: int = 42) -> str:
    """The tiny job on synthetic STSb-format data, its file's path."""
    import yaml
    from conftest import write_stsb

    data = {s: {"format": "stsb", "path": str(write_stsb(root / f"sts-{s}.csv", n, data_seed))}
            for s, n, data_seed in [("train", 48, 1), ("dev", 24, 2), ("test", 24, 3)]}
    job = {"name": "tiny-gpus", "data": data, "seed": seed,
           "cross_encoder": {"model": model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
           "bi_encoder": {"model": model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
           "sampling": {"strategy": "bm25", "top_k": 2, "query_batch_size": 16},
           "labeling": {"block_size": 32, "micro_batch_size": 8},
           "evaluation": {"batch_size": 16},
           "training": {"cpus_per_worker": 1}}  # CPUs enough for two trainings at once: the GPUs decide
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)
