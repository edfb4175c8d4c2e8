"""Semantic search (``ss``, ``bm25+ss``) on a corpus's sentence parts: the pairs of the single-process
sampler, with the embeddings cut into blocks and the Faiss index into shards that no process holds
together."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_off_driver import _NoInputs
from test_sharded import _corpus

from augsbert_ray import schema
from augsbert_ray.candidates import corpus_shards, off_driver, semantic, sharded, sharded_semantic
from augsbert_ray.config import CorpusConfig, FaissConfig, SamplingConfig
from augsbert_ray.loaders import corpus as loader
from augsbert_ray.stages import candidates as stage


def _env(out: Path) -> SimpleNamespace:
    out.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(out=out, cluster=SimpleNamespace(cpus=2, nodes=1), ship=None, base_model=lambda name: name,
                           reporter=lambda: None, hosts=None)


def _outputs(params, out: Path, monkeypatch, caplog, sharded_path: bool):
    """The stage's result, its two files and its log: on the driver, or on shards cut small (parts of
    about 40 sentences, query blocks of 48, index shards of 96 vectors)."""
    monkeypatch.setattr(off_driver, "OFF_DRIVER_BYTES", 0 if sharded_path else off_driver.OFF_DRIVER_BYTES)
    monkeypatch.setattr(sharded, "ENABLED", sharded_path)
    monkeypatch.setattr(loader, "RANGE_BYTES", 2048)
    monkeypatch.setattr(corpus_shards, "SHARD_BYTES", 2048)
    monkeypatch.setattr(corpus_shards, "QUERY_BLOCK", 50)
    monkeypatch.setattr(sharded_semantic, "INDEX_BYTES", 96 * 32 * 4)  # the tiny model: 32 floats a sentence
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="augsbert_ray"):
        result = stage._corpus_run(_NoInputs(), params, _env(out))
    log = "\n".join(r.getMessage() for r in caplog.records)
    return result, pq.read_table(out / "sentences.parquet"), pq.read_table(out / "candidates.parquet"), log


def _params(path: Path, model: str, **sampling) -> stage.CandidatesParams:
    return stage.CandidatesParams(source="target corpus", seed=3, embed_model=model, max_length=32,
                                  sampling=SamplingConfig(top_k=3, query_batch_size=16, embed_batch_size=8,
                                                          faiss=FaissConfig(use_gpu=False), **sampling),
                                  corpus=CorpusConfig(path=str(path), max_chars=200))


# bm25+ss adds BM25 (test_sharded.py) and the union (test_combined.py) to ss: end to end in the slow tier.
@pytest.mark.parametrize("strategy", ["ss", pytest.param("bm25+ss", marks=pytest.mark.slow)])
def test_semantic_search_on_shards_finds_the_single_process_pairs(tmp_path, ray_local, tiny_model, monkeypatch,
                                                                   caplog, strategy):
    params = _params(_corpus(tmp_path / "corpus.txt"), tiny_model, strategy=strategy)
    single = _outputs(params, tmp_path / "single", monkeypatch, caplog, False)
    result, sentences, candidates, log = _outputs(params, tmp_path / "sharded", monkeypatch, caplog, True)

    assert "sentence parts" in log and "sentence parts" not in single[3]
    assert result.model_dump() == single[0].model_dump()
    assert sentences.equals(single[1])
    # The same embeddings (the same batches) and an exact index: the same pairs, scores to the bit.
    assert candidates.equals(single[2])
    origins = set(candidates.column(schema.ORIGIN).to_pylist())
    assert origins == ({"ss"} if strategy == "ss" else {"bm25", "ss", "bm25+ss"})
    out = tmp_path / "sharded"
    assert len(list((out / "sentences.parts").glob("part-*.parquet"))) > 5
    assert len(list((out / "index" / "faiss").glob("shard-*.faiss"))) == 5  # 396 sentences, 96 vectors a shard
    assert "9 blocks of up to 48 sentences, 5 index shards" in log
    assert not (out / "_hits").exists()


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
