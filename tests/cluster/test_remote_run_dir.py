"""A run directory on S3-compatible storage (moto's server on loopback), then resumed from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, write_stsb

pytestmark = pytest.mark.slow

BUCKET = "augsbert-runs"


@pytest.fixture
def s3(monkeypatch):
    pytest.importorskip("moto")
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    yield client, env
    server.stop()


def _keys(client, prefix: str) -> set[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"][len(prefix):] for page in pages for o in page.get("Contents", [])}


def _run(job, env, staging) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "augsbert_ray.cli", "run", str(job)], cwd=REPO, capture_output=True, text=True,
        timeout=1500, env={**os.environ, **env, "AUGSBERT_STAGING_DIR": str(staging), "RAY_ADDRESS": ""},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr  # the summary on stdout, the job's progress lines on stderr


@pytest.mark.timeout(600)
def test_run_dir_on_s3_then_resumed_from_another_machine(s3, tiny_model, tmp_path):
    client, env = s3
    stsb = {s: write_stsb(tmp_path / f"sts-{s}.csv", n, seed) for s, n, seed in [("train", 40, 1), ("dev", 20, 2), ("test", 20, 3)]}
    uri = f"s3://{BUCKET}/runs/tiny"
    job = tmp_path / "tiny.yaml"
    job.write_text(yaml.safe_dump({
        "name": "tiny-s3", "run_dir": uri, "ray": {"num_cpus": 2},
        "data": {s: {"format": "stsb", "path": str(p)} for s, p in stsb.items()},
        "cross_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "bi_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "sampling": {"strategy": "bm25", "top_k": 2},
        "labeling": {"block_size": 32, "micro_batch_size": 8},
    }))

    out = _run(job, env, tmp_path / "machine-a")
    assert f"run directory {uri}" in out
    keys = _keys(client, "runs/tiny/")
    for name in ["config.yaml", "metrics.json", "summary.md", "gold/train.parquet", "candidates.parquet",
                 "silver.parquet", "models/cross-encoder/model.safetensors",
                 "models/bi-encoder-augsbert/model.safetensors"]:
        assert name in keys, name
    markers = {k.split("/")[1]: k for k in keys if k.startswith("stages/") and k.endswith("/done.json")}
    assert {"augsbert", "silver", "cross_encoder"} <= set(markers)
    first = json.loads(client.get_object(Bucket=BUCKET, Key="runs/tiny/metrics.json")["Body"].read())
    assert first["run_dir"] == uri
    train = next(s for s in first["stages"] if s["name"] == "augsbert")["result"]["train"]
    assert train["storage_filesystem"] == "s3"  # Ray Train kept its checkpoints on S3 itself
    assert not [k for k in keys if "/ray/" in k]  # and they are removed once the stage is done

    # Another machine (an empty staging directory) resumes: every stage is found complete on S3.
    out = _run(job, env, tmp_path / "machine-b")
    second = json.loads(client.get_object(Bucket=BUCKET, Key="runs/tiny/metrics.json")["Body"].read())
    assert sorted(second["stages_reused"]) == sorted(
        ["cross_encoder", "eval_cross_encoder", "eval_zero_shot", "gold_only", "eval_gold_only", "candidates",
         "silver", "augsbert", "eval_augsbert"])
    assert second["scores"] == first["scores"]
    assert "fetched" in out

    # A stage whose marker is gone from the storage is redone, and only that stage.
    client.delete_object(Bucket=BUCKET, Key=f"runs/tiny/{markers['augsbert']}")
    _run(job, env, tmp_path / "machine-b")
    third = json.loads(client.get_object(Bucket=BUCKET, Key="runs/tiny/metrics.json")["Body"].read())
    assert "augsbert" not in third["stages_reused"] and len(third["stages_reused"]) == 8
    for split in ("dev", "test"):  # seeded: the same model again
        assert third["scores"]["augsbert"][split]["spearman"] == pytest.approx(first["scores"]["augsbert"][split]["spearman"])
