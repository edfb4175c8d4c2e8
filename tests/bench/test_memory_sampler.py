"""The memory sampler tells a process's own heap from shared memory (Ray's object store)."""

import subprocess
import sys
import time

MIB = 2 ** 20

_CHILD = """
import sys, time
from multiprocessing import shared_memory
n = 64 * 2 ** 20
heap = b"\\x01" * n                        # anonymous pages, touched
shm = shared_memory.SharedMemory(create=True, size=n)
shm.buf[:] = heap                          # shared-memory pages, touched
shm.unlink()                               # mapped still; nothing left behind when killed
print("ready", flush=True)
time.sleep(60)
"""


def test_the_sampler_splits_anonymous_memory_from_shared_memory():
    from augsbert_ray.bench.memory import MemorySampler

    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    try:
        with MemorySampler(interval=0.05) as mem:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(0.5)
        # the child's 64 MiB of each kind, and the sampler's own process on top of the heap
        assert mem.peak_total_shmem >= 60 * MIB
        assert mem.peak_total_anon >= 60 * MIB
        assert mem.peak_total >= mem.peak_total_anon + 60 * MIB
        assert mem.stage_peaks["start"]["total_shmem"] == mem.peak_total_shmem
        # the largest single process: the child, by its command's first word, with both kinds
        pss, anon = mem.process_peaks[sys.executable]
        assert pss >= 120 * MIB and anon >= 60 * MIB and "driver" in mem.process_peaks
    finally:
        child.kill()
        child.wait()


def test_processes_are_told_apart_by_their_ray_titles():
    from augsbert_ray.bench.memory import process_role

    assert process_role("ray::_Host.call") == "warm hosts"
    assert process_role("ray::_Host") == "warm hosts"
    assert process_role("ray::MapWorker(MapBatches(PairScorer))") == "labelling actors"
    assert process_role("ray::IDLE") == "idle Ray workers"
    assert process_role("ray::ProgressSink.drain") == "other Ray workers"
    assert process_role("/usr/lib/ray/core/src/ray/raylet/raylet") == "Ray's own processes"
    assert process_role("") == "Ray's own processes"
    # a worker process before it titles itself
    assert process_role("/venv/bin/python -u /venv/ray/_private/workers/default_worker.py --node-ip-address=1"
                        ) == "idle Ray workers"


_TITLED = """
import json, subprocess, sys, time
from augsbert_ray.bench.memory import MemorySampler
code = 'import time\\nheap = b"\\\\x01" * (64 * 2 ** 20)\\nprint("ready", flush=True)\\ntime.sleep(60)\\n'
child = subprocess.Popen(["ray::MapWorker(MapBatches(PairScorer))", "-c", code], executable=sys.executable,
                         stdout=subprocess.PIPE, text=True)
try:
    with MemorySampler(interval=0.05) as mem:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(1.2)
finally:
    child.kill()
    child.wait()
print(json.dumps({"peaks": mem.role_peaks, "timeline": mem.timeline}))
"""


def test_the_sampler_puts_a_processs_heap_under_its_kind_over_time():
    """In a process of its own, so that only its child is sampled (a test worker may hold Ray's
    processes, labelling actors among them, as its children): a child titled as Ray titles a
    labelling actor, holding 64 MiB of heap."""
    import json

    done = subprocess.run([sys.executable, "-c", _TITLED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    peaks, timeline = got["peaks"], got["timeline"]
    assert 60 * MIB <= peaks["labelling actors"] < 100 * MIB
    assert peaks["driver"] > 0 and peaks["warm hosts"] == 0
    assert len(timeline) >= 2 and timeline[0][0] == 0.0
    assert max(point["labelling actors"] for _, point in timeline) == peaks["labelling actors"]
