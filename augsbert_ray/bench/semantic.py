"""Semantic top-k: the engine's Faiss search, exact and approximate, against
``sentence_transformers.util.semantic_search`` on the same embeddings, queries and k.

Queries are corpus rows, each searching for its k nearest *other* rows (as semantic-search
sampling does); the approximate indexes' recall@k is measured against exact search.
"""

from __future__ import annotations

import time

import numpy as np

from augsbert_ray.bench.records import PartResult


def grow(emb: np.ndarray, scale: int, noise: float, seed: int) -> np.ndarray:
    """``emb`` and ``scale - 1`` noisy copies of it, each row of unit norm: a larger corpus with
    the real embeddings' cluster structure (synthetic, to be said where it is reported)."""
    if scale == 1:
        return emb
    rng = np.random.default_rng(seed)
    out = np.empty((len(emb) * scale, emb.shape[1]), np.float32)
    out[:len(emb)] = emb
    for i in range(1, scale):
        e = rng.standard_normal(emb.shape).astype(np.float32)
        e *= noise / np.linalg.norm(e, axis=1, keepdims=True)
        e += emb
        out[i * len(emb):(i + 1) * len(emb)] = e / np.linalg.norm(e, axis=1, keepdims=True)
    return out


def top_k_others(scores: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Each query's first ``k`` hits that are not the query itself (-1 where fewer)."""
    keep = (ids >= 0) & (ids != queries[:, None])
    keep &= np.cumsum(keep, axis=1) <= k
    out = np.full((len(ids), k), -1, np.int64)
    for r in range(len(ids)):
        row = ids[r][keep[r]]
        out[r, :len(row)] = row
    return out


def recall(got: np.ndarray, exact: np.ndarray) -> float:
    """The mean share of each exact top-k list that ``got`` found."""
    k = exact.shape[1]
    return float(np.mean([len(set(g[g >= 0].tolist()) & set(e.tolist())) / k for g, e in zip(got, exact)]))


def st_search(corpus: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``util.semantic_search`` (exact cosine top-k in torch), as (scores, ids) arrays."""
    import torch
    from sentence_transformers import util

    hits = util.semantic_search(torch.from_numpy(queries), torch.from_numpy(corpus), top_k=k)
    return (np.array([[h["score"] for h in row] for row in hits], np.float32),
            np.array([[h["corpus_id"] for h in row] for row in hits], np.int64))


def run(result: PartResult, emb: np.ndarray, k: int, n_queries: int, approximate: list[tuple[str, object]],
        log, use_gpu: bool = False) -> None:
    """Fills ``result`` with queries/s and recall@k of each search on ``emb`` (unit rows).

    Args:
        approximate: (name, ``config.FaissConfig``) of each approximate index to time.
        use_gpu: also time the exact index on a GPU (where faiss has one).
    """
    from augsbert_ray.candidates.semantic import build_faiss_index
    from augsbert_ray.config import FaissConfig

    n = len(emb)
    q_ids = np.sort(np.random.default_rng(1).choice(n, min(n_queries, n), replace=False))
    queries = np.ascontiguousarray(emb[q_ids])
    peer_name, exact_name = "sentence_transformers.util.semantic_search (exact)", "engine: Faiss flat (exact)"

    def timed(name: str, build, search, side: str = "engine", vs: str | None = peer_name):
        t0 = time.perf_counter()
        index = build()
        built = time.perf_counter() - t0
        search(index, queries[:16])  # warm-up (threads, caches), not timed
        t0 = time.perf_counter()
        scores, ids = search(index, queries)
        secs = time.perf_counter() - t0
        log(f"[bench] semantic: {name}: {len(q_ids) / secs:,.0f} queries/s")
        result.add(name, len(q_ids) / secs, "queries/s", side=side, vs=vs,
                   note=f"index built in {built:.2f} s" if built > 0.01 else "")
        return top_k_others(scores, ids, q_ids, k)

    peer = timed(peer_name, lambda: None, lambda _, q: st_search(emb, q, k + 1), side="peer", vs=None)
    exact = timed(exact_name, lambda: build_faiss_index(emb, FaissConfig(use_gpu=False), 0),
                  lambda ix, q: ix.search(q, k + 1))
    recalls = {peer_name: recall(peer, exact)}
    if use_gpu:
        import faiss

        if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
            name = "engine: Faiss flat on the GPU (exact)"
            recalls[name] = recall(timed(name, lambda: build_faiss_index(emb, FaissConfig(use_gpu=True), 0),
                                         lambda ix, q: ix.search(q, k + 1)), exact)
    for name, cfg in approximate:
        got = timed(name, lambda c=cfg: build_faiss_index(emb, c, 0), lambda ix, q: ix.search(q, k + 1))
        recalls[name] = recall(got, exact)
    for name, r in recalls.items():
        result.add(f"recall@{k} vs exact: {name.split(' (')[0]}", r, f"recall@{k}", side="info")
    result.data.update({"rows": n, "queries": len(q_ids), "k": k, "recall": recalls})
