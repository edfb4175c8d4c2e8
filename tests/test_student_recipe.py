"""benchmarks/student_recipe.py: its variants, the gold-only reference it compares with, and the
silver-first and symmetric-label trials, on a tiny random model and a hand-made run folder."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import load_benchmark, make_sentence

FINGERPRINT = "0123456789abcdef"


@pytest.fixture(scope="module")
def recipe():
    return load_benchmark("student_recipe")


def _pairs(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    return pa.table({"sentence1": [make_sentence(rng) for _ in range(n)],
                     "sentence2": [make_sentence(rng) for _ in range(n)],
                     "label": pa.array([rng.random() for _ in range(n)], pa.float32())})


@pytest.fixture
def run_dir(tmp_path):
    """A finished run as the script reads it: gold splits and one silver stage's labels."""
    run = tmp_path / "run"
    (run / "gold").mkdir(parents=True)
    for split, n, seed in (("train", 12, 1), ("dev", 10, 2), ("test", 10, 3)):
        pq.write_table(_pairs(n, seed), run / "gold" / f"{split}.parquet")
    (run / "stages" / "silver" / FINGERPRINT).mkdir(parents=True)
    pq.write_table(_pairs(20, 4), run / "stages" / "silver" / FINGERPRINT / "silver.parquet")
    return run


def _spec(run, model, settings, silver=True, reverse=None):
    return {"run_dir": str(run), "model": model, "num_layers": None, "device": "cpu", "threads": 1,
            "teacher_predictions": None, "variant": "v", "settings": settings, "seed": 1,
            "silver": FINGERPRINT if silver else None, "name": "v", "reverse": reverse}


def test_variants_take_the_order_and_the_labels_and_refuse_others(recipe):
    base = {"lr": 1e-4, "epochs": 1, "batch_size": 16, "warmup_ratio": 0.1, "calibration": "none",
            "gold_repeat": 1, "objective": "cosine", "order": "mixed", "labels": "teacher"}
    name, settings = recipe.parse_variant("sf:order=silver-first,labels=symmetric,gold_repeat=10", base)
    assert (name, settings["order"], settings["labels"], settings["gold_repeat"]) == ("sf", "silver-first",
                                                                                       "symmetric", 10)
    with pytest.raises(SystemExit, match="order must be one of mixed, silver-first"):
        recipe.parse_variant("x:order=gold-first", base)
    with pytest.raises(SystemExit, match="labels must be one of teacher, symmetric"):
        recipe.parse_variant("x:labels=both", base)


def test_the_gold_only_reference_depends_on_how_often_it_counts_gold(recipe):
    settings = {"lr": 1e-4, "epochs": 1, "batch_size": 16, "warmup_ratio": 0.1}
    assert recipe._gold_key({**settings, "gold_repeat": 10}, 1) != recipe._gold_key({**settings, "gold_repeat": 1}, 1)
    # rows written before the reference counted gold as AugSBERT does trained on gold once
    assert recipe._gold_key(settings, 1) == recipe._gold_key({**settings, "gold_repeat": 1}, 1)


@pytest.mark.timeout(120)
def test_silver_first_trains_silver_then_gold_as_many_steps_as_mixed(recipe, run_dir, tiny_model):
    settings = {"lr": 1e-4, "epochs": 1, "batch_size": 4, "warmup_ratio": 0.1, "calibration": "none",
                "gold_repeat": 3, "objective": "cosine", "order": "mixed", "labels": "teacher"}
    mixed = recipe.trial(_spec(run_dir, tiny_model, settings))
    first = recipe.trial(_spec(run_dir, tiny_model, {**settings, "order": "silver-first"}))
    gold_only = recipe.trial(_spec(run_dir, tiny_model, settings, silver=False))
    # 20 silver pairs and 12 gold pairs counted 3 times: 56 in one training, or 20 then 36
    assert mixed["train_pairs"] == first["train_pairs"] == 56
    assert (mixed["steps"], first["steps"]) == (14, 5 + 9)
    assert gold_only["train_pairs"] == 36  # the reference counts gold as AugSBERT does
    assert first["preds"]["test"] != mixed["preds"]["test"]  # another model, not the mixed one again


@pytest.mark.timeout(120)
def test_symmetric_labels_score_each_silver_pair_the_other_way_round(recipe, run_dir, tiny_cross_encoder, tmp_path):
    from augsbert_ray.models import load_cross_encoder
    from augsbert_ray.scoring import prepare_model, score_pairs

    shutil.copytree(tiny_cross_encoder, run_dir / "models" / "cross-encoder")
    out = tmp_path / "out" / "trials"
    out.parent.mkdir()
    path = recipe.reverse_scores(run_dir, FINGERPRINT, out, "cpu")
    silver = pq.read_table(run_dir / "stages" / "silver" / FINGERPRINT / "silver.parquet")
    model, tok = load_cross_encoder(tiny_cross_encoder)
    expected = score_pairs(prepare_model(model, "fp32", "cpu"), tok, silver.column("sentence2").to_pylist(),
                           silver.column("sentence1").to_pylist())
    np.testing.assert_allclose(pq.read_table(path).column("score").to_numpy(), expected, rtol=1e-5, atol=1e-6)
    assert recipe.reverse_scores(run_dir, FINGERPRINT, out, "cpu") == path  # written once, then read

    orders = recipe.symmetric_teacher(run_dir, "cpu")
    assert set(orders) == {"dev", "test"} and -1 <= orders["test"]["orders_agree"] <= 1
