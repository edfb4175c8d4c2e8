"""KDE selection (AugSBERT section 3.1, "Kernel Density Estimation").

Random recombination yields mostly dissimilar pairs, so its silver label distribution
is far from gold's. KDE selection labels a large random pool, then keeps a pair with
score s with probability ``min(1, F_gold(s) / F_silver(s))``, where F are Gaussian kernel
density estimates of the gold and silver labels. The kept set's density is then
proportional to ``min(F_gold, F_silver)``: it follows gold wherever the pool has enough
pairs, and is thinner than gold where the pool is sparse (random pairs rarely score high).
For binary tasks the paper keeps every positive and samples negatives down to the
gold negative/positive ratio.

Sampling draws the pool (``sample``); ``select`` runs after labelling. Strategy ``bm25-kde``
selects the same way from BM25's top-k pool instead of a random one.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from augsbert_ray import schema


# Scores are one-dimensional, so each density is evaluated once on a fine grid and
# interpolated: exact evaluation at every pool score costs O(pool x fit points), which is
# hours for a million-pair pool. Fitting on a seeded subsample bounds the rest.
GRID_POINTS = 2049
MAX_FIT_POINTS = 20_000


def density(values: np.ndarray, at: np.ndarray, bandwidth: float | None = None, seed: int = 0) -> np.ndarray:
    """Gaussian KDE of ``values`` evaluated at ``at`` (grid + linear interpolation)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) > MAX_FIT_POINTS:
        values = np.random.default_rng([seed, 3]).choice(values, MAX_FIT_POINTS, replace=False)
    from scipy.stats import gaussian_kde

    kde = gaussian_kde(values, bw_method=bandwidth)
    lo, hi = min(at.min(), values.min()), max(at.max(), values.max())
    pad = 3 * float(np.sqrt(kde.covariance[0, 0]))
    grid = np.linspace(lo - pad, hi + pad, GRID_POINTS)
    return np.interp(at, grid, kde(grid))


def keep_probability(silver_scores: np.ndarray, gold_scores: np.ndarray, bandwidth: float | None = None) -> np.ndarray:
    """``min(1, F_gold(s) / F_silver(s))`` for every silver score s.

    Args:
        silver_scores: the teacher's labels of the pool.
        gold_scores: the gold training labels.
        bandwidth: scipy ``bw_method``; None uses Scott's rule.
    """
    silver_scores = np.asarray(silver_scores, dtype=np.float64)
    f_gold = density(gold_scores, silver_scores, bandwidth)
    f_silver = density(silver_scores, silver_scores, bandwidth)
    return np.minimum(1.0, f_gold / np.maximum(f_silver, np.finfo(np.float64).tiny))


def select_regression(scores: np.ndarray, gold: np.ndarray, seed: int, bandwidth: float | None = None) -> np.ndarray:
    """Boolean mask of the pool rows kept by KDE selection (seeded)."""
    p = keep_probability(scores, gold, bandwidth)
    return np.random.default_rng([seed, 1]).random(len(scores)) < p


def select_binary(scores: np.ndarray, gold: np.ndarray, seed: int) -> np.ndarray:
    """Keeps every positive (score >= 0.5) and a seeded sample of negatives at gold's ratio."""
    positive = np.asarray(scores) >= 0.5
    gold_pos = int(np.sum(np.asarray(gold) >= 0.5))
    gold_neg = len(gold) - gold_pos
    negatives = np.flatnonzero(~positive)
    want = len(negatives) if gold_pos == 0 else min(len(negatives), round(positive.sum() * gold_neg / gold_pos))
    keep = positive.copy()
    keep[np.random.default_rng([seed, 2]).choice(negatives, size=want, replace=False)] = True
    return keep


def select(silver: pa.Table, gold_labels: np.ndarray, task: str, seed: int, cfg) -> pa.Table:
    """The kept rows of a labelled pool (``schema.SILVER_SCHEMA``), in pool order."""
    if silver.num_rows == 0:
        return silver
    scores = silver.column(schema.LABEL).to_numpy()
    if task == "binary":
        mask = select_binary(scores, gold_labels, seed)
    else:
        mask = select_regression(scores, gold_labels, seed, cfg.kde.bandwidth)
    return silver.filter(pa.array(mask))


def sample(ctx) -> pa.Table:
    """The random pool that KDE selection labels: ``kde.pool_per_sentence`` partners per sentence."""
    from augsbert_ray.candidates.random_pairs import sample_random

    return sample_random(ctx, ctx.cfg.kde.pool_per_sentence, origin="kde")
