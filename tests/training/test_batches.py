"""Pre-tokenised batches: the same tensors as tokenising each batch, the same trained weights."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import make_sentence

from augsbert_ray.training.batches import TokenRows
from augsbert_ray.training.loop import HParams, PairTrainer
from augsbert_ray.training.recipes import BiEncoderRecipe, CrossEncoderRecipe


# One intra-op thread (tests/conftest.py): faster on a small shared CPU, the same reductions every run.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pairs(n: int, seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    rng = random.Random(seed)
    # Sentences of very different lengths, some past max_length, so batches need padding and truncation.
    s1 = [" ".join(make_sentence(rng) for _ in range(rng.randint(1, 6))) for _ in range(n)]
    s2 = [make_sentence(rng) for _ in range(n)]
    return s1, s2, np.array([rng.random() for _ in range(n)], dtype=np.float32)


def _recipe(kind: str, model: str):
    return BiEncoderRecipe(model=model, max_length=24) if kind == "bi" else CrossEncoderRecipe(model=model, max_length=40)


def _tokenized_batch(recipe, s1, s2) -> dict:
    """What ``loss`` tokenises for a batch (the path without pre-tokenising)."""
    if isinstance(recipe, BiEncoderRecipe):
        return dict(recipe._st.tokenize(list(s1) + list(s2)))
    return dict(recipe._encode(s1, s2))


@pytest.mark.parametrize("kind,side", [("bi", "right"), ("cross", "right"), ("cross", "left")])
def test_padding_pretokenised_rows_equals_tokenising_the_batch(tiny_model, kind, side):
    s1, s2, _ = _pairs(40)
    recipe = _recipe(kind, tiny_model)
    recipe.build("cpu")
    tokenizer = recipe._st.tokenizer if kind == "bi" else recipe._tokenizer
    tokenizer.padding_side = side
    rows = recipe.pretokenize(s1, s2)
    assert rows.left == (side == "left") and len(rows) == (80 if kind == "bi" else 40)
    rng = np.random.default_rng(1)
    for size in (1, 3, 16, 40):
        idx = rng.permutation(40)[:size]
        got = rows.batch(recipe.batch_rows(idx, 40))
        want = _tokenized_batch(recipe, [s1[i] for i in idx], [s2[i] for i in idx])
        assert got.keys() == want.keys()
        for key, value in want.items():
            if torch.is_tensor(value):
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), (key, size)
            else:
                assert got[key] == value
    # Padding really happened (so the comparison covers it): rows of different lengths.
    assert len(set(rows.lengths.tolist())) > 3


def test_token_rows_reject_outputs_that_are_not_per_token():
    chunk = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3, dtype=torch.long),
             "prompt_length": torch.ones(2, dtype=torch.long)}
    with pytest.raises(ValueError, match="'prompt_length' has shape"):
        TokenRows.from_padded([chunk], pad_id=0)


class _TokenisingEachBatch:
    """A recipe without ``pretokenize``: the loop tokenises each batch through ``loss``, as it
    did before batches were pre-tokenised."""

    def __init__(self, recipe):
        self.recipe = recipe

    def build(self, device):
        return self.recipe.build(device)

    def loss(self, module, s1, s2, labels, silver=None):
        return self.recipe.loss(module, s1, s2, labels, silver=silver)

    def lengths(self, s1, s2):
        return self.recipe.lengths(s1, s2)


@pytest.mark.parametrize("kind,grouping,objective", [("cross", 2, None), ("bi", 2, "cosent-distill")])
def test_pretokenised_training_gives_the_same_weights_as_tokenising_each_batch(tiny_model, kind, grouping, objective):
    s1, s2, labels = _pairs(16, seed=2)
    silver = np.arange(16) % 3 == 0 if objective == "cosent-distill" else None
    hp = HParams(epochs=1, lr=1e-3, batch_size=4, warmup_ratio=0.1, seed=4, length_grouping=grouping)

    def recipe():
        r = _recipe(kind, tiny_model)
        return BiEncoderRecipe(model=r.model, max_length=r.max_length, objective=objective) if objective else r

    # One after the other: each seeds the global RNG that dropout draws from.
    new = PairTrainer(recipe(), s1, s2, labels, hp, silver=silver)
    new.run()
    old = PairTrainer(_TokenisingEachBatch(recipe()), s1, s2, labels, hp, silver=silver)
    old.run()
    assert new.tokens is not None and old.tokens is None
    # The pre-tokenised path takes its lengths from its rows: the same as the recipe's own.
    assert np.array_equal(new.lengths, old.lengths) and len(set(new.lengths.tolist())) > 1
    a, b = new.module.state_dict(), old.module.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert new.stats()["final_loss"] == old.stats()["final_loss"]
    start = recipe()
    torch.manual_seed(hp.seed)
    untrained = start.build("cpu").state_dict()  # the comparison can fail: training moved the weights
    assert not all(torch.equal(a[k], untrained[k]) for k in a if a[k].is_floating_point())


def test_losses_are_read_at_log_points_only(tiny_model):
    s1, s2, labels = _pairs(16)
    hp = HParams(epochs=10, lr=1e-3, batch_size=4, warmup_ratio=0.0, seed=0)
    trainer = PairTrainer(_recipe("cross", tiny_model), s1, s2, labels, hp)
    trainer.run(until=5)  # log points every 4 steps: step 4 read, step 5 still on the device
    assert len(trainer.losses) == 4 and len(trainer._pending) == 1
    final = trainer.stats()["final_loss"]  # reads the rest: the last log_every losses
    assert len(trainer.losses) == 4 and not trainer._pending and final == pytest.approx(np.mean(trainer.losses))


def test_st_features_equal_tokenize_without_its_deprecation_warning(tiny_model, caplog):
    from augsbert_ray.training.recipes import st_features

    recipe = _recipe("bi", tiny_model)
    recipe.build("cpu")
    s1, s2, _ = _pairs(8)
    with caplog.at_level("WARNING"):
        got = st_features(recipe._st, s1 + s2)
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]
    want = recipe._st.tokenize(s1 + s2)  # the older name: the same features
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], v) if torch.is_tensor(v) else got[k] == v for k, v in want.items())

    class Older:  # a release without preprocess
        def tokenize(self, texts):
            return {"n": len(texts)}

    assert st_features(Older(), ["a", "b"]) == {"n": 2}


def test_each_logged_step_carries_its_loss_and_learning_rate_for_tracking(tiny_model, caplog):
    import logging

    from augsbert_ray.tracking.points import point_of

    s1, s2, labels = _pairs(16)
    hp = HParams(epochs=10, lr=1e-3, batch_size=4, warmup_ratio=0.0, seed=0)
    trainer = PairTrainer(_recipe("cross", tiny_model), s1, s2, labels, hp, name="cross-encoder")
    with caplog.at_level(logging.INFO, logger="augsbert_ray.training.loop"):
        trainer.run(until=4)
        losses = list(trainer.losses)
        trainer.run(until=8)  # log points every 4 of the 40 steps
    points = [p for p in map(point_of, caplog.records) if p is not None]
    assert [(p["model"], p["step"], p["epoch"]) for p in points] == [("cross-encoder", 4, 1), ("cross-encoder", 8, 2)]
    assert points[0]["loss"] == pytest.approx(np.mean(losses)) and points[1]["loss"] == pytest.approx(
        np.mean(trainer.losses))
    # the learning rate the step took: linear decay from 1e-3 without warmup (step s uses (40 - s + 1) / 40)
    assert [p["lr"] for p in points] == pytest.approx([1e-3 * 37 / 40, 1e-3 * 33 / 40])
