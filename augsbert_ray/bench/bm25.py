"""BM25: the engine's Tantivy index against ``bm25s``, on the same sentences, queries and k.

Each sentence of the corpus is also a query, as in BM25 sampling. Both run in this process
on one thread (``n_threads=1`` for bm25s): queries per second per core.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from augsbert_ray.bench.records import PartResult


def engine_search(docs: list[str], k: int, queries: list[str] | None = None) -> dict:
    """The engine's index (``candidates.bm25``) built over ``docs`` and queried with each of
    ``queries`` (default: ``docs``).

    Returns:
        ``index_s``, ``qps``, ``queries`` and each query's top-k ``ids``.
    """
    import pyarrow as pa

    from augsbert_ray import schema
    from augsbert_ray.candidates.bm25 import BM25Index, build_index

    queries = docs if queries is None else queries
    with tempfile.TemporaryDirectory(prefix="bench-bm25-") as tmp:
        t0 = time.perf_counter()
        table = pa.table({schema.SENTENCE_ID: np.arange(len(docs), dtype=np.int64), schema.TEXT: docs},
                         schema=schema.SENTENCE_SCHEMA)
        index = BM25Index(build_index(table, Path(tmp) / "index"))
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = [[i for i, _ in index.top_k(q, k)] for q in queries]
        secs = time.perf_counter() - t0
    return {"index_s": built, "qps": len(queries) / secs, "queries": len(queries), "ids": ids}


def bm25s_search(docs: list[str], k: int, queries: list[str] | None = None) -> dict:
    """``bm25s`` over the same ``docs`` and ``queries`` (one thread); as ``engine_search``."""
    import bm25s

    queries = docs if queries is None else queries
    t0 = time.perf_counter()
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(docs, stopwords=None, lower=True, show_progress=False), show_progress=False)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    q_tokens = bm25s.tokenize(queries, stopwords=None, lower=True, show_progress=False)
    ids, _ = retriever.retrieve(q_tokens, k=k, n_threads=1, show_progress=False)
    secs = time.perf_counter() - t0
    return {"index_s": built, "qps": len(queries) / secs, "queries": len(queries), "ids": [r.tolist() for r in ids]}


def overlap(a: list[list[int]], b: list[list[int]], k: int) -> float:
    """The mean share of one top-k list's ids that the other's holds."""
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)])) if a else 0.0


def run(result: PartResult, docs: list[str], k: int, log) -> None:
    """Fills ``result``: each library's queries/s and index build time, and their top-k overlap."""
    log(f"[bench] bm25: {len(docs):,} sentences, each a query, top-{k}")
    ours = engine_search(docs, k)
    engine = "engine: Tantivy index, in-process, 1 thread"
    result.add(engine, ours["qps"], "queries/s", vs="bm25s, 1 thread",
               note=f"{ours['queries']:,} queries; index built in {ours['index_s']:.2f} s")
    result.data["engine"] = {k_: v for k_, v in ours.items() if k_ != "ids"}
    try:
        import bm25s  # noqa: F401
    except ImportError:
        result.add("bm25s, 1 thread", None, "queries/s", side="peer", note="bm25s is not installed (pip install bm25s)")
        return
    peer = bm25s_search(docs, k)
    result.add("bm25s, 1 thread", peer["qps"], "queries/s", side="peer",
               note=f"{peer['queries']:,} queries; index built in {peer['index_s']:.2f} s")
    result.data["bm25s"] = {k_: v for k_, v in peer.items() if k_ != "ids"}
    shared = overlap(ours["ids"], peer["ids"], k)
    result.add(f"top-{k} overlap, engine vs bm25s", shared, "share", side="info",
               note="tokenisation and idf differ slightly between the libraries")
