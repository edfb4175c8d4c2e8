"""Scoring models on labelled pairs, per task.

Models produce one similarity per pair (cosine for bi-encoders, the sigmoid score for
cross-encoders); the task turns predictions into metrics:

- regression: Spearman x100 between predictions and gold scores (the STS convention);
- binary: F1 of the positive class and accuracy, at the threshold that maximises F1 on
  dev, applied unchanged to test (so test labels never choose it); and AUC(0.05), the
  area under the ROC curve up to a false-positive rate of 0.05 (``partial_auc``), which
  needs no threshold.

``PRIMARY_METRIC[task]`` names the number that matters; greater is better for both.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from augsbert_ray import schema

PRIMARY_METRIC = {"regression": "spearman", "binary": "f1"}
GREATER_IS_BETTER = True


def spearman100(pred: np.ndarray, gold: np.ndarray) -> float:
    """Spearman rank correlation x 100 (the STS convention).

    NaN where it is undefined: every prediction (or every gold label) the same, as from a
    model that collapsed to one output (``undefined_scores`` names such splits).
    """
    if len(pred) < 2:
        raise ValueError("Spearman needs at least two pairs")
    pred, gold = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if np.all(pred == pred[0]) or np.all(gold == gold[0]):
        return float("nan")
    return float(np.corrcoef(_average_ranks(pred), _average_ranks(gold))[1, 0] * 100)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their mean rank (what ``scipy.stats.rankdata`` gives, so the
    correlation is scipy's ``spearmanr`` to the bit); pandas' ranking keeps scipy's import,
    about a second, off the driver's path before Ray starts."""
    import pandas as pd

    return pd.Series(values).rank(method="average").to_numpy(dtype=np.float64)


def undefined_scores(scores: dict, metric: str, preds: dict) -> list[str]:
    """One reason per split whose ``metric`` is NaN, e.g. "dev: the model gave all 1500 pairs the
    same score (0.5)"; empty when every score is defined."""
    out = []
    for split, row in scores.items():
        value = row.get(metric)
        if value is None or not np.isnan(value):
            continue
        p = np.asarray(preds.get(split, []), dtype=np.float64)
        if len(p) and np.all(p == p[0]):
            out.append(f"{split}: the model gave all {len(p)} pairs the same score ({p[0]:.4g})")
        else:
            out.append(f"{split}: {metric} is undefined")
    return out


def f1_accuracy(pred_positive: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    """F1 x100 of the positive class and accuracy x100."""
    gold = np.asarray(gold) >= 0.5
    pred_positive = np.asarray(pred_positive, dtype=bool)
    tp = np.sum(pred_positive & gold)
    precision_den, recall_den = pred_positive.sum(), gold.sum()
    f1 = 0.0 if tp == 0 else 2 * tp / (precision_den + recall_den)
    return float(f1 * 100), float(np.mean(pred_positive == gold) * 100)


def best_f1_threshold(scores: np.ndarray, gold: np.ndarray) -> float:
    """The threshold t maximising F1 of ``scores >= t``; ties go to the highest t.

    Every distinct score is a candidate (midpoints would change nothing on dev), so the
    search is exact: O(n log n) after one sort.
    """
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(gold) >= 0.5
    if len(scores) == 0:
        raise ValueError("no pairs to choose a threshold on")
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], positive[order]
    tp = np.cumsum(y)
    predicted = np.arange(1, len(s) + 1)
    f1 = 2 * tp / (predicted + positive.sum())
    last_of_value = np.append(s[1:] != s[:-1], True)  # a threshold keeps every equal score
    f1 = np.where(last_of_value, f1, -1)
    return float(s[int(np.argmax(f1))])


def roc_points(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve of ``scores`` (higher means positive): (fpr, tpr) from (0, 0) to (1, 1).

    Tied scores form one point, so the curve does not depend on the order of ties.
    """
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("a ROC curve needs both positive and negative pairs")
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], positive[order]
    last_of_value = np.append(s[1:] != s[:-1], True)
    tp, fp = np.cumsum(y)[last_of_value], np.cumsum(~y)[last_of_value]
    return np.concatenate([[0.0], fp / n_neg]), np.concatenate([[0.0], tp / n_pos])


def partial_auc(scores: np.ndarray, positive: np.ndarray, max_fpr: float = 0.05) -> float:
    """Area under the ROC curve for FPR in [0, max_fpr], divided by ``max_fpr`` (in [0, 1]).

    This is AUC(0.05) as Shah et al. (2018) report it and the AugSBERT paper uses for
    domain adaptation on duplicate-question tasks: 1 for a perfect ranking, ``max_fpr / 2``
    for a random one. The curve is interpolated linearly at ``max_fpr``.
    """
    if not 0 < max_fpr <= 1:
        raise ValueError(f"max_fpr must be in (0, 1], got {max_fpr}")
    fpr, tpr = roc_points(scores, positive)
    cut = np.searchsorted(fpr, max_fpr, side="right")  # points with fpr <= max_fpr
    x, y = fpr[:cut], tpr[:cut]
    if x[-1] < max_fpr:  # the point on the segment that crosses max_fpr
        x0, x1, y0, y1 = fpr[cut - 1], fpr[cut], tpr[cut - 1], tpr[cut]
        x = np.append(x, max_fpr)
        y = np.append(y, y0 + (y1 - y0) * (max_fpr - x0) / (x1 - x0))
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / max_fpr)


def regression_metrics(preds: dict[str, np.ndarray], golds: dict[str, np.ndarray]) -> dict[str, dict]:
    return {split: {"spearman": spearman100(preds[split], golds[split]), "pairs": len(golds[split])} for split in preds}


def binary_metrics(preds: dict[str, np.ndarray], golds: dict[str, np.ndarray]) -> dict[str, dict]:
    threshold = best_f1_threshold(preds["dev"], golds["dev"])
    out = {}
    for split in preds:
        f1, acc = f1_accuracy(preds[split] >= threshold, golds[split])
        positive = np.asarray(golds[split]) >= 0.5
        auc = partial_auc(preds[split], positive, 0.05) * 100 if 0 < positive.sum() < len(positive) else None
        out[split] = {"f1": f1, "accuracy": acc, "auc_0.05": auc, "threshold": threshold, "pairs": len(golds[split])}
    return out


TASK_METRICS = {"regression": regression_metrics, "binary": binary_metrics}


def set_score(task: str, pred: np.ndarray, gold: np.ndarray, threshold: float | None = None) -> float:
    """The primary metric on one set: Spearman, or F1 at ``threshold`` (None: the set's best, as
    dev is scored)."""
    if task == "regression":
        return spearman100(pred, gold)
    return f1_accuracy(pred >= (best_f1_threshold(pred, gold) if threshold is None else threshold), gold)[0]


def paired_bootstrap(task: str, pred_a: np.ndarray, pred_b: np.ndarray, gold: np.ndarray, *,
                     resamples: int = 1000, confidence: float = 0.9, seed: int = 0,
                     thresholds: tuple[float, float] | None = None) -> dict:
    """How sure a difference between two models' scores on one labelled set is.

    Both models' predictions are resampled together (the same pairs, drawn with replacement,
    as Koehn (2004) does for translation), each sample is scored as the set itself is, and the
    ``confidence`` interval of score(b) - score(a) is read from the samples' percentiles. For
    binary tasks the F1 threshold is chosen again on each sample, as dev's is, unless
    ``thresholds`` (a's, b's) fixes them, as a test set is scored at the thresholds dev chose.

    Returns:
        ``{"difference", "low", "high", "resamples", "confidence"}``; ``low`` above 0 means b
        is better than a beyond what the set's size can tell apart, ``high`` below 0 worse.
        Samples on which a score is undefined (a constant sample) are left out.
    """
    pred_a, pred_b = np.asarray(pred_a, dtype=np.float64), np.asarray(pred_b, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    if not len(pred_a) == len(pred_b) == len(gold):
        raise ValueError(f"paired predictions must cover the same pairs: {len(pred_a)}, {len(pred_b)} and "
                         f"{len(gold)} labels")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    ta, tb = thresholds or (None, None)
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(resamples):
        i = rng.integers(0, len(gold), len(gold))
        diffs.append(set_score(task, pred_b[i], gold[i], tb) - set_score(task, pred_a[i], gold[i], ta))
    diffs = np.asarray(diffs)
    diffs = diffs[~np.isnan(diffs)]
    tail = (1 - confidence) / 2 * 100
    low, high = (float(x) for x in np.percentile(diffs, [tail, 100 - tail])) if len(diffs) else (np.nan, np.nan)
    return {"difference": set_score(task, pred_b, gold, tb) - set_score(task, pred_a, gold, ta), "low": low,
            "high": high, "resamples": int(len(diffs)), "confidence": confidence}


# The number that matters on a domain-adaptation target: binary targets are ranked by
# AUC(0.05) (the paper's metric there), which needs no threshold and so no target dev set.
TARGET_METRIC = {"regression": "spearman", "binary": "auc_0.05"}


def target_metrics(task: str, preds: dict[str, np.ndarray], splits: dict[str, pa.Table]) -> dict[str, dict]:
    """Metrics on a target domain's labelled sets (``target_test``, optionally ``target_dev``).

    Regression: Spearman. Binary: AUC(0.05) x100 on each set, and F1 / accuracy only when a
    target dev set exists to choose the threshold (it is then applied to the test set).
    """
    golds = {s: splits[s].column(schema.LABEL).to_numpy() for s in preds}
    if task == "regression":
        return regression_metrics(preds, golds)
    out = {}
    for split in preds:
        positive = golds[split] >= 0.5
        out[split] = {"auc_0.05": partial_auc(preds[split], positive, 0.05) * 100, "pairs": len(positive)}
    if "target_dev" in preds:
        threshold = best_f1_threshold(preds["target_dev"], golds["target_dev"])
        for split in preds:
            f1, acc = f1_accuracy(preds[split] >= threshold, golds[split])
            out[split].update({"f1": f1, "accuracy": acc, "threshold": threshold})
    return out


def task_metrics(task: str, preds: dict[str, np.ndarray], splits: dict[str, pa.Table]) -> dict[str, dict]:
    """Metrics of per-split predictions against the splits' gold labels."""
    golds = {s: splits[s].column(schema.LABEL).to_numpy() for s in preds}
    return TASK_METRICS[task](preds, golds)


def cosine_scores(model, s1: list[str], s2: list[str], batch_size: int = 64) -> np.ndarray:
    """cos(embed(a), embed(b)) per pair; each distinct sentence is embedded once."""
    texts = list(dict.fromkeys(list(s1) + list(s2)))
    emb = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                       show_progress_bar=False)
    pos = {t: i for i, t in enumerate(texts)}
    a = emb[[pos[t] for t in s1]]
    b = emb[[pos[t] for t in s2]]
    return np.sum(a * b, axis=1)


def _texts(t: pa.Table) -> tuple[list[str], list[str]]:
    return t.column(schema.SENTENCE1).to_pylist(), t.column(schema.SENTENCE2).to_pylist()


def bi_encoder_predictions(model, splits: dict[str, pa.Table], batch_size: int = 64) -> dict[str, np.ndarray]:
    return {name: cosine_scores(model, *_texts(t), batch_size) for name, t in splits.items()}


def cross_encoder_predictions(model, tokenizer, splits: dict[str, pa.Table], batch_size: int = 64,
                              max_length: int = 128, device: str = "cpu") -> dict[str, np.ndarray]:
    from augsbert_ray.labeling import score_pairs

    return {
        name: score_pairs(model, tokenizer, *_texts(t), micro_batch_size=batch_size, max_length=max_length, device=device)
        for name, t in splits.items()
    }


_WORD = re.compile(r"\w+")


def jaccard_predictions(splits: dict[str, pa.Table]) -> dict[str, np.ndarray]:
    """Word-overlap baseline (the paper's Jaccard row): |A ∩ B| / |A ∪ B| of lowercased words."""

    def jaccard(a: str, b: str) -> float:
        wa, wb = set(_WORD.findall(a.lower())), set(_WORD.findall(b.lower()))
        return len(wa & wb) / len(wa | wb) if wa | wb else 0.0

    return {name: np.array([jaccard(a, b) for a, b in zip(*_texts(t))]) for name, t in splits.items()}


def majority_metrics(train: pa.Table, splits: dict[str, pa.Table]) -> dict[str, dict]:
    """Majority-label baseline for binary tasks: always predict the commonest training label."""
    positive = bool(np.mean(train.column(schema.LABEL).to_numpy() >= 0.5) >= 0.5)
    out = {}
    for name, t in splits.items():
        gold = t.column(schema.LABEL).to_numpy()
        f1, acc = f1_accuracy(np.full(len(gold), positive), gold)
        out[name] = {"f1": f1, "accuracy": acc, "predicts": int(positive), "pairs": len(gold)}
    return out
