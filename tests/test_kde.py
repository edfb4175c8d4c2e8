"""KDE selection: acceptance follows min(1, F_gold(s) / F_silver(s)) (AugSBERT section 3.1)."""

import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import gaussian_kde, ks_2samp

from augsbert_ray import schema
from augsbert_ray.candidates import kde
from augsbert_ray.config import SamplingConfig


def test_keep_probability_is_the_formula():
    rng = np.random.default_rng(0)
    gold = rng.beta(5, 2, 400)
    silver = rng.beta(2, 5, 2000)
    p = kde.keep_probability(silver, gold)
    expected = np.minimum(1, gaussian_kde(gold)(silver) / gaussian_kde(silver)(silver))
    np.testing.assert_allclose(p, expected, rtol=1e-3, atol=1e-6)  # grid interpolation vs exact evaluation
    assert ((p >= 0) & (p <= 1)).all()
    # Where gold is denser than silver every pair is kept; where silver piles up, few are.
    assert p[silver > 0.85].min() == 1.0
    assert p[silver < 0.15].mean() < 0.2


def test_selection_moves_silver_towards_gold_and_is_seeded():
    rng = np.random.default_rng(1)
    gold = rng.beta(5, 2, 500)
    silver = rng.beta(2, 5, 8000)
    kept = silver[kde.select_regression(silver, gold, seed=3)]
    assert len(kept) > 300
    assert ks_2samp(kept, gold).statistic < ks_2samp(silver, gold).statistic - 0.1
    # Kept density = F_silver * min(1, F_gold / F_silver) = min(F_gold, F_silver), normalised.
    def overlap(x):
        return np.minimum(gaussian_kde(gold)(x), gaussian_kde(silver)(x))

    fine = np.linspace(0, 1, 2001)
    counts, edges = np.histogram(kept, bins=np.linspace(0, 1, 21))
    centres = (edges[:-1] + edges[1:]) / 2
    expected = overlap(centres) / np.trapezoid(overlap(fine), fine) * len(kept) * 0.05
    # Within 4 standard deviations of a Poisson count in every bin.
    assert (np.abs(counts - expected) < 4 * np.sqrt(expected) + 5).all()
    np.testing.assert_array_equal(kde.select_regression(silver, gold, 3), kde.select_regression(silver, gold, 3))
    assert not np.array_equal(kde.select_regression(silver, gold, 3), kde.select_regression(silver, gold, 4))


def test_acceptance_rate_matches_probability():
    # Known distributions: gold uniform on [0, 1], silver uniform on [0, 0.5] U [0, 1] mix.
    rng = np.random.default_rng(2)
    gold = rng.uniform(0, 1, 5000)
    silver = np.concatenate([rng.uniform(0, 0.5, 15000), rng.uniform(0, 1, 5000)])
    keep = kde.select_regression(silver, gold, seed=0)
    p = kde.keep_probability(silver, gold)
    for lo, hi in [(0.1, 0.4), (0.6, 0.9)]:
        band = (silver > lo) & (silver < hi)
        assert keep[band].mean() == pytest.approx(p[band].mean(), abs=0.02)
    # True densities: silver 2 on [0, .5) and 0.5 on [.5, 1] -> acceptance ~0.5 below 0.5, 1 above.
    assert keep[(silver > 0.1) & (silver < 0.4)].mean() == pytest.approx(0.5, abs=0.08)
    assert keep[(silver > 0.6) & (silver < 0.9)].mean() > 0.9


def test_binary_keeps_all_positives_and_gold_ratio_of_negatives():
    scores = np.r_[np.full(100, 0.9), np.full(1000, 0.1)]
    gold = np.r_[np.ones(30), np.zeros(60)]  # 2 negatives per positive
    keep = kde.select_binary(scores, gold, seed=0)
    assert keep[:100].all()
    assert keep[100:].sum() == 200
    np.testing.assert_array_equal(keep, kde.select_binary(scores, gold, seed=0))


def test_select_on_a_silver_table():
    n = 50
    silver = pa.table(
        {
            schema.ID1: pa.array(np.arange(n), pa.int64()), schema.ID2: pa.array(np.arange(n) + n, pa.int64()),
            schema.SENTENCE1: ["a"] * n, schema.SENTENCE2: ["b"] * n, schema.ORIGIN: ["kde"] * n,
            schema.RETRIEVAL_SCORE: pa.array(np.full(n, np.nan), pa.float32()),
            schema.LABEL: pa.array(np.r_[np.full(10, 0.9), np.full(40, 0.2)], pa.float32()),
        },
        schema=schema.SILVER_SCHEMA,
    )
    kept = kde.select(silver, np.r_[np.ones(5), np.zeros(5)], "binary", 0, SamplingConfig())
    assert kept.schema == schema.SILVER_SCHEMA and kept.num_rows == 20
    assert kept.column(schema.ID1).to_pylist() == sorted(kept.column(schema.ID1).to_pylist())


def test_large_pools_are_fitted_on_a_bounded_subsample(monkeypatch):
    # Exact KDE evaluation at every pool score is O(pool x fit points); the fit is capped
    # and evaluation goes through a fixed grid, whatever the pool size.
    fitted, evaluated = [], []
    import scipy.stats

    real = scipy.stats.gaussian_kde

    class Recording(real):
        def __init__(self, dataset, **kw):
            fitted.append(np.size(dataset))
            super().__init__(dataset, **kw)

        def __call__(self, points):
            evaluated.append(np.size(points))
            return super().__call__(points)

    monkeypatch.setattr(scipy.stats, "gaussian_kde", Recording)  # kde imports it when it fits
    rng = np.random.default_rng(5)
    silver = rng.beta(2, 5, 100_000)
    p = kde.keep_probability(silver, rng.beta(5, 2, 1000))
    assert len(p) == len(silver)
    assert max(fitted) == kde.MAX_FIT_POINTS and max(evaluated) == kde.GRID_POINTS
