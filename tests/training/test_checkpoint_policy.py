"""How often a training writes its checkpoints (``training.checkpoint_every`` and
``training.checkpoint_min_seconds``): intermediate checkpoints sooner than the minimum after the
last one are skipped, the final one is always written, and it holds no optimizer state. A warm
host's first training reports the host's start."""

from __future__ import annotations

import pytest
import torch
from test_silver_flags import _pairs

from augsbert_ray import workers
from augsbert_ray.training.executors import WarmHost, choose_executor
from augsbert_ray.training.ray_trainer import STATE_FILE, WorkerResources, train_on_ray


def _train(tiny_model, tmp_path, name, min_seconds, workers_=1, hosts=None) -> dict:
    executor = choose_executor(hosts, workers_, False, str(tmp_path / "ray_train"))
    assert isinstance(executor, WarmHost) == (hosts is not None and workers_ == 1)
    return train_on_ray(
        "bi_encoder", _pairs(48, 5), recipe={"model": tiny_model, "max_length": 32},
        hparams={"epochs": 3, "lr": 1e-3, "batch_size": 8, "warmup_ratio": 0.1, "seed": 3},
        resources=WorkerResources(num_workers=workers_, use_gpu=False, cpus_per_worker=1, checkpoint_every=0.25,
                                  max_failures=0, checkpoint_min_seconds=min_seconds),
        storage_dir=tmp_path / "ray_train", out_dir=tmp_path / name, name=name, executor=executor)


def _written(tmp_path, name) -> list:
    """The checkpoints a training left in its storage (folders holding a training state)."""
    return [p for p in (tmp_path / "ray_train" / name).glob("checkpoint_*") if (p / STATE_FILE).is_file()]


def _steps(tmp_path, name) -> list[int]:
    return sorted(int(p.name.rsplit("_", 1)[1]) for p in _written(tmp_path, name))


def test_a_short_training_on_a_warm_host_writes_only_its_final_checkpoint(ray_local, tiny_model, tmp_path):
    hosts = workers.HostPool()
    try:
        # 18 steps, a checkpoint due every 4: all of them are written without a minimum gap...
        first = _train(tiny_model, tmp_path, "every", min_seconds=0, hosts=hosts)
        assert first["steps"] == 18 and _steps(tmp_path, "every") == [16, 18]  # the latest two kept
        # ...and none but the last with one the training does not reach.
        second = _train(tiny_model, tmp_path, "final-only", min_seconds=3600, hosts=hosts)
        assert second["steps"] == 18 and _steps(tmp_path, "final-only") == [18]
        # The first training started the host and says so; the second found it warm.
        assert first["host_start_seconds"] > 0 and "host_start_seconds" not in second
    finally:
        hosts.close()
    final = torch.load(_written(tmp_path, "final-only")[0] / STATE_FILE, weights_only=True)
    assert "optimizer" not in final and final["step"] == 18
    assert (tmp_path / "final-only" / "model.safetensors").exists()


@pytest.mark.slow
def test_data_parallel_ranks_skip_the_same_checkpoints(ray_local, tiny_model, tmp_path):
    """Two workers: rank 0's decision is every rank's (a checkpoint is a collective report), so
    the training ends instead of waiting for a rank that skipped."""
    stats = _train(tiny_model, tmp_path, "ddp", min_seconds=3600, workers_=2)
    assert stats["steps"] == 18
    written = _written(tmp_path, "ddp")
    assert len(written) == 1 and "optimizer" not in torch.load(written[0] / STATE_FILE, weights_only=True)
    assert (tmp_path / "ddp" / "model.safetensors").exists()
