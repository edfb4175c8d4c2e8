"""Semantic search (``ss``, ``bm25+ss``) on a corpus's sentence parts: the pairs of the single-process
sampler, with the embeddings cut into blocks and the Faiss index into shards that no process holds
together."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_off_driver import _NoInputs
from test_sharded import _corpus

from augsbert_ray import schema
from augsbert_ray.candidates import corpus_shards, off_driver, sharded, sharded_semantic
from augsbert_ray.config import CorpusConfig, FaissConfig, SamplingConfig
from augsbert_ray.loaders import corpus as loader
from augsbert_ray.stages import candidates as stage


def _env(out: Path) -> SimpleNamespace:
    out.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(out=out, cluster=SimpleNamespace(cpus=2, nodes=1), ship=None, base_model=lambda name: name,
                           reporter=lambda: None, hosts=None)


@pytest.fixture
def small_cuts(monkeypatch):
    """Shards cut small: parts of about 40 sentences, query blocks of 48, index shards of 96 vectors."""
    monkeypatch.setattr(loader, "RANGE_BYTES", 2048)
    monkeypatch.setattr(corpus_shards, "SHARD_BYTES", 2048)
    monkeypatch.setattr(corpus_shards, "QUERY_BLOCK", 50)
    monkeypatch.setattr(sharded_semantic, "INDEX_BYTES", 96 * 32 * 4)  # the tiny model: 32 floats a sentence


def _params(path: Path, model: str, strategy: str) -> stage.CandidatesParams:
    return stage.CandidatesParams(source="target corpus", seed=3, embed_model=model, max_length=32,
                                  sampling=SamplingConfig(strategy=strategy, top_k=3, query_batch_size=16,
                                                          embed_batch_size=8, faiss=FaissConfig(use_gpu=False)),
                                  corpus=CorpusConfig(path=str(path), max_chars=200))


def _sharded_layout(out: Path, log: str) -> None:
    assert "9 blocks of up to 48 sentences, 5 index shards" in log
    assert len(list((out / "sentences.parts").glob("part-*.parquet"))) > 5
    assert len(list((out / "index" / "faiss").glob("shard-*.faiss"))) == 5  # 396 sentences, 96 vectors a shard
    assert not (out / "_hits").exists()


def test_ss_on_shards_finds_the_single_process_pairs(tmp_path, ray_local, tiny_model, small_cuts, caplog):
    from augsbert_ray.candidates import get_sampler

    params = _params(_corpus(tmp_path / "corpus.txt"), tiny_model, "ss")
    out = tmp_path / "sharded"
    parts = corpus_shards.shard_corpus(params.corpus, loader.list_files(params.corpus.path), out, params.seed)
    # The stage's own sampling context, its sentences left to the sampler (stages/candidates.py)
    ctx = stage._context(None, np.empty(0, np.int64), params, _env(out), None, None)
    with caplog.at_level(logging.INFO, logger="augsbert_ray"):
        rows = sharded.sample_parts(ctx, parts, out)
    candidates = pq.read_table(out / "candidates.parquet")

    sentences = pa.concat_tables([pq.read_table(p) for p in parts.parts])  # test_sharded.py: read_corpus's
    single = get_sampler("ss")(dataclasses.replace(ctx, sentences=sentences)).cast(schema.CANDIDATE_SCHEMA)
    # The same embeddings (the same batches) and an exact index: the same pairs, scores to the bit.
    assert rows == single.num_rows > parts.sentences and candidates.equals(single)
    _sharded_layout(out, caplog.text)


@pytest.mark.slow  # bm25+ss adds BM25 (test_sharded.py) and the union (test_combined.py) to ss: the stage end to end
def test_bm25_ss_on_shards_finds_the_single_process_pairs(tmp_path, ray_local, tiny_model, small_cuts, monkeypatch,
                                                          caplog):
    params = _params(_corpus(tmp_path / "corpus.txt"), tiny_model, "bm25+ss")
    outputs = {}
    for path in ("single", "sharded"):
        monkeypatch.setattr(off_driver, "OFF_DRIVER_BYTES", 0 if path == "sharded" else off_driver.OFF_DRIVER_BYTES)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="augsbert_ray"):
            result = stage._corpus_run(_NoInputs(), params, _env(tmp_path / path))
        outputs[path] = (result.model_dump(), *(pq.read_table(tmp_path / path / f) for f in stage.OUTPUTS),
                         caplog.text)
    single, got = outputs["single"], outputs["sharded"]
    assert "sentence parts" in got[3] and "sentence parts" not in single[3]
    assert got[0] == single[0] and got[1].equals(single[1]) and got[2].equals(single[2])
    assert set(got[2].column(schema.ORIGIN).to_pylist()) == {"bm25", "ss", "bm25+ss"}
    _sharded_layout(tmp_path / "sharded", got[3])


def test_embedding_blocks_start_at_a_multiple_of_the_batch(monkeypatch):
    monkeypatch.setattr(corpus_shards, "QUERY_BLOCK", 16_384)
    assert sharded_semantic.block_rows(256) == 16_384
    assert sharded_semantic.block_rows(100) == 16_400
    assert sharded_semantic.block_rows(50_000) == 50_000


def test_every_strategy_is_sharded_and_semantic_search_needs_a_bi_encoder(tmp_path):
    from augsbert_ray.candidates import SAMPLERS, SamplingContext

    assert sharded.SHARDED == set(SAMPLERS)
    assert sharded.wanted(SimpleNamespace(format="lines"), "bm25+ss")
    for strategy in ("ss", "bm25+ss"):
        ctx = SamplingContext(None, np.empty(0, np.int64), SamplingConfig(strategy=strategy), tmp_path, 0)
        with pytest.raises(ValueError, match="bi_encoder is None"):  # before any search
            sharded.sample_parts(ctx, corpus_shards.SentenceParts(tmp_path / "parts", 0, [0]), tmp_path)


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_an_index_shard_mapped_from_storage_searches_as_built(tmp_path, kind):
    from augsbert_ray.candidates import semantic

    rng = np.random.default_rng(1)
    emb = rng.standard_normal((400, 16)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    folder, index_dir = tmp_path / "embeddings", tmp_path / "faiss"
    for j in (0, 1):
        sharded_semantic._save(folder / f"{j:05d}.npy", emb[j * 200:(j + 1) * 200])
    fcfg = FaissConfig(index=kind, ivf_nlist=4, ivf_nprobe=2, hnsw_m=8, hnsw_ef_search=20, use_gpu=False)
    row = sharded_semantic._build_shard(pa.table({"index": [0]}), str(folder), str(index_dir), [[0, 1], [2]], fcfg, 5)
    assert row.column(corpus_shards.FOUND).to_pylist() == [2]
    mapped = sharded_semantic._open_shard(sharded_semantic._shard_path(str(index_dir), 0), fcfg)
    built = semantic.build_faiss_index(emb, fcfg, 5)  # the seed plus the shard's number
    assert getattr(mapped, "nprobe", None) == getattr(built, "nprobe", None)  # search settings kept
    for got, expected in zip(mapped.search(emb[:50], 4), built.search(emb[:50], 4)):
        assert np.array_equal(got, expected)
    # A block that this node does not see: counted, nothing built (the driver names the storage)
    row = sharded_semantic._build_shard(pa.table({"index": [1]}), str(folder), str(index_dir), [[0, 1], [2]], fcfg, 5)
    assert row.column(corpus_shards.FOUND).to_pylist() == [0]
    assert not sharded_semantic._shard_path(str(index_dir), 1).exists()
