"""The rules every sampler obeys, checked against a plain-Python reference."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

from augsbert_ray import schema
from augsbert_ray.candidates.pairs import (
    concat_hits,
    finalize_candidates,
    gold_pair_keys,
    pair_keys,
    unique_sentences,
)

TEXTS = [f"sentence number {i}" for i in range(6)]


def _sentences(texts=TEXTS) -> pa.Table:
    return pa.table(
        {schema.SENTENCE_ID: pa.array(range(len(texts)), pa.int64()), schema.TEXT: pa.array(texts, pa.string())},
        schema=schema.SENTENCE_SCHEMA,
    )


def _gold(pairs: list[tuple[str, str]]) -> pa.Table:
    n = len(pairs)
    return pa.table(
        {
            schema.SENTENCE1: [a for a, _ in pairs],
            schema.SENTENCE2: [b for _, b in pairs],
            schema.LABEL: pa.array([0.5] * n, pa.float32()),
            schema.SPLIT: ["train"] * n,
            schema.SOURCE: ["mem"] * n,
            schema.LINE: pa.array(range(1, n + 1), pa.int64()),
            schema.GENRE: pa.array([None] * n, pa.string()),
        },
        schema=schema.PAIR_SCHEMA,
    )


def _reference(q, h, s, n_sentences, gold: set[frozenset]) -> list[tuple[int, int, float]]:
    """What finalize_candidates should return, written the obvious way."""
    best: dict[tuple[int, int], float] = {}
    for a, b, score in zip(q, h, s):
        if a == b or frozenset((a, b)) in gold:
            continue
        key = (min(a, b), max(a, b))
        best[key] = max(best.get(key, -np.inf), float(np.float32(score)))
    return sorted((a, b, sc) for (a, b), sc in best.items())


# --- unique_sentences -------------------------------------------------------------------


def test_unique_sentences_first_appearance_order_and_dense_ids():
    # All of sentence1 is read before sentence2 (row-major order would give b, a, c, d).
    table = unique_sentences(_gold([("b", "a"), ("a", "c"), ("d", "b"), ("c", "c")]))
    assert table.schema == schema.SENTENCE_SCHEMA
    assert table.column(schema.TEXT).to_pylist() == ["b", "a", "d", "c"]
    assert table.column(schema.SENTENCE_ID).to_pylist() == [0, 1, 2, 3]


def test_unique_sentences_of_empty_table():
    table = unique_sentences(_gold([]))
    assert table.num_rows == 0 and table.schema == schema.SENTENCE_SCHEMA


# --- pair_keys / gold_pair_keys ---------------------------------------------------------


def test_pair_keys_is_order_free_and_injective():
    n = 7
    a, b = np.array(list(itertools.product(range(n), repeat=2))).T
    keys = pair_keys(a, b, n)
    assert keys.dtype == np.int64
    np.testing.assert_array_equal(keys, pair_keys(b, a, n))
    # Distinct unordered pairs get distinct keys, and the key decodes to (min, max).
    unordered = {(min(x, y), max(x, y)) for x, y in zip(a, b)}
    assert len(set(keys.tolist())) == len(unordered)
    np.testing.assert_array_equal(keys // n, np.minimum(a, b))
    np.testing.assert_array_equal(keys % n, np.maximum(a, b))


def test_gold_pair_keys_sorted_unique_and_skips_unknown_sentences():
    sentences = _sentences()
    t = TEXTS
    gold = _gold([(t[3], t[1]), (t[1], t[3]), (t[0], t[5]), (t[2], "not a known sentence"), (t[4], t[4])])
    keys = gold_pair_keys(gold, sentences)
    n = len(TEXTS)
    assert keys.dtype == np.int64
    assert keys.tolist() == sorted([1 * n + 3, 0 * n + 5, 4 * n + 4])


def test_gold_pair_keys_empty():
    keys = gold_pair_keys(_gold([]), _sentences())
    assert keys.dtype == np.int64 and keys.size == 0


# --- finalize_candidates ----------------------------------------------------------------


def _check_table(table: pa.Table, sentences: pa.Table, origin: str) -> None:
    assert schema.conforms(table, schema.CANDIDATE_SCHEMA)
    id1 = table.column(schema.ID1).to_pylist()
    id2 = table.column(schema.ID2).to_pylist()
    texts = sentences.column(schema.TEXT).to_pylist()
    assert all(a < b for a, b in zip(id1, id2))
    assert list(zip(id1, id2)) == sorted(set(zip(id1, id2)))  # sorted and no duplicate
    assert table.column(schema.SENTENCE1).to_pylist() == [texts[i] for i in id1]
    assert table.column(schema.SENTENCE2).to_pylist() == [texts[i] for i in id2]
    assert set(table.column(schema.ORIGIN).to_pylist()) <= {origin}


def test_finalize_drops_self_and_gold_pairs_and_keeps_best_duplicate():
    sentences = _sentences()
    n = sentences.num_rows
    q = np.array([0, 0, 1, 2, 3, 5, 4, 4, 2, 1])
    h = np.array([0, 1, 0, 3, 2, 4, 5, 4, 0, 5])
    s = np.array([9.0, 1.0, 2.5, 3.0, 0.5, 7.0, 6.0, 8.0, 4.0, 1.5])
    gold = pair_keys(np.array([3, 5]), np.array([2, 1]), n)  # (2,3) in reverse order and (1,5)
    table = finalize_candidates(q, h, s, sentences, np.sort(gold), origin="bm25")
    _check_table(table, sentences, "bm25")
    got = list(zip(table.column(schema.ID1).to_pylist(), table.column(schema.ID2).to_pylist(),
                   table.column(schema.RETRIEVAL_SCORE).to_pylist()))
    assert got == [(0, 1, 2.5), (0, 2, 4.0), (4, 5, 7.0)]
    assert got == _reference(q, h, s, n, {frozenset((2, 3)), frozenset((1, 5))})


def test_finalize_matches_reference_on_random_hits():
    rng = np.random.default_rng(0)
    texts = [f"s{i}" for i in range(30)]
    sentences = _sentences(texts)
    n = len(texts)
    q = rng.integers(0, n, 500)
    h = rng.integers(0, n, 500)
    s = rng.normal(size=500).astype(np.float32)
    ga, gb = rng.integers(0, n, 40), rng.integers(0, n, 40)
    gold_keys = np.unique(pair_keys(ga, gb, n))
    table = finalize_candidates(q, h, s, sentences, gold_keys, origin="rs")
    _check_table(table, sentences, "rs")
    expected = _reference(q.tolist(), h.tolist(), s.tolist(), n, {frozenset((a, b)) for a, b in zip(ga, gb)})
    assert len(expected) > 50  # the draw exercises every rule, not a near-empty output
    got = list(zip(table.column(schema.ID1).to_pylist(), table.column(schema.ID2).to_pylist(),
                   table.column(schema.RETRIEVAL_SCORE).to_pylist()))
    assert got == expected
    assert not np.isin(pair_keys(table.column(schema.ID1).to_numpy(), table.column(schema.ID2).to_numpy(), n),
                       gold_keys).any()


def test_finalize_keeps_nan_scores_of_random_sampling():
    sentences = _sentences()
    table = finalize_candidates(np.array([0, 1]), np.array([1, 0]), np.array([np.nan, np.nan]), sentences,
                                np.empty(0, np.int64), origin="rs")
    assert table.num_rows == 1
    assert np.isnan(table.column(schema.RETRIEVAL_SCORE).to_numpy()).all()


@pytest.mark.parametrize("all_removed", [False, True])
def test_finalize_empty_result_has_schema(all_removed):
    sentences = _sentences()
    if all_removed:  # every hit is a self-pair or gold
        q, h, s = np.array([1, 2, 3]), np.array([1, 4, 3]), np.array([1.0, 2.0, 3.0])
        gold = pair_keys(np.array([2]), np.array([4]), sentences.num_rows)
    else:
        q, h, s = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
        gold = np.empty(0, np.int64)
    table = finalize_candidates(q, h, s, sentences, gold, origin="bm25")
    assert table.num_rows == 0
    assert schema.conforms(table, schema.CANDIDATE_SCHEMA)


def test_concat_hits_stacks_tables_and_handles_none():
    q, h, s = concat_hits([])
    assert q.size == h.size == s.size == 0 and s.dtype == np.float32
    hits_schema = pa.schema([("query_id", pa.int64()), ("hit_id", pa.int64()), ("score", pa.float32())])
    t1 = pa.table({"query_id": [0, 1], "hit_id": [2, 3], "score": [1.0, 2.0]}, schema=hits_schema)
    t2 = pa.table({"query_id": [4], "hit_id": [5], "score": [3.0]}, schema=hits_schema)
    q, h, s = concat_hits([t1, t2])
    assert q.tolist() == [0, 1, 4] and h.tolist() == [2, 3, 5] and s.tolist() == [1.0, 2.0, 3.0]
    assert s.dtype == np.float32


def test_candidate_texts_are_held_once_and_written_plain(tmp_path):
    """A candidate table shares its sentences' text buffer (no copy per pair); written in
    slices it is plain ``CANDIDATE_SCHEMA`` Parquet with the same texts."""
    import pyarrow.parquet as pq

    from augsbert_ray.rundir import RunDir

    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(200)]
    sentences = _sentences(texts)
    rng = np.random.default_rng(1)
    q, h = rng.integers(0, 200, 3000), rng.integers(0, 200, 3000)
    table = finalize_candidates(q, h, np.zeros(3000, np.float32), sentences, np.empty(0, np.int64), origin="bm25")
    text_data = sentences.column(schema.TEXT).chunk(0).buffers()[2].address
    for col in (schema.SENTENCE1, schema.SENTENCE2):
        chunk = table.column(col).chunk(0)
        assert chunk.dictionary.buffers()[2].address == text_data  # the sentences' own bytes
        assert chunk.indices.equals(table.column(schema.ID1 if col == schema.SENTENCE1 else schema.ID2).chunk(0))
    path = RunDir(tmp_path).write_table("candidates.parquet", table, schema.CANDIDATE_SCHEMA, rows_per_write=97)
    back = pq.read_table(path)
    assert back.schema == schema.CANDIDATE_SCHEMA and back.num_rows == table.num_rows
    assert back.column(schema.SENTENCE1).to_pylist() == [texts[i] for i in table.column(schema.ID1).to_pylist()]
    assert back.column(schema.SENTENCE2).to_pylist() == [texts[i] for i in table.column(schema.ID2).to_pylist()]
    empty = RunDir(tmp_path).write_table("empty.parquet", table.slice(0, 0), schema.CANDIDATE_SCHEMA)
    assert pq.read_table(empty).schema == schema.CANDIDATE_SCHEMA


def test_conforms_checks_names_and_value_types():
    plain = schema.empty_table(schema.CANDIDATE_SCHEMA)
    assert schema.conforms(plain, schema.CANDIDATE_SCHEMA)
    assert schema.conforms(schema.empty_table(schema.CANDIDATE_MEMORY_SCHEMA), schema.CANDIDATE_SCHEMA)
    assert not schema.conforms(plain.drop_columns([schema.ORIGIN]), schema.CANDIDATE_SCHEMA)
    wrong = plain.set_column(0, schema.ID1, pa.array([], pa.int32()))
    assert not schema.conforms(wrong, schema.CANDIDATE_SCHEMA)
