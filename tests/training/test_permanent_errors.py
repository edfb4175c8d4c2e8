"""Training errors that no retry can fix reach the user once, as one line, without Ray Train's
restarts; transient faults keep them (tests/chaos/test_training_failure.py)."""

from __future__ import annotations

import random
import time

import pyarrow as pa
import pytest
from conftest import make_sentence
from safetensors import SafetensorError

from augsbert_ray.errors import DataError, ModelError, TrainingError
from augsbert_ray.testing import RaiseAt, inject_training_fault
from augsbert_ray.training.ray_trainer import WorkerResources, describe_error, is_permanent, train_on_ray


@pytest.mark.parametrize("error", [
    DataError("x.csv", 3, "label", "out of range"), ModelError("m: no config.json"), ValueError("no training pairs"),
    TypeError("bad argument"), KeyError("label"), FileNotFoundError(2, "No such file", "m/config.json"),
    RuntimeError("Error(s) in loading state_dict for BertModel: size mismatch for embeddings"),
    OSError("m does not appear to have a file named config.json"), SafetensorError("incomplete metadata"),
])
def test_errors_that_recur_on_every_attempt_are_permanent(error):
    assert is_permanent(error)


@pytest.mark.parametrize("error", [
    RuntimeError("NCCL error: unhandled system error"), OSError(104, "Connection reset by peer"),
    MemoryError(), ConnectionError("hub unreachable"), SystemError("worker died"),
])
def test_faults_that_may_pass_are_transient(error):
    assert not is_permanent(error)


def test_an_error_is_described_on_one_line():
    assert describe_error(ValueError("first line\nsecond line")) == "ValueError: first line"
    assert describe_error(KeyError()) == "KeyError"


def _pairs(n: int = 16) -> pa.Table:
    rng = random.Random(5)
    rows = [(make_sentence(rng), make_sentence(rng), rng.random()) for _ in range(n)]
    return pa.table({"sentence1": [r[0] for r in rows], "sentence2": [r[1] for r in rows],
                     "label": pa.array([r[2] for r in rows], pa.float32())})


@pytest.mark.timeout(120)
def test_a_permanent_error_in_the_training_loop_is_raised_once_without_restarts(ray_local, tiny_model, tmp_path,
                                                                                 monkeypatch):
    flag = tmp_path / "attempts"
    inject_training_fault(monkeypatch, RaiseAt(rank=0, step=1, flag=str(flag), message="labels and model do not fit"))
    t0 = time.perf_counter()
    with pytest.raises(TrainingError) as info:
        train_on_ray(
            "bi_encoder", _pairs(), recipe={"model": tiny_model, "max_length": 32},
            hparams={"epochs": 1, "lr": 1e-3, "batch_size": 8, "warmup_ratio": 0.1, "seed": 3},
            resources=WorkerResources(1, False, 1, checkpoint_every=0.5, max_failures=2),
            storage_dir=tmp_path / "ray_train", out_dir=tmp_path / "out", name="doomed",
        )
    seconds = time.perf_counter() - t0
    message = str(info.value)
    assert info.value.permanent and flag.read_text() == "1\n", "raised on the first attempt, and never retried"
    assert "\n" not in message and "ValueError: labels and model do not fit" in message
    saved = tmp_path / "ray_train" / "doomed.error.txt"
    assert f"the traceback is in {saved}" in message and "Traceback" in saved.read_text()
    assert not (tmp_path / "out").exists()
    print(f"permanent error reported in {seconds:.1f}s")
