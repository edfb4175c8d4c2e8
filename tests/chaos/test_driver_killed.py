"""Chaos: the driver is killed (SIGKILL to the job's whole process group, its local Ray
included) and the job is run again.

Mid-labelling: the re-run completes, its silver set equals a fault-free run's row for row,
and the labelling it redoes is at most the shards that were in flight when the driver died:
no committed shard is labelled twice. Mid-training: the re-run resumes the stage's Ray Train
run from its latest checkpoint and ends with the fault-free run's model, bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from augsbert_ray.labeling import TRACE_ENV

pytestmark = pytest.mark.slow


def _job(path: Path, run_dir: Path, stsb: dict, model: str) -> Path:
    job = {
        "name": "driver-chaos",
        "run_dir": str(run_dir),
        "ray": {"num_cpus": 2},
        # every checkpoint written, so that the slowed training has one to resume from early
        "training": {"checkpoint_min_seconds": 0},
        "data": {s: {"format": "stsb", "path": str(p)} for s, p in stsb.items()},
        "cross_encoder": {"model": model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "bi_encoder": {"model": model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "sampling": {"strategy": "bm25", "top_k": 4, "query_batch_size": 16},
        "labeling": {"block_size": 8, "micro_batch_size": 8, "actors": 1},
        "evaluation": {"batch_size": 16},
    }
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def _run(job: Path, log: Path, trace: dict | None = None, train_delay_s: float = 0) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop(TRACE_ENV, None)
    if trace:
        env[TRACE_ENV] = json.dumps(trace)
    # `augsbert run JOB`, its trainings slowed down by train_delay_s a step (augsbert_ray.testing).
    slow = f"from augsbert_ray.testing import slow_training; slow_training({train_delay_s!r}); " if train_delay_s else ""
    code = f"import sys; {slow}from augsbert_ray.cli import main; sys.exit(main(['run', {str(job)!r}]))"
    # A session of its own, so that killing its group kills the driver and the local Ray it started.
    return subprocess.Popen([sys.executable, "-c", code], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def _events(trace: Path, kind: str) -> set[int]:
    out = set()
    if trace.exists():
        for line in trace.read_text().splitlines():
            event, *shards = line.split()
            if event == kind:
                out.update(map(int, shards))
    return out


def _folder(run_dir: Path, stage: str) -> Path:
    (folder,) = [p.parent for p in (run_dir / "stages" / stage).glob("*/done.json")]
    return folder


def _kill_when(proc, log: Path, ready, what: str) -> None:
    deadline = time.time() + 600
    while not ready():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.time() < deadline, f"no {what} within 600 s"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.mark.timeout(1200)
def test_a_killed_driver_redoes_only_what_was_in_flight(tiny_stsb, tiny_model, tmp_path, ray_local):
    from augsbert_ray.config import validate_tree
    from augsbert_ray.pipeline import run_job

    # A fault-free run first (in this process, on the session's Ray: it is not killed).
    clean_dir = tmp_path / "clean"
    job = _job(tmp_path / "clean.yaml", clean_dir, tiny_stsb, tiny_model)
    run_job(validate_tree(yaml.safe_load(job.read_text())))
    clean = pq.read_table(clean_dir / "silver.parquet")
    n_shards = json.loads((_folder(clean_dir, "silver") / "done.json").read_text())["result"]["shards"]["total"]
    assert n_shards >= 8

    # The same job with the stages before labelling done (copied: they are not the point),
    # then labelling slowed down and the driver killed once a few shards are committed.
    run_dir = tmp_path / "chaos"
    shutil.copytree(clean_dir, run_dir, ignore=shutil.ignore_patterns("silver", "augsbert", "eval_augsbert"))
    job = _job(tmp_path / "chaos.yaml", run_dir, tiny_stsb, tiny_model)
    trace1 = tmp_path / "trace1.txt"
    proc = _run(job, tmp_path / "chaos1.log", {"path": str(trace1), "delay_s": 0.6})
    shards = lambda: list(run_dir.glob("stages/silver/*/shards/*/part-*.json"))  # noqa: E731
    _kill_when(proc, tmp_path / "chaos1.log", lambda: len(shards()) >= 3, "committed shards")
    committed = {int(p.stem.split("-")[1]) for p in shards()}
    in_flight = _events(trace1, "start") - committed  # begun before the kill, not committed
    assert 3 <= len(committed) < n_shards and not list(run_dir.glob("stages/silver/*/done.json"))

    # The re-run, with the bi-encoder's training slowed down and the driver killed again once
    # the training stage has a checkpoint.
    trace2 = tmp_path / "trace2.txt"
    proc = _run(job, tmp_path / "chaos2.log", {"path": str(trace2), "delay_s": 0}, train_delay_s=0.5)
    checkpoints = lambda: list(run_dir.glob("stages/augsbert/*/ray/train/*/checkpoint_*"))  # noqa: E731
    _kill_when(proc, tmp_path / "chaos2.log", checkpoints, "training checkpoint")
    silver = pq.read_table(run_dir / "silver.parquet")
    assert silver.equals(clean)  # row for row: nothing lost, nothing doubled
    result = json.loads((_folder(run_dir, "silver") / "done.json").read_text())["result"]
    labelled_again = _events(trace2, "start")
    redone = labelled_again & _events(trace1, "start")  # labelling work done twice
    print(f"\nshards {n_shards}: committed before the kill {len(committed)}, in flight {len(in_flight)}, "
          f"labelled by the re-run {len(labelled_again)}, redone {len(redone)}")
    assert result["shards"] == {"total": n_shards, "reused": len(committed), "labelled": n_shards - len(committed),
                                "block_size": 8}
    assert labelled_again == set(range(n_shards)) - committed  # no committed shard is labelled again
    assert redone <= in_flight  # the work redone is at most what was in flight
    assert not list(run_dir.glob("stages/silver/*/shards"))  # shards removed once silver.parquet is complete

    # The third run resumes the interrupted training from its checkpoint: the same model as
    # the fault-free run, bit for bit. (In this process, on the session's Ray: where the
    # re-run's driver runs is not the point, and it saves a Ray start.)
    third = run_job(validate_tree(yaml.safe_load(job.read_text())))
    assert third.stage("augsbert").result.train["resumed_from_step"] > 0
    weights = "model/model.safetensors"
    assert (_folder(run_dir, "augsbert") / weights).read_bytes() == (_folder(clean_dir, "augsbert") / weights).read_bytes()
