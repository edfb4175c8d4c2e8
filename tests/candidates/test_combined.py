"""BM25 + SS: the union labels each pair once and keeps who found it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from augsbert_ray import schema
from augsbert_ray.candidates import SamplingContext, bm25, combined, get_sampler, semantic
from augsbert_ray.candidates.pairs import finalize_candidates, pair_keys
from augsbert_ray.config import SamplingConfig

N = 12
SENTENCES = pa.table(
    {schema.SENTENCE_ID: pa.array(range(N), pa.int64()), schema.TEXT: pa.array([f"s{i}" for i in range(N)])},
    schema=schema.SENTENCE_SCHEMA,
)
GOLD = pair_keys(np.array([0]), np.array([11]), N)

# Raw (query, hit, score) of the two samplers; (1, 2) / (2, 1) and (4, 5) are found by both.
BM25_HITS = [(1, 2, 9.0), (3, 1, 7.5), (4, 5, 3.0), (6, 7, 2.0)]
SS_HITS = [(2, 1, 0.9), (5, 4, 0.8), (8, 9, 0.7), (10, 3, 0.6)]


def _cands(hits, origin: str) -> pa.Table:
    q, h, s = (np.array(c) for c in zip(*hits))
    return finalize_candidates(q, h, s, SENTENCES, GOLD, origin=origin)


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    # Fakes with fixed tables: the union is what is tested here, not the two samplers.
    monkeypatch.setattr(bm25, "sample", lambda ctx: _cands(BM25_HITS, "bm25"))
    monkeypatch.setattr(semantic, "sample", lambda ctx: _cands(SS_HITS, "ss"))
    return SamplingContext(
        sentences=SENTENCES, gold_keys=GOLD, cfg=SamplingConfig(), work_dir=tmp_path, seed=0, bi_encoder="unused"
    )


def test_union_keeps_origins_and_first_samplers_score(ctx):
    got = get_sampler("bm25+ss")(ctx)
    assert schema.conforms(got, schema.CANDIDATE_SCHEMA)
    columns = (schema.ID1, schema.ID2, schema.ORIGIN, schema.RETRIEVAL_SCORE)
    rows = list(zip(*(got.column(c).to_pylist() for c in columns)))
    assert rows == [
        (1, 2, "bm25+ss", 9.0),  # found by both: BM25, named first, gives the score
        (1, 3, "bm25", 7.5),
        (3, 10, "ss", pytest.approx(0.6)),
        (4, 5, "bm25+ss", 3.0),
        (6, 7, "bm25", 2.0),
        (8, 9, "ss", pytest.approx(0.7)),
    ]
    assert got.column(schema.SENTENCE1).to_pylist() == [f"s{i}" for i, *_ in rows]
    assert got.column(schema.SENTENCE2).to_pylist() == [f"s{j}" for _, j, *_ in rows]


def test_union_counts_each_pair_once_and_obeys_the_rules(ctx):
    a, b = bm25.sample(ctx), semantic.sample(ctx)
    got = combined.sample(ctx)

    def keyset(t):
        return set(pair_keys(t.column(schema.ID1).to_numpy(), t.column(schema.ID2).to_numpy(), N).tolist())

    assert got.num_rows == len(keyset(a) | keyset(b))
    id1, id2 = got.column(schema.ID1).to_numpy(), got.column(schema.ID2).to_numpy()
    keys = pair_keys(id1, id2, N)
    assert (id1 < id2).all() and (np.diff(keys) > 0).all()  # no self pair, no duplicate, sorted
    assert not np.isin(keys, GOLD).any()


def test_union_applies_the_shared_rules_to_any_input():
    # Hand-made rows breaking the rules (self pair, gold pair, a duplicate in reverse
    # order within one table) come out clean; origins already combined merge by part.
    def raw(rows, origin):
        id1, id2, score = (list(c) for c in zip(*rows))
        return pa.table(
            {schema.ID1: id1, schema.ID2: id2, schema.SENTENCE1: ["x"] * len(id1), schema.SENTENCE2: ["x"] * len(id1),
             schema.ORIGIN: [origin] * len(id1), schema.RETRIEVAL_SCORE: pa.array(score, pa.float32())},
            schema=schema.CANDIDATE_SCHEMA,
        )

    a = raw([(3, 3, 1.0), (0, 11, 1.0), (2, 5, 1.0), (5, 2, 4.0)], "bm25+ss")
    b = raw([(2, 5, 0.5), (6, 7, 0.5)], "ss")
    c = raw([(7, 6, np.nan)], "rs")
    got = combined.union_candidates([a, b, c, schema.empty_table(schema.CANDIDATE_SCHEMA)], SENTENCES, GOLD)
    assert schema.conforms(got, schema.CANDIDATE_SCHEMA)
    assert got.column(schema.ID1).to_pylist() == [2, 6]
    assert got.column(schema.ID2).to_pylist() == [5, 7]
    assert got.column(schema.ORIGIN).to_pylist() == ["bm25+ss", "ss+rs"]
    assert got.column(schema.RETRIEVAL_SCORE).to_pylist() == [4.0, 0.5]  # first table's, its best
    assert got.column(schema.SENTENCE1).to_pylist() == ["s2", "s6"]  # texts come from the sentence table
    assert combined.union_candidates([], SENTENCES, GOLD).num_rows == 0


def test_missing_bi_encoder_fails_before_bm25(tmp_path, monkeypatch):
    monkeypatch.setattr(bm25, "sample", lambda ctx: pytest.fail("BM25 ran although SS cannot"))
    ctx = SamplingContext(sentences=SENTENCES, gold_keys=GOLD, cfg=SamplingConfig(), work_dir=tmp_path, seed=0)
    with pytest.raises(ValueError, match="bi_encoder is None"):
        get_sampler("bm25+ss")(ctx)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_union_of_pair_keys_is_union_candidates(seed):
    # What each pair bucket of a sharded corpus computes (candidates.sharded) against the union of whole tables.
    from augsbert_ray.candidates.pairs import unique_pairs

    rng = np.random.default_rng(seed)
    n, empty = 40, np.empty(0, np.int64)
    found = []
    for origin, size in (("bm25", 0 if seed == 0 else 60), ("ss", 80)):  # seed 0: BM25 found nothing
        q, h = rng.integers(0, n, size), rng.integers(0, n, size)
        found.append((origin, *unique_pairs(q, h, rng.random(size).astype(np.float32), n, empty)))
    sentences = pa.table({schema.SENTENCE_ID: pa.array(range(n), pa.int64()),
                          schema.TEXT: pa.array([f"s{i}" for i in range(n)])}, schema=schema.SENTENCE_SCHEMA)
    tables = [finalize_candidates(k // n, k % n, s, sentences, empty, origin) for origin, k, s in found]
    expected = combined.union_candidates(tables, sentences, empty)
    keys, scores, origins = combined.union_pairs(found)
    assert np.array_equal(keys, pair_keys(expected.column(schema.ID1).to_numpy(),
                                          expected.column(schema.ID2).to_numpy(), n))
    assert np.array_equal(scores, expected.column(schema.RETRIEVAL_SCORE).to_numpy())
    assert origins.to_pylist() == expected.column(schema.ORIGIN).to_pylist()
    assert len(found[0][1]) == 0 or "bm25+ss" in origins.to_pylist()
