"""Scoring models on labelled pairs: Spearman x100 between predictions and gold labels.

Each evaluator returns a dict of metrics per split and names its primary metric, so the
report (and, later, model selection) knows which number matters and which way is better.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from scipy.stats import spearmanr

from augsbert_ray import schema

PRIMARY_METRIC = "spearman"
GREATER_IS_BETTER = True


def spearman100(pred: np.ndarray, gold: np.ndarray) -> float:
    """Spearman rank correlation x 100 (the STS convention)."""
    if len(pred) < 2:
        raise ValueError("Spearman needs at least two pairs")
    return float(spearmanr(pred, gold).statistic * 100)


def cosine_scores(model, s1: list[str], s2: list[str], batch_size: int = 64) -> np.ndarray:
    """cos(embed(a), embed(b)) per pair; each distinct sentence is embedded once."""
    texts = list(dict.fromkeys(list(s1) + list(s2)))
    emb = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                       show_progress_bar=False)
    pos = {t: i for i, t in enumerate(texts)}
    a = emb[[pos[t] for t in s1]]
    b = emb[[pos[t] for t in s2]]
    return np.sum(a * b, axis=1)


def _split_metrics(pred: np.ndarray, table: pa.Table) -> dict:
    return {PRIMARY_METRIC: spearman100(pred, table.column(schema.LABEL).to_numpy()), "pairs": table.num_rows}


def evaluate_bi_encoder(model, splits: dict[str, pa.Table], batch_size: int = 64) -> dict[str, dict]:
    """Spearman x100 of cosine similarity vs gold, per split."""
    return {
        name: _split_metrics(
            cosine_scores(model, t.column(schema.SENTENCE1).to_pylist(), t.column(schema.SENTENCE2).to_pylist(), batch_size),
            t,
        )
        for name, t in splits.items()
    }


def evaluate_cross_encoder(model, tokenizer, splits: dict[str, pa.Table], batch_size: int = 64,
                           max_length: int = 128, device: str = "cpu") -> dict[str, dict]:
    """Spearman x100 of the cross-encoder's sigmoid score vs gold, per split."""
    from augsbert_ray.labeling import score_pairs

    return {
        name: _split_metrics(
            score_pairs(model, tokenizer, t.column(schema.SENTENCE1).to_pylist(), t.column(schema.SENTENCE2).to_pylist(),
                        micro_batch_size=batch_size, max_length=max_length, device=device),
            t,
        )
        for name, t in splits.items()
    }
