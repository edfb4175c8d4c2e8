"""Scoring models on labelled pairs, per task.

Models produce one similarity per pair (cosine for bi-encoders, the sigmoid score for
cross-encoders); the task turns predictions into metrics:

- regression: Spearman x100 between predictions and gold scores (the STS convention);
- binary: F1 of the positive class and accuracy, at the threshold that maximises F1 on
  dev, applied unchanged to test (so test labels never choose it).

``PRIMARY_METRIC[task]`` names the number that matters; greater is better for both.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
from scipy.stats import spearmanr

from augsbert_ray import schema

PRIMARY_METRIC = {"regression": "spearman", "binary": "f1"}
GREATER_IS_BETTER = True


def spearman100(pred: np.ndarray, gold: np.ndarray) -> float:
    """Spearman rank correlation x 100 (the STS convention)."""
    if len(pred) < 2:
        raise ValueError("Spearman needs at least two pairs")
    return float(spearmanr(pred, gold).statistic * 100)


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


def regression_metrics(preds: dict[str, np.ndarray], golds: dict[str, np.ndarray]) -> dict[str, dict]:
    return {split: {"spearman": spearman100(preds[split], golds[split]), "pairs": len(golds[split])} for split in preds}


def binary_metrics(preds: dict[str, np.ndarray], golds: dict[str, np.ndarray]) -> dict[str, dict]:
    threshold = best_f1_threshold(preds["dev"], golds["dev"])
    out = {}
    for split in preds:
        f1, acc = f1_accuracy(preds[split] >= threshold, golds[split])
        out[split] = {"f1": f1, "accuracy": acc, "threshold": threshold, "pairs": len(golds[split])}
    return out


TASK_METRICS = {"regression": regression_metrics, "binary": binary_metrics}


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
