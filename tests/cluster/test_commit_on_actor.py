"""Shards committed where they are labelled: on a 3-node ``ray.cluster_utils.Cluster``, each
shard's Parquet file and manifest are written by the node whose actor labelled it, not by the
driver's, and a re-run verifies the committed shards and labels only those whose manifest is
missing; the same with the shards in an S3 bucket (moto's server on loopback)."""

from __future__ import annotations

import pytest
from three_nodes import run_script

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_each_shard_is_committed_by_the_node_that_labelled_it(tmp_path):
    result = run_script("commit_on_actor.py", tmp_path / "out")
    manifests = result["manifests"]
    assert len(manifests) == 12 and result["silver_ok"]
    writers = {m["writer"] for m in manifests.values()}
    # every shard written by a labelling actor's node; both actors' nodes wrote; the driver's none
    assert set(result["actor_nodes"]) == set(result["workers"])
    assert writers == set(result["workers"]) and result["head"] not in writers
    assert all(m["rows"] == 8 and len(m["sha256"]) == 64 for m in manifests.values())
    # the candidates file is the same on every node (one machine's disk): every node may read shards
    assert result["readers"] == sorted([result["head"], *result["workers"]])
    assert result["selector"].startswith("in(") and all(n in result["selector"] for n in result["readers"])
    first, again = result["runs"]
    assert first == {"rows": 96, "shards": 12, "reused": 0, "labelled": 12, "redone": first["redone"]}
    assert sorted(first["redone"]) == list(range(12))
    assert {**again, "redone": sorted(again["redone"])} == {"rows": 96, "shards": 12, "reused": 10, "labelled": 2,
                                                             "redone": [3, 7]}


@pytest.mark.timeout(300)
def test_on_s3_each_shard_is_put_in_the_bucket_by_the_node_that_labelled_it(tmp_path):
    pytest.importorskip("moto")
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="shards")
        # The endpoint and credentials in the URI: every node's workers open it without an environment.
        uri = f"s3://testing:testing@shards/run/block-8?endpoint_override={host}:{port}&scheme=http&region=us-east-1"
        out = tmp_path / "out"
        result = run_script("commit_on_actor.py", out, uri)
        listed = client.list_objects_v2(Bucket="shards", Prefix="run/block-8/")["Contents"]
        keys = {o["Key"] for o in listed if not o["Key"].endswith("/")}  # pyarrow keeps a folder's marker
    finally:
        server.stop()
    manifests = result["manifests"]
    assert len(manifests) == 12 and result["silver_ok"] and not (out / "shards").exists()
    assert keys == {f"run/block-8/part-{i:06d}.{ext}" for i in range(12) for ext in ("json", "parquet")} | {
        "run/block-8/.writers"}
    writers = {m["writer"] for m in manifests.values()}
    assert set(result["actor_nodes"]) == set(result["workers"])
    assert writers == set(result["workers"]) and result["head"] not in writers
    first, again = result["runs"]
    assert (first["reused"], first["labelled"]) == (0, 12)
    assert (again["reused"], again["labelled"], sorted(again["redone"])) == (10, 2, [3, 7])
