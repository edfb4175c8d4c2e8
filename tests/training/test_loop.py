"""The training loop: data sharding, and real (tiny) fine-tuning of both recipes."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import make_sentence

from augsbert_ray.labeling import score_pairs
from augsbert_ray.progress.messages import lines_to
from augsbert_ray.models import load_cross_encoder
from augsbert_ray.training.loop import HParams, rank_batch_size, shard_order, steps_per_epoch, train_pairs
from augsbert_ray.training.recipes import BiEncoderRecipe, CrossEncoderRecipe, make_recipe

# --- shard_order / steps_per_epoch ------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_partition_the_rows_when_divisible(world):
    n = 24
    shards = [shard_order(n, epoch=0, seed=5, rank=r, world=world) for r in range(world)]
    assert all(len(s) == n // world for s in shards)
    assert sorted(np.concatenate(shards).tolist()) == list(range(n))  # disjoint and complete


@pytest.mark.parametrize("n,world", [(10, 3), (7, 4), (25, 2), (1, 3)])
def test_shards_are_padded_to_equal_length_when_not_divisible(n, world):
    shards = [shard_order(n, epoch=1, seed=5, rank=r, world=world) for r in range(world)]
    per_rank = -(-n // world)
    assert [len(s) for s in shards] == [per_rank] * world
    rows = np.concatenate(shards)
    counts = np.bincount(rows, minlength=n)
    assert (counts >= 1).all()  # every row is trained on
    assert counts.max() - counts.min() <= 1  # padding wraps around: no row is favoured twice over


def test_shard_order_is_seeded_and_changes_with_epoch_and_seed():
    a = shard_order(50, epoch=0, seed=1, rank=0, world=1)
    np.testing.assert_array_equal(a, shard_order(50, epoch=0, seed=1, rank=0, world=1))
    assert sorted(a.tolist()) == list(range(50))
    assert not np.array_equal(a, np.arange(50))  # shuffled
    assert not np.array_equal(a, shard_order(50, epoch=1, seed=1, rank=0, world=1))
    assert not np.array_equal(a, shard_order(50, epoch=0, seed=2, rank=0, world=1))


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_more_workers_split_the_batch_and_keep_the_schedule(world):
    # batch_size is the global batch: the steps of an epoch do not depend on the workers.
    rb = rank_batch_size(16, world)
    assert rb * world == 16 and steps_per_epoch(160, rb, world) == steps_per_epoch(160, 16, 1) == 10
    assert rank_batch_size(16, 3) == 6 and rank_batch_size(2, 4) == 1


@pytest.mark.parametrize("n,batch,world,expected", [(24, 8, 1, 3), (25, 8, 1, 4), (25, 8, 2, 2), (1, 8, 4, 1), (16, 8, 2, 1)])
def test_steps_per_epoch(n, batch, world, expected):
    assert steps_per_epoch(n, batch, world) == expected
    shard = shard_order(n, epoch=0, seed=0, rank=0, world=world)
    assert len(range(0, len(shard), batch)) == expected  # what the loop actually iterates


# --- train_pairs on a tiny model ----------------------------------------------------------

# Off-topic sentences: a 2-layer random BERT learns "same sentence vs. unrelated news" in a
# few dozen steps, while telling two near-identical templated sentences apart takes far more.
UNRELATED = [
    "Stock markets fell sharply on Monday.",
    "The senate passed the budget bill.",
    "Oil prices rose again overnight.",
    "Heavy rain is expected across the north.",
]


# One intra-op thread (tests/conftest.py): faster on a small shared CPU, the same reductions every run.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _toy_pairs(n: int = 24, seed: int = 3) -> tuple[list[str], list[str], np.ndarray]:
    """Half identical pairs (label 1), half a sentence with an unrelated one (label 0)."""
    rng = random.Random(seed)
    s1, s2, labels = [], [], []
    for i in range(n):
        a = make_sentence(rng)
        b, y = (a, 1.0) if i % 2 == 0 else (UNRELATED[i // 2 % len(UNRELATED)], 0.0)
        s1.append(a)
        s2.append(b)
        labels.append(y)
    return s1, s2, np.array(labels, dtype=np.float32)


def _recipe(kind: str, model: str):
    return BiEncoderRecipe(model=model, max_length=32) if kind == "bi" else CrossEncoderRecipe(model=model, max_length=64)


def _full_loss(recipe, module, s1, s2, labels) -> float:
    was_training = module.training
    module.eval()
    with torch.no_grad():
        loss = recipe.loss(module, s1, s2, torch.from_numpy(labels)).item()
    module.train(was_training)
    return loss


def _state(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# The cross-encoder's fresh head starts at logit ~0 and Adam moves it ~lr per step, so it
# gets a larger rate than the bi-encoder, whose cosine reacts to every weight at once.
HPARAMS = {
    "bi": HParams(epochs=8, lr=1e-3, batch_size=8, warmup_ratio=0.1, seed=11),
    "cross": HParams(epochs=20, lr=3e-3, batch_size=8, warmup_ratio=0.1, seed=11),
}


@pytest.mark.parametrize("kind", ["bi", "cross"])
def test_train_pairs_learns_and_is_reproducible(tiny_model, kind):
    s1, s2, labels = _toy_pairs()
    HP = HPARAMS[kind]

    # The model train_pairs starts from: same seed, same build (the cross-encoder's head is random).
    torch.manual_seed(HP.seed)
    start = _recipe(kind, tiny_model)
    initial = _full_loss(start, start.build("cpu"), s1, s2, labels)

    lines: list[str] = []
    recipe = _recipe(kind, tiny_model)
    with lines_to(lines.append):  # the loop logs its progress lines
        module, stats = train_pairs(recipe, s1, s2, labels, HP, name=kind)
    final = _full_loss(recipe, module, s1, s2, labels)
    assert final < 0.5 * initial, (initial, final)
    assert stats["steps"] == steps_per_epoch(len(labels), HP.batch_size, 1) * HP.epochs == 3 * HP.epochs
    assert stats["train_pairs"] == 24 and np.isfinite(stats["final_loss"])
    assert lines and all(line.startswith(f"[{kind}] epoch") for line in lines)
    assert f"step {stats['steps']}/{stats['steps']}" in lines[-1]

    # Same seed: bit-identical weights. Another seed: different ones (so the comparison can fail).
    again, _ = train_pairs(_recipe(kind, tiny_model), s1, s2, labels, HP)
    other, _ = train_pairs(
        _recipe(kind, tiny_model), s1, s2, labels, HParams(**{**HP.to_dict(), "seed": HP.seed + 1})
    )
    first, second, third = _state(module), _state(again), _state(other)
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key
    assert any(not torch.equal(first[k], third[k]) for k in first if first[k].is_floating_point())


def test_bi_encoder_save_loads_in_sentence_transformers(tiny_model, tmp_path, capfd):
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    s1, s2, labels = _toy_pairs(8)
    recipe = make_recipe("bi_encoder", model=tiny_model, max_length=32)
    module, _ = train_pairs(recipe, s1, s2, labels, HParams(epochs=1, lr=1e-3, batch_size=4, warmup_ratio=0.0, seed=0))
    out = tmp_path / "bi"
    capfd.readouterr()
    recipe.save(module, str(out))
    # No "Writing model shards" bar (in a Ray worker it reaches the terminal late), and the
    # setting is as it was.
    assert "Writing model shards" not in capfd.readouterr().err and hf_logging.is_progress_bar_enabled()
    loaded = SentenceTransformer(str(out), device="cpu")
    module.eval()
    expected = module.st.encode(s1, convert_to_numpy=True)
    got = loaded.encode(s1, convert_to_numpy=True)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # The trained weights were saved, not the starting ones.
    untrained = SentenceTransformer(tiny_model, device="cpu").encode(s1, convert_to_numpy=True)
    assert not np.allclose(untrained, got, atol=1e-6)


class _Wrapped(torch.nn.Module):
    """Stands in for DistributedDataParallel: the model lives in ``.module``."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_cross_encoder_save_loads_in_sentence_transformers_and_predicts_sigmoid(tiny_model, tmp_path):
    from sentence_transformers import CrossEncoder

    s1, s2, labels = _toy_pairs(8)
    recipe = make_recipe("cross_encoder", model=tiny_model, max_length=64)
    module, _ = train_pairs(recipe, s1, s2, labels, HParams(epochs=1, lr=1e-3, batch_size=4, warmup_ratio=0.0, seed=0),
                            wrap=_Wrapped)
    assert isinstance(module, _Wrapped)
    out = tmp_path / "cross"
    recipe.save(module, str(out))  # unwraps, as it must for a DDP-wrapped model

    predicted = CrossEncoder(str(out), device="cpu").predict(list(zip(s1, s2)), convert_to_numpy=True)
    predicted = np.asarray(predicted, dtype=np.float64).reshape(-1)
    assert predicted.shape == (8,) and ((predicted >= 0) & (predicted <= 1)).all()

    model, tokenizer = load_cross_encoder(str(out))
    model.eval()
    scored = score_pairs(model, tokenizer, s1, s2, micro_batch_size=3, max_length=64)
    np.testing.assert_allclose(predicted, scored, atol=1e-5)

    # Both are sigmoid of the trained module's raw logit.
    inner = module.module.eval()
    enc = tokenizer(s1, s2, truncation=True, max_length=64, padding=True, return_tensors="pt")
    with torch.no_grad():
        raw = inner(**enc).logits.reshape(-1)
    np.testing.assert_allclose(scored, torch.sigmoid(raw).numpy(), atol=1e-5)
    assert len(np.unique(np.round(scored, 6))) > 1  # a real function of the pair, not a constant


def test_train_pairs_rank_trains_on_its_shard_only(tiny_model):
    s1, s2, labels = _toy_pairs(10)
    hp = HParams(epochs=2, lr=1e-3, batch_size=4, warmup_ratio=0.0, seed=0)
    _, stats = train_pairs(CrossEncoderRecipe(model=tiny_model, max_length=64), s1, s2, labels, hp,
                           rank=1, world=3)
    # 10 rows over 3 ranks: 4 each; the global batch of 4 is 2 a rank: 2 steps an epoch
    assert stats["steps"] == steps_per_epoch(10, rank_batch_size(4, 3), 3) * 2 == 4


def test_train_pairs_rejects_empty_data(tiny_model):
    hp = HParams(epochs=1, lr=1e-3, batch_size=4, warmup_ratio=0.0, seed=0)
    with pytest.raises(ValueError, match="teacher: no training pairs"):
        train_pairs(CrossEncoderRecipe(model=tiny_model), [], [], np.array([]), hp, name="teacher")


def test_make_recipe_builds_by_name_and_rejects_unknown_names():
    assert make_recipe("bi_encoder", model="m", num_layers=2) == BiEncoderRecipe(model="m", num_layers=2)
    assert make_recipe("cross_encoder", model="m") == CrossEncoderRecipe(model="m")
    with pytest.raises(ValueError, match=r"unknown recipe 'student'; valid: bi_encoder, cross_encoder"):
        make_recipe("student", model="m")


@pytest.mark.parametrize("objective", ["softmax", "contrastive"])
def test_binary_objectives_train_and_save_only_the_encoder(tiny_model, tmp_path, objective):
    from sentence_transformers import SentenceTransformer

    s1, s2, labels = _toy_pairs(8)
    labels = (np.asarray(labels) >= 0.5).astype(np.float32)
    recipe = make_recipe("bi_encoder", model=tiny_model, max_length=32, objective=objective)
    module, stats = train_pairs(recipe, s1, s2, labels, HParams(epochs=2, lr=1e-3, batch_size=4, warmup_ratio=0.0, seed=0))
    assert (module.head is not None) == (objective == "softmax")
    assert np.isfinite(stats["final_loss"])
    recipe.save(module, str(tmp_path / "bi"))
    assert SentenceTransformer(str(tmp_path / "bi"), device="cpu").encode(["A man."]).shape == (1, 32)


def test_unknown_objective_is_rejected(tiny_model):
    with pytest.raises(ValueError, match="valid: angle, angle-distill, contrastive, cosent, cosent-distill, cosine, softmax"):
        make_recipe("bi_encoder", model=tiny_model, objective="triplet").build("cpu")


class _SilverSpy:
    """A recipe without a transformer that records the silver flags each batch's loss is given."""

    def __init__(self):
        self.seen: list[tuple[list[str], list[bool] | None]] = []

    def build(self, device):
        return torch.nn.Linear(1, 1)

    def loss(self, module, s1, s2, labels, silver=None):
        self.seen.append((list(s1), None if silver is None else silver.tolist()))
        return module.weight.sum() * labels.mean()


def test_the_loop_hands_each_batch_its_own_silver_flags():
    s1 = [f"s{i}" for i in range(10)]
    silver = np.array([i % 3 == 0 for i in range(10)])
    spy = _SilverSpy()
    hp = HParams(epochs=2, lr=1e-3, batch_size=4, warmup_ratio=0.0, seed=1)
    train_pairs(spy, s1, s1, np.zeros(10, np.float32), hp, silver=silver)
    assert len(spy.seen) == 6 and sorted(x for batch, _ in spy.seen[:3] for x in batch) == sorted(s1)
    for batch, flags in spy.seen:  # shuffled rows, each with its own flag
        assert flags == [int(x[1:]) % 3 == 0 for x in batch]
    plain = _SilverSpy()
    train_pairs(plain, s1, s1, np.zeros(10, np.float32), hp)
    assert all(flags is None for _, flags in plain.seen)  # pairs that do not say: no flags
    with pytest.raises(ValueError, match="3 silver flags for 10 pairs"):
        train_pairs(_SilverSpy(), s1, s1, np.zeros(10, np.float32), hp, silver=silver[:3])


@pytest.mark.parametrize("objective", ["angle-distill"])  # the ranking losses alone: test_objectives.py
def test_regression_objectives_learn_and_distillation_needs_the_silver_flags(tiny_model, objective):
    s1, s2, labels = _toy_pairs(16)
    silver = np.arange(16) % 2 == 1
    hp = HParams(epochs=6, lr=1e-3, batch_size=8, warmup_ratio=0.0, seed=2)
    recipe = make_recipe("bi_encoder", model=tiny_model, max_length=32, objective=objective)
    torch.manual_seed(hp.seed)
    start = make_recipe("bi_encoder", model=tiny_model, max_length=32, objective=objective)
    flags = torch.from_numpy(silver) if objective.endswith("-distill") else None
    module = start.build("cpu")
    with torch.no_grad():
        initial = start.loss(module, s1, s2, torch.from_numpy(labels), silver=flags).item()
    module, _ = train_pairs(recipe, s1, s2, labels, hp, silver=silver)
    with torch.no_grad():
        final = recipe.loss(module, s1, s2, torch.from_numpy(labels), silver=flags).item()
    assert final < 0.5 * initial, (initial, final)
    if objective.endswith("-distill"):
        with pytest.raises(ValueError, match="needs to know which pairs are silver"):
            recipe.loss(module, s1, s2, torch.from_numpy(labels))


@pytest.mark.parametrize("kind,precision,grouping", [("bi", "fp32", 0), ("cross", "fp32", 0), ("bi", "bf16", 0),
                                                    ("cross", "fp32", 2)])
def test_stopped_and_resumed_training_equals_an_uninterrupted_run(tiny_model, tmp_path, kind, precision, grouping):
    """Weights, optimizer, schedule, data order and dropout RNG all carry over a resume."""
    from augsbert_ray.training.loop import PairTrainer

    s1, s2, labels = _toy_pairs()
    hp = HParams(**{**HPARAMS[kind].to_dict(), "epochs": 3, "precision": precision, "length_grouping": grouping})
    straight = PairTrainer(_recipe(kind, tiny_model), s1, s2, labels, hp)
    straight.run()

    first = PairTrainer(_recipe(kind, tiny_model), s1, s2, labels, hp)
    first.run(until=4)  # mid-epoch: epoch 2, batch 1
    first.save_state(tmp_path / "state.pt")
    torch.manual_seed(12345)  # a new process would start from another RNG state
    lines: list[str] = []
    resumed = PairTrainer(_recipe(kind, tiny_model), s1, s2, labels, hp, name=kind)
    resumed.load_state(tmp_path / "state.pt")
    assert resumed.step == 4
    with lines_to(lines.append):
        resumed.run()
    assert resumed.step == straight.step == 9
    assert "step 9/9" in lines[-1] and not any("step 1/" in line for line in lines)  # the counter continued
    a, b = _state(straight.module), _state(resumed.module)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.stats()["final_loss"] == pytest.approx(straight.stats()["final_loss"])
    # and a resume that lost the RNG state would not match (so the comparison can fail)
    broken = PairTrainer(_recipe(kind, tiny_model), s1, s2, labels, hp)
    broken.load_state(tmp_path / "state.pt")
    torch.manual_seed(999)
    broken.run()
    c = _state(broken.module)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_an_ended_trainings_state_has_the_model_but_no_optimizer_and_resumes_nothing(tiny_model, tmp_path):
    from augsbert_ray.training.loop import PairTrainer

    s1, s2, labels = _toy_pairs()
    hp = HParams(**{**HPARAMS["bi"].to_dict(), "epochs": 1})
    ended = PairTrainer(_recipe("bi", tiny_model), s1, s2, labels, hp)
    ended.run()
    ended.save_state(tmp_path / "end.pt")
    state = torch.load(tmp_path / "end.pt", weights_only=True)
    assert "optimizer" not in state and "scheduler" not in state and state["step"] == ended.total
    again = PairTrainer(_recipe("bi", tiny_model), s1, s2, labels, hp)
    again.load_state(tmp_path / "end.pt")
    assert again.step == again.total
    a, b = _state(ended.module), _state(again.module)
    assert all(torch.equal(a[k], b[k]) for k in a)
    longer = PairTrainer(_recipe("bi", tiny_model), s1, s2, labels, HParams(**{**hp.to_dict(), "epochs": 2}))
    with pytest.raises(ValueError, match="cannot continue a training of"):
        longer.load_state(tmp_path / "end.pt")


@pytest.mark.parametrize("kind", ["bi", "cross"])
def test_bf16_training_autocasts_the_forward_and_learns(tiny_model, kind):
    """Mixed precision: the linear layers run in bf16 while the weights stay fp32."""
    s1, s2, labels = _toy_pairs()
    hp = HParams(**{**HPARAMS[kind].to_dict(), "precision": "bf16"})
    torch.manual_seed(hp.seed)
    start = _recipe(kind, tiny_model)
    initial = _full_loss(start, start.build("cpu"), s1, s2, labels)

    from augsbert_ray.training.loop import PairTrainer

    lines: list[str] = []
    recipe = _recipe(kind, tiny_model)
    trainer = PairTrainer(recipe, s1, s2, labels, hp, name=kind)
    seen: set[torch.dtype] = set()
    linear = next(m for m in trainer.module.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    with lines_to(lines.append):
        trainer.run()
    assert seen == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in trainer.module.parameters())
    stats = trainer.stats()
    assert stats["precision"] == "bf16" and np.isfinite(stats["final_loss"])
    assert lines[-1].endswith(", bf16)")
    assert _full_loss(recipe, trainer.module, s1, s2, labels) < 0.5 * initial

    # The default stays fp32 (the same hook sees fp32 outputs).
    seen.clear()
    fp32 = PairTrainer(_recipe(kind, tiny_model), s1, s2, labels, HPARAMS[kind])
    next(m for m in fp32.module.modules() if isinstance(m, torch.nn.Linear)).register_forward_hook(
        lambda _m, _i, out: seen.add(out.dtype))
    fp32.run(until=1)
    assert seen == {torch.float32} and fp32.stats()["precision"] == "fp32"


def test_training_precision_auto_follows_the_cpu_and_rejects_unknown_values(monkeypatch):
    from augsbert_ray import scoring
    from augsbert_ray.training.loop import resolve_training_precision

    monkeypatch.setattr(scoring, "cpu_has_bf16", lambda: True)
    assert resolve_training_precision("auto", "cpu") == "bf16"
    monkeypatch.setattr(scoring, "cpu_has_bf16", lambda: False)
    assert resolve_training_precision("auto", "cpu") == "fp32"
    assert resolve_training_precision("bf16", "cpu") == "bf16"
    assert resolve_training_precision("fp32", "cpu") == "fp32"
    with pytest.raises(ValueError, match="training precision must be one of .* not 'fp16'"):
        resolve_training_precision("fp16", "cpu")


def test_length_grouped_batches_hold_every_row_once_and_cut_the_padding():
    from augsbert_ray.training.loop import length_grouped_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 60, size=1000)
    order = rng.permutation(1000)
    plain = length_grouped_batches(order, lengths, 16, 0, seed=1, epoch=0)
    assert [b.tolist() for b in plain] == [order[i:i + 16].tolist() for i in range(0, 1000, 16)]
    grouped = length_grouped_batches(order, lengths, 16, 10, seed=1, epoch=0)
    assert sorted(np.concatenate(grouped).tolist()) == list(range(1000)) and len(grouped) == len(plain)
    padded = lambda batches: sum(len(b) * lengths[b].max() for b in batches) / lengths.sum()  # noqa: E731
    assert padded(grouped) < 1.2 < padded(plain)  # about 1.1 against 1.7 here
    again = length_grouped_batches(order, lengths, 16, 10, seed=1, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(grouped, again))  # seeded
    other = length_grouped_batches(order, lengths, 16, 10, seed=1, epoch=1)
    assert not all(np.array_equal(a, b) for a, b in zip(grouped, other))  # each epoch its own batch order


def test_grouped_training_runs_the_same_steps_and_learns(tiny_model):
    from augsbert_ray.training.loop import PairTrainer

    s1, s2, labels = _toy_pairs()
    hp = HParams(**{**HPARAMS["bi"].to_dict(), "epochs": 3, "length_grouping": 2})
    trainer = PairTrainer(_recipe("bi", tiny_model), s1, s2, labels, hp)
    plain = PairTrainer(_recipe("bi", tiny_model), s1, s2, labels, HParams(**{**hp.to_dict(), "length_grouping": 0}))
    assert trainer.lengths is not None and len(trainer.lengths) == len(labels) and plain.lengths is None
    trainer.run()
    assert trainer.step == plain.total and np.isfinite(trainer.stats()["final_loss"])


def test_a_diverged_training_stops_at_the_first_read_naming_the_step_and_is_not_retried(tiny_model, tmp_path):
    from augsbert_ray.errors import TrainingError
    from augsbert_ray.training.loop import PairTrainer
    from augsbert_ray.training.ray_trainer import is_permanent

    s1, s2, labels = _toy_pairs()
    # An infinite learning rate: step 1's loss is finite, its update makes every weight NaN.
    trainer = PairTrainer(_recipe("bi", tiny_model), s1, s2, labels,
                          HParams(epochs=2, lr=float("inf"), batch_size=8, warmup_ratio=0.0, seed=1), name="student")
    with pytest.raises(TrainingError, match=r"student: the training loss is nan at step 2/6 \(epoch 1\)") as raised:
        trainer.run()
    assert is_permanent(raised.value) and raised.value.permanent
    with pytest.raises(TrainingError):  # nor can a checkpoint of it be written
        trainer.save_state(tmp_path / "state.pt")
    assert not (tmp_path / "state.pt").exists()
