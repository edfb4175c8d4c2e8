"""Score distillation needs each row's origin: a student's training set carries it through Ray
Train to the loss (the loss raises without it, so a lost column would fail the run)."""

from __future__ import annotations

import random

import pyarrow as pa
from conftest import make_sentence

from augsbert_ray import schema
from augsbert_ray.stages.student import student_training_set
from augsbert_ray.training.ray_trainer import WorkerResources, train_on_ray


def _pairs(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    return pa.table({schema.SENTENCE1: [make_sentence(rng) for _ in range(n)],
                     schema.SENTENCE2: [make_sentence(rng) for _ in range(n)],
                     schema.LABEL: pa.array([rng.random() for _ in range(n)], pa.float32())})


def test_distillation_trains_on_ray_with_the_training_sets_silver_flags(ray_local, tiny_model, tmp_path):
    train = student_training_set(_pairs(6, 1), _pairs(10, 2), "regression", gold_repeat=2)
    assert schema.silver_flags(train).sum() == 10
    stats = train_on_ray(
        "bi_encoder", train, recipe={"model": tiny_model, "max_length": 32, "objective": "cosent-distill"},
        hparams={"epochs": 1, "lr": 1e-3, "batch_size": 8, "warmup_ratio": 0.1, "seed": 3},
        resources=WorkerResources(1, False, 1, checkpoint_every=0, max_failures=0),
        storage_dir=tmp_path / "ray_train", out_dir=tmp_path / "out", name="distilled")
    assert stats["steps"] == 3 and stats["train_pairs"] == 22
    assert (tmp_path / "out" / "model.safetensors").exists()
