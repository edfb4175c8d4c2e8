"""A real Ray head (`ray start --head`) on loopback with token authentication, and a job
submitted to it with `ray job submit`, as users submit them to their clusters, its run
directory on S3-compatible storage (moto's server on loopback) and then resumed from
another machine.

The head runs with its own temporary directory, ports and HOME (so no token file of the
user's is found), and is stopped by ending its `--block` process; other Ray instances on
the machine are left alone (never `ray stop`, which stops every Ray on the host).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest

from conftest import REPO, free_ports

BUCKET = "augsbert-runs"

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


class Head:
    def __init__(self, token: str):
        self.token = token
        # Short: Ray's socket paths live under the temp dir and must stay under ~100 characters.
        self.tmp = Path(tempfile.mkdtemp(prefix="arh-", dir="/tmp"))
        self.home = self.tmp / "home"
        self.home.mkdir()
        gcs, self.dash, agl, agg, met, rte, nm, om = free_ports(8)
        self.address = f"http://127.0.0.1:{self.dash}"
        self.env = {**os.environ, "HOME": str(self.home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                    "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
        self.env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
             "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dash),
             "--dashboard-agent-listen-port", str(agl), "--dashboard-agent-grpc-port", str(agg),
             "--metrics-export-port", str(met), "--runtime-env-agent-port", str(rte),
             "--node-manager-port", str(nm), "--object-manager-port", str(om),
             "--num-cpus", "2", "--temp-dir", str(self.tmp / "r"), "--disable-usage-stats"],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start failed:\n{self.proc.stdout.read()}")
            try:
                self.get("/api/version", token=token)
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)
        raise RuntimeError("the Ray head did not come up in 120 s")

    def replace_if_exited(self) -> bool:
        """Starts a new head in place of one whose `ray start --block` has exited (it exits,
        taking the whole head down, when any of its processes dies, as one can on a loaded
        machine); warns with its output, which names the process. Returns whether it did."""
        if self.proc.poll() is None:
            return False
        out = _read_available(self.proc.stdout)
        warnings.warn(f"the Ray head exited (status {self.proc.returncode}); starting another. Its output:\n"
                      f"{out[-3000:]}", stacklevel=2)
        self.proc.stdout.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of it is left
        except ProcessLookupError:
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.__init__(self.token)
        return True

    def get(self, path: str, token: str | None) -> int:
        req = urllib.request.Request(self.address + path)
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status

    def jobs(self) -> list[dict]:
        """The jobs the head has recorded (its job API, with the token)."""
        req = urllib.request.Request(self.address + "/api/jobs/")
        req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read().decode())

    def ray(self, *args: str, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray"), *args], env=env or self.env, cwd=REPO, capture_output=True,
                              text=True, timeout=timeout)

    def stop(self) -> None:
        """`ray start --block` stops the processes it started on SIGTERM; if it has not within
        a few seconds, its process group (a throwaway cluster) is killed."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _read_available(stream, wait_s: float = 2.0) -> str:
    """What a pipe holds now (never blocks on a pipe a surviving child still holds open)."""
    import select

    chunks, fd = [], stream.fileno()
    while select.select([fd], [], [], wait_s)[0]:
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def head():
    h = Head(secrets.token_hex(32))
    yield h
    h.stop()


def test_the_head_refuses_requests_without_the_token(head):
    for token in (None, "not-the-token"):
        with pytest.raises(urllib.error.HTTPError) as err:
            head.get("/api/jobs/", token=token)
        assert err.value.code in (401, 403)
    assert head.get("/api/jobs/", token=head.token) == 200


@pytest.mark.parametrize("token", [None, "not-the-token"])
def test_a_submission_without_the_token_is_refused(head, token, tmp_path):
    env = {k: v for k, v in head.env.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}
    if token:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    marker = tmp_path / "ran"
    proc = head.ray("job", "submit", "--address", head.address, "--", "touch", str(marker), env=env)
    assert proc.returncode != 0
    assert "authentication" in (proc.stdout + proc.stderr).lower()
    # Refused, not merely slow: the head recorded no job with this entrypoint, so none will run.
    assert not [j for j in head.jobs() if str(marker) in (j.get("entrypoint") or "")]
    assert not marker.exists()


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


def _metrics(client, prefix: str) -> dict:
    return json.loads(client.get_object(Bucket=BUCKET, Key=f"{prefix}metrics.json")["Body"].read())


def _run_locally(job, env, staging) -> str:
    """``augsbert run`` on a local Ray of its own (another machine: its own staging directory)."""
    proc = subprocess.run(
        [sys.executable, "-m", "augsbert_ray.cli", "run", str(job)], cwd=REPO, capture_output=True, text=True,
        timeout=900, env={**os.environ, **env, "AUGSBERT_STAGING_DIR": str(staging), "RAY_ADDRESS": ""},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr  # the summary on stdout, the job's progress lines on stderr


@pytest.mark.timeout(1200)
def test_a_submitted_job_keeps_its_run_dir_on_s3_and_another_machine_resumes_it(head, s3, tiny_stsb, tiny_model,
                                                                                 tmp_path):
    import yaml

    client, s3_env = s3
    uri = f"s3://{BUCKET}/runs/tiny"
    job = tmp_path / "tiny.yaml"
    # A tiny model and data: this test is about submission and storage, not quality (the smoke
    # job runs the embedded model end to end in tests/test_smoke_job.py).
    job.write_text(yaml.safe_dump({
        "name": "tiny-submitted", "run_dir": uri,
        "data": {s: {"format": "stsb", "path": str(p)} for s, p in tiny_stsb.items()},
        "cross_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "bi_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "sampling": {"strategy": "bm25", "top_k": 2}, "labeling": {"block_size": 32, "micro_batch_size": 8},
    }))
    # The storage's credentials and endpoint travel in the job's runtime environment, as a user
    # passes them to a cluster; the job stages its files in a folder of its own.
    runtime_env = json.dumps({"env_vars": {**s3_env, "AUGSBERT_STAGING_DIR": str(tmp_path / "machine-a")}})
    # The head answers HTTP before its job agent is up; on a loaded machine a submission can
    # come too early and get "No available agent" (nothing was started). Then it is resubmitted.
    # A head found gone (before the job or during it) is replaced once, with a warning.
    replaced = head.replace_if_exited()
    for attempt in range(10):
        proc = head.ray("job", "submit", "--address", head.address, "--submission-id", f"augsbert-tiny-{attempt}",
                        "--working-dir", ".", "--runtime-env-json", runtime_env, "--",
                        "augsbert", "run", str(job), timeout=800)
        out = proc.stdout + proc.stderr
        if not replaced and head.replace_if_exited():
            replaced = True
            continue
        if "No available agent to submit job" not in out:
            break
        time.sleep(10)
    assert proc.returncode == 0, out[-4000:]
    status = head.ray("job", "status", "--address", head.address, f"augsbert-tiny-{attempt}")
    assert "succeeded" in (status.stdout + status.stderr).lower()
    # progress and where things are, in the job's log
    assert f"run directory {uri}" in out
    for stage in ("cross_encoder", "candidates", "silver", "augsbert"):
        assert f"] {stage} done in" in out  # "[2/12] cross_encoder done in 0:00:19"
    # Everything on the storage; the job ran on the submitted-to cluster, not on a Ray of its own.
    keys = _keys(client, "runs/tiny/")
    for name in ["config.yaml", "metrics.json", "summary.md", "gold/train.parquet", "candidates.parquet",
                 "silver.parquet", "models/cross-encoder/model.safetensors",
                 "models/bi-encoder-augsbert/model.safetensors"]:
        assert name in keys, name
    markers = {k.split("/")[1]: k for k in keys if k.startswith("stages/") and k.endswith("/done.json")}
    assert {"augsbert", "silver", "cross_encoder"} <= set(markers)
    first = _metrics(client, "runs/tiny/")
    assert first["run_dir"] == uri and first["cluster"]["cpus"] == 2
    train = next(s for s in first["stages"] if s["name"] == "augsbert")["result"]["train"]
    assert train["storage_filesystem"] == "s3"  # Ray Train kept its checkpoints on S3 itself
    assert not [k for k in keys if "/ray/" in k]  # and they are removed once the stage is done

    # Another machine (an empty staging directory, a local Ray) resumes the run, whose
    # augsbert stage has lost its marker and its model on the storage: every other stage is
    # found complete on S3 and reused, and that one stage is trained again, to the same model
    # (seeded).
    model_key = f"runs/tiny/{markers['augsbert'].rsplit('/', 1)[0]}/model/model.safetensors"
    first_model = client.get_object(Bucket=BUCKET, Key=model_key)["Body"].read()
    for key in (f"runs/tiny/{markers['augsbert']}", model_key):
        client.delete_object(Bucket=BUCKET, Key=key)
    out = _run_locally(job, s3_env, tmp_path / "machine-b")
    second = _metrics(client, "runs/tiny/")
    assert sorted(second["stages_reused"]) == sorted(
        ["cross_encoder", "eval_cross_encoder", "eval_zero_shot", "gold_only", "eval_gold_only", "candidates",
         "silver", "eval_augsbert"])
    assert "fetched" in out and "] augsbert done in" in out
    assert markers["augsbert"] in _keys(client, "runs/tiny/")
    assert client.get_object(Bucket=BUCKET, Key=model_key)["Body"].read() == first_model
    assert second["scores"] == first["scores"]
