"""Every state that a kill or a full disk can leave in a training's storage resumes: the
driver stopped after the last step (a final checkpoint, no exported model), a half-written
export, a half-written checkpoint, and a full disk during the export. The faults are put in
place directly (the files a kill leaves) or injected (``ENOSPC`` from the copy), on a warm host."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from test_silver_flags import _pairs

from augsbert_ray import workers
from augsbert_ray.errors import DiskFullError
from augsbert_ray.training import ray_trainer
from augsbert_ray.training.executors import WarmHost
from augsbert_ray.training.ray_trainer import STATE_FILE, WorkerResources, train_on_ray


def _train(hosts, tiny_model, tmp_path, name) -> dict:
    return train_on_ray(
        "bi_encoder", _pairs(48, 5), recipe={"model": tiny_model, "max_length": 32},
        hparams={"epochs": 3, "lr": 1e-3, "batch_size": 8, "warmup_ratio": 0.1, "seed": 3},
        resources=WorkerResources(num_workers=1, use_gpu=False, cpus_per_worker=1, checkpoint_every=0.25,
                                  max_failures=0, checkpoint_min_seconds=0),
        storage_dir=tmp_path / "ray_train", out_dir=tmp_path / name, name=name, executor=WarmHost(hosts))


def _weights(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


def _checkpoints(tmp_path, name) -> list[Path]:
    return sorted(p for p in (tmp_path / "ray_train" / name).glob("checkpoint_*") if (p / STATE_FILE).is_file())


@pytest.fixture
def hosts(ray_local):
    pool = workers.HostPool()
    yield pool
    pool.close()


def test_every_state_a_kill_or_a_full_disk_leaves_resumes_to_the_same_model(hosts, tiny_model, tmp_path,
                                                                             monkeypatch):
    first = _train(hosts, tiny_model, tmp_path, "run")  # 18 steps; checkpoints at 16 and 18 kept
    reference = _weights(tmp_path / "run")
    assert [p.name for p in _checkpoints(tmp_path, "run")] == ["checkpoint_000000016", "checkpoint_000000018"]
    assert first["resumed_from_step"] == 0

    # 1. Stopped after the last step, before the export: the final checkpoint is exported.
    shutil.rmtree(tmp_path / "run")
    again = _train(hosts, tiny_model, tmp_path, "run")
    assert again["resumed_from_step"] == 18 and _weights(tmp_path / "run") == reference

    # 2. A full disk mid-export: one typed error naming the folder, nothing half-copied left
    # where the model belongs, and the next run exports it.
    def copy_until_full(src, dst, **kwargs):
        Path(dst).mkdir(parents=True)
        (Path(dst) / "config.json").write_bytes(b"")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(dst) / "model.safetensors"))

    shutil.rmtree(tmp_path / "run")
    with monkeypatch.context() as m:
        m.setattr(ray_trainer.shutil, "copytree", copy_until_full)
        with pytest.raises(DiskFullError, match="no space left on device while writing .*run"):
            _train(hosts, tiny_model, tmp_path, "run")
    assert not (tmp_path / "run").exists() and not (tmp_path / ".run.exporting").exists()

    # 3. A kill mid-export of an earlier version of the code: a half-copied model in place.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_bytes(b"")
    _train(hosts, tiny_model, tmp_path, "run")
    assert _weights(tmp_path / "run") == reference and (tmp_path / "run" / "config.json").stat().st_size > 0

    # 4. The newest checkpoint half-written (its state cut short): it is set aside, the older one
    # resumes, and the last two steps trained again give the same model bit for bit.
    final = _checkpoints(tmp_path, "run")[-1]
    state = (final / STATE_FILE).read_bytes()
    (final / STATE_FILE).write_bytes(state[: len(state) // 2])
    resumed = _train(hosts, tiny_model, tmp_path, "run")
    assert resumed["resumed_from_step"] == 16 and resumed["steps"] == 18
    assert _weights(tmp_path / "run") == reference
