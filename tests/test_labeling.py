import numpy as np
import pyarrow as pa
import pytest

from augsbert_ray import runtime, schema
from augsbert_ray.config import LabelingConfig
from augsbert_ray.labeling import ShardStore, label_candidates, label_candidates_file, pool_size, score_pairs
from augsbert_ray.labeling.pool import labelled_dataset
from augsbert_ray.labeling.shards import file_shards
from augsbert_ray.models import load_cross_encoder
from conftest import make_sentence


def pairs(n, seed=0):
    import random

    rng = random.Random(seed)
    s1 = [make_sentence(rng) + " and more" * rng.randint(0, 6) for _ in range(n)]
    s2 = [make_sentence(rng) for _ in range(n)]
    return s1, s2


def one_by_one(model, tok, s1, s2):
    import torch

    out = []
    with torch.inference_mode():
        for a, b in zip(s1, s2):
            enc = tok([a], [b], return_tensors="pt", truncation=True, max_length=128)
            out.append(torch.sigmoid(model(**enc).logits.reshape(-1)).item())
    return np.array(out, dtype=np.float32)


def test_length_sorted_batches_keep_input_order(tiny_model):
    model, tok = load_cross_encoder(tiny_model)
    model.eval()
    s1, s2 = pairs(23)
    got = score_pairs(model, tok, s1, s2, micro_batch_size=4)
    np.testing.assert_allclose(got, one_by_one(model, tok, s1, s2), atol=1e-5)
    assert got.dtype == np.float32 and ((got >= 0) & (got <= 1)).all()
    assert len(score_pairs(model, tok, [], [])) == 0


def candidates(s1, s2):
    n = len(s1)
    return pa.table(
        {
            schema.ID1: pa.array(np.arange(n) * 2, pa.int64()),
            schema.ID2: pa.array(np.arange(n) * 2 + 1, pa.int64()),
            schema.SENTENCE1: s1,
            schema.SENTENCE2: s2,
            schema.ORIGIN: ["bm25"] * n,
            schema.RETRIEVAL_SCORE: pa.array(np.ones(n), pa.float32()),
        },
        schema=schema.CANDIDATE_SCHEMA,
    )


@pytest.mark.parametrize("actors", [1, 2])
def test_actor_pool_labels_every_candidate_once(ray_local, tiny_cross_encoder, actors, monkeypatch):
    s1, s2 = pairs(37, seed=1)
    cands = candidates(s1, s2)
    cfg = LabelingConfig(actors=actors, block_size=5, micro_batch_size=3, precision="fp32")
    seen = []
    from_refs = ray_local.data.from_arrow_refs
    monkeypatch.setattr(ray_local.data, "from_arrow_refs", lambda refs, **kw: seen.append(refs) or from_refs(refs, **kw))
    silver = label_candidates(cands, tiny_cross_encoder, cfg, max_length=128, cpus_per_actor=1)
    # One block per actor batch, so every actor of the pool gets work.
    assert [b.num_rows for b in ray_local.get(seen[0])] == [5] * 7 + [2]
    assert silver.schema == schema.SILVER_SCHEMA
    assert silver.num_rows == cands.num_rows
    assert silver.column(schema.ID1).to_pylist() == cands.column(schema.ID1).to_pylist()
    model, tok = load_cross_encoder(tiny_cross_encoder)
    model.eval()
    np.testing.assert_allclose(silver.column(schema.LABEL).to_numpy(), one_by_one(model, tok, s1, s2), atol=1e-5)


def test_warm_hosts_label_small_sets_within_a_job_on_one_machine():
    from augsbert_ray.labeling.hosts import WARM_MAX_PAIRS, use_hosts

    assert use_hosts("auto", WARM_MAX_PAIRS, hosts_serve=True)
    assert not use_hosts("auto", WARM_MAX_PAIRS + 1, hosts_serve=True)
    assert use_hosts("hosts", WARM_MAX_PAIRS + 1, hosts_serve=True)
    assert not use_hosts("pool", 10, hosts_serve=True)
    assert not use_hosts("hosts", 10, hosts_serve=False)  # outside a job, multi-node, several GPUs


def test_hosts_serve_a_job_on_one_machine_with_at_most_one_gpu(monkeypatch):
    import ray

    from augsbert_ray import runtime, workers

    nodes, gpus = [True], [1.0]
    monkeypatch.setattr(runtime, "driver_is_the_only_node", lambda: nodes[0])
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "GPU": gpus[0]})
    assert not workers.hosts_serve(None)  # outside a job
    pool = object()
    assert workers.hosts_serve(pool)
    gpus[0] = 2.0
    assert not workers.hosts_serve(pool)  # several GPUs: tasks and actors place work on each
    gpus[0], nodes[0] = 0.0, False
    assert not workers.hosts_serve(pool)  # a multi-node cluster


def test_warm_hosts_label_every_candidate_once_with_the_models_scores(ray_local, tiny_cross_encoder):
    """(The chaos tier checks a host's labels equal the actor pool's, row for row.)"""
    from augsbert_ray import workers

    s1, s2 = pairs(37, seed=1)
    cands = candidates(s1, s2)
    cfgs = [LabelingConfig(actors=actors, block_size=5, micro_batch_size=3, precision="fp32", tokenize_stage=where)
            for actors, where in ((2, "actor"), (1, "separate"))]
    hosts = workers.HostPool()
    try:
        assert workers.hosts_serve(hosts)  # a job on one machine without GPUs
        warm = [label_candidates(cands, tiny_cross_encoder, c, 128, 1, hosts=hosts) for c in cfgs]
        assert hosts.started == 2  # both hosts labelled, and the second run reused one
    finally:
        hosts.close()
    model, tok = load_cross_encoder(tiny_cross_encoder)
    ref = one_by_one(model.eval(), tok, s1, s2)
    for silver in warm:
        assert silver.schema == schema.SILVER_SCHEMA
        assert silver.column(schema.ID1).to_pylist() == cands.column(schema.ID1).to_pylist()
        np.testing.assert_allclose(silver.column(schema.LABEL).to_numpy(), ref, atol=1e-5)


def test_pool_size_defaults_to_the_clusters_gpus_and_cpus_and_to_one_cpu_actor():
    assert pool_size(LabelingConfig(), 8) == 1  # CPU: one actor with all the cores
    assert pool_size(LabelingConfig(num_gpus=1), 8) == 8
    assert pool_size(LabelingConfig(num_gpus=0.5), 1) == 2
    assert pool_size(LabelingConfig(num_gpus=2), 7) == 3
    assert pool_size(LabelingConfig(num_gpus=1), 0) == 1  # GPU nodes still joining
    assert pool_size(LabelingConfig(num_gpus=1, actors=3), 8) == 3
    assert pool_size(LabelingConfig(actors=2), 0) == 2
    # a GPU actor per GPU only where the CPUs hold them and the tokenising task that feeds them
    assert pool_size(LabelingConfig(num_gpus=1), 2, 2) == 1 and pool_size(LabelingConfig(num_gpus=1), 2, 3) == 2
    assert pool_size(LabelingConfig(num_gpus=1, num_cpus=2), 4, 5) == 2
    assert pool_size(LabelingConfig(num_gpus=1, tokenize_stage="actor"), 2, 2) == 2


def test_gpu_pool_gets_one_actor_per_cluster_gpu(ray_local, tiny_cross_encoder, monkeypatch):
    # The dataset is only planned, never run, so no GPU is needed to see the pool it asks for.
    sizes = []
    strategy = ray_local.data.ActorPoolStrategy
    monkeypatch.setattr(ray_local.data, "ActorPoolStrategy", lambda size, **kw: sizes.append(size) or strategy(size=size, **kw))
    monkeypatch.setattr(ray_local, "cluster_resources", lambda: {"CPU": 16.0, "GPU": 4.0})
    monkeypatch.setattr(runtime.resources, "node_capacities", lambda: [{"CPU": 16.0, "GPU": 4.0}])
    refs = [ray_local.put(candidates(*pairs(3)))]
    labelled_dataset(refs, tiny_cross_encoder, LabelingConfig(num_gpus=1, block_size=5), 128, 1)
    labelled_dataset(refs, tiny_cross_encoder, LabelingConfig(num_gpus=1, block_size=5, actors=2), 128, 1)
    assert sizes == [4, 2]


def test_no_candidates_no_actors(tiny_model):
    silver = label_candidates(candidates([], []), tiny_model, LabelingConfig(), 128, 1)
    assert silver.num_rows == 0 and silver.schema == schema.SILVER_SCHEMA


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_tokenising_stage_ahead_of_the_actors_gives_the_same_labels(ray_local, tiny_cross_encoder, precision):
    s1, s2 = pairs(29, seed=2)
    cands = candidates(s1, s2)
    base = dict(actors=1, block_size=8, micro_batch_size=4, precision=precision)
    in_actor = label_candidates(cands, tiny_cross_encoder, LabelingConfig(**base, tokenize_stage="actor"), 128, 1)
    staged = label_candidates(cands, tiny_cross_encoder, LabelingConfig(**base, tokenize_stage="separate"), 128, 1)
    assert staged.column_names == in_actor.column_names  # the token columns do not leak into the output
    np.testing.assert_allclose(staged.column(schema.LABEL).to_numpy(), in_actor.column(schema.LABEL).to_numpy(),
                               atol=1e-6)
    model, tok = load_cross_encoder(tiny_cross_encoder)
    ref = one_by_one(model.eval(), tok, s1, s2)
    tol = 1e-5 if precision == "fp32" else 2e-2  # int8: the stated tolerance of dynamic quantisation
    assert np.abs(staged.column(schema.LABEL).to_numpy() - ref).max() < tol


@pytest.mark.timeout(120)
def test_the_tokenising_stage_is_left_a_cpu_and_a_pool_that_cannot_run_fails_at_once(ray_local,
                                                                                  tiny_cross_encoder):
    """Before: with a separate tokenising stage, the actor reserved every CPU of the node and the
    tokenising tasks ahead of it never got one: no progress, for ever."""
    import time

    from augsbert_ray.errors import AugSBERTError
    from augsbert_ray.labeling import actor_cpus

    s1, s2 = pairs(20, seed=4)
    cands = candidates(s1, s2)
    cfg = LabelingConfig(block_size=8, micro_batch_size=8, precision="fp32", tokenize_stage="separate")
    cpus = actor_cpus(cfg, cluster_cpus=2, actors=1)  # this session's Ray has 2 CPUs
    assert cpus == 1 and actor_cpus(cfg.model_copy(update={"tokenize_stage": "actor"}), 2, 1) == 2
    assert actor_cpus(LabelingConfig(num_gpus=1), 16, 1) == 1  # a GPU actor leaves the CPUs to tokenising
    silver = label_candidates(cands, tiny_cross_encoder, cfg, 64, cpus, actors=1)
    assert silver.num_rows == cands.num_rows
    greedy = cfg.model_copy(update={"num_cpus": 2})
    t0 = time.perf_counter()
    with pytest.raises(AugSBERTError, match=r"labelling \(labeling.actors, labeling.num_cpus.*tokenising"):
        label_candidates(cands, tiny_cross_encoder, greedy, 64, 2, actors=1)
    assert time.perf_counter() - t0 < 10  # at once, not after a wait


def test_resource_requests_are_packed_onto_nodes():
    from augsbert_ray.runtime import fits

    two_nodes = [{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}]
    assert fits([{"CPU": 2, "GPU": 1}] * 2, two_nodes)
    assert not fits([{"CPU": 3}], two_nodes)  # 4 CPUs in all, but no node has 3
    assert not fits([{"CPU": 1, "GPU": 1}] * 3, two_nodes)
    assert fits([{"CPU": 1, "GPU": 1}, {"CPU": 1}, {"CPU": 1}], two_nodes)


@pytest.mark.parametrize("row_group", [3, 7, 100])
def test_file_shards_cut_any_row_groups_into_exact_shards(tmp_path, row_group):
    import pyarrow.parquet as pq

    s1, s2 = pairs(23, seed=3)
    path = tmp_path / "candidates.parquet"
    pq.write_table(candidates(s1, s2), path, row_group_size=row_group)
    shards = list(file_shards(path, 5))
    assert [t.num_rows for t in shards] == [5, 5, 5, 5, 3]
    assert pa.concat_tables(shards).equals(pq.read_table(path))


def test_reading_tasks_give_each_pending_shard_its_rows_once(tmp_path):
    """The pool's reading tasks (``FileSource``): each pending shard's rows, in order, tagged with
    its index; shards already labelled are skipped, row groups need not line up with shards."""
    import pyarrow.parquet as pq

    from augsbert_ray.labeling import pool
    from augsbert_ray.labeling.driver import _Pending
    from augsbert_ray.labeling.shards import SHARD

    s1, s2 = pairs(33, seed=5)
    path = tmp_path / "candidates.parquet"
    pq.write_table(candidates(s1, s2), path, row_group_size=7)
    shards = list(file_shards(path, 5))  # 7 shards, the last of 3 rows
    source = pool.FileSource(str(path), 5, "node")
    pending = {i: _Pending(None, (), shards[i].num_rows, source, i) for i in (0, 1, 3, 4, 6)}
    tasks = source.tasks(pending)
    assert [t["shards"] for t in tasks] == [[0], [1], [3], [4], [6]]
    read = pa.concat_tables([pool.read_shards(pa.Table.from_pylist([t])) for t in tasks])
    assert read.column(SHARD).to_pylist() == [i for i in (0, 1, 3, 4, 6) for _ in range(shards[i].num_rows)]
    expect = pa.concat_tables([shards[i] for i in (0, 1, 3, 4, 6)])
    assert read.drop_columns([SHARD]).equals(expect)
    for i in pending:  # what a warm host is handed: the same rows, read alone
        block = pending[i].block()
        assert block.drop_columns([SHARD]).equals(shards[i]) and set(block.column(SHARD).to_pylist()) == {i}


def test_file_labelling_reads_shards_in_tasks_not_through_the_driver(ray_local, tiny_cross_encoder, tmp_path,
                                                                     monkeypatch):
    """From a candidates file, the driver puts no shard in the object store: the pool's tasks
    read them (several reading tasks here), and a resumed run reads only the shards not done."""
    import pyarrow.parquet as pq

    from augsbert_ray.labeling import LabelingReport
    from augsbert_ray.labeling.shards import keys_digest

    s1, s2 = pairs(41, seed=6)
    cands = candidates(s1, s2)
    path = tmp_path / "candidates.parquet"
    pq.write_table(cands, path, row_group_size=9)
    cfg = LabelingConfig(actors=1, block_size=6, micro_batch_size=4, precision="fp32")
    model, tok = load_cross_encoder(tiny_cross_encoder)
    expect = cands.append_column(schema.LABEL, pa.array(one_by_one(model.eval(), tok, s1, s2))).cast(
        schema.SILVER_SCHEMA)
    store = ShardStore(tmp_path / "shards")
    for i, shard in enumerate(file_shards(path, 6)):
        if i in (1, 4):  # labelled by an earlier run
            store.commit(i, expect.slice(i * 6, shard.num_rows), keys_digest(shard))
    put, tasks = [], []
    real_put, real_items = ray_local.put, ray_local.data.from_items
    monkeypatch.setattr(ray_local, "put", lambda value, **kw: put.append(value) or real_put(value, **kw))
    monkeypatch.setattr(ray_local.data, "from_items", lambda items, **kw: tasks.append(items) or real_items(items, **kw))
    report = LabelingReport()
    n = label_candidates_file(path, tmp_path / "silver.parquet", tiny_cross_encoder, cfg, 128, 1, store=store,
                              report=report)
    assert n == 41 and (report.reused, report.labelled) == (2, 5)
    assert [t["shards"] for t in tasks[0]] == [[0], [2], [3], [5], [6]]  # the done shards are not read
    # no shard went through the driver (Ray Data puts the reading tasks' descriptions only)
    assert not [v for v in put if isinstance(v, pa.Table) and schema.SENTENCE1 in v.column_names]
    silver = pq.read_table(tmp_path / "silver.parquet")
    assert silver.select([schema.ID1, schema.ID2]).equals(expect.select([schema.ID1, schema.ID2]))
    np.testing.assert_allclose(silver.column(schema.LABEL).to_numpy(), expect.column(schema.LABEL).to_numpy(),
                               atol=1e-5)


def test_a_reading_worker_decodes_a_row_group_once_for_its_shards_and_a_rewritten_file_anew(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from augsbert_ray.labeling import pool

    s1, s2 = pairs(30, seed=8)
    cands = candidates(s1, s2)
    path = tmp_path / "candidates.parquet"
    pq.write_table(cands, path, row_group_size=20)
    decoded, real = [], pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, g, **kw: decoded.append(g) or real(self, g, **kw))
    read = [pool._read_cached(str(path), start, min(start + 6, 30)) for start in range(0, 30, 6)]
    assert pa.concat_tables(read).equals(cands)
    assert decoded == [0, 1]  # five shards, one of them (rows 18-23) across both groups: each decoded once
    pq.write_table(cands.slice(0, 10), path)  # another file under the same name
    assert pool._read_cached(str(path), 0, 4).equals(cands.slice(0, 4)) and decoded == [0, 1, 0]


@pytest.mark.parametrize("where", ["file", "spool"])
def test_each_shard_comes_back_from_the_pool_on_its_own(ray_local, tmp_path, where):
    """The pool returns one block per shard, whichever source its tasks read, so that each shard
    is committed as soon as it is labelled (Ray Data hands an actor a reading task's rows as one
    block, and returns its labels as one block)."""
    import pyarrow.parquet as pq

    from augsbert_ray.bench.control_plane import NullScorer
    from augsbert_ray.labeling import ScorerSpec, pool
    from augsbert_ray.labeling.driver import _Pending
    from augsbert_ray.labeling.shards import SHARD, table_shards
    from augsbert_ray.labeling.spool import ShardSpool

    s1, s2 = pairs(40, seed=7)
    cands = candidates(s1, s2)
    path = tmp_path / "candidates.parquet"
    pq.write_table(cands, path)  # one row group for every shard
    node = ray_local.get_runtime_context().get_node_id()
    spool = ShardSpool(tmp_path / "spool", node)
    source = pool.FileSource(str(path), 4, node)
    pending = {}
    for i, shard in enumerate(table_shards(cands, 4)):
        block = shard.append_column(SHARD, pa.array(np.full(shard.num_rows, i, np.int64)))
        pending[i] = _Pending(None, "", shard.num_rows, source if where == "file" else spool.put(i, block), i)
    cfg = LabelingConfig(actors=1, block_size=4, tokenize_stage="actor")
    labelled = pool.labelled_dataset(pool.pool_input(pending), "unused", cfg, 64, 1, scorer=ScorerSpec(NullScorer))
    shards_per_block = [set(b.column(SHARD).to_pylist())
                        for b in labelled.iter_batches(batch_size=None, batch_format="pyarrow")]
    assert sorted(s.pop() for s in shards_per_block if len(s) == 1) == list(range(10))
    assert len(shards_per_block) == 10


def test_file_to_file_labelling_matches_in_memory_and_resumes(ray_local, tiny_cross_encoder, tmp_path):
    """Candidates streamed from a Parquet file (row groups that do not line up with shards)
    give the in-memory path's silver rows; a re-run reuses every committed shard."""
    import pyarrow.parquet as pq

    from augsbert_ray.labeling import LabelingReport

    s1, s2 = pairs(41, seed=4)
    cands = candidates(s1, s2)
    path = tmp_path / "candidates.parquet"
    pq.write_table(cands, path, row_group_size=9)
    cfg = LabelingConfig(actors=2, block_size=6, micro_batch_size=4, precision="fp32")
    store = ShardStore(tmp_path / "shards")
    report = LabelingReport()
    n = label_candidates_file(path, tmp_path / "silver.parquet", tiny_cross_encoder, cfg, 128, 1, store=store,
                              report=report)
    silver = pq.read_table(tmp_path / "silver.parquet")
    assert n == silver.num_rows == 41 and report.labelled == report.shards == 7 and report.reused == 0
    assert silver.schema == schema.SILVER_SCHEMA
    expect = label_candidates(cands, tiny_cross_encoder, cfg, 128, 1)
    assert silver.select([schema.ID1, schema.ID2, schema.SENTENCE1, schema.SENTENCE2]).equals(
        expect.select([schema.ID1, schema.ID2, schema.SENTENCE1, schema.SENTENCE2]))
    np.testing.assert_allclose(silver.column(schema.LABEL).to_numpy(), expect.column(schema.LABEL).to_numpy(),
                               atol=1e-6)
    again = LabelingReport()
    (tmp_path / "silver.parquet").unlink()
    label_candidates_file(path, tmp_path / "silver.parquet", tiny_cross_encoder, cfg, 128, 1, store=store,
                          report=again)
    assert (again.reused, again.labelled) == (7, 0)
    assert pq.read_table(tmp_path / "silver.parquet").equals(silver)


def test_a_model_without_a_trained_head_gets_the_same_new_head_in_every_actor(tiny_model):
    """The random BERT has no classification head: each PairScorer draws the same one, so
    actors (and re-runs) agree on the scores of such a model."""
    from augsbert_ray.labeling import PairScorer

    s1, s2 = pairs(9, seed=6)
    batch = pa.table({schema.SENTENCE1: s1, schema.SENTENCE2: s2})
    scores = [PairScorer(tiny_model, micro_batch_size=4, max_length=32, threads=1, use_gpu=False, precision="fp32")(
        batch).column(schema.LABEL).to_numpy() for _ in range(2)]
    np.testing.assert_array_equal(scores[0], scores[1])
    assert np.ptp(scores[0]) > 0  # a head that scores, not a constant
