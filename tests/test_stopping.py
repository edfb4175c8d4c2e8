"""A stop (Ctrl-C, SIGTERM) starts no new attempt: a labelling pool or a training that fails
because the job is stopping is not retried, and once the job's Ray is stopped a Ray call from a
thread still unwinding fails at once instead of joining the stopped cluster (Ray's auto-connect
would wait a minute for its GCS)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from augsbert_ray import signals
from augsbert_ray.config.labeling import LabelingConfig
from augsbert_ray.labeling import driver
from augsbert_ray.progress.messages import lines_to


def _candidates(n: int) -> pa.Table:
    from augsbert_ray import schema

    return pa.table({schema.ID1: pa.array(range(n), pa.int64()), schema.ID2: pa.array(range(1, n + 1), pa.int64()),
                     schema.SENTENCE1: [f"a {i}" for i in range(n)], schema.SENTENCE2: [f"b {i}" for i in range(n)],
                     schema.ORIGIN: ["bm25"] * n, schema.RETRIEVAL_SCORE: pa.array([1.0] * n, pa.float32())})


@pytest.mark.parametrize("stopped", [False, True])
def test_a_pool_that_fails_while_the_job_stops_is_not_retried(monkeypatch, stopped):
    import ray

    attempts = []

    def failing_attempt(pending, *args):
        attempts.append(sorted(pending))
        if stopped:
            signals._received.append(signal.SIGTERM)  # the signal arrived; the pool then fails with Ray
        raise RuntimeError("the actor pool's actors died")

    monkeypatch.setattr(ray, "put", lambda value: value)  # no Ray here: the shards stay in this process
    monkeypatch.setattr(driver, "_run_attempt", failing_attempt)
    monkeypatch.setattr(signals, "_received", [])
    shards = list(driver.table_shards(_candidates(6), 3))
    lines: list[str] = []
    with lines_to(lines.append):
        if stopped:
            with pytest.raises(signals.Interrupted) as raised:
                driver._label(shards, {}, "model", LabelingConfig(pool_retries=2), 32, 1, None, None, None)
            assert raised.value.signum == signal.SIGTERM
        else:
            with pytest.raises(driver.LabelingError, match="pool_retries=2"):
                driver._label(shards, {}, "model", LabelingConfig(pool_retries=2), 32, 1, None, None, None)
    assert len(attempts) == (1 if stopped else 3)
    assert any("a new pool" in line for line in lines) is not stopped


_AFTER_STOP = """
import threading, time
from augsbert_ray.runtime import start_ray, stop_ray
import ray
start_ray(num_cpus=1, verbose=False)
ray.get(ray.put(1))
out, stopped = {}, threading.Event()
def late_call():  # a stage thread still unwinding when the job's Ray is stopped
    stopped.wait()
    t0 = time.monotonic()
    try:
        ray.put(2)
        out["result"] = "connected"
    except Exception as e:
        out["result"] = type(e).__name__
    out["seconds"] = time.monotonic() - t0
thread = threading.Thread(target=late_call, name="stage-augsbert", daemon=True)
thread.start()
stop_ray()
stopped.set()
thread.join(30)
print(out.get("result", "hung"), round(out.get("seconds", 99), 1), ray.is_initialized())
"""


def test_after_the_jobs_ray_is_stopped_a_late_ray_call_fails_at_once():
    done = subprocess.run([sys.executable, "-c", _AFTER_STOP], capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result, seconds, initialized = done.stdout.split()[-3:]
    assert result != "connected" and result != "hung" and float(seconds) < 5 and initialized == "False", done.stdout


def _tiny_job(path, run_dir, stsb: dict, model: str):
    import yaml

    job = {"name": "stop", "run_dir": str(run_dir), "ray": {"num_cpus": 2},
           "data": {s: {"format": "stsb", "path": str(p)} for s, p in stsb.items()},
           "cross_encoder": {"model": model, "epochs": 4, "batch_size": 8}}
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_stop_mid_training_ends_the_job_at_once_with_one_line(tiny_stsb, tiny_model, tmp_path):
    """The job's first training (on a warm host) is stopped part-way: the job ends within 10 s
    with 130, one ``interrupted`` line and no retry, and nothing joins the stopped Ray."""
    import os

    signum = signal.SIGINT
    run_dir = tmp_path / "run"
    job = _tiny_job(tmp_path / "job.yaml", run_dir, tiny_stsb, tiny_model)
    code = ("import sys; from augsbert_ray.testing import slow_training; slow_training(1.0); "
            f"from augsbert_ray.cli import main; sys.exit(main(['run', {str(job)!r}, '--until', 'cross_encoder']))")
    out = tmp_path / "out.txt"
    with open(out, "w") as err_file:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=err_file,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while "[cross-encoder] epoch" not in (out.read_text() if out.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.1)
        sent = time.monotonic()
        os.kill(proc.pid, signum)
        rc = proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = out.read_text()
    assert rc == 128 + signum and took < 10, (rc, took, err[-3000:])
    assert err.strip().splitlines()[-1] == "augsbert: interrupted" and err.count("interrupted") == 1, err[-3000:]
    ray_log = (run_dir / "logs" / "ray.log").read_text()
    assert "Connecting to existing Ray cluster" not in ray_log, ray_log[-3000:]
    assert ray_log.count("Started a local Ray") == 1, ray_log[-3000:]  # the job's own, and no other
    assert "restart" not in (run_dir / "logs" / "job.log").read_text()
