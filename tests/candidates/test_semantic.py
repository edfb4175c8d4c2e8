"""Semantic search sampling (SS): Faiss search checked against brute-force cosine top-k."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_sentence

from augsbert_ray import schema
from augsbert_ray.candidates import SamplingContext, get_sampler, semantic
from augsbert_ray.candidates.pairs import finalize_candidates, pair_keys
from augsbert_ray.config import FaissConfig, SamplingConfig

K = 5


def _unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    e = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def _brute_top_k(emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k most cosine-similar other rows (ids, scores), best first."""
    sims = emb @ emb.T
    np.fill_diagonal(sims, -np.inf)
    ids = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return ids, np.take_along_axis(sims, ids, axis=1)


def _per_query(q: np.ndarray, h: np.ndarray, n: int) -> list[list[int]]:
    return [h[q == i].tolist() for i in range(n)]


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return _unit_vectors(500, 32, seed=0)


def test_flat_equals_brute_force(vectors):
    index = semantic.build_faiss_index(vectors, FaissConfig(index="flat"), seed=0)
    q, h, s = semantic.search_top_k(index, vectors, K)
    ids, scores = _brute_top_k(vectors, K)
    assert q.dtype == h.dtype == np.int64 and s.dtype == np.float32
    assert np.array_equal(q, np.repeat(np.arange(len(vectors)), K))
    # Random vectors have no ties, so ids match exactly, best first.
    assert np.array_equal(h.reshape(-1, K), ids)
    np.testing.assert_allclose(s.reshape(-1, K), scores, atol=1e-5)


def test_ivf_probing_every_cell_equals_flat(vectors):
    cfg = FaissConfig(index="ivf", ivf_nlist=64, ivf_nprobe=10_000)
    index = semantic.build_faiss_index(vectors, cfg, seed=0)
    assert index.nlist == len(vectors) // 39  # capped at Faiss's 39 training points per cell
    assert index.nprobe == index.nlist
    flat = semantic.search_top_k(semantic.build_faiss_index(vectors, FaissConfig(), seed=0), vectors, K)
    got = semantic.search_top_k(index, vectors, K)
    assert np.array_equal(got[0], flat[0]) and np.array_equal(got[1], flat[1])
    np.testing.assert_allclose(got[2], flat[2], atol=1e-5)


def test_hnsw_recall_against_flat(vectors):
    index = semantic.build_faiss_index(vectors, FaissConfig(index="hnsw", hnsw_m=16, hnsw_ef_search=64), seed=0)
    assert index.hnsw.efSearch == 64
    q, h, _ = semantic.search_top_k(index, vectors, K)
    ids, _ = _brute_top_k(vectors, K)
    found = _per_query(q, h, len(vectors))
    assert all(len(f) == K and i not in f for i, f in enumerate(found))
    recall = np.mean([len(set(f) & set(ids[i].tolist())) / K for i, f in enumerate(found)])
    assert recall > 0.9


def test_search_drops_missing_hits_and_keeps_k_when_the_query_is_not_returned():
    # Four sentences, k = 5: Faiss pads with -1, which must not become pairs.
    emb = _unit_vectors(4, 8, seed=1)
    q, h, _ = semantic.search_top_k(semantic.build_faiss_index(emb, FaissConfig(), 0), emb, K)
    assert len(q) == 4 * 3 and (h >= 0).all() and not (q == h).any()
    # Duplicated vectors: a query may be outranked by its twin, and still gets k hits, none itself.
    twins = np.repeat(emb, 2, axis=0)
    q, h, _ = semantic.search_top_k(semantic.build_faiss_index(twins, FaissConfig(), 0), twins, 2)
    assert len(q) == 16 and not (q == h).any()
    assert all(i ^ 1 in found for i, found in enumerate(_per_query(q, h, 8)))  # each finds its twin


def test_merge_top_k_takes_the_best_across_shards_and_drops_padding():
    a = (np.array([[0.9, 0.5], [0.4, -1.0]], np.float32), np.array([[3, 1], [0, -1]]))
    b = (np.array([[0.7, 0.6], [0.8, 0.2]], np.float32), np.array([[10, 12], [11, 13]]))
    scores, ids = semantic.merge_top_k([a, b], 3)
    assert ids.tolist() == [[3, 10, 12], [11, 0, 13]]
    np.testing.assert_allclose(scores, [[0.9, 0.7, 0.6], [0.8, 0.4, 0.2]])
    # Fewer hits than k in all shards together: the padding stays -1 (search_top_k drops it).
    _, ids = semantic.merge_top_k([a, b], 4)
    assert ids[1].tolist() == [11, 0, 13, -1]


def test_merged_shards_break_ties_as_one_flat_index():
    # Nine distinct vectors, each many times: every neighbour list ends in a tie that spans shards.
    rng = np.random.default_rng(0)
    base = rng.standard_normal((9, 8)).astype(np.float32)
    emb = (base / np.linalg.norm(base, axis=1, keepdims=True))[rng.integers(0, 9, 300)]
    k = 4
    one = semantic.search_top_k(semantic.build_faiss_index(emb, FaissConfig(use_gpu=False), 0), emb, k)
    for cuts in ([0, 100, 300], [0, 7, 13, 150, 151, 300]):
        top = np.empty((300, 0), np.float32), np.empty((300, 0), np.int64)
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            index = semantic.build_faiss_index(emb[lo:hi], FaissConfig(use_gpu=False), 0)
            scores, ids = index.search(emb, min(k + 1, hi - lo))
            top = semantic.merge_top_k([top, (scores, ids + lo)], k + 1)
        got = semantic.top_k_others(np.arange(300), *top, k)
        assert all(np.array_equal(a, b) for a, b in zip(got, one)), cuts


def test_sharded_flat_index_equals_one_index(ray_local, vectors):
    ids, scores = _brute_top_k(vectors, K)
    # 3 uneven shards (500 rows), queries sent in batches of 128.
    index = semantic.ShardedIndex(vectors, FaissConfig(), seed=0, shards=3, num_cpus=0.5, query_batch=128)
    try:
        assert len(index.actors) == 3
        q, h, s = semantic.search_top_k(index, vectors, K)
    finally:
        index.close()
    assert np.array_equal(q, np.repeat(np.arange(len(vectors)), K))
    assert np.array_equal(h.reshape(-1, K), ids)
    np.testing.assert_allclose(s.reshape(-1, K), scores, atol=1e-5)
    # More shards than rows: empty shards are skipped, missing hits dropped.
    small = _unit_vectors(4, 8, seed=1)
    index = semantic.ShardedIndex(small, FaissConfig(), seed=0, shards=6, num_cpus=0.25)
    try:
        assert len(index.actors) == 4
        q, h, _ = semantic.search_top_k(index, small, K)
    finally:
        index.close()
    assert len(q) == 4 * 3 and (h >= 0).all() and not (q == h).any()


def test_unknown_index_and_missing_bi_encoder_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown faiss index 'lsh'"):
        semantic.build_faiss_index(_unit_vectors(4, 8, 0), FaissConfig.model_construct(index="lsh"), 0)
    ctx = SamplingContext(
        sentences=_table(["a", "b"]), gold_keys=np.empty(0, np.int64), cfg=SamplingConfig(), work_dir=tmp_path, seed=0
    )
    with pytest.raises(ValueError, match="bi_encoder is None"):
        get_sampler("ss")(ctx)


def test_embeddings_come_back_in_sentence_order_whatever_the_blocks():
    emb = _unit_vectors(10, 4, seed=2)

    def block(ids):
        flat = pa.array(emb[ids].reshape(-1), pa.float32())
        return pa.table({schema.SENTENCE_ID: pa.array(ids, pa.int64()),
                         semantic.EMBEDDING: pa.FixedSizeListArray.from_arrays(flat, 4)})

    # Blocks finish in any order on any actor, and may arrive as slices of larger tables.
    blocks = [block([7, 8, 9]), block([0, 1, 2, 3, 4, 5, 6]).slice(3), block([0, 1, 2])]
    np.testing.assert_array_equal(semantic.embeddings_by_id(blocks, 10), emb)
    with pytest.raises(RuntimeError, match="not 0..9"):
        semantic.embeddings_by_id(blocks[:2], 10)


def _table(texts: list[str]) -> pa.Table:
    return pa.table(
        {schema.SENTENCE_ID: pa.array(range(len(texts)), pa.int64()), schema.TEXT: pa.array(texts, pa.string())},
        schema=schema.SENTENCE_SCHEMA,
    )


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts: dict[str, None] = {}
    while len(texts) < n:
        texts.setdefault(make_sentence(rng))
    return list(texts)


def test_sample_on_ray_equals_local_brute_force(ray_local, tiny_model, tmp_path, monkeypatch):
    from augsbert_ray.models import load_bi_encoder

    texts = _sentences(30, seed=3)
    local = semantic.embed_texts(load_bi_encoder(tiny_model, 64), texts, batch_size=8)
    ids, scores = _brute_top_k(local, K)
    # Near-ties at the k-th neighbour could swap with tiny float differences between
    # batchings; the fixed tiny model and texts have a clear margin, checked here.
    sims = local @ local.T
    np.fill_diagonal(sims, -np.inf)
    margin = scores[:, -1] - np.sort(sims, axis=1)[:, -K - 1]
    assert margin.min() > 1e-5

    n = len(texts)
    gold_keys = np.unique(pair_keys(ids[::6, 0], np.arange(0, n, 6), n))  # gold pairs SS would find
    expected = finalize_candidates(
        np.repeat(np.arange(n), K), ids.reshape(-1), scores.reshape(-1), _table(texts), gold_keys, origin="ss"
    )
    # One actor (each one imports torch, seconds on a small CI box); several blocks.
    cfg = SamplingConfig(top_k=K, query_batch_size=7, searchers=1, embed_batch_size=4)
    ctx = SamplingContext(
        sentences=_table(texts), gold_keys=gold_keys, cfg=cfg, work_dir=tmp_path, seed=0,
        bi_encoder=tiny_model, max_length=64,
    )
    # Record the embeddings the sampler computes (an actor pool starts in seconds, so once).
    seen = []
    embed_on_ray = semantic.embed_on_ray
    monkeypatch.setattr(semantic, "embed_on_ray", lambda c: seen.append(embed_on_ray(c)) or seen[-1])
    got = get_sampler("ss")(ctx)
    np.testing.assert_allclose(seen[0], local, atol=1e-5)

    assert schema.conforms(got, schema.CANDIDATE_SCHEMA)
    assert got.drop_columns([schema.RETRIEVAL_SCORE]).equals(expected.drop_columns([schema.RETRIEVAL_SCORE]))
    np.testing.assert_allclose(
        got.column(schema.RETRIEVAL_SCORE).to_numpy(), expected.column(schema.RETRIEVAL_SCORE).to_numpy(), atol=1e-5
    )
    keys = pair_keys(got.column(schema.ID1).to_numpy(), got.column(schema.ID2).to_numpy(), n)
    assert (got.column(schema.ID1).to_numpy() < got.column(schema.ID2).to_numpy()).all()
    assert len(np.unique(keys)) == len(keys) and not np.isin(keys, gold_keys).any()
    assert set(got.column(schema.ORIGIN).to_pylist()) == {"ss"}

    # The same search over two index shards (Ray actors) gives the same candidates.
    monkeypatch.setattr(semantic, "embed_on_ray", lambda c: seen[0])
    sharded = SamplingConfig(top_k=K, faiss=FaissConfig(shards=2, shard_cpus=0.5))
    assert get_sampler("ss")(ctx.__class__(**{**ctx.__dict__, "cfg": sharded})).equals(got)

    # Embedded on a warm host instead of the pool: the same batches, the same embeddings.
    from augsbert_ray import workers

    monkeypatch.setattr(semantic, "embed_on_ray", embed_on_ray)
    hosts = workers.HostPool()
    try:
        warm = ctx.__class__(**{**ctx.__dict__, "hosts": hosts})
        np.testing.assert_array_equal(semantic.embed_on_ray(warm), seen[0])
        assert hosts.started == 1
    finally:
        hosts.close()
