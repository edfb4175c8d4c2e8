"""Chaos: a Ray Train worker dies mid-training; the worker group restarts from the latest
checkpoint and finishes with the same model as a run that never failed."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from conftest import make_sentence
from safetensors.torch import load_file

from augsbert_ray.errors import TrainingError
from augsbert_ray.testing import CrashAt, inject_training_fault
from augsbert_ray.training.ray_trainer import WorkerResources, train_on_ray

pytestmark = pytest.mark.slow


def _pairs(n: int = 48) -> pa.Table:
    rng = random.Random(5)
    rows = [(make_sentence(rng), make_sentence(rng), rng.random()) for _ in range(n)]
    return pa.table({"sentence1": [r[0] for r in rows], "sentence2": [r[1] for r in rows],
                     "label": pa.array([r[2] for r in rows], pa.float32())})


def _train(tiny_model, tmp_path, name) -> dict:
    return train_on_ray(
        "bi_encoder", _pairs(), recipe={"model": tiny_model, "max_length": 32},
        hparams={"epochs": 3, "lr": 1e-3, "batch_size": 8, "warmup_ratio": 0.1, "seed": 3},
        resources=WorkerResources(num_workers=1, use_gpu=False, cpus_per_worker=1, checkpoint_every=0.25,
                                  max_failures=2),
        storage_dir=tmp_path / "ray_train", out_dir=tmp_path / name, name=name,
    )


def test_a_killed_training_worker_resumes_from_its_checkpoint(ray_local, tiny_model, tmp_path, monkeypatch):
    flag = tmp_path / "fault-fired"
    # 18 steps (6 per epoch), checkpoints every round(0.25 x 18) = 4 steps: the worker dies at
    # step 10, two steps after the checkpoint at step 8.
    with monkeypatch.context() as faulty:
        inject_training_fault(faulty, CrashAt(rank=0, step=10, flag=str(flag)))
        stats = _train(tiny_model, tmp_path, "faulty")
    assert flag.read_text() == "10"  # the fault fired
    # Resumed, not restarted: from the latest checkpoint Ray Train had registered when the
    # worker died (step 8, or step 4 if the report at step 8 was still in flight).
    assert stats["steps"] == 18 and stats["resumed_from_step"] in (4, 8)
    from ray._private import state  # the GCS's actor table (no dashboard in tests)

    before = set(state.actors())
    clean = _train(tiny_model, tmp_path, "clean")
    assert clean["resumed_from_step"] == 0
    # The run started none of the Ray Train helpers it has no use for: a dataset manager (no
    # datasets are passed) and, on this one-node Ray, a placement-group cleaner.
    started = {a["ActorClassName"].rsplit(".", 1)[-1] for k, a in state.actors().items() if k not in before}
    assert "RayTrainWorker" in started and not started & {"DatasetManager", "PlacementGroupCleaner"}, started
    a = load_file(tmp_path / "faulty" / "model.safetensors")
    b = load_file(tmp_path / "clean" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)  # the same model as without the fault


def test_failures_beyond_the_limit_fail_the_stage(ray_local, tiny_model, tmp_path, monkeypatch):
    # max_failures=0: the first crash ends training with the engine's TrainingError naming the limit,
    # not a hang, a partial model or Ray Train's own exception.
    inject_training_fault(monkeypatch, CrashAt(rank=0, step=2, flag=str(tmp_path / "flag")))
    with pytest.raises(TrainingError) as err:
        train_on_ray(
            "bi_encoder", _pairs(), recipe={"model": tiny_model, "max_length": 32},
            hparams={"epochs": 1, "lr": 1e-3, "batch_size": 8, "warmup_ratio": 0.1, "seed": 3},
            resources=WorkerResources(1, False, 1, checkpoint_every=0.5, max_failures=0),
            storage_dir=tmp_path / "ray_train", out_dir=tmp_path / "out", name="no-retries",
        )
    assert not err.value.permanent  # a crash is transient: it was retried as far as the limit allowed
    assert "no restart left (training.max_failures=0)" in str(err.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert not (tmp_path / "out").exists()
