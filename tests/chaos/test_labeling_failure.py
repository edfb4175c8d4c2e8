"""Chaos: a labelling actor dies mid-batch. Ray restarts it and the batch is redone; the
silver set equals a fault-free run's row for row. With restarts exhausted, the stage fails
with a clear report, keeps the shards it committed, and a re-run labels only the rest."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_sentence

from augsbert_ray import schema
from augsbert_ray.config import LabelingConfig
from augsbert_ray.errors import LabelingError
from augsbert_ray.labeling import LabelingReport, PairScorer, ShardStore, label_candidates, pool
from augsbert_ray.progress.messages import lines_to
from augsbert_ray.testing import dying_scorer, failing_scorer

pytestmark = pytest.mark.slow

N_PAIRS, BLOCK = 60, 6  # 10 shards


def _candidates() -> pa.Table:
    rng = random.Random(11)
    return pa.table(
        {
            schema.ID1: pa.array(np.arange(N_PAIRS) * 2, pa.int64()),
            schema.ID2: pa.array(np.arange(N_PAIRS) * 2 + 1, pa.int64()),
            schema.SENTENCE1: [make_sentence(rng) for _ in range(N_PAIRS)],
            schema.SENTENCE2: [make_sentence(rng) for _ in range(N_PAIRS)],
            schema.ORIGIN: ["bm25"] * N_PAIRS,
            schema.RETRIEVAL_SCORE: pa.array(np.ones(N_PAIRS), pa.float32()),
        },
        schema=schema.CANDIDATE_SCHEMA,
    )


@pytest.fixture(scope="module")
def teacher(_tiny_model_master, tmp_path_factory) -> str:
    """One tiny cross-encoder for the file, so that one fault-free labelling serves every test."""
    from augsbert_ray.models import load_cross_encoder

    model, tok = load_cross_encoder(str(_tiny_model_master))
    out = tmp_path_factory.mktemp("teacher") / "tiny-ce"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _label(teacher, store=None, report=None, hosts=None, **cfg):
    cfg = LabelingConfig(actors=2, block_size=BLOCK, micro_batch_size=4, **cfg)
    return label_candidates(_candidates(), teacher, cfg, max_length=32, cpus_per_actor=1, store=store, report=report,
                            hosts=hosts)


@pytest.fixture(scope="module")
def clean(ray_local, teacher) -> pa.Table:
    """The fault-free labelling that every faulty run must equal, row for row."""
    assert pool.PairScorer is PairScorer
    return _label(teacher)


@pytest.mark.parametrize("source", ["memory", "file"])
def test_a_killed_labelling_actor_loses_and_doubles_nothing(ray_local, teacher, clean, tmp_path, monkeypatch,
                                                            source):
    """``file``: the silver stage's path, where the pool's tasks read the shards from the
    candidates file (a redone batch is read again from its block, not from the driver)."""
    flag = tmp_path / "fault-fired"
    monkeypatch.setattr(pool, "PairScorer", dying_scorer(after_batches=2, flag=flag))
    report = LabelingReport()
    if source == "memory":
        faulty = _label(teacher, store=ShardStore(tmp_path / "shards"), report=report)
    else:
        import pyarrow.parquet as pq

        from augsbert_ray.labeling import label_candidates_file

        pq.write_table(_candidates(), tmp_path / "candidates.parquet", row_group_size=25)
        cfg = LabelingConfig(actors=2, block_size=BLOCK, micro_batch_size=4)
        label_candidates_file(tmp_path / "candidates.parquet", tmp_path / "silver.parquet", teacher, cfg, 32, 1,
                              store=ShardStore(tmp_path / "shards"), report=report)
        faulty = pq.read_table(tmp_path / "silver.parquet")
    assert "exited after 2 batches" in flag.read_text()  # an actor did die mid-batch
    assert faulty.equals(clean)  # row for row: same pairs, same order, same labels
    assert report.shards == 10 and report.labelled == 10 and report.reused == 0
    keys = list(zip(faulty.column(schema.ID1).to_pylist(), faulty.column(schema.ID2).to_pylist()))
    assert len(keys) == len(set(keys)) == N_PAIRS


def test_a_killed_warm_host_loses_and_doubles_nothing(ray_local, teacher, clean, tmp_path, monkeypatch):
    from augsbert_ray import workers

    flag = tmp_path / "fault-fired"
    monkeypatch.setattr(pool, "PairScorer", dying_scorer(after_batches=2, flag=flag))
    report, lines = LabelingReport(), []
    hosts = workers.HostPool()
    try:
        with lines_to(lines.append):
            faulty = _label(teacher, store=ShardStore(tmp_path / "shards"), report=report, executor="hosts",
                            hosts=hosts)
    finally:
        hosts.close()
    assert "exited after 2 batches" in flag.read_text()  # a host did die mid-shard
    assert any("warm host" in line for line in lines) and any("a new pool labels the" in line for line in lines)
    assert faulty.equals(clean)
    assert report.shards == 10 and report.labelled == 10 and report.reused == 0


def test_exhausted_restarts_fail_clearly_and_a_rerun_labels_only_the_rest(ray_local, teacher, clean, tmp_path, monkeypatch):
    store = ShardStore(tmp_path / "shards")
    monkeypatch.setattr(pool, "PairScorer", dying_scorer(after_batches=3, flag=tmp_path / "flag"))
    with pytest.raises(LabelingError) as err:
        _label(teacher, store=store, max_restarts=0, max_task_retries=0, pool_retries=0)
    msg = str(err.value)
    committed = sorted(p.name for p in store.root.glob("part-*.json"))
    assert len(committed) < 10  # the failure stopped labelling part-way
    assert "labeling.max_restarts=0" in msg and f"{10 - len(committed)} of 10 shards not labelled" in msg
    # the kept shards are named where the pool committed some before it failed (how many is timing)
    assert ("a re-run resumes from them" in msg and str(store.root) in msg) == bool(committed)
    monkeypatch.undo()
    report = LabelingReport()
    again = _label(teacher, store=store, report=report)
    assert report.reused == len(committed) and report.labelled == 10 - len(committed)
    assert again.equals(clean)


def test_a_new_pool_labels_what_a_failed_pool_left(ray_local, teacher, clean, tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "PairScorer", dying_scorer(after_batches=3, flag=tmp_path / "flag"))
    report = LabelingReport()
    lines = []
    with lines_to(lines.append):
        got = label_candidates(_candidates(), teacher, LabelingConfig(actors=2, block_size=BLOCK, micro_batch_size=4,
                                                                      max_restarts=0, pool_retries=1),
                               max_length=32, cpus_per_actor=1, store=ShardStore(tmp_path / "shards"), report=report)
    assert any("a new pool labels the" in line for line in lines)  # the first pool did fail
    assert got.equals(clean) and report.labelled == 10 and sorted(report.redone_shards) == list(range(10))


def test_a_failed_pools_actor_is_ended_before_a_new_pool_needs_its_cpus_and_the_cause_is_named(
        ray_local, teacher, clean, tmp_path, monkeypatch):
    """One actor takes both of the session's CPUs; its model fails on the first batch. The retry
    pool needs the same CPUs, which the failed pool's actor held until ended: a new pool would
    wait for them for minutes."""
    cause = "The size of tensor a (2056) must match the size of tensor b (512) at non-singleton dimension 1"
    monkeypatch.setattr(pool, "PairScorer", failing_scorer(tmp_path / "flag", cause))
    lines = []
    with lines_to(lines.append):
        got = label_candidates(_candidates(), teacher, LabelingConfig(actors=1, block_size=BLOCK, micro_batch_size=4,
                                                                      max_restarts=0, pool_retries=1),
                               max_length=32, cpus_per_actor=ray_local.cluster_resources()["CPU"])
    retry = [line for line in lines if "a new pool labels the" in line]
    assert len(retry) == 1 and f"RuntimeError: {cause}" in retry[0] and "\x1b" not in retry[0], retry
    assert (tmp_path / "flag").exists() and got.num_rows == N_PAIRS
    np.testing.assert_allclose(got.column(schema.LABEL).to_numpy(), clean.column(schema.LABEL).to_numpy(), atol=1e-5)


def test_a_damaged_shard_is_labelled_again(ray_local, teacher, tmp_path):
    store = ShardStore(tmp_path / "shards")
    first = _label(teacher, store=store)
    store.part(3).write_bytes(store.part(3).read_bytes()[:-9])  # truncated by a crash of the disk, say
    store.manifest(5).unlink()  # the part was written, its manifest never was
    report = LabelingReport()
    assert _label(teacher, store=store, report=report).equals(first)
    assert report.reused == 8 and sorted(report.redone_shards) == [3, 5]
