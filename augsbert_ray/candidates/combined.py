"""BM25 + semantic search sampling (AugSBERT section 3.1, "BM25 + Semantic Search").

The paper's best in-domain sampler: the union of the BM25 top-k and the semantic-search
top-k of every sentence, so lexical and semantic neighbours both get silver labels.
A pair proposed by both is labelled once.

Each pair keeps who found it: ``origin`` is "bm25+ss" when both did, else "bm25" or
"ss". BM25 scores (unbounded) and cosine similarities are not on one scale, so a pair's
``retrieval_score`` is always the score of the sampler named first in its origin: BM25's
for "bm25" and "bm25+ss", the cosine for "ss".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.candidates import bm25, semantic
from augsbert_ray.candidates.pairs import finalize_candidates, pair_keys

SEPARATOR = "+"


def union_candidates(tables: Sequence[pa.Table], sentences: pa.Table, gold_keys: np.ndarray) -> pa.Table:
    """Merges candidate tables into one, with one row per pair.

    Args:
        tables: ``schema.CANDIDATE_SCHEMA`` tables over the same ``sentences``, in
            priority order: a pair found by several keeps the ``retrieval_score`` of the
            first table that has it (the highest, should that table repeat the pair).
        sentences: the job's ``schema.SENTENCE_SCHEMA`` table.
        gold_keys: keys of the gold pairs (``pairs.pair_keys``), excluded again for safety.

    Returns:
        ``schema.CANDIDATE_SCHEMA`` rows sorted by (id1, id2), one per pair, with no
        self or gold pair (``pairs.finalize_candidates``' rules). A pair's ``origin`` joins
        with "+" the distinct origins that proposed it, in the order they first appear
        in ``tables`` (so "bm25+ss", never "ss+bm25", for ``[bm25, ss]``).
    """
    n = sentences.num_rows
    names: list[str] = []  # origin components, in order of first appearance
    keys, ranks, scores, masks = [], [], [], []
    for rank, table in enumerate(tables):
        origins = table.column(schema.ORIGIN).combine_chunks().dictionary_encode()
        # One bit per component, so a pair's origins combine with a bitwise OR.
        bits = []
        for value in origins.dictionary.to_pylist():
            b = 0
            for part in value.split(SEPARATOR):
                if part not in names:
                    names.append(part)
                b |= 1 << names.index(part)
            bits.append(b)
        keys.append(pair_keys(table.column(schema.ID1).to_numpy(), table.column(schema.ID2).to_numpy(), n))
        ranks.append(np.full(table.num_rows, rank, np.int64))
        scores.append(table.column(schema.RETRIEVAL_SCORE).to_numpy().astype(np.float32))
        masks.append(np.asarray(bits, np.int64)[origins.indices.to_numpy()])
    if not keys:
        return schema.empty_table(schema.CANDIDATE_SCHEMA)
    key, rank, score, mask = (np.concatenate(x) for x in (keys, ranks, scores, masks))

    # Sort by key, then table priority, then best score (the rule of finalize_candidates,
    # should a table repeat a pair): the first row of each key carries the score kept.
    order = np.lexsort((-score, rank, key))
    key, score, mask = key[order], score[order], mask[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(first)
    mask = np.bitwise_or.reduceat(mask, starts) if len(starts) else mask  # every origin of the pair
    key, score = key[starts], score[starts]

    # finalize_candidates applies the shared rules (self, gold, sort); keys are already
    # unique, so its dedupe keeps every row, and its output is sorted by key like ours.
    out = finalize_candidates(key // n, key % n, score, sentences, gold_keys, origin="")
    kept = np.searchsorted(key, pair_keys(out.column(schema.ID1).to_numpy(), out.column(schema.ID2).to_numpy(), n))
    present, which = np.unique(mask[kept], return_inverse=True)
    labels = [SEPARATOR.join(nm for i, nm in enumerate(names) if m >> i & 1) for m in present.tolist()]
    origin = pa.array(labels, pa.string()).take(pa.array(which.reshape(-1), pa.int64()))
    return out.set_column(out.schema.get_field_index(schema.ORIGIN), out.schema.field(schema.ORIGIN), origin)


def union_pairs(found: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """``union_candidates``' rule on pair keys: ``found`` lists, in priority order, each sampler's
    ``(origin, keys, scores)``, its keys unique (``pairs.unique_pairs``). Returns the sorted keys
    of the union, each one's score from the first sampler that found it, and its origins joined
    with "+" in the order of ``found`` (pure)."""
    if not found:
        return np.empty(0, np.int64), np.empty(0, np.float32), pa.array([], pa.string())
    key = np.concatenate([np.asarray(k, np.int64) for _, k, _ in found])
    rank = np.concatenate([np.full(len(k), i, np.int64) for i, (_, k, _) in enumerate(found)])
    score = np.concatenate([np.asarray(s, np.float32) for _, _, s in found])
    order = np.lexsort((rank, key))  # by key, then priority: the first row of a key carries its score
    key, rank, score = key[order], rank[order], score[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(first)
    mask = np.bitwise_or.reduceat(np.int64(1) << rank, starts) if len(starts) else rank
    present, which = np.unique(mask, return_inverse=True)
    names = [origin for origin, _, _ in found]
    labels = [SEPARATOR.join(nm for i, nm in enumerate(names) if m >> i & 1) for m in present.tolist()]
    return key[starts], score[starts], pa.array(labels, pa.string()).take(pa.array(which.reshape(-1), pa.int64()))


def sample(ctx) -> pa.Table:
    """BM25 + SS: the union of both samplers' top-k candidates, origins kept.

    Raises:
        ValueError: if ``ctx.bi_encoder`` is not set (semantic search needs it).
    """
    if ctx.bi_encoder is None:  # fail before spending time on BM25
        raise ValueError("bm25+ss sampling needs a bi-encoder: SamplingContext.bi_encoder is None")
    return union_candidates([bm25.sample(ctx), semantic.sample(ctx)], ctx.sentences, ctx.gold_keys)
