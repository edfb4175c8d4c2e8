"""Run by test_sharded_candidates.py in a process of its own: a corpus's candidates made on
shards (BM25, then random pairs) on a 3-node ``ray.cluster_utils.Cluster``: a head with no
CPUs, where the driver is, and two 1-CPU nodes; the stage's folder a local one that every node
reads and writes, as a shared file system would be.

    python sharded_candidates.py OUT_DIR CORPUS_GLOB

Writes OUT_DIR/<strategy>/{sentences,candidates}.parquet, and OUT_DIR/result.json: the nodes,
the stage's results, and the nodes that each round of tasks ran on (from the engine's log).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from three_nodes import three_nodes


class _NoInputs:
    def __contains__(self, name: str) -> bool:
        return False


class _Rounds(logging.Handler):
    """The nodes each round's tasks ran on, as the engine's log records carry them."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.nodes: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.nodes.update(getattr(record, "task_nodes", {}))


def main(out: Path, corpus: str) -> None:
    from augsbert_ray.candidates import corpus_shards, off_driver
    from augsbert_ray.config import CorpusConfig, SamplingConfig
    from augsbert_ray.loaders import corpus as loader
    from augsbert_ray.stages import candidates as stage

    # a small corpus cut as a large one is: many byte ranges, hash shards and query blocks
    off_driver.OFF_DRIVER_BYTES = 0
    loader.RANGE_BYTES, corpus_shards.SHARD_BYTES, corpus_shards.QUERY_BLOCK = 2048, 4096, 40
    rounds = _Rounds()
    logger = logging.getLogger("augsbert_ray")
    logger.setLevel(logging.INFO)
    logger.addHandler(rounds)
    with three_nodes() as (head, workers):
        result = {"head": head, "workers": workers, "runs": {}}
        for strategy in ("bm25", "rs"):
            rounds.nodes = {}
            folder = out / strategy
            folder.mkdir(parents=True)
            env = SimpleNamespace(out=folder, storage=str(folder), cluster=SimpleNamespace(cpus=2, nodes=3), ship=None,
                                  base_model=None, reporter=lambda: None, hosts=None)
            params = stage.CandidatesParams(
                source="target corpus", seed=3, sampling=SamplingConfig(strategy=strategy, top_k=3, searchers=2),
                corpus=CorpusConfig(path=corpus, format="tsv", column="body", max_chars=200))
            res = stage._corpus_run(_NoInputs(), params, env)
            result["runs"][strategy] = {"result": res.model_dump(), "nodes": rounds.nodes}
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    main(Path(sys.argv[1]), sys.argv[2])
