"""The control-plane ceiling: the labelling pipeline with a scorer that does no model work.

The pairs go through ``labeling.label_shards`` (what ``augsbert label`` runs): shards cut
and fingerprinted on the driver, written to its spool on disk, read by Ray Data tasks and handed
to an actor pool, checked against their input and committed to disk with their manifests. Only the
actors' scorer is another, ``NullScorer`` (passed as the pipeline's ``scorer``), which returns
a constant label without tokenising or running a model; the run's rate is then what the engine itself can move, and
``ceiling.analyse`` says where its time goes.

The input shards are made in memory from a pool of sentences (a shard's pairs are distinct;
making them is timed apart, as reading files would be).
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray.bench.ceiling import PhaseTimes, analyse, devices_fed, steady_rate
from augsbert_ray.bench.records import PartResult

NULL_LABEL = -1.0  # outside any cross-encoder's [0, 1]: a shard labelled by a real model shows


class NullScorer:
    """A labelling actor that does no model work: every pair gets ``NULL_LABEL``.

    It takes no model; token columns made by a tokenising stage ahead of it are dropped, as
    ``PairScorer`` drops them.
    """

    def __init__(self, **_):
        pass

    def __call__(self, batch: pa.Table) -> pa.Table:
        from augsbert_ray import schema
        from augsbert_ray.labeling import codec

        batch = batch.drop_columns([c for c in (codec.IDS, codec.TYPES) if c in batch.column_names])
        return batch.append_column(schema.LABEL, pa.array(np.full(batch.num_rows, NULL_LABEL, np.float32)))


class TimedStore:
    """A ``labeling.ShardStore`` that times its commits and checks they carry ``NULL_LABEL``."""

    def __init__(self, root):
        from augsbert_ray.labeling import ShardStore

        self._store = ShardStore(root)
        self.root = self._store.root
        self.commit_s = 0.0
        self.commit_times: list[float] = []
        self.sizes: list[int] = []

    def done(self, i: int, digest: str) -> bool:
        return self._store.done(i, digest)

    def read(self, i: int) -> pa.Table:
        return self._store.read(i)

    def commit(self, i: int, table: pa.Table, digest: str) -> None:
        from augsbert_ray import schema

        if not self.sizes:
            labels = table.column(schema.LABEL).to_numpy()
            if not np.all(labels == NULL_LABEL):
                raise RuntimeError("the actor pool scored with a model, not the null scorer: the labelling pipeline "
                                   "no longer builds its actors from the scorer it is given (see bench.control_plane)")
        t0 = time.perf_counter()
        self._store.commit(i, table, digest)
        t1 = time.perf_counter()
        self.commit_s += t1 - t0
        self.commit_times.append(t1)
        self.sizes.append(table.num_rows)


class PhaseClock:
    """The ``progress`` the pipeline reports to: marks when every shard is queued (the pipeline
    sets its total then), and prints a line every ``every`` seconds."""

    def __init__(self, log, every: float = 10.0):
        import psutil

        self.me = psutil.Process()
        self.log, self.every = log, every
        self.queued_at: float | None = None
        self.cpu_at_queued = 0.0
        self.total = self.done = 0
        self._last = time.perf_counter()

    def cpu(self) -> float:
        t = self.me.cpu_times()
        return t.user + t.system

    def set_total(self, total: int, unit: str = "pairs") -> None:
        self.queued_at, self.cpu_at_queued, self.total = time.perf_counter(), self.cpu(), total
        self.log(f"[bench] control plane: {total:,} pairs queued; labelling")

    def update(self, n: int) -> None:
        self.done += n

    def advance(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self._last >= self.every:
            self._last = now
            self.log(f"[bench] control plane: {self.done:,}/{self.total:,} pairs")


def shards(pool: list[str], pairs: int, size: int, timer: list[float]):
    """``pairs`` candidate pairs in shards of ``size``, made from ``pool`` (the time spent making
    them is added to ``timer[0]``). Pair ``j`` joins sentence ``j`` and ``j + 1`` of the pool,
    cycled, with the pair's number appended, so no two pairs are alike."""
    from augsbert_ray import schema

    texts = pa.array(pool, pa.string())
    m = len(pool)
    for start in range(0, pairs, size):
        t0 = time.perf_counter()
        j = np.arange(start, min(start + size, pairs), dtype=np.int64)
        number = pc.cast(pa.array(j), pa.string())
        s1 = pc.binary_join_element_wise(texts.take(pa.array(j % m)), number, " ")
        s2 = pc.binary_join_element_wise(texts.take(pa.array((j + 1) % m)), number, " ")
        table = pa.table({schema.ID1: j, schema.ID2: j + pairs, schema.SENTENCE1: s1, schema.SENTENCE2: s2,
                          schema.ORIGIN: pa.array(["bench"] * len(j), pa.string()),
                          schema.RETRIEVAL_SCORE: pa.array(np.zeros(len(j), np.float32))},
                         schema=schema.CANDIDATE_SCHEMA)
        timer[0] += time.perf_counter() - t0
        yield table


def measure(pool: list[str], pairs: int, block_size: int, actors: int, cluster_cpus: float, log) -> PhaseTimes:
    """One null-scorer labelling run of ``pairs`` pairs in shards of ``block_size``."""
    from augsbert_ray.bench.memory import MemorySampler
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import LabelingReport, ScorerSpec, actor_cpus, label_shards
    from augsbert_ray.progress.messages import lines_to

    cfg = LabelingConfig(actors=actors, block_size=block_size, tokenize_stage="actor")
    clock, report, made = PhaseClock(log), LabelingReport(), [0.0]
    with tempfile.TemporaryDirectory(prefix="bench-control-plane-") as tmp, \
            MemorySampler(interval=0.5, descendants=False) as mem, lines_to(log):
        store = TimedStore(tmp)
        rss0, cpu0, t0 = clock.me.memory_info().rss, clock.cpu(), time.perf_counter()
        label_shards(shards(pool, pairs, block_size, made), "embedded", cfg, 128,
                     actor_cpus(cfg, cluster_cpus, actors), store, report=report, actors=actors,
                     progress=clock, scorer=ScorerSpec(NullScorer), spool=os.path.join(tmp, "_spool"))
        wall, cpu1 = time.perf_counter() - t0, clock.cpu()
    queued = (clock.queued_at or t0) - t0
    return PhaseTimes(pairs=pairs, shards=report.shards, wall=wall, input=made[0], queued=queued,
                      first_shard=report.first_shard_seconds or 0.0, commit=store.commit_s,
                      driver_cpu_queued=clock.cpu_at_queued - cpu0, driver_cpu_pool=cpu1 - clock.cpu_at_queued,
                      peak_rss=mem.peak_rss, steady_pairs_per_s=steady_rate(store.commit_times, store.sizes),
                      rss_before=rss0, peak_private=mem.peak_private, peak_shared=mem.peak_shared)


def run(result: PartResult, pool: list[str], plan, cluster, per_device: tuple[str, float | None], log) -> None:
    """Fills ``result`` with the ceiling, its phases and how many labelling devices it feeds.

    Args:
        per_device: (what a device is, e.g. "GPU actor", and its steady pairs/s from the
            labelling part of this run, or None).
    """
    actors = plan.null_actors if plan.null_actors else max(1, int(cluster.gpus) or 1)
    log(f"[bench] control plane: {plan.null_pairs:,} pairs in shards of {plan.null_block:,} "
        f"({-(-plan.null_pairs // plan.null_block):,} shards), {actors} null actor(s)")
    t = measure(pool, plan.null_pairs, plan.null_block, actors, cluster.cpus, log)
    c = analyse(t)
    result.add("engine: null scorer, end to end (the pool's start included)", c.end_to_end_pairs_per_s, "pairs/s",
               note=f"{t.pairs:,} pairs, {t.shards:,} shards, {actors} actor(s), {t.wall:.1f} s")
    result.add("engine: null scorer, once every shard is queued", t.pairs / t.pool if t.pool else None, "pairs/s")
    result.add("engine: null scorer, steady: the ceiling", t.steady_pairs_per_s, "pairs/s",
               note="first shard committed to last")
    result.add("driver's peak memory (RSS)", c.peak_rss_mib, "MiB", side="info",
               note="psutil, every 0.5 s; this process's imports and earlier parts included")
    result.add("driver's memory growth during the run (peak RSS less RSS before)", c.rss_growth_mib, "MiB",
               side="info")
    result.add("driver's peak private memory (its own heap)", t.peak_private / 2**20, "MiB", side="info")
    result.add("driver's peak shared memory (the object store's pages it maps)", t.peak_shared / 2**20, "MiB",
               side="info", note="bounded by the store's size")
    for phase, secs in c.phases.items():
        result.add(f"time: {phase}", secs, "s", side="info")
    result.add("driver CPU while queueing", c.driver_busy_queued, "CPU-s/s", side="info")
    result.add("driver CPU while the pool ran", c.driver_busy_pool, "CPU-s/s", side="info")
    what, rate = per_device
    fed = devices_fed(c.pairs_per_s, rate)  # both steady rates: the pool's start is paid once
    result.notes.append(f"Limited by: {c.limit}.")
    if fed is not None:
        result.add(f"{what}s one driver can feed (ceiling / one {what}'s steady rate)", fed, what + "s", side="info",
                   note=f"one {what}: {rate:,.0f} pairs/s steady in the labelling part")
    else:
        result.notes.append("No labelling device rate from this run to divide by: one driver feeds as many devices as "
                            "the ceiling above divided by one device's steady pairs/s.")
    result.data.update({"phases": t.__dict__, "ceiling": c.to_dict(), "devices_fed": fed})
