"""Peak memory while something runs, sampled by a background thread (psutil)."""

from __future__ import annotations

import threading
import time


_PSS_FIELDS = ("Pss:", "Pss_Anon:", "Pss_Shmem:")


def _pss_kib(pid: int) -> tuple[int, int, int]:
    """A process's proportional set size (shared pages split between the processes that map
    them), and its anonymous and shared-memory parts (KiB): Ray's object store is shared memory,
    so the split tells the store's pages from the processes' own heaps. Zeros if unreadable."""
    found = dict.fromkeys(_PSS_FIELDS, 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                words = line.split()
                if words and words[0] in found:
                    found[words[0]] = int(words[1])
    except (OSError, ValueError):
        pass
    return found["Pss:"], found["Pss_Anon:"], found["Pss_Shmem:"]


def _rss_parts() -> tuple[int, int]:
    """This process's resident private memory and resident shared memory (bytes): Ray's object
    store pages that a process has read count in its RSS as shared memory, not as its own."""
    parts = {"RssAnon:": 0, "RssShmem:": 0}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                words = line.split()
                if words and words[0] in parts:
                    parts[words[0]] = int(words[1]) * 1024
    except (OSError, ValueError):
        pass
    return parts["RssAnon:"], parts["RssShmem:"]


# Ray titles its worker processes ``ray::<actor class>[.<method>]`` (``ray::IDLE`` when free).
ROLES = ("driver", "warm hosts", "labelling actors", "other Ray workers", "idle Ray workers", "Ray's own processes")


def process_role(title: str) -> str:
    """Which kind of process a Ray job's process is, from its title (its command line), for a
    process other than the driver: a warm host, a labelling actor, another Ray worker, or one
    of Ray's own (GCS, raylet, dashboard, agents)."""
    if not title.startswith("ray::"):
        # a worker that has not yet titled itself is still starting: idle
        return ROLES[4] if "default_worker.py" in title else ROLES[5]
    if title.startswith("ray::_Host"):
        return ROLES[1]
    if "PairScorer" in title or title.startswith("ray::MapWorker"):
        return ROLES[2]
    return ROLES[4] if title.startswith("ray::IDLE") else ROLES[3]


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


class MemorySampler:
    """Peak driver RSS, and (``descendants``) peak PSS summed over the driver and every process
    it started (Ray's GCS, raylet, workers: Ray's shared-memory object store counted once).
    ``peak_private`` and ``peak_shared``: the peaks of the driver's RSS that is its own and of
    the part that is shared memory (object store pages it mapped; Linux only, else 0).

    ``peak_total_anon`` and ``peak_total_shmem``: the peaks of that sum's anonymous part (the
    processes' own heaps) and of its shared-memory part (Ray's object store).

    ``role_peaks``: per kind of process (``ROLES``), the peak of its processes' anonymous PSS
    summed; ``timeline``: that sum per kind about once a second (``[seconds, {role: bytes}]``),
    to see which process grows and when.

    ``process_peaks``: per process title (what a Ray worker runs now: ``ray::MapBatches(fn)``,
    ``ray::_in_task``; the driver as "driver"), the peak PSS and anonymous PSS of one process
    with that title: the largest single process, where ``role_peaks`` sums them.

    ``stage`` names what runs now; ``stage_peaks`` keeps the peaks of each stage.

    Example::

        with MemorySampler(descendants=False) as mem:
            work()
        print(mem.peak_rss)
    """

    def __init__(self, interval: float = 0.25, descendants: bool = True):
        import psutil

        self.me = psutil.Process()
        self.interval = interval
        self.descendants = descendants
        self.peak_rss = 0
        self.peak_total = 0
        self.peak_private = 0
        self.peak_shared = 0
        self.peak_total_anon = 0
        self.peak_total_shmem = 0
        self.stage_peaks: dict[str, dict[str, int]] = {}
        self.role_peaks: dict[str, int] = {}
        self.process_peaks: dict[str, list[int]] = {}
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self._t0 = None
        self._next_point = 0.0
        self.stage = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        rss = self.me.memory_info().rss
        total = anon = shmem = 0
        if self.descendants:
            pids = [self.me.pid] + [c.pid for c in self.me.children(recursive=True)]
            parts = [_pss_kib(p) for p in pids]
            total, anon, shmem = (sum(col) * 1024 for col in zip(*parts))
            self._by_role(pids, parts)
        private, shared = _rss_parts()
        self.peak_rss, self.peak_total = max(self.peak_rss, rss), max(self.peak_total, total)
        self.peak_private, self.peak_shared = max(self.peak_private, private), max(self.peak_shared, shared)
        self.peak_total_anon, self.peak_total_shmem = max(self.peak_total_anon, anon), max(self.peak_total_shmem, shmem)
        peaks = self.stage_peaks.setdefault(self.stage, dict.fromkeys(
            ("driver_rss", "total_pss", "driver_private", "driver_shared", "total_anon", "total_shmem"), 0))
        for key, value in (("driver_rss", rss), ("total_pss", total), ("driver_private", private),
                           ("driver_shared", shared), ("total_anon", anon), ("total_shmem", shmem)):
            peaks[key] = max(peaks[key], value)

    def _by_role(self, pids: list[int], parts: list[tuple[int, int, int]]) -> None:
        roles = dict.fromkeys(ROLES, 0)
        for pid, (pss, anon, _) in zip(pids, parts):
            title = "driver" if pid == self.me.pid else _title(pid)
            roles[ROLES[0] if pid == self.me.pid else process_role(title)] += anon * 1024
            # a worker's title is its task's name: the arguments after it say nothing more
            peak = self.process_peaks.setdefault(title.split(" ")[0][:80] or "?", [0, 0])
            peak[0], peak[1] = max(peak[0], pss * 1024), max(peak[1], anon * 1024)
        for role, value in roles.items():
            self.role_peaks[role] = max(self.role_peaks.get(role, 0), value)
        now = time.monotonic()
        self._t0 = now if self._t0 is None else self._t0
        if now >= self._next_point:
            self.timeline.append((round(now - self._t0, 1), roles))
            self._next_point = now + 1.0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:  # a process ended between listing and reading
                pass
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        try:
            self._sample()  # the end state too, however short the run
        except Exception:
            pass
