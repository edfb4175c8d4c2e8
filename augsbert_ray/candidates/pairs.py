"""The rules every sampler obeys: no self-pairs, no duplicates in either order, no gold pairs.

Sentences are identified by their row in the job's table of unique sentences, and a
pair by the order-free key ``min(id) * n + max(id)``, which makes dedupe exact and cheap.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema


def unique_sentences(pairs: pa.Table) -> pa.Table:
    """The distinct sentences of a pair table, in order of first appearance (SENTENCE_SCHEMA)."""
    seen: dict[str, int] = {}
    for col in (schema.SENTENCE1, schema.SENTENCE2):
        for text in pairs.column(col).to_pylist():
            seen.setdefault(text, len(seen))
    texts = list(seen)
    return pa.table(
        {schema.SENTENCE_ID: pa.array(np.arange(len(texts), dtype=np.int64)), schema.TEXT: pa.array(texts, pa.string())},
        schema=schema.SENTENCE_SCHEMA,
    )


def pair_keys(id_a: np.ndarray, id_b: np.ndarray, n: int) -> np.ndarray:
    """Order-free int64 keys of pairs of sentence ids (``n`` = number of sentences)."""
    a, b = np.asarray(id_a, dtype=np.int64), np.asarray(id_b, dtype=np.int64)
    return np.minimum(a, b) * np.int64(n) + np.maximum(a, b)


def gold_pair_keys(gold: pa.Table, sentences: pa.Table) -> np.ndarray:
    """Keys of the gold pairs whose sentences are both in ``sentences`` (sorted, unique)."""
    index = {t: i for i, t in enumerate(sentences.column(schema.TEXT).to_pylist())}
    ids = [
        (index[a], index[b])
        for a, b in zip(gold.column(schema.SENTENCE1).to_pylist(), gold.column(schema.SENTENCE2).to_pylist())
        if a in index and b in index
    ]
    if not ids:
        return np.empty(0, dtype=np.int64)
    arr = np.asarray(ids, dtype=np.int64)
    return np.unique(pair_keys(arr[:, 0], arr[:, 1], sentences.num_rows))


def unique_pairs(query_ids: np.ndarray, hit_ids: np.ndarray, scores: np.ndarray, n: int,
                 gold_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``finalize_candidates``' rules on raw triples: the sorted keys of the pairs kept (no
    self-pair, no gold pair, each pair once) and each one's highest score."""
    q = np.asarray(query_ids, dtype=np.int64)
    h = np.asarray(hit_ids, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float32)
    keep = q != h
    q, h, s = q[keep], h[keep], s[keep]
    keys = pair_keys(q, h, n)
    keep = ~np.isin(keys, gold_keys)
    keys, s = keys[keep], s[keep]
    order = np.lexsort((-s, keys))  # by key, best score first within a key
    keys, s = keys[order], s[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    return keys[first], s[first]


def finalize_candidates(
    query_ids: np.ndarray,
    hit_ids: np.ndarray,
    scores: np.ndarray,
    sentences: pa.Table,
    gold_keys: np.ndarray,
    origin: str,
) -> pa.Table:
    """Turns raw (query, hit, score) triples into the candidate table.

    Drops self-pairs, pairs already in gold, and duplicates in either order (keeping the
    highest retrieval score). Output is sorted by (id1, id2), so it is deterministic.

    Returns:
        A table of ``schema.CANDIDATE_MEMORY_SCHEMA``: ``schema.CANDIDATE_SCHEMA`` with the
        texts as dictionary columns over ``sentences``.
    """
    n = sentences.num_rows
    keys, s = unique_pairs(query_ids, hit_ids, scores, n, gold_keys)
    id1, id2 = pa.array(keys // n, pa.int64()), pa.array(keys % n, pa.int64())
    # The texts are dictionary columns over the sentence table: their indices are the id
    # columns themselves, so a million candidates hold no copy of their sentences until a
    # slice of them is written (``schema.CANDIDATE_SCHEMA`` on disk; ``schema.conforms``).
    column = sentences.column(schema.TEXT)
    texts = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return pa.table(
        {
            schema.ID1: id1,
            schema.ID2: id2,
            schema.SENTENCE1: pa.DictionaryArray.from_arrays(id1, texts),
            schema.SENTENCE2: pa.DictionaryArray.from_arrays(id2, texts),
            schema.ORIGIN: pa.repeat(pa.scalar(origin, pa.string()), len(keys)),
            schema.RETRIEVAL_SCORE: pa.array(s, pa.float32()),
        },
        schema=schema.CANDIDATE_MEMORY_SCHEMA,
    )


def concat_hits(tables: list[pa.Table]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stacks hit tables (query_id, hit_id, score) coming back from Ray into arrays."""
    if not tables:
        return (np.empty(0, np.int64),) * 2 + (np.empty(0, np.float32),)
    t = pa.concat_tables(tables)
    return (
        t.column("query_id").to_numpy(),
        t.column("hit_id").to_numpy(),
        pc.cast(t.column("score"), pa.float32()).to_numpy(),
    )
