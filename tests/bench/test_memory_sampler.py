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
    finally:
        child.kill()
        child.wait()
