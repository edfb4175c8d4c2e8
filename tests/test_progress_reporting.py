"""What the stage modules report to a ``StageProgress``: labelling, training steps, BM25 queries."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.config import LabelingConfig
from augsbert_ray.labeling import LabelingReport, ShardStore, driver
from augsbert_ray.labeling.driver import _label
from augsbert_ray.labeling.pool import checked_shard
from augsbert_ray.labeling.shards import keys_digest, table_shards
from augsbert_ray.progress.messages import lines_to


class Recorder:
    """A ``StageProgress`` that records its calls."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        if name in ("advance", "set_total", "add_total", "update", "message", "flush"):
            return lambda *args, **kw: self.calls.append((name, *args, *kw.values()))
        raise AttributeError(name)


def _candidates(n: int) -> pa.Table:
    return pa.table({
        schema.ID1: pa.array(np.arange(n) * 2, pa.int64()), schema.ID2: pa.array(np.arange(n) * 2 + 1, pa.int64()),
        schema.SENTENCE1: [f"a man is playing {i}" for i in range(n)],
        schema.SENTENCE2: [f"a woman is cutting {i}" for i in range(n)],
        schema.ORIGIN: ["bm25"] * n, schema.RETRIEVAL_SCORE: pa.array(np.ones(n), pa.float32()),
    }, schema=schema.CANDIDATE_SCHEMA)


def test_labelling_reports_its_pairs_reused_shards_first(ray_local, tmp_path, monkeypatch):
    cands = _candidates(23)
    cfg = LabelingConfig(block_size=5, precision="fp32")
    store = ShardStore(tmp_path / "shards")
    for i, shard in enumerate(table_shards(cands, 5)):
        if i in (0, 2):  # labelled by an earlier run
            store.commit(i, shard.append_column(schema.LABEL, pa.array(np.zeros(shard.num_rows), pa.float32())),
                         keys_digest(shard))

    def fake_pool(pending, finished, commit, *args):  # labels each pending shard, no actors
        for i in sorted(pending):
            block = ray_local.get(pending[i].ref)
            labelled = block.append_column(schema.LABEL, pa.array(np.full(block.num_rows, 0.5), pa.float32()))
            commit(i, checked_shard(i, labelled, pending[i].pairs))

    monkeypatch.setattr(driver, "run_pool", fake_pool)
    progress, lines = Recorder(), []
    report = LabelingReport()
    with lines_to(lines.append):
        assert _label(table_shards(cands, 5), None, "model", cfg, 128, 1, store, None, report, progress=progress) == 5
    assert progress.calls == [("set_total", 23, "pairs"), ("update", 10), ("advance", 5), ("advance", 5),
                              ("advance", 3)]
    # the display shows the count: only the last "k/n shards" line is logged
    assert [line for line in lines if "shards labelled (" in line] == [lines[-1]] and "5/5 shards" in lines[-1]


def test_training_reports_its_total_and_each_step():
    from augsbert_ray.training.ray_trainer import _step_reporter

    class Trainer:
        total, step = 12, 4  # resumed from a checkpoint at step 4

    progress = Recorder()
    hook = _step_reporter(progress, Trainer())
    hook(5)
    hook(6)
    assert progress.calls == [("set_total", 12, "steps"), ("update", 4), ("update", 5), ("update", 6)]
    assert _step_reporter(None, Trainer()) is None


def test_bm25_searcher_reports_each_batch(tmp_path):
    from augsbert_ray.candidates import bm25

    texts = [f"a man is playing the guitar {i}" for i in range(12)]
    sentences = pa.table({schema.SENTENCE_ID: pa.array(range(12), pa.int64()), schema.TEXT: texts},
                         schema=schema.SENTENCE_SCHEMA)
    index = bm25.build_index(sentences, tmp_path / "index")
    progress = Recorder()
    searcher = bm25.BM25Searcher(str(index), top_k=2, progress=progress)
    searcher(sentences.slice(0, 8))
    searcher(sentences.slice(8, 4))
    assert progress.calls == [("advance", 8), ("flush",), ("advance", 4), ("flush",)]


def test_labelling_hands_the_pool_the_scorer_it_is_given(ray_local, monkeypatch):
    """``label_shards`` (``augsbert label``, the bench's null scorer) passes its ``scorer`` to the
    pool; without one the pool builds ``PairScorer`` for the model (``pair_scorer_kwargs``)."""
    from augsbert_ray.labeling import ScorerSpec, label_shards
    from augsbert_ray.labeling.scorer import pair_scorer_kwargs

    seen = []

    def fake_pool(pending, finished, commit, *args):
        seen.append(args[-1])
        for i in sorted(pending):
            block = ray_local.get(pending[i].ref)
            commit(i, checked_shard(i, block.append_column(schema.LABEL, pa.array(np.zeros(block.num_rows),
                                                                                   pa.float32())), pending[i].pairs))

    monkeypatch.setattr(driver, "run_pool", fake_pool)

    class Null:
        pass

    spec = ScorerSpec(Null, {"label": -1.0})
    cfg = LabelingConfig(block_size=4, num_gpus=0.5, precision="bf16")
    assert label_shards(table_shards(_candidates(6), 4), "model", cfg, 64, 2.0, MemoryStore(), scorer=spec) == 2
    assert label_shards(table_shards(_candidates(6), 4), "model", cfg, 64, 2.0, MemoryStore()) == 2
    assert seen == [spec, None]
    kwargs = pair_scorer_kwargs("model", cfg, 64, 2.0)
    assert (kwargs["model_dir"], kwargs["threads"], kwargs["use_gpu"], kwargs["precision"], kwargs["max_length"]) \
        == ("model", 2, True, "bf16", 64)


class MemoryStore:
    """A ``ShardStore`` in memory (nothing committed before)."""

    def __init__(self):
        self.root, self.shards = "memory", {}

    def done(self, i, digest):
        return False

    def commit(self, i, table, digest):
        self.shards[i] = table
