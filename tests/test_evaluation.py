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
