"""BM25 sampling, checked against a brute-force BM25 and against the sampler run without Ray."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_sentence

from augsbert_ray import schema
from augsbert_ray.candidates import SamplingContext, bm25, get_sampler
from augsbert_ray.candidates.pairs import finalize_candidates, pair_keys
from augsbert_ray.config import SamplingConfig

K1, B = 1.2, 0.75
TOP_K = 3
EXTRA = ["slowly", "today", "outside", "again", "with a friend", "near the river", "in the rain", "very very"]


def _corpus(n: int = 40, seed: int = 7) -> list[str]:
    """Distinct synthetic sentences of varied length (all well under Tantivy's 40-token exact fieldnorm range)."""
    rng = random.Random(seed)
    texts: dict[str, None] = {}
    while len(texts) < n:
        extra = " ".join(rng.sample(EXTRA, rng.randint(0, 4)))
        texts.setdefault(f"{make_sentence(rng)[:-1]} {extra}".strip() + ".")
    return list(texts)


def _table(texts: list[str]) -> pa.Table:
    return pa.table(
        {schema.SENTENCE_ID: pa.array(range(len(texts)), pa.int64()), schema.TEXT: pa.array(texts, pa.string())},
        schema=schema.SENTENCE_SCHEMA,
    )


class BruteBM25:
    """Tantivy's BM25 computed directly: score every document for every query term."""

    def __init__(self, texts: list[str]):
        an = bm25.analyzer()
        self.analyzer = an
        self.docs = [Counter(an.analyze(t)) for t in texts]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avgdl = sum(self.lengths) / len(self.docs)
        self.df = Counter(term for d in self.docs for term in d)

    def scores(self, text: str) -> np.ndarray:
        n_docs = len(self.docs)
        out = np.zeros(n_docs)
        for term in set(self.analyzer.analyze(text)):  # distinct terms, each once
            n = self.df.get(term, 0)
            if n == 0:
                continue
            idf = math.log(1 + (n_docs - n + 0.5) / (n + 0.5))
            for i, doc in enumerate(self.docs):
                tf = doc.get(term, 0)
                if tf:
                    norm = K1 * (1 - B + B * self.lengths[i] / self.avgdl)
                    out[i] += idf * (K1 + 1) * tf / (tf + norm)
        return out


@pytest.fixture(scope="module")
def corpus():
    return _corpus()


@pytest.fixture(scope="module")
def index_dir(corpus, tmp_path_factory):
    return bm25.build_index(_table(corpus), tmp_path_factory.mktemp("bm25") / "index")


def _assert_top_k_matches(hits: list[tuple[int, float]], expected: np.ndarray, k: int) -> None:
    """Same scores as brute force, and the same ids up to ties."""
    matching = np.flatnonzero(expected > 0)
    assert len(hits) == min(k, len(matching))
    ids = [i for i, _ in hits]
    scores = np.array([s for _, s in hits])
    assert len(set(ids)) == len(ids)
    assert np.all(np.diff(scores) <= 1e-6), "hits come best first"
    # Each hit's score is that document's true score ...
    np.testing.assert_allclose(scores, expected[ids], rtol=1e-4)
    # ... and the score multiset is the brute-force top k.
    np.testing.assert_allclose(scores, np.sort(expected[matching])[::-1][: len(hits)], rtol=1e-4)
    # Documents strictly better than the k-th score (not tied with it) must all be returned.
    if hits:
        kth = scores[-1]
        must = set(np.flatnonzero(expected > kth * (1 + 1e-4) + 1e-9).tolist())
        assert must <= set(ids)


def test_corpus_is_varied(corpus):
    lengths = [len(bm25.analyzer().analyze(t)) for t in corpus]
    assert max(lengths) < 30 and len(set(lengths)) >= 5
    assert len(set(corpus)) == len(corpus) == 40


@pytest.mark.parametrize("k", [1, TOP_K + 1, 10])
def test_top_k_matches_brute_force_for_every_sentence(corpus, index_dir, k):
    brute = BruteBM25(corpus)
    index = bm25.BM25Index(index_dir)
    untied = 0
    for text in corpus:
        expected = brute.scores(text)
        hits = index.top_k(text, k)
        _assert_top_k_matches(hits, expected, k)
        top = np.sort(expected)[::-1]
        untied += top[0] > top[1] * (1 + 1e-4)
    assert untied > len(corpus) // 2  # most queries have a unique best hit, so ids are really checked


def test_top_k_other_queries(corpus, index_dir):
    brute = BruteBM25(corpus)
    index = bm25.BM25Index(index_dir)
    for text in ["GUITAR guitar guitar", "the river, the rain!", "a dog eating bread outside today"]:
        _assert_top_k_matches(index.top_k(text, 5), brute.scores(text), 5)
    assert index.top_k("zebra xylophone", 5) == []  # no term in the corpus
    assert index.top_k("...", 5) == []  # no term at all
    assert index.top_k(corpus[0], 0) == []


def test_searcher_drops_own_sentence_and_returns_at_most_k(corpus, index_dir):
    table = _table(corpus)
    brute = BruteBM25(corpus)
    out = bm25.BM25Searcher(str(index_dir), top_k=TOP_K)(table.slice(5, 20))
    assert out.schema == schema.HITS_SCHEMA
    q = out.column("query_id").to_numpy()
    h = out.column("hit_id").to_numpy()
    s = out.column("score").to_numpy()
    assert set(q.tolist()) == set(range(5, 25))
    assert not (q == h).any()
    for sid in range(5, 25):
        mine = q == sid
        assert mine.sum() == TOP_K  # every sentence shares terms with more than k others
        expected = brute.scores(corpus[sid])
        expected[sid] = 0.0  # the query itself is not a candidate
        _assert_top_k_matches(list(zip(h[mine].tolist(), s[mine].tolist())), expected, TOP_K)


def _gold_keys(corpus: list[str], index_dir) -> np.ndarray:
    """Gold pairs that BM25 would propose: each chosen sentence with its best other hit."""
    index = bm25.BM25Index(index_dir)
    a, b = [], []
    for sid in range(0, len(corpus), 4):
        best = next(i for i, _ in index.top_k(corpus[sid], 2) if i != sid)
        a.append(best)  # reversed order on purpose: gold keys are order-free
        b.append(sid)
    return np.unique(pair_keys(np.array(a), np.array(b), len(corpus)))


def _without_ray(corpus: list[str], index_dir, gold_keys: np.ndarray) -> tuple[pa.Table, set]:
    table = _table(corpus)
    out = bm25.BM25Searcher(str(index_dir), top_k=TOP_K)(table)
    raw = pair_keys(out.column("query_id").to_numpy(), out.column("hit_id").to_numpy(), len(corpus))
    cands = finalize_candidates(
        out.column("query_id").to_numpy(), out.column("hit_id").to_numpy(), out.column("score").to_numpy(),
        table, gold_keys, origin="bm25",
    )
    return cands, set(raw.tolist())


@pytest.mark.parametrize("searchers,on_hosts", [(1, False), (2, False), (1, True)])
def test_sample_on_ray_equals_local_candidates(ray_local, corpus, index_dir, tmp_path, searchers, on_hosts,
                                               monkeypatch):
    from augsbert_ray import workers

    # Ray Data gives each actor whole blocks: record what the sampler hands it, to check
    # that the queries are split into blocks that several searchers can share.
    seen = []
    from_arrow = ray_local.data.from_arrow
    monkeypatch.setattr(ray_local.data, "from_arrow", lambda tables, **kw: seen.append(tables) or from_arrow(tables, **kw))
    gold_keys = _gold_keys(corpus, index_dir)
    expected, raw_keys = _without_ray(corpus, index_dir, gold_keys)
    assert set(gold_keys.tolist()) <= raw_keys  # the gold filter really has something to drop

    cfg = SamplingConfig(top_k=TOP_K, query_batch_size=7, searchers=searchers)
    assert len(corpus) > 3 * cfg.query_batch_size  # several batches
    hosts = workers.HostPool() if on_hosts else None
    ctx = SamplingContext(sentences=_table(corpus), gold_keys=gold_keys, cfg=cfg, work_dir=tmp_path, seed=0,
                          hosts=hosts)
    try:
        got = get_sampler("bm25")(ctx)
    finally:
        if hosts is not None:
            hosts.close()

    if on_hosts:
        assert not seen and hosts.started == 1  # one warm host searched; no Ray Data pool
    else:
        blocks = seen[0] if isinstance(seen[0], list) else [seen[0]]
        assert len(blocks) >= searchers
        assert pa.concat_tables(blocks).equals(ctx.sentences)

    assert schema.conforms(got, schema.CANDIDATE_SCHEMA)
    assert got.column(schema.ID1).to_pylist() == expected.column(schema.ID1).to_pylist()
    assert got.column(schema.ID2).to_pylist() == expected.column(schema.ID2).to_pylist()
    np.testing.assert_allclose(
        got.column(schema.RETRIEVAL_SCORE).to_numpy(), expected.column(schema.RETRIEVAL_SCORE).to_numpy(), rtol=1e-6
    )
    assert got.drop_columns([schema.RETRIEVAL_SCORE]).equals(expected.drop_columns([schema.RETRIEVAL_SCORE]))
    id1, id2 = got.column(schema.ID1).to_numpy(), got.column(schema.ID2).to_numpy()
    keys = pair_keys(id1, id2, len(corpus))
    assert (id1 < id2).all()  # no self pair, canonical order
    assert len(np.unique(keys)) == len(keys)  # no duplicate in either order
    assert not np.isin(keys, gold_keys).any()
    assert set(got.column(schema.ORIGIN).to_pylist()) == {"bm25"}
    # Every sentence asked for TOP_K neighbours; after dedupe and gold removal most survive.
    assert got.num_rows >= len(corpus)


def test_unknown_sampler_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown sampling strategy 'nope'; valid: .*bm25"):
        get_sampler("nope")


def test_a_shipped_index_answers_without_its_directory(ray_local, corpus, index_dir, tmp_path):
    import shutil

    from augsbert_ray.artifacts import ship_directory

    copy = tmp_path / "index-copy"
    shutil.copytree(index_dir, copy)
    shipped = ship_directory(copy)
    shutil.rmtree(copy)  # as on a node that never saw the driver's disk
    table = _table(corpus).slice(0, 10)
    got = bm25.BM25Searcher(shipped, top_k=TOP_K)(table)
    assert got.equals(bm25.BM25Searcher(str(index_dir), top_k=TOP_K)(table))


def test_warm_hosts_search_small_sets_within_a_job_on_one_machine():
    from augsbert_ray.candidates.hosts import WARM_MAX_SENTENCES, use_hosts

    assert use_hosts("auto", WARM_MAX_SENTENCES, hosts_serve=True)
    assert not use_hosts("auto", WARM_MAX_SENTENCES + 1, hosts_serve=True)
    assert use_hosts("hosts", WARM_MAX_SENTENCES + 1, hosts_serve=True)
    assert not use_hosts("pool", 10, hosts_serve=True)
    assert not use_hosts("hosts", 10, hosts_serve=False)  # outside a job, multi-node, several GPUs


def test_a_host_that_dies_mid_sampling_is_replaced_and_the_call_made_again(monkeypatch):
    from ray.exceptions import RayActorError

    from augsbert_ray import workers
    from augsbert_ray.candidates import hosts

    calls = []

    def dies_then_works(pool, fn, make, kwargs, sentences, batch_size, **resources):
        calls.append(resources)
        if len(calls) <= hosts.HOST_RETRIES:
            raise RayActorError()
        return fn(make, kwargs, sentences, batch_size)

    monkeypatch.setattr(workers, "remote_call", dies_then_works)
    table = pa.table({"x": list(range(5))})
    out = hosts.map_on_host(None, lambda: (lambda b: b), {}, table, 2, cpus=1, gpus=0, what="x")
    assert pa.concat_tables(out).equals(table) and [b.num_rows for b in out] == [2, 2, 1]
    assert len(calls) == hosts.HOST_RETRIES + 1 and calls[0] == {"num_cpus": 1, "num_gpus": 0, "what": "x"}

    def always_dies(*args, **resources):
        calls.append(resources)
        raise RayActorError()

    calls.clear()
    monkeypatch.setattr(workers, "remote_call", always_dies)
    with pytest.raises(RayActorError):  # out of retries: the stage fails, naming the dead actor
        hosts.map_on_host(None, lambda: (lambda b: b), {}, table, 2, cpus=1, gpus=0, what="x")
    assert len(calls) == hosts.HOST_RETRIES + 1
