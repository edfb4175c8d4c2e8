"""Shards committed where they are labelled (``labeling.commit``): the actor-side wrapper checks a
shard's labels against its input and commits it once; a shard written twice ends as one file
with one manifest. Pure: no Ray."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from augsbert_ray import schema
from augsbert_ray.errors import LabelingError
from augsbert_ray.labeling.commit import CommittingScorer, StoreTarget, decode
from augsbert_ray.labeling.shards import SHARD, ShardStore, keys_digest


def _shard(i: int, rows: int, size: int) -> pa.Table:
    ids = np.arange(i * size, i * size + rows, dtype=np.int64)
    return pa.table({schema.ID1: ids, schema.ID2: ids + 1000, schema.SENTENCE1: [f"a man {j}" for j in ids],
                     schema.SENTENCE2: [f"a dog {j}" for j in ids], schema.ORIGIN: ["bm25"] * rows,
                     schema.RETRIEVAL_SCORE: pa.array(np.ones(rows), pa.float32()), SHARD: np.full(rows, i)})


class Scorer:
    """Labels each pair id1 / 100 (``drop``: loses the last row of every batch); counts calls."""

    calls = 0

    def __init__(self, drop: bool = False):
        self.drop = drop

    def __call__(self, batch: pa.Table) -> pa.Table:
        type(self).calls += 1
        if self.drop:
            batch = batch.slice(0, batch.num_rows - 1)
        labels = batch.column(schema.ID1).to_numpy().astype(np.float32) / 100
        return batch.append_column(schema.LABEL, pa.array(labels))


def _actor(store: ShardStore, total: int, size: int, token: str | None = None, **kwargs) -> CommittingScorer:
    target = StoreTarget(str(store.root), token or store.open_for_workers(), size, total)
    return CommittingScorer(Scorer, kwargs, target)


def test_a_shard_in_pieces_is_committed_whole_by_the_call_that_completes_it(tmp_path):
    store = ShardStore(tmp_path / "shards")
    actor = _actor(store, total=10, size=4)  # shards of 4, 4 and 2 rows
    first, second = _shard(1, 4, 4), _shard(2, 2, 4)
    assert actor(first.slice(0, 3)).num_rows == 0  # shard 1 not whole yet: nothing written
    assert not store.part(1).exists()
    out = actor(pa.concat_tables([first.slice(3), second]))  # the rest of 1, and 2 whole
    assert out.column("shard").to_pylist() == [1, 2] and out.column("rows").to_pylist() == [4, 2]
    assert out.column("table").null_count == 2  # committed here: only the record comes back
    for i, shard in ((1, first), (2, second)):
        record = json.loads(store.manifest(i).read_text())
        assert store.done(i, keys_digest(shard)) and record["rows"] == shard.num_rows
        assert store.read(i).column(schema.LABEL).to_pylist() == pytest.approx(
            (shard.column(schema.ID1).to_numpy() / 100).tolist())
    assert len(out.column("input")[0].as_py()) == 64 and out.slice(0, 1).get_total_buffer_size() < 1024


def test_labels_that_lose_a_pair_are_refused_and_nothing_is_committed(tmp_path):
    store = ShardStore(tmp_path / "shards")
    actor = _actor(store, total=8, size=4, drop=True)
    with pytest.raises(LabelingError, match="shard 0: the labelled pairs differ"):
        actor(_shard(0, 4, 4))
    assert not list(store.root.glob("*part-000000*"))
    assert not actor._inputs and not actor._labelled  # a failed call keeps no pieces for the retry


def test_an_actor_that_does_not_see_the_store_sends_the_checked_shard(tmp_path):
    store = ShardStore(tmp_path / "shards")
    store.open_for_workers()
    actor = _actor(store, total=4, size=4, token="another-run")  # as on a node with a disk of its own
    out = actor(_shard(0, 4, 4))
    table = decode(out.column("table")[0].as_py())
    assert table.num_rows == 4 and table.schema == schema.SILVER_SCHEMA and not store.part(0).exists()


def test_a_shard_written_twice_ends_as_one_file_and_one_manifest_and_is_not_labelled_again(tmp_path):
    store = ShardStore(tmp_path / "shards")
    actor = _actor(store, total=8, size=4)
    shard = _shard(1, 4, 4)
    first = actor(shard).to_pylist()[0]
    calls = Scorer.calls
    again = actor(shard).to_pylist()[0]  # a task retried after its commit: the store holds the shard
    assert Scorer.calls == calls and again["sha256"] == first["sha256"]
    labelled = store.read(1)
    record = store.commit(1, labelled, first["input"], writer="another node")  # written twice all the same
    assert sorted(p.name for p in store.root.iterdir()) == [".writers", "part-000001.json", "part-000001.parquet"]
    assert json.loads(store.manifest(1).read_text()) == record and record["writer"] == "another node"
    assert store.done(1, first["input"]) and store.committed() == {1}


def test_reading_tasks_take_consecutive_shards_only_where_many_are_pending():
    from augsbert_ray.labeling.pool import MAX_SHARDS_PER_TASK, FileSource, shards_per_task

    tasks = FileSource("c.parquet", 4, "node").tasks_for({0: 4, 1: 4, 2: 4, 4: 4, 5: 2}, per_task=2)
    assert [(t["shards"], t["start"], t["stop"]) for t in tasks] == [([0, 1], 0, 8), ([2], 8, 12), ([4, 5], 16, 22)]
    assert shards_per_task(5, 1) == 1 and shards_per_task(1221, 1) == MAX_SHARDS_PER_TASK
    assert shards_per_task(300, 4) == 9  # 75 shards an actor: still 8 tasks each
    assert shards_per_task(28, 4) == 1  # 7 shards an actor: each its own task
    assert shards_per_task(10**6, 64) == MAX_SHARDS_PER_TASK
    assert shards_per_task(10**6, 64, block_size=65_536) == MAX_SHARDS_PER_TASK // 8  # bounded in pairs too


def test_actors_commit_each_shard_of_a_reading_task_of_several(ray_local, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from augsbert_ray.bench.control_plane import NULL_LABEL, NullScorer
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import LabelingReport, ScorerSpec, label_candidates_file, pool

    monkeypatch.setattr(pool, "shards_per_task", lambda pending, actors, block_size: 3)
    cands = pa.concat_tables([_shard(i, 4, 4) for i in range(10)] + [_shard(10, 3, 4)]).drop_columns([SHARD])
    pq.write_table(cands, tmp_path / "candidates.parquet", row_group_size=7)
    store, report = ShardStore(tmp_path / "shards"), LabelingReport()
    cfg = LabelingConfig(actors=1, block_size=4, tokenize_stage="actor", executor="pool")
    n = label_candidates_file(tmp_path / "candidates.parquet", tmp_path / "silver.parquet", "unused", cfg, 32, 1.0,
                              store=store, report=report, actors=1, scorer=ScorerSpec(NullScorer))
    silver = pq.read_table(tmp_path / "silver.parquet")
    assert n == 43 and silver.column(schema.ID1).to_pylist() == cands.column(schema.ID1).to_pylist()
    assert set(silver.column(schema.LABEL).to_pylist()) == {NULL_LABEL} and report.labelled == 11
    node = ray_local.get_runtime_context().get_node_id()
    assert {json.loads(store.manifest(i).read_text())["writer"] for i in range(11)} == {node}


def test_reading_tasks_run_on_the_nodes_that_see_the_candidates_file(ray_local, tmp_path):
    from augsbert_ray.labeling.driver import _file_identity, nodes_that_see
    from augsbert_ray.labeling.pool import FileSource, read_tasks

    node = ray_local.get_runtime_context().get_node_id()
    (tmp_path / "c.parquet").write_bytes(b"x" * 70_000)
    assert _file_identity(str(tmp_path / "c.parquet"))[0] == 70_000
    assert _file_identity(str(tmp_path / "missing.parquet")) is None
    assert nodes_that_see(str(tmp_path / "c.parquet"), node) == [node]  # one node: nothing to ask
    assert FileSource("c", 8, "a").selector() == {"ray.io/node-id": "a"}
    assert FileSource("c", 8, "a", ("a",)).selector() == {"ray.io/node-id": "a"}
    assert FileSource("c", 8, "a", ("a", "b")).selector() == {"ray.io/node-id": "in(a, b)"}
    assert read_tasks(None) == read_tasks(1) == read_tasks(8) == 2 and read_tasks(64) == 16
