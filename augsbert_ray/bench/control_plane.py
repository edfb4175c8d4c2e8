"""The control-plane ceiling: the labelling pipeline with a scorer that does no model work,
beside plain Ray Data moving the same pairs.

The engine's side is ``labeling.label_file`` (the silver stage's path): a candidates file whose
shards' bounds come from its footer, read by Ray Data tasks, handed to an actor pool whose actors
check each shard against its input and commit it (Parquet and manifest) to the store themselves,
the driver receiving one small record per shard. Only the actors' scorer is another,
``NullScorer`` (passed as the pipeline's ``scorer``), which returns a constant label without
tokenising or running a model; the run's rate is then what the engine itself can move, and
``ceiling.analyse`` says where its time goes.

The peer is what a user would write without exactly-once: ``read_parquet`` over the same pairs,
one file per shard -> ``map_batches`` through the same null actor (the same shard size and actor
count) -> ``write_parquet``. Beside the rates, each side's driver CPU per shard (per block for the
peer) says how many GPUs one driver can feed.

The input pairs are made from a pool of sentences (a shard's pairs are distinct) and written
before either side starts (timed apart, as the candidates stage writes them).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray.bench.ceiling import PhaseTimes, analyse, devices_fed, steady_driver, steady_rate
from augsbert_ray.bench.records import PartResult

NULL_LABEL = -1.0  # outside any cross-encoder's [0, 1]: a shard labelled by a real model shows


class NullScorer:
    """A labelling actor that does no model work: every pair gets ``NULL_LABEL``.

    It takes no model; token columns made by a tokenising stage ahead of it are dropped, as
    ``PairScorer`` drops them.
    """

    def __init__(self, delay_s: float = 0.0, **_):
        self.delay_s = delay_s  # seconds per batch: a slow labeller, to see the driver while it waits

    def __call__(self, batch: pa.Table) -> pa.Table:
        from augsbert_ray import schema
        from augsbert_ray.labeling import codec

        if self.delay_s:
            time.sleep(self.delay_s)

        batch = batch.drop_columns([c for c in (codec.IDS, codec.TYPES) if c in batch.column_names])
        return batch.append_column(schema.LABEL, pa.array(np.full(batch.num_rows, NULL_LABEL, np.float32)))


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
        self.times: list[float] = []  # when each shard was committed
        self.sizes: list[int] = []
        self.cpus: list[float] = []  # the driver's CPU seconds then

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
        self.times.append(now)
        self.sizes.append(n)
        self.cpus.append(self.cpu())
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


def write_inputs(pool: list[str], pairs: int, size: int, folder, peer: bool = True) -> tuple[str, str, float]:
    """The pairs as the engine reads them (one Parquet file, a row group per shard) and, with
    ``peer``, as the peer does (a folder of one Parquet file per shard: a Ray Data block each).

    Returns:
        The file, the folder, and the seconds spent making the pairs and writing both.
    """
    import pyarrow.parquet as pq

    from augsbert_ray import schema

    path, parts = os.path.join(folder, "candidates.parquet"), os.path.join(folder, "peer-input")
    os.makedirs(parts, exist_ok=True)
    t0 = time.perf_counter()
    with pq.ParquetWriter(path, schema.CANDIDATE_SCHEMA) as writer:
        for i, table in enumerate(shards(pool, pairs, size, [0.0])):
            writer.write_table(table, row_group_size=size)
            if peer:
                pq.write_table(table, os.path.join(parts, f"part-{i:06d}.parquet"))
    return path, parts, time.perf_counter() - t0


def measure(pool: list[str], pairs: int, block_size: int, actors: int, cluster_cpus: float, log,
            inputs: tuple[str, str, float] | None = None, delay_s: float = 0.0) -> PhaseTimes:
    """One null-scorer labelling run of ``pairs`` pairs in shards of ``block_size``, through the
    engine (``labeling.label_file``). ``inputs``: what ``write_inputs`` made (None: made here);
    ``delay_s``: seconds the null scorer waits per shard."""
    from augsbert_ray.bench.memory import MemorySampler
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import LabelingReport, ScorerSpec, ShardStore, actor_cpus
    from augsbert_ray.labeling.driver import label_file
    from augsbert_ray.progress.messages import lines_to

    cfg = LabelingConfig(actors=actors, block_size=block_size, tokenize_stage="actor", executor="pool")
    clock, report = PhaseClock(log), LabelingReport()
    with tempfile.TemporaryDirectory(prefix="bench-control-plane-") as tmp:
        path, _, made = inputs if inputs is not None else write_inputs(pool, pairs, block_size, tmp)
        store = ShardStore(os.path.join(tmp, "shards"))
        with MemorySampler(interval=0.5, descendants=False) as mem, lines_to(log):
            rss0, cpu0, t0 = clock.me.memory_info().rss, clock.cpu(), time.perf_counter()
            label_file(path, store, "embedded", cfg, 128, actor_cpus(cfg, cluster_cpus, actors), report=report,
                       actors=actors, progress=clock, scorer=ScorerSpec(NullScorer, {"delay_s": delay_s}))
            wall, cpu1 = time.perf_counter() - t0, clock.cpu()
        _check_null_labels(store)
    queued = (clock.queued_at or t0) - t0
    return PhaseTimes(pairs=pairs, shards=report.shards, wall=wall + made, input=made, queued=queued + made,
                      first_shard=report.first_shard_seconds or 0.0, commit=0.0,
                      driver_cpu_queued=clock.cpu_at_queued - cpu0, driver_cpu_pool=cpu1 - clock.cpu_at_queued,
                      peak_rss=mem.peak_rss, steady_pairs_per_s=steady_rate(clock.times, clock.sizes),
                      rss_before=rss0, peak_private=mem.peak_private, peak_shared=mem.peak_shared,
                      **dict(zip(("steady_driver_cpu_rate", "steady_shards_per_s"),
                                 steady_driver(clock.times, clock.cpus))))


def _check_null_labels(store) -> None:
    """Every shard is committed, with ``NULL_LABEL``s (a real model's would show) and by an actor."""
    import json

    from augsbert_ray import schema

    first = store.read(0).column(schema.LABEL).to_numpy()
    if not np.all(first == NULL_LABEL):
        raise RuntimeError("the actor pool scored with a model, not the null scorer: the labelling pipeline "
                           "no longer builds its actors from the scorer it is given (see bench.control_plane)")
    if not json.loads(store.manifest(0).read_text()).get("writer"):
        raise RuntimeError("shard 0's manifest names no writer: it was not committed by a labelling actor")


@dataclass(frozen=True)
class PeerTimes:
    """Plain Ray Data moving the same pairs: seconds, the driver's CPU seconds, blocks, bytes."""

    pairs: int
    blocks: int
    wall: float
    driver_cpu: float
    peak_rss: int
    rss_before: int


def measure_peer(parts: str, pairs: int, block_size: int, actors: int, log) -> PeerTimes:
    """``read_parquet`` (one file per shard) -> ``map_batches(NullScorer)`` on ``actors`` actors of
    one CPU with batches of ``block_size`` -> ``write_parquet``; checks every pair was written."""
    import psutil
    import pyarrow.parquet as pq
    import ray
    from ray.data import ActorPoolStrategy

    from augsbert_ray.bench.memory import MemorySampler

    me = psutil.Process()
    blocks = len(os.listdir(parts))
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as out, \
            MemorySampler(interval=0.5, descendants=False) as mem:
        rss0, t = me.memory_info().rss, me.cpu_times()
        cpu0, t0 = t.user + t.system, time.perf_counter()
        ray.data.read_parquet(parts).map_batches(
            NullScorer, batch_size=block_size, batch_format="pyarrow", compute=ActorPoolStrategy(size=actors),
            num_cpus=1).write_parquet(out)  # a CPU each: Ray Data's reading and writing tasks need the others
        wall, t = time.perf_counter() - t0, me.cpu_times()
        written = sum(pq.ParquetFile(os.path.join(out, f)).metadata.num_rows for f in os.listdir(out))
    if written != pairs:
        raise RuntimeError(f"plain Ray Data wrote {written} of {pairs} pairs")
    log(f"[bench] control plane: plain Ray Data moved {pairs:,} pairs in {wall:.1f} s")
    return PeerTimes(pairs=pairs, blocks=blocks, wall=wall, driver_cpu=t.user + t.system - cpu0,
                     peak_rss=mem.peak_rss, rss_before=rss0)


def driver_ms_per_shard(t: PhaseTimes) -> float:
    """The engine driver's CPU per shard over the labelling call (the input's making aside)."""
    return 1000 * (t.driver_cpu_queued + t.driver_cpu_pool) / max(1, t.shards)


def gpus_fed(ms_per_shard: float, block_size: int, per_gpu: float) -> float:
    """GPUs one driver keeps busy if its CPU per shard is all that limits it: the pairs/s one
    core of driver sustains (``block_size`` pairs per ``ms_per_shard``) over one GPU's rate."""
    return block_size / (ms_per_shard / 1000) / per_gpu if ms_per_shard > 0 else float("inf")


def driver_capacity(fast_rate: float | None, fast_shards_per_s: float | None, slow_rate: float | None,
                    slow_shards_per_s: float | None) -> dict | None:
    """The driver's CPU as ``waiting_rate + ms_per_shard * shards/s``, from two steady runs (CPU
    seconds per second and shards per second each), and the shards/s at which it fills one core:
    what limits one driver once the shards come faster than this machine's actors make them.
    None where the two runs do not tell the parts apart."""
    if None in (fast_rate, fast_shards_per_s, slow_rate, slow_shards_per_s) or fast_shards_per_s <= slow_shards_per_s:
        return None
    per_shard = (fast_rate - slow_rate) / (fast_shards_per_s - slow_shards_per_s)
    waiting = slow_rate - per_shard * slow_shards_per_s
    if per_shard <= 0 or waiting >= 1:
        return None
    return {"ms_per_shard": per_shard * 1000, "waiting_rate": max(0.0, waiting),
            "shards_per_s": (1 - max(0.0, waiting)) / per_shard}


GPU_RATES = (100_000, 250_000)  # pairs/s per GPU: an H100/H200 today, and the goal
# The run that shows the driver while it waits for shards (driver_capacity's slow run).
WAITING_SHARDS, WAITING_DELAY_S = 30, 0.3


def run(result: PartResult, pool: list[str], plan, cluster, per_device: tuple[str, float | None], log) -> None:
    """Fills ``result`` with the engine's ceiling beside plain Ray Data's, its phases, and how many
    labelling devices one driver feeds.

    Args:
        per_device: (what a device is, e.g. "GPU actor", and its steady pairs/s from the
            labelling part of this run, or None).
    """
    actors = plan.null_actors if plan.null_actors else max(1, int(cluster.gpus) or 1)
    block = plan.null_block
    log(f"[bench] control plane: {plan.null_pairs:,} pairs in shards of {block:,} "
        f"({-(-plan.null_pairs // block):,} shards), {actors} null actor(s); engine, then plain Ray Data")
    with tempfile.TemporaryDirectory(prefix="bench-control-plane-input-") as tmp:
        inputs = write_inputs(pool, plan.null_pairs, block, tmp)
        t = measure(pool, plan.null_pairs, block, actors, cluster.cpus, log, inputs=inputs)
        peer = measure_peer(inputs[1], plan.null_pairs, block, actors, log)
    log(f"[bench] control plane: {WAITING_SHARDS} shards through a null actor waiting {WAITING_DELAY_S:g} s a shard "
        "(the driver while it waits)")
    with tempfile.TemporaryDirectory(prefix="bench-control-plane-input-") as tmp:
        pairs = WAITING_SHARDS * block
        waiting = measure(pool, pairs, block, actors, cluster.cpus, log,
                          inputs=write_inputs(pool, pairs, block, tmp, peer=False), delay_s=WAITING_DELAY_S)
    c = analyse(t)
    engine_wall = t.wall - t.input
    peer_name = "plain Ray Data: read_parquet -> map_batches (null actor) -> write_parquet, end to end"
    result.add(peer_name, t.pairs / peer.wall, "pairs/s", side="peer",
               note=f"{peer.blocks:,} blocks of {block:,}, {actors} actor(s), {peer.wall:.1f} s, no exactly-once")
    result.add("engine: null scorer, end to end (the pool's start included)", t.pairs / engine_wall, "pairs/s",
               vs=peer_name, note=f"{t.pairs:,} pairs, {t.shards:,} shards, {actors} actor(s), {engine_wall:.1f} s; "
                                  "shards committed by the actors")
    result.add("engine: null scorer, once every shard is queued", t.pairs / t.pool if t.pool else None, "pairs/s")
    result.add("engine: null scorer, steady: the ceiling", t.steady_pairs_per_s, "pairs/s",
               note="first shard committed to last")
    peer_cpu = "plain Ray Data: driver CPU per block"
    engine_ms, peer_ms = driver_ms_per_shard(t), 1000 * peer.driver_cpu / max(1, peer.blocks)
    result.add(peer_cpu, peer_ms, "ms", side="peer", note=f"{peer.driver_cpu:.1f} CPU-s for {peer.blocks:,} blocks")
    result.add("engine: driver CPU per shard", engine_ms, "ms", vs=peer_cpu,
               note=f"{t.driver_cpu_queued + t.driver_cpu_pool:.1f} CPU-s for {t.shards:,} shards")
    for rate in GPU_RATES:
        result.add(f"GPUs one driver feeds at {rate:,} pairs/s per GPU (its CPU per shard the limit)",
                   gpus_fed(engine_ms, block, rate), "GPUs", side="info",
                   note=f"{block:,} pairs per {engine_ms:.1f} ms of driver CPU")
    fit = driver_capacity(t.steady_driver_cpu_rate, t.steady_shards_per_s, waiting.steady_driver_cpu_rate,
                          waiting.steady_shards_per_s)
    if fit is not None:
        result.add("engine: driver CPU per shard, steady, less its CPU while waiting", fit["ms_per_shard"], "ms",
                   side="info", note=f"while waiting: {fit['waiting_rate'] * 100:.1f}% of a core (Ray Data's polling)")
        for rate in GPU_RATES:
            result.add(f"GPUs one driver feeds at {rate:,} pairs/s per GPU (steady: one core's shards/s)",
                       fit["shards_per_s"] * block / rate, "GPUs", side="info",
                       note=f"{fit['shards_per_s']:,.0f} shards/s fill one driver core")
    else:
        result.notes.append("The steady driver CPU per shard could not be told apart from its CPU while waiting "
                            "(too few shards, or the waiting run as fast as the null run).")
    result.add("driver's peak memory (RSS)", c.peak_rss_mib, "MiB", side="info",
               note="psutil, every 0.5 s; this process's imports and earlier parts included")
    result.add("driver's memory growth during the run (peak RSS less RSS before)", c.rss_growth_mib, "MiB",
               side="info")
    result.add("driver's peak private memory (its own heap)", t.peak_private / 2**20, "MiB", side="info")
    result.add("driver's peak shared memory (the object store's pages it maps)", t.peak_shared / 2**20, "MiB",
               side="info", note="bounded by the store's size")
    result.add("plain Ray Data: driver's memory growth (peak RSS less RSS before)",
               max(0, peer.peak_rss - peer.rss_before) / 2**20, "MiB", side="info")
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
    result.data.update({"phases": t.__dict__, "ceiling": c.to_dict(), "devices_fed": fed, "peer": peer.__dict__,
                        "driver_ms_per_shard": engine_ms, "peer_driver_ms_per_block": peer_ms,
                        "gpus_fed": {str(r): gpus_fed(engine_ms, block, r) for r in GPU_RATES},
                        "waiting": waiting.__dict__, "steady_capacity": fit})
