import numpy as np
import pytest
from scipy.stats import spearmanr

from augsbert_ray.evaluation import cosine_scores, spearman100


def test_spearman100_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.random(50), rng.random(50)
    assert spearman100(a, b) == pytest.approx(spearmanr(a, b).statistic * 100)
    assert spearman100(a, a) == pytest.approx(100)
    assert spearman100(a, -a) == pytest.approx(-100)
    with pytest.raises(ValueError):
        spearman100(a[:1], b[:1])


def test_spearman100_equals_scipy_with_ties():
    # STSb labels come in steps of 0.2 and a model's scores can tie: ties share their mean rank,
    # and the result is scipy's to the bit, so no reported score moves.
    rng = np.random.default_rng(1)
    for n in (2, 3, 17, 1500):
        gold = rng.integers(0, 26, n) / 5
        pred = np.round(rng.normal(size=n), 1)
        assert spearman100(pred, gold) == spearmanr(pred, gold).statistic * 100


def test_spearman_of_a_collapsed_model_is_nan_and_named():
    import warnings

    from augsbert_ray.evaluation import undefined_scores

    gold = np.linspace(0, 1, 20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no scipy warning: the engine names the cause itself
        assert np.isnan(spearman100(np.full(20, 0.5), gold))
        assert np.isnan(spearman100(gold, np.full(20, 0.5)))
    scores = {"dev": {"spearman": float("nan")}, "test": {"spearman": 40.0}}
    reasons = undefined_scores(scores, "spearman", {"dev": np.full(20, 0.5), "test": gold})
    assert reasons == ["dev: the model gave all 20 pairs the same score (0.5)"]


class FakeEncoder:
    """Embeds a sentence as a fixed vector, to check the cosine bookkeeping."""

    vectors = {"a": [1.0, 0.0], "b": [0.0, 2.0], "c": [1.0, 1.0]}

    def __init__(self):
        self.calls = []

    def encode(self, texts, normalize_embeddings, **kw):
        self.calls.append(list(texts))
        v = np.array([self.vectors[t] for t in texts], dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True) if normalize_embeddings else v


def test_cosine_scores_embed_each_sentence_once():
    enc = FakeEncoder()
    scores = cosine_scores(enc, ["a", "a", "c"], ["b", "c", "c"])
    np.testing.assert_allclose(scores, [0.0, np.sqrt(0.5), 1.0], atol=1e-6)
    assert sorted(enc.calls[0]) == ["a", "b", "c"]


from augsbert_ray.evaluation import best_f1_threshold, binary_metrics, f1_accuracy, jaccard_predictions, majority_metrics


def brute_force_best_threshold(scores, gold):
    best = (-1.0, None)
    for t in sorted(set(scores), reverse=True):
        f1, _ = f1_accuracy(scores >= t, gold)
        if f1 > best[0]:
            best = (f1, t)
    return best[1]


def test_f1_accuracy_by_hand():
    f1, acc = f1_accuracy(np.array([1, 1, 0, 0], bool), np.array([1, 0, 1, 0]))
    assert f1 == pytest.approx(50.0) and acc == pytest.approx(50.0)
    assert f1_accuracy(np.zeros(3, bool), np.array([1, 1, 0]))[0] == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_best_threshold_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 80)
    scores = np.round(gold * 0.3 + rng.random(80), 2)  # rounding makes ties
    t = best_f1_threshold(scores, gold)
    assert f1_accuracy(scores >= t, gold)[0] == pytest.approx(f1_accuracy(scores >= brute_force_best_threshold(scores, gold), gold)[0])


def test_threshold_is_chosen_on_dev_and_applied_to_test():
    dev_scores, dev_gold = np.array([0.9, 0.8, 0.3, 0.2]), np.array([1, 1, 0, 0])
    test_scores, test_gold = np.array([0.85, 0.5, 0.1]), np.array([1, 1, 0])
    m = binary_metrics({"dev": dev_scores, "test": test_scores}, {"dev": dev_gold, "test": test_gold})
    assert m["dev"]["threshold"] == m["test"]["threshold"] == 0.8
    assert m["dev"]["f1"] == pytest.approx(100)
    assert m["test"]["f1"] == pytest.approx(2 / 3 * 100)  # 0.5 falls under dev's threshold
    assert m["test"]["accuracy"] == pytest.approx(2 / 3 * 100)


def test_baselines():
    import pyarrow as pa

    t = pa.table({"sentence1": ["a b c", "x y"], "sentence2": ["a b d", "z"], "label": [1.0, 0.0]})
    np.testing.assert_allclose(jaccard_predictions({"dev": t})["dev"], [0.5, 0.0])
    train = pa.table({"label": [1.0, 1.0, 0.0]})
    m = majority_metrics(train, {"test": t})["test"]
    assert m["predicts"] == 1 and m["accuracy"] == pytest.approx(50) and m["f1"] == pytest.approx(2 / 3 * 100)


def test_partial_auc_by_hand():
    from augsbert_ray.evaluation import partial_auc, roc_points

    # 2 positives, 4 negatives. Ranked: P(0.9) N(0.8) P(0.7) N N N.
    scores = np.array([0.9, 0.8, 0.7, 0.3, 0.2, 0.1])
    pos = np.array([1, 0, 1, 0, 0, 0], dtype=bool)
    fpr, tpr = roc_points(scores, pos)
    np.testing.assert_allclose(fpr, [0, 0, 0.25, 0.25, 0.5, 0.75, 1])
    np.testing.assert_allclose(tpr, [0, 0.5, 0.5, 1, 1, 1, 1])
    # Up to FPR 0.05 the curve is flat at TPR 0.5: area 0.05 * 0.5, normalised by 0.05.
    assert partial_auc(scores, pos, 0.05) == pytest.approx(0.5)
    # Up to 0.5: 0.25 * 0.5 + 0.25 * 1 = 0.375, / 0.5.
    assert partial_auc(scores, pos, 0.5) == pytest.approx(0.75)
    assert partial_auc(scores, pos, 1.0) == pytest.approx(0.875)  # the full AUC: 7 of 8 pairs ordered
    assert partial_auc(-scores[::-1], pos[::-1], 0.05) == pytest.approx(0.0)  # worst ranking
    # Ties form one point: a tie between a positive and a negative is a diagonal segment.
    assert partial_auc(np.array([1.0, 1.0]), np.array([True, False]), 1.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        partial_auc(scores, np.ones(6, dtype=bool))


@pytest.mark.parametrize("seed", range(5))
def test_partial_auc_agrees_with_scikit_learn(seed):
    from sklearn.metrics import roc_auc_score

    from augsbert_ray.evaluation import partial_auc

    rng = np.random.default_rng(seed)
    pos = rng.random(400) < 0.3
    scores = np.round(rng.normal(size=400) + pos * rng.uniform(0.5, 2), 2)  # with ties
    for max_fpr in (0.05, 0.2, 1.0):
        ours = partial_auc(scores, pos, max_fpr)
        if max_fpr == 1.0:
            assert ours == pytest.approx(roc_auc_score(pos, scores))
            continue
        # scikit-learn reports the McClish standardisation of the same area:
        # 0.5 * (1 + (area - max_fpr^2 / 2) / (max_fpr - max_fpr^2 / 2)).
        area, lo = ours * max_fpr, max_fpr**2 / 2
        assert 0.5 * (1 + (area - lo) / (max_fpr - lo)) == pytest.approx(roc_auc_score(pos, scores, max_fpr=max_fpr))


def test_paired_bootstrap_tells_a_real_gain_from_dev_noise():
    from augsbert_ray.evaluation import paired_bootstrap

    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 1, 1500)
    weak, strong = gold + rng.normal(0, 0.6, 1500), gold + rng.normal(0, 0.2, 1500)
    clear = paired_bootstrap("regression", weak, strong, gold)
    assert clear["difference"] == pytest.approx(spearman100(strong, gold) - spearman100(weak, gold))
    assert 0 < clear["low"] < clear["difference"] < clear["high"] and clear["resamples"] == 1000
    worse = paired_bootstrap("regression", strong, weak, gold)
    assert worse["high"] < 0
    # Binary: 408 pairs, the second model moves a handful of scores a little: the F1 difference
    # is within the noise, and the interval spans 0 on both sides.
    labels = (rng.uniform(0, 1, 408) < 0.68).astype(float)
    a = labels + rng.normal(0, 0.6, 408)
    b = a + rng.normal(0, 0.05, 408)
    small = paired_bootstrap("binary", a, b, labels)
    assert small["low"] < 0 < small["high"]
    assert paired_bootstrap("binary", a, b, labels) == small  # seeded: the same interval again


def test_paired_bootstrap_at_fixed_thresholds_scores_as_test_is():
    from augsbert_ray.evaluation import f1_accuracy, paired_bootstrap

    rng = np.random.default_rng(1)
    labels = (rng.uniform(0, 1, 600) < 0.68).astype(float)
    a = labels + rng.normal(0, 0.6, 600)
    # The same scores: chosen again on each sample they tie; a's threshold from another set,
    # too high for this one, costs a its F1 on every sample, and the interval says so.
    assert paired_bootstrap("binary", a, a, labels)["high"] == 0
    fixed = paired_bootstrap("binary", a, a, labels, thresholds=(1.5, 0.5))
    want = f1_accuracy(a >= 0.5, labels)[0] - f1_accuracy(a >= 1.5, labels)[0]
    assert fixed["difference"] == pytest.approx(want) and 0 < fixed["low"] < want < fixed["high"]


def test_paired_bootstrap_needs_paired_predictions():
    from augsbert_ray.evaluation import paired_bootstrap

    with pytest.raises(ValueError, match="same pairs: 3, 2 and 3 labels"):
        paired_bootstrap("regression", [0.1, 0.2, 0.3], [0.1, 0.2], [0.0, 0.5, 1.0])


@pytest.mark.parametrize("gpus, cuda, expected", [(0, True, "cpu"), (1, True, "cuda:0"), (1, False, "cpu")])
def test_scoring_uses_a_gpu_only_when_it_holds_one(monkeypatch, gpus, cuda, expected):
    """A warm host sees the node's GPUs whatever it reserved: scoring that holds no GPU stays on
    the CPU even where torch sees one, and one that holds a GPU torch cannot see falls back."""
    import torch

    from augsbert_ray import models
    from augsbert_ray.stages import evaluate

    class Loaded(Exception):
        pass

    seen = []

    def load(*args, device=None, **kwargs):
        seen.append(device)
        raise Loaded

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(models, "load_cross_encoder", load)
    monkeypatch.setattr(models, "load_bi_encoder", load)
    with pytest.raises(Loaded):
        evaluate._predict_cross_encoder("model", {}, 8, 32, threads=1, gpus=gpus)
    with pytest.raises(Loaded):
        evaluate._predict_bi_encoder("model", {}, 8, 32, None, threads=1, gpus=gpus)
    assert seen == [expected, expected]
