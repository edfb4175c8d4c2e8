"""Chaos on a warm host (``augsbert_ray.workers``): the host process is killed mid-training;
the driver starts a new host, which resumes from the latest checkpoint in the run's storage
and ends with the model a Ray Train worker group trains without a fault, bit for bit. With
no restart left, the stage fails with the engine's TrainingError naming the limit; an error no
retry can fix is raised at once."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file
from test_training_failure import _pairs

from augsbert_ray import workers
from augsbert_ray.errors import TrainingError
from augsbert_ray.testing import CrashAt, RaiseAt, inject_training_fault
from augsbert_ray.training.executors import choose_executor
from augsbert_ray.training.ray_trainer import WorkerResources, train_on_ray

pytestmark = pytest.mark.slow


def _train(tiny_model, tmp_path, name, fault=None, epochs=3, max_failures=2, hosts=None, monkeypatch=None) -> dict:
    if fault is not None:
        with monkeypatch.context() as faulty:
            inject_training_fault(faulty, fault)
            return _train(tiny_model, tmp_path, name, None, epochs, max_failures, hosts)
    return train_on_ray(
        "bi_encoder", _pairs(), recipe={"model": tiny_model, "max_length": 32},
        hparams={"epochs": epochs, "lr": 1e-3, "batch_size": 8, "warmup_ratio": 0.1, "seed": 3},
        resources=WorkerResources(num_workers=1, use_gpu=False, cpus_per_worker=1, checkpoint_every=0.25,
                                  max_failures=max_failures),
        storage_dir=tmp_path / "ray_train", out_dir=tmp_path / name, name=name,
        executor=choose_executor(hosts, 1, False, str(tmp_path / "ray_train")),
    )


def test_a_killed_host_resumes_on_a_new_one_with_the_worker_groups_model(ray_local, tiny_model, tmp_path,
                                                                          monkeypatch):
    clean = _train(tiny_model, tmp_path, "worker-group")  # no hosts: Ray Train's worker group
    assert clean["storage_filesystem"] == "local" and clean["resumed_from_step"] == 0
    pool = workers.HostPool()
    try:
        flag = tmp_path / "fault-fired"
        # 18 steps, a checkpoint every 4: the host dies at step 10, after the checkpoint at step 8.
        stats = _train(tiny_model, tmp_path, "host", fault=CrashAt(rank=0, step=10, flag=str(flag)), hosts=pool,
                       monkeypatch=monkeypatch)
        assert flag.read_text() == "10" and pool.started == 2  # the fault fired; a new host took over
        assert stats["steps"] == 18 and stats["resumed_from_step"] == 8
        checkpoints = sorted(p.name for p in (tmp_path / "ray_train" / "host").glob("checkpoint_*"))
        assert checkpoints == ["checkpoint_000000016", "checkpoint_000000018"]  # written where a resume finds them
        with pytest.raises(TrainingError) as err:
            _train(tiny_model, tmp_path, "no-retries", epochs=1, max_failures=0,
                   fault=CrashAt(rank=0, step=2, flag=str(tmp_path / "flag")), hosts=pool,
                   monkeypatch=monkeypatch)
        assert not err.value.permanent and "no restart left (training.max_failures=0)" in str(err.value)
        assert not (tmp_path / "no-retries").exists()
        attempts = tmp_path / "attempts"
        with pytest.raises(TrainingError) as err:  # an error no retry can fix: one attempt
            _train(tiny_model, tmp_path, "doomed", epochs=1,
                   fault=RaiseAt(rank=0, step=1, flag=str(attempts), message="labels and model do not fit"), hosts=pool,
                   monkeypatch=monkeypatch)
        assert err.value.permanent and attempts.read_text() == "1\n"
        assert "ValueError: labels and model do not fit" in str(err.value)
    finally:
        pool.close()
    a = load_file(tmp_path / "host" / "model.safetensors")
    b = load_file(tmp_path / "worker-group" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
