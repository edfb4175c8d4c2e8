"""Where a training runs (a warm host or a Ray Train worker group), and a warm host's
checkpoints: pure parts, without Ray."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from augsbert_ray.training.ray_trainer import STATE_FILE
from augsbert_ray.training.warm_fit import KEEP, latest_checkpoint, persist_checkpoint
from augsbert_ray.workers import Placement, training_on_host

ONE_CPU_WORKER = Placement(num_workers=1, use_gpu=False, pool_open=True, single_node=True, local_storage=True,
                           node_gpus=0)


def test_one_worker_on_the_drivers_machine_trains_on_a_warm_host():
    assert training_on_host(ONE_CPU_WORKER)
    assert training_on_host(replace(ONE_CPU_WORKER, use_gpu=True, node_gpus=1))


@pytest.mark.parametrize("change", [
    {"num_workers": 2},  # data parallel: Ray Train's worker group
    {"pool_open": False},  # outside a job: nothing would end a host
    {"single_node": False},  # a multi-node cluster or a remote address
    {"local_storage": False},  # checkpoints to a URI
    {"use_gpu": True, "node_gpus": 2},  # which device the reservation holds is not the host's to know
])
def test_everything_else_keeps_the_worker_group(change):
    assert not training_on_host(replace(ONE_CPU_WORKER, **change))


def _write(step):
    return lambda d: (d / STATE_FILE).write_text(str(step))


def test_checkpoints_are_written_whole_and_the_latest_two_kept(tmp_path):
    run = tmp_path / "run"
    assert latest_checkpoint(run, STATE_FILE) is None
    for step in (4, 8, 12):
        saved = persist_checkpoint(_write(step), run, step)
        os.utime(saved / STATE_FILE, ns=(step * 10**9, step * 10**9))  # file times as the writes would order them
        assert latest_checkpoint(run, STATE_FILE) == saved
    assert sorted(p.name for p in run.iterdir()) == [f"checkpoint_{s:09d}" for s in (8, 12)][-KEEP:]
    (run / ".checkpoint_000000016.writing").mkdir()  # a write cut short by a kill
    (run / ".checkpoint_000000016.writing" / STATE_FILE).write_text("16")
    assert (latest_checkpoint(run, STATE_FILE) / STATE_FILE).read_text() == "12"


def test_a_host_keeps_the_gpus_visible_on_a_gpu_node_and_takes_the_jobs_environment_elsewhere():
    from augsbert_ray.workers import _host_options

    assert _host_options(1)["runtime_env"] == {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    assert "runtime_env" not in _host_options(0)  # an idle worker Ray keeps started can become the host
    assert _host_options(0)["num_cpus"] == 0 == _host_options(1)["num_cpus"]  # its placement group reserves


_HELD_HEAP = """
import json, sys
from augsbert_ray.workers import trim_heap

def anon_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("RssAnon:"))

# Blocks below glibc's mmap threshold come from the heap; the last one kept pins the heap's top,
# so freeing the rest leaves their pages with the process until something trims the heap.
blocks = [bytearray(60_000) for _ in range(3_000)]
keep = blocks[-1]
del blocks
held = anon_mib()
trim_heap()
print(json.dumps([held, anon_mib()]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the process's memory from /proc")
def test_trimming_the_heap_hands_a_finished_works_memory_back():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _HELD_HEAP], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    held, after = json.loads(done.stdout)
    assert held - after > 100  # MiB of the ~170 MiB freed
