"""The control plane's ceiling: where the time of a labelling run with no model work goes.

With a scorer that does no model work, the labelling pipeline's rate is what the engine
itself can move: the driver reading the candidates file's footer and having a re-run's
committed shards verified, Ray Data reading the shards and handing them to the actors, each
actor checking its shard and committing it (Parquet, sha256, manifest) and the driver taking one
small record per shard. That rate, divided by one GPU's steady labelling rate, is how many GPUs
one driver can keep busy. ``analyse`` splits a run's time into those phases and names the one
that limits it; it is pure arithmetic on ``PhaseTimes``, measured by ``control_plane``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Above this share of one core, the driver process is the bottleneck of the phase.
DRIVER_BUSY = 0.85


@dataclass(frozen=True)
class PhaseTimes:
    """What one null-scorer labelling run measured (seconds unless named otherwise)."""

    pairs: int
    shards: int
    wall: float  # the whole labelling call
    input: float  # making the input (here: synthetic pairs written as the candidates stage writes them)
    queued: float  # from the start until every shard is queued for the pool (includes ``input``)
    first_shard: float  # from then until the first shard is committed (the actor pool's start)
    commit: float  # in the driver's shard commits (Parquet, sha256, manifest); none where the actors commit
    driver_cpu_queued: float  # the driver process's CPU seconds while queueing
    driver_cpu_pool: float  # ... while the pool ran
    peak_rss: int  # the driver's peak resident memory, bytes
    steady_pairs_per_s: float | None = None  # from the first shard committed to the last
    rss_before: int = 0  # the driver's resident memory when the run started (its imports, earlier work)
    # The peak RSS's two parts: the driver's own heap, and the object store's pages it maps
    # (bounded by the store's size), each at its own peak; bytes.
    peak_private: int = 0
    peak_shared: int = 0
    # The driver's CPU seconds per second and shards committed per second over the middle
    # three fifths of the shards (the pool's start and last shards left out); None if too few.
    steady_driver_cpu_rate: float | None = None
    steady_shards_per_s: float | None = None

    @property
    def pool(self) -> float:
        return max(0.0, self.wall - self.queued)


@dataclass(frozen=True)
class Ceiling:
    pairs_per_s: float  # what one driver sustains once running: steady, else once every shard is queued
    end_to_end_pairs_per_s: float  # from the first shard made to the last committed, the pool's start included
    phases: dict  # phase -> seconds, in the order they happen
    limit: str  # the phase (of those that grow with the pairs) that takes longest, and the driver's load there
    driver_busy_queued: float  # the driver's CPU seconds per second in each phase
    driver_busy_pool: float
    peak_rss_mib: float
    rss_growth_mib: float  # the peak less what the driver held before the run

    def to_dict(self) -> dict:
        return asdict(self)


START = "starting the actor pool (to the first shard back)"
QUEUE = "driver: the shards' bounds and a re-run's verified shards, before the pool"
POOL = "Ray Data: shards read, labelled, checked and committed by the actors, a record each to the driver"


def analyse(t: PhaseTimes) -> Ceiling:
    """Splits a run's time into phases and names the one that limits its rate.

    The actor pool's start is paid once, whatever the number of pairs, so it is reported but
    the limit is the longest of the phases that grow with the pairs.

    Returns:
        The run's ``Ceiling``.

    Raises:
        ValueError: times that cannot come from one run (a phase longer than the whole).
    """
    if t.wall <= 0 or t.queued > t.wall + 1e-9 or t.input > t.queued + 1e-9:
        raise ValueError(f"inconsistent times: wall {t.wall}, queued {t.queued}, input {t.input}")
    start = min(t.first_shard, t.pool)
    phases = {
        "making the input": t.input,
        QUEUE: t.queued - t.input,
        START: start,
        POOL: max(0.0, t.pool - start - t.commit),
        "driver: committing shards (Parquet, sha256, manifest)": t.commit,
    }
    growing = {k: v for k, v in phases.items() if k != START}
    worst = max(growing, key=growing.get)
    busy_q = t.driver_cpu_queued / t.queued if t.queued else 0.0
    busy_p = t.driver_cpu_pool / t.pool if t.pool else 0.0
    busy = busy_q if worst in ("making the input", QUEUE) else busy_p
    limit = f"{worst} ({100 * phases[worst] / sum(growing.values()):.0f}% of the time that grows with the pairs)"
    limit += (f"; the driver process is CPU-bound there ({busy:.2f} CPU-s per s)" if busy >= DRIVER_BUSY
              else f"; the driver process is not CPU-bound there ({busy:.2f} CPU-s per s)")
    pool_rate = t.pairs / t.pool if t.pool else 0.0
    return Ceiling(pairs_per_s=t.steady_pairs_per_s or pool_rate, end_to_end_pairs_per_s=t.pairs / t.wall,
                   phases=phases, limit=limit, driver_busy_queued=busy_q, driver_busy_pool=busy_p,
                   peak_rss_mib=t.peak_rss / 2**20, rss_growth_mib=max(0, t.peak_rss - t.rss_before) / 2**20)


def devices_fed(ceiling_pairs_per_s: float, per_device_pairs_per_s: float | None) -> float | None:
    """How many labelling devices (GPUs, or CPU actors) one driver keeps busy: its ceiling over
    one device's steady rate (None without a rate)."""
    if not per_device_pairs_per_s or per_device_pairs_per_s <= 0:
        return None
    return ceiling_pairs_per_s / per_device_pairs_per_s


def steady_driver(commit_times: list[float], cpu_at_commit: list[float]) -> tuple[float | None, float | None]:
    """The driver's CPU seconds per second and its shards per second over the middle three
    fifths of the commits: the pool's start and its end left out. (None, None) with fewer
    than ten shards."""
    n = len(commit_times)
    if n < 10 or len(cpu_at_commit) != n:
        return None, None
    a, b = n // 5, n - 1 - n // 5
    span = commit_times[b] - commit_times[a]
    if span <= 0:
        return None, None
    return (cpu_at_commit[b] - cpu_at_commit[a]) / span, (b - a) / span


def steady_rate(commit_times: list[float], pairs_per_shard: list[int]) -> float | None:
    """Pairs/s from the first shard committed to the last (the first shard's pairs are not
    counted: its time is the pool's start). None with fewer than three shards: two or more are
    often committed at once, and a rate over one interval says little."""
    if len(commit_times) < 3 or len(commit_times) != len(pairs_per_shard):
        return None
    span = commit_times[-1] - commit_times[0]
    return sum(pairs_per_shard[1:]) / span if span > 0 else None
