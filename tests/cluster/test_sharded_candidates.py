"""A corpus's candidates on shards over a 3-node ``ray.cluster_utils.Cluster``: the sentence
parts, the queries (BM25 searchers, random draws) and the pair buckets are made by tasks on
more than one node, never the driver's, and the pairs are those of one process on one node."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from three_nodes import run_script

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).parents[1] / "candidates"))
from test_sharded import _same, _table_corpus


@pytest.mark.timeout(300)
def test_sharded_candidates_run_on_every_node_and_find_the_one_node_pairs(tmp_path, ray_local):
    from augsbert_ray.config import CorpusConfig, SamplingConfig
    from augsbert_ray.stages import candidates as stage
    from test_off_driver import _env, _NoInputs

    corpus = _table_corpus(tmp_path / "corpus", "tsv")
    out = tmp_path / "cluster"
    result = run_script("sharded_candidates.py", out, corpus)
    workers = set(result["workers"])
    for strategy, run in result["runs"].items():
        nodes = run["nodes"]
        # sentence parts numbered, queries and pair buckets, each on both CPU nodes; the driver's none
        for name in ("read", "number", "query", "pairs"):
            assert set(nodes[name]) == workers, (strategy, name, nodes)
        # the same sentences and pairs as one process on one node (the session's local Ray)
        params = stage.CandidatesParams(
            source="target corpus", seed=3, sampling=SamplingConfig(strategy=strategy, top_k=3, searchers=2),
            corpus=CorpusConfig(path=corpus, format="tsv", column="body", max_chars=200))
        single = stage._corpus_run(_NoInputs(), params, _env(tmp_path / "one" / strategy))
        assert run["result"] == single.model_dump(), strategy
        one, there = tmp_path / "one" / strategy, out / strategy
        assert pq.read_table(there / "sentences.parquet").equals(pq.read_table(one / "sentences.parquet"))
        assert _same(pq.read_table(there / "candidates.parquet"), pq.read_table(one / "candidates.parquet")), strategy
        assert len(list((there / "sentences.parts").glob("part-*.parquet"))) > 4
