"""Labelling shards on object storage (``labeling.store.UriShardStore``), against a real S3 endpoint: moto's
server on loopback. The bucket's endpoint and credentials travel in the store's URI (user info and
query, as pyarrow reads them), so the session's Ray workers reach it without any environment."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from augsbert_ray import schema
from augsbert_ray.errors import LabelingError
from augsbert_ray.labeling.shards import ShardStore, keys_digest, sees_store

BUCKET = "labelling"


@pytest.fixture(scope="module")
def s3():
    """``(boto3 client, uri_of(prefix))`` of a bucket on a loopback S3 server."""
    pytest.importorskip("moto")
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=BUCKET)

    def uri_of(prefix: str) -> str:
        return f"s3://testing:testing@{BUCKET}/{prefix}?endpoint_override={host}:{port}&scheme=http&region=us-east-1"

    yield client, uri_of
    server.stop()


def _keys(client, prefix: str) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/").get("Contents", [])
    return {o["Key"][len(prefix) + 1:]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def _candidates(n: int) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table({schema.ID1: ids, schema.ID2: ids + 1000, schema.SENTENCE1: [f"a man {j}" for j in ids],
                     schema.SENTENCE2: [f"a dog {j}" for j in ids], schema.ORIGIN: ["bm25"] * n,
                     schema.RETRIEVAL_SCORE: pa.array(np.ones(n), pa.float32())})


def _labelled(rows: pa.Table, scale: float) -> pa.Table:
    labels = pa.array(rows.column(schema.ID1).to_numpy().astype(np.float32) * scale)
    return rows.append_column(schema.LABEL, labels).select(schema.SILVER_SCHEMA.names).cast(schema.SILVER_SCHEMA)


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def test_a_shard_on_s3_is_a_file_and_its_manifest_and_damaged_bytes_are_never_accepted(s3):
    client, uri_of = s3
    store = ShardStore(uri_of("plain/block-4"))
    assert type(store).__name__ == "UriShardStore" and "testing" not in store.where
    assert store.committed() == set() and _keys(client, "plain") == {}  # nothing made until a commit
    rows = _candidates(4)
    digest = keys_digest(rows.select(INPUT))
    record = store.commit(0, _labelled(rows, 0.01), digest, writer="node-a")
    objects = _keys(client, "plain/block-4")
    assert sorted(objects) == ["part-000000.json", "part-000000.parquet"]
    assert json.loads(objects["part-000000.json"]) == record and record["writer"] == "node-a"
    assert store.done(0, digest) and not store.done(0, "another input") and store.committed() == {0}
    assert store.read(0).column(schema.LABEL).to_pylist() == pytest.approx([0.0, 0.01, 0.02, 0.03])

    # The same rows with other labels put in its place (a valid Parquet file, its manifest kept):
    # the shard is not done, and its rows are never read as the shard's.
    client.put_object(Bucket=BUCKET, Key="plain/block-4/part-000000.parquet", Body=_parquet(_labelled(rows, 0.02)))
    assert not store.done(0, digest)
    with pytest.raises(LabelingError, match=r"s3://labelling/plain/block-4: shard 0's file does not match"):
        store.read(0)


INPUT = [schema.ID1, schema.ID2, schema.SENTENCE1, schema.SENTENCE2]


def test_two_writers_of_one_shard_end_as_one_file_and_the_manifest_that_names_it(s3, monkeypatch):
    """Writer A puts its file; writer B (an actor retried after A wrote) commits the shard whole
    with other labels before A's manifest: A's check finds B's file in place and names it."""
    from augsbert_ray.labeling import store as stores

    client, uri_of = s3
    store = ShardStore(uri_of("race/block-4"))
    rows = _candidates(4)
    digest = keys_digest(rows.select(INPUT))
    put = stores.put_bytes
    raced = []

    def put_racing(fs, path, data):
        if path.endswith(".json") and not raced:  # A is about to write its manifest: B commits first
            raced.append(None)
            raced[0] = ShardStore(uri_of("race/block-4")).commit(0, _labelled(rows, 0.02), digest, writer="B")
        put(fs, path, data)

    monkeypatch.setattr(stores, "put_bytes", put_racing)
    record = store.commit(0, _labelled(rows, 0.01), digest, writer="A")
    objects = _keys(client, "race/block-4")
    assert sorted(objects) == ["part-000000.json", "part-000000.parquet"]
    assert json.loads(objects["part-000000.json"]) == record and record["sha256"] == raced[0]["sha256"]
    assert store.done(0, digest)
    assert store.read(0).column(schema.LABEL).to_pylist() == pytest.approx([0.0, 0.02, 0.04, 0.06])  # B's file

    # Written twice in turn (a task retried after its commit): still one file and one manifest.
    again = store.commit(0, _labelled(rows, 0.01), digest, writer="C")
    assert sorted(_keys(client, "race/block-4")) == ["part-000000.json", "part-000000.parquet"]
    assert store.record(0) == again and store.done(0, digest)


def test_a_worker_sees_a_store_on_storage_by_its_token(s3):
    _, uri_of = s3
    store = ShardStore(uri_of("token/block-4"))
    token = store.open_for_workers()
    assert sees_store(store.location, token) and not sees_store(store.location, "another run")
    assert not sees_store(uri_of("token/block-8"), token)  # nothing there
    assert not sees_store(store.location.replace(f"s3://testing:testing@{BUCKET}", "s3://testing:testing@nobucket"),
                          token)


def test_the_silver_stage_of_a_run_dir_on_s3_has_its_actors_commit_there_and_resumes_from_it(s3, ray_local, tmp_path,
                                                                                             monkeypatch):
    """The silver stage under a run directory on S3: its store is the stage's folder on the bucket,
    which the labelling actor writes to itself (nothing goes through the staging copy). Of what an
    earlier run left there, the verified shards are reused and a damaged one, one without its
    manifest and a stale block size's are not; the shards go once ``silver.parquet`` holds them."""
    from types import SimpleNamespace

    from augsbert_ray.bench.control_plane import NULL_LABEL, NullScorer
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import pool, shards, store as stores
    from augsbert_ray.rundir import RunDir
    from augsbert_ray.stages.base import Artifact, Inputs
    from augsbert_ray.stages.silver import Silver, SilverParams, shards_location

    client, uri_of = s3
    monkeypatch.setenv("AUGSBERT_STAGING_DIR", str(tmp_path / "staging"))
    monkeypatch.setattr(pool, "PairScorer", NullScorer)  # looked up at each attempt: no model work
    rd = RunDir(uri_of("job"))
    rel = "stages/silver/ab12"
    env = SimpleNamespace(out=rd.path(rel), storage=rd.storage(f"{rel}/ray"), rd=rd, hosts=None,
                          cluster=SimpleNamespace(gpus=0, cpus=2), ship=str, reporter=lambda local=False: None)
    env.out.mkdir(parents=True)
    cands = _candidates(22)  # shards of 4: five whole, one of 2
    pq.write_table(cands, tmp_path / "candidates.parquet", row_group_size=7)
    inputs = Inputs({"candidates": Artifact(tmp_path / "candidates.parquet", "c"),
                     "teacher": Artifact(tmp_path / "teacher", "t")}, "silver")
    prefix = f"job/{rel}/ray/shards"
    assert shards_location(env) == uri_of(prefix)
    # An earlier run committed shards 0 to 3; then shard 2's bytes were damaged in the bucket and
    # shard 3's manifest lost. It also left shards of another block size.
    earlier = ShardStore(uri_of(f"{prefix}/block-4"))
    for i in range(4):
        rows = shards.read_rows(tmp_path / "candidates.parquet", 4 * i, 4 * i + 4)  # as a worker reads them
        labels = rows.append_column(schema.LABEL, pa.array(np.full(4, NULL_LABEL, np.float32)))
        earlier.commit(i, labels.select(schema.SILVER_SCHEMA.names).cast(schema.SILVER_SCHEMA), keys_digest(rows))
    damaged = bytearray(client.get_object(Bucket=BUCKET, Key=f"{prefix}/block-4/part-000002.parquet")["Body"].read())
    damaged[len(damaged) // 2] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/block-4/part-000002.parquet", Body=bytes(damaged))
    client.delete_object(Bucket=BUCKET, Key=f"{prefix}/block-4/part-000003.json")
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/block-8/part-000000.json", Body=b"{}")
    kept = _keys(client, f"{prefix}/block-4")["part-000000.parquet"]

    seen = {}
    remove = stores.remove_stores

    def remove_seen(location, keep=None):  # the bucket as labelling left it, before the shards go
        if keep is None:
            seen.update(_keys(client, prefix))
        remove(location, keep)

    monkeypatch.setattr(stores, "remove_stores", remove_seen)
    params = SilverParams(labeling=LabelingConfig(actors=1, block_size=4, tokenize_stage="actor", executor="pool"),
                          max_length=32)
    result = Silver().run(inputs, params, env)
    assert (result.shards.total, result.shards.reused, result.shards.labelled) == (6, 2, 4)
    silver = pq.read_table(env.out / "silver.parquet")
    assert silver.column(schema.ID1).to_pylist() == cands.column(schema.ID1).to_pylist()
    assert set(silver.column(schema.LABEL).to_pylist()) == {NULL_LABEL}
    assert not [k for k in seen if k.startswith("block-8/")] and seen["block-4/part-000000.parquet"] == kept
    node = ray_local.get_runtime_context().get_node_id()  # written by the actor, on the node that labelled them
    assert [json.loads(seen[f"block-4/part-{i:06d}.json"])["writer"] for i in range(6)] == [None, None] + [node] * 4
    assert not [k for k in _keys(client, f"job/{rel}") if "shards" in k]  # gone from the bucket once merged
    assert not list(rd.root.rglob("part-*"))  # and none went through the staging copy
