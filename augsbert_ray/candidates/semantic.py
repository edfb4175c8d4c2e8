"""Semantic search sampling (AugSBERT section 3.1, "Semantic Search Sampling (SS)").

A bi-encoder (in the paper, the one trained on the gold data) embeds every unique
sentence; each sentence's top-k nearest neighbours by cosine similarity become
candidate pairs. SS finds the semantically similar pairs that BM25's lexical overlap
misses, such as paraphrases sharing few words.

Embedding runs in a Ray Data actor pool (the model loads once per actor, on a GPU when
one is given); the nearest-neighbour search runs in Faiss over normalised embeddings, so
that inner product is cosine similarity: one index in the sampling process, or
``faiss.shards`` indexes each held by a Ray actor (``ShardedIndex``), whose top-k lists
are merged exactly. Flat and IVF indexes run on a GPU where faiss-gpu sees one.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from augsbert_ray import schema

EMBEDDING = "embedding"


def embed_texts(model, texts: list[str], batch_size: int) -> np.ndarray:
    """Embeds texts with a sentence-transformers model.

    Args:
        model: a ``SentenceTransformer``.
        texts: the sentences.
        batch_size: sentences per forward pass.

    Returns:
        float32 array of shape (len(texts), dim), each row of unit L2 norm.
    """
    emb = model.encode(
        list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    return np.ascontiguousarray(emb, dtype=np.float32)


class SentenceEmbedder:
    """Ray Data callable: loads the bi-encoder once, maps sentences to (sentence_id, embedding).

    With ``progress`` (a picklable ``StageProgress``), each batch's sentences are reported.
    """

    def __init__(self, model_path: str, max_length: int, batch_size: int, threads: float, use_gpu: bool,
                 progress=None):
        import torch

        from augsbert_ray.models import load_bi_encoder

        # Without this torch takes every core of the node, and actors sharing it thrash.
        torch.set_num_threads(max(1, int(threads)))
        device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        self.model = load_bi_encoder(model_path, max_length, device=device)
        self.batch_size = batch_size
        self.progress = progress

    def __call__(self, batch: pa.Table) -> pa.Table:
        import torch

        with torch.inference_mode():
            emb = embed_texts(self.model, batch.column(schema.TEXT).to_pylist(), self.batch_size)
        flat = pa.array(emb.reshape(-1), pa.float32())
        if self.progress is not None:
            self.progress.advance(batch.num_rows)
            self.progress.flush()
        return pa.table(
            {
                schema.SENTENCE_ID: batch.column(schema.SENTENCE_ID),
                EMBEDDING: pa.FixedSizeListArray.from_arrays(flat, emb.shape[1]),
            }
        )


def embeddings_by_id(tables: list[pa.Table], n_sentences: int) -> np.ndarray:
    """Stacks embedder output into one (n_sentences, dim) float32 array, row i = sentence i.

    Raises:
        RuntimeError: if the sentence ids are not exactly ``0 .. n_sentences - 1``.
    """
    t = pa.concat_tables(tables)
    ids = t.column(schema.SENTENCE_ID).to_numpy()
    col = t.column(EMBEDDING)
    dim = col.type.list_size
    # flatten() honours each chunk's offset, so sliced chunks come out right.
    emb = np.concatenate(
        [c.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim) for c in col.chunks]
    ) if col.num_chunks else np.empty((0, dim), np.float32)
    order = np.argsort(ids, kind="stable")
    if not np.array_equal(ids[order], np.arange(n_sentences)):  # every sentence embedded exactly once
        raise RuntimeError(f"embedding returned {len(ids)} rows whose ids are not 0..{n_sentences - 1}")
    return np.ascontiguousarray(emb[order], dtype=np.float32)


def build_faiss_index(emb: np.ndarray, cfg, seed: int):
    """Builds an inner-product Faiss index over normalised embeddings (inner product = cosine).

    Args:
        emb: float32 array (n, dim), rows of unit norm.
        cfg: ``config.FaissConfig``. ``flat`` is exact; ``ivf`` clusters into
            ``min(ivf_nlist, n // 39)`` cells (39 points per centroid is Faiss's training
            minimum) and visits ``ivf_nprobe`` of them; ``hnsw`` is a graph of degree
            ``hnsw_m`` searched with beam ``hnsw_ef_search``.
        seed: seeds IVF's k-means, so the index is reproducible. (HNSW built on several
            threads may still differ slightly between runs.)

    Returns:
        A ``faiss.Index`` holding ``emb``, ids = row numbers.

    Raises:
        ValueError: on an unknown ``cfg.index``.
    """
    import faiss

    emb = np.ascontiguousarray(emb, dtype=np.float32)
    n, dim = emb.shape
    if cfg.index == "flat":
        index = faiss.IndexFlatIP(dim)
    elif cfg.index == "ivf":
        nlist = min(cfg.ivf_nlist, max(1, n // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = int(seed) % 2**31
        index.train(emb)
        index.nprobe = min(cfg.ivf_nprobe, nlist)
    elif cfg.index == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = cfg.hnsw_ef_search
    else:
        raise ValueError(f"unknown faiss index '{cfg.index}'; valid: flat, hnsw, ivf")
    index.add(emb)
    return _on_gpu(index) if getattr(cfg, "use_gpu", False) else index


def _on_gpu(index):
    """``index`` copied to GPU 0 where faiss-gpu sees a GPU (not HNSW, which faiss runs on CPU)."""
    import faiss

    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return index
    if isinstance(index, faiss.IndexHNSW):
        return index
    res = faiss.StandardGpuResources()
    gpu_index = faiss.index_cpu_to_gpu(res, 0, index)
    gpu_index.referenced_objects = [res]  # the resources must live as long as the index
    return gpu_index


def merge_top_k(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merges per-shard ``(scores, ids)`` top lists (ids global, -1 for none) into one top ``k``,
    listed as one flat index over all the rows lists them.

    Every true top-k neighbour is in its own shard's top k, so the merge is exact. Equal scores
    are ordered as a Faiss flat index orders them: of a tie at the k-th place the smallest ids
    are kept, and tied hits are listed largest id first (``test_semantic.py`` checks this against
    Faiss), so that dropping the query itself (``top_k_others``) keeps the same neighbours.
    """
    scores = np.concatenate([p[0] for p in parts], axis=1).astype(np.float32)
    ids = np.concatenate([p[1] for p in parts], axis=1).astype(np.int64)
    scores[ids < 0] = -np.inf
    kept = np.lexsort((ids, -scores))[:, :k]  # best first, then the smallest ids
    scores, ids = np.take_along_axis(scores, kept, 1), np.take_along_axis(ids, kept, 1)
    order = np.lexsort((-ids, -scores))
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


class _IndexShard:
    """Ray actor: one shard's Faiss index over rows ``offset .. offset + len(emb)``."""

    def __init__(self, emb: np.ndarray, offset: int, cfg, seed: int):
        self.offset = offset
        self.index = build_faiss_index(emb, cfg, seed)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = self.index.search(queries, min(k, self.index.ntotal))
        return scores, np.where(ids >= 0, ids + self.offset, -1)


class ShardedIndex:
    """A Faiss index split row-wise over ``shards`` Ray actors, searched like one index.

    Each query batch goes to every shard; the shards' top-k lists are merged (``merge_top_k``).
    With ``flat`` shards the result equals one flat index over all rows.
    """

    def __init__(self, emb: np.ndarray, cfg, seed: int, shards: int, num_cpus: float = 1, num_gpus: float = 0,
                 query_batch: int = 65536):

        import ray

        from augsbert_ray.runtime import require_resources

        require_resources([{"CPU": num_cpus, "GPU": num_gpus}] * shards,
                          "the Faiss index shards (sampling.faiss.shards, shard_cpus, shard_gpus)")
        self.ntotal = len(emb)
        bounds = np.linspace(0, self.ntotal, shards + 1).astype(np.int64)
        actor = ray.remote(_IndexShard).options(num_cpus=num_cpus, num_gpus=num_gpus)
        self.actors = [actor.remote(np.ascontiguousarray(emb[lo:hi]), int(lo), cfg, seed + i)
                       for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])) if hi > lo]
        self.query_batch = query_batch

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import logging

        import ray

        log = logging.getLogger(__name__)
        out_s, out_i = [], []
        for start in range(0, len(queries), self.query_batch):
            batch = ray.put(np.ascontiguousarray(queries[start:start + self.query_batch]))
            s, i = merge_top_k(ray.get([a.search.remote(batch, k) for a in self.actors]), k)
            out_s.append(s)
            out_i.append(i)
            log.debug("semantic search: %d / %d queries over %d shards", min(start + self.query_batch, len(queries)),
                      len(queries), len(self.actors))
        return np.concatenate(out_s), np.concatenate(out_i)

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


def search_top_k(index, emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` nearest other sentences of every sentence.

    Searches ``k + 1`` neighbours, since a sentence is normally its own nearest one, then
    drops the sentence itself and the ``-1`` ids Faiss pads with when it finds fewer.

    Args:
        index: a Faiss index over ``emb`` (ids = row numbers).
        emb: the queries: the same float32 (n, dim) embeddings.
        k: neighbours per sentence.

    Returns:
        ``(query_ids, hit_ids, scores)``: int64, int64, float32 arrays, each query's hits
        best first.
    """
    n = len(emb)
    if n == 0 or k <= 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    scores, hits = index.search(np.ascontiguousarray(emb, dtype=np.float32), min(k + 1, n))
    return top_k_others(np.arange(n, dtype=np.int64), scores, hits, k)


def top_k_others(query_ids: np.ndarray, scores: np.ndarray, hits: np.ndarray,
                 k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A search's ``k + 1`` hits per query (rows best first, ``-1`` for none) as the best ``k``
    other sentences of each: ``(query_ids, hit_ids, scores)``, each query's hits best first."""
    queries = np.broadcast_to(np.asarray(query_ids, np.int64)[:, None], hits.shape)
    keep = (hits >= 0) & (hits != queries)
    # If the query was not among its own hits (a tie, or an approximate index missing
    # it), k + 1 others remain: keep the best k.
    keep &= np.cumsum(keep, axis=1) <= k
    return queries[keep], hits[keep].astype(np.int64), scores[keep].astype(np.float32)


def embed_on_ray(ctx) -> np.ndarray:
    """Embeds ``ctx.sentences`` with ``ctx.bi_encoder`` in a Ray Data actor pool (or on a warm
    host: ``ctx.on_hosts``).

    Returns:
        float32 array (n_sentences, dim) of unit rows, row i = sentence id i.
    """
    import ray
    from ray.data import ActorPoolStrategy

    from augsbert_ray.runtime import dataset_of_blocks, require_resources

    cfg = ctx.cfg
    progress = getattr(ctx, "progress", None)
    kwargs = {
        "model_path": ctx.bi_encoder,  # a name, a path, or a ShippedModel: resolved in each actor
        "max_length": ctx.max_length,
        "batch_size": cfg.embed_batch_size,
        "threads": ctx.cpus_per_actor,
        "use_gpu": ctx.gpus_per_actor > 0,
        "progress": progress,
    }
    what = "embedding sentences for semantic search (sampling.searchers, training.use_gpu)"
    if ctx.on_hosts:
        from augsbert_ray.candidates.hosts import map_on_host

        if progress is not None:
            progress.add_total(ctx.sentences.num_rows, unit="sentences")
        tables = map_on_host(ctx.hosts, SentenceEmbedder, kwargs, ctx.sentences, cfg.query_batch_size, cpus=ctx.cpus_per_actor,
                             gpus=ctx.gpus_per_actor, what=what)
        return embeddings_by_id(tables, ctx.sentences.num_rows)
    require_resources([{"CPU": ctx.cpus_per_actor, "GPU": ctx.gpus_per_actor}] * cfg.searchers, what)
    if progress is not None:
        progress.add_total(ctx.sentences.num_rows, unit="sentences")
    embedded = dataset_of_blocks(ctx.sentences, cfg.query_batch_size).map_batches(
        SentenceEmbedder,
        fn_constructor_kwargs=kwargs,
        compute=ActorPoolStrategy(size=cfg.searchers),
        batch_size=cfg.query_batch_size,
        batch_format="pyarrow",
        num_cpus=ctx.cpus_per_actor,
        num_gpus=ctx.gpus_per_actor,
    )
    return embeddings_by_id(ray.get(embedded.to_arrow_refs()), ctx.sentences.num_rows)


def sample(ctx) -> pa.Table:
    """SS: each sentence's ``cfg.top_k`` nearest neighbours by the bi-encoder's cosine.

    Raises:
        ValueError: if ``ctx.bi_encoder`` is not set.
    """
    from augsbert_ray.candidates.pairs import finalize_candidates

    if ctx.bi_encoder is None:
        raise ValueError("semantic search sampling needs a bi-encoder: SamplingContext.bi_encoder is None")
    if ctx.sentences.num_rows == 0:
        return schema.empty_table(schema.CANDIDATE_SCHEMA)
    emb = embed_on_ray(ctx)
    fcfg = ctx.cfg.faiss
    if fcfg.shards > 1:
        index = ShardedIndex(emb, fcfg, ctx.seed, fcfg.shards, num_cpus=fcfg.shard_cpus, num_gpus=fcfg.shard_gpus)
        try:
            q, h, s = search_top_k(index, emb, ctx.cfg.top_k)
        finally:
            index.close()
    else:
        q, h, s = search_top_k(build_faiss_index(emb, fcfg, ctx.seed), emb, ctx.cfg.top_k)
    return finalize_candidates(q, h, s, ctx.sentences, ctx.gold_keys, origin="ss")
