"""Semantic top-k: the engine's Faiss search, exact and approximate, against
``sentence_transformers.util.semantic_search`` on the same embeddings, queries and k.

Queries are corpus rows, each searching for its k nearest *other* rows (as semantic-search
sampling does); the approximate indexes' recall@k is measured against exact search.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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


def sample_queries(emb: np.ndarray, n_queries: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A seeded sample of ``n_queries`` rows of ``emb`` (all where fewer): (row ids, sorted; their rows)."""
    n = len(emb)
    q_ids = np.sort(np.random.default_rng(seed).choice(n, min(n_queries, n), replace=False))
    return q_ids, np.ascontiguousarray(emb[q_ids])


@dataclass(frozen=True)
class Timing:
    """One search timed: its index's build time, the search's time and rate, and its top-k."""

    build_s: float
    search_s: float
    queries_per_s: float
    hits: np.ndarray  # each query's top-k other rows (-1 where fewer)


def timed_search(build, search, queries: np.ndarray, q_ids: np.ndarray, k: int) -> Timing:
    """Builds an index and times one search of every query through it.

    Args:
        build: ``() -> index`` (timed apart from the search).
        search: ``(index, queries) -> (scores, ids)``, asked for ``k + 1`` hits (a query finds itself).
        queries, q_ids: the query rows and their row ids (``sample_queries``).
        k: the hits kept per query, the query itself left out.

    Returns:
        A ``Timing``. A warm-up search of 16 queries (threads, caches) runs first, untimed; an
        index with ``close`` (sharded over actors) is closed after.
    """
    t0 = time.perf_counter()
    index = build()
    built = time.perf_counter() - t0
    search(index, queries[:16])
    t0 = time.perf_counter()
    scores, ids = search(index, queries)
    secs = time.perf_counter() - t0
    if hasattr(index, "close"):
        index.close()
    return Timing(built, secs, len(q_ids) / secs, top_k_others(scores, ids, q_ids, k))


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
    q_ids, queries = sample_queries(emb, n_queries)
    peer_name, exact_name = "sentence_transformers.util.semantic_search (exact)", "engine: Faiss flat (exact)"

    def timed(name: str, build, search, side: str = "engine", vs: str | None = peer_name):
        t = timed_search(build, search, queries, q_ids, k)
        log(f"[bench] semantic: {name}: {t.queries_per_s:,.0f} queries/s")
        result.add(name, t.queries_per_s, "queries/s", side=side, vs=vs,
                   note=f"index built in {t.build_s:.2f} s" if t.build_s > 0.01 else "")
        return t.hits

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
