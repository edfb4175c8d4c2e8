"""The labelling control plane with shards committed by the actors, beside plain Ray Data and
beside the driver committing every shard, in one run.

Three ways move the same candidate pairs through one null actor (``bench.control_plane.NullScorer``:
no model work), in shards of ``--block`` pairs:

- ``engine``: ``labeling.label_file`` (the silver stage's path): shard bounds from the file's
  footer, Ray Data tasks read the shards, each actor checks and commits its shards (Parquet and
  manifest) and the driver receives one small record per shard;
- ``driver commits``: the same file through the driver-side path the engine keeps for Ray Client
  and the warm hosts (``labeling.driver._label`` with the file as the pool's source): the driver
  cuts and fingerprints every shard, and every labelled shard comes back to it to be checked,
  written and hashed (what the silver stage ran before actors committed their shards);
- ``plain Ray Data``: ``read_parquet`` (one file per shard) -> ``map_batches`` through the same
  null actor -> ``write_parquet``: what a user would write without exactly-once.

For each it reports pairs/s end to end (the pool's start included, the input's writing not) and
the driver process's CPU per shard (per block for plain Ray Data), and for the engine the
driver's memory growth (peak RSS less RSS before) at each size and the GPUs one driver feeds at
100,000 and 250,000 pairs/s per GPU, from its CPU per shard. One process, one local Ray, the
ways run one after the other for each size.

    python benchmarks/control_plane_commit.py --sizes 1000000,10000000 \
        --out benchmarks/results/control_plane_commit_on_actor
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WAYS = ("engine", "driver commits", "plain Ray Data")


def driver_commits(path: str, pairs: int, block: int, actors: int, cpus: float, log) -> dict:
    """The driver-side path over the same file: shards cut, fingerprinted, checked and committed
    by the driver."""
    import psutil

    from augsbert_ray.bench.control_plane import NULL_LABEL, NullScorer
    from augsbert_ray.bench.memory import MemorySampler
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import LabelingReport, ScorerSpec, ShardStore, actor_cpus, driver
    from augsbert_ray.labeling.shards import file_shards
    from augsbert_ray.progress.messages import lines_to

    cfg = LabelingConfig(actors=actors, block_size=block, tokenize_stage="actor", executor="pool")
    me, report = psutil.Process(), LabelingReport()
    with tempfile.TemporaryDirectory(prefix="bench-driver-commits-") as tmp:
        store = ShardStore(os.path.join(tmp, "shards"))
        with MemorySampler(interval=0.5, descendants=False) as mem, lines_to(log):
            rss0, t = me.memory_info().rss, me.cpu_times()
            cpu0, t0 = t.user + t.system, time.perf_counter()
            driver._label(file_shards(path, block), None, "embedded", cfg, 128, actor_cpus(cfg, cpus, actors), store,
                          None, report, actors, scorer=ScorerSpec(NullScorer),
                          source=driver.file_source(path, cfg))
            wall, t = time.perf_counter() - t0, me.cpu_times()
        first = store.read(0).column("label").to_numpy()
        if len(first) != min(block, pairs) or (first != NULL_LABEL).any() or report.labelled != -(-pairs // block):
            raise RuntimeError("the driver-side path did not commit every shard with the null scorer's labels")
    return {"wall": wall, "driver_cpu": t.user + t.system - cpu0, "shards": report.shards,
            "rss_growth_mib": max(0, mem.peak_rss - rss0) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="pair counts, comma-separated")
    parser.add_argument("--block", type=int, default=8192, help="pairs per shard (per block for plain Ray Data)")
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=2, help="the local Ray's CPUs")
    parser.add_argument("--work", default=None, help="a folder for the inputs (default: a temporary one)")
    parser.add_argument("--per-task", default=None,
                        help="most shards a reading task takes, comma-separated: the engine runs once per value "
                             "(default: the engine's own, labeling.pool.MAX_SHARDS_PER_TASK)")
    parser.add_argument("--tasks-per-actor", type=int, default=None,
                        help="fewest tasks per actor before shards are grouped (default: the engine's own, "
                             "labeling.pool.TASKS_PER_ACTOR)")
    parser.add_argument("--waiting-shards", type=int, default=60,
                        help="shards of a run whose null actor waits --waiting-delay s per shard: the driver's "
                             "CPU while it waits (0: no such run)")
    parser.add_argument("--waiting-delay", type=float, default=0.5)
    parser.add_argument("--ways", default=",".join(WAYS), help=f"which ways, comma-separated, of: {', '.join(WAYS)}")
    parser.add_argument("--out", default="benchmarks/results/control_plane_commit_on_actor")
    args = parser.parse_args()

    import ray

    from augsbert_ray.bench import control_plane as cp
    from augsbert_ray.bench.data import synthetic_sentences
    from augsbert_ray.bench.hardware import load_average
    from augsbert_ray.labeling import pool as labeling_pool
    from augsbert_ray.runtime import local_ray_options
    from provenance import provenance, write_result

    log = lambda line: print(line, flush=True)  # noqa: E731
    ways = [w.strip() for w in args.ways.split(",")]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        parser.error(f"unknown way(s) {', '.join(unknown)}; valid: {', '.join(WAYS)}")
    if args.tasks_per_actor is not None:
        labeling_pool.TASKS_PER_ACTOR = args.tasks_per_actor
    per_task = ([int(n) for n in args.per_task.split(",")] if args.per_task
                else [labeling_pool.MAX_SHARDS_PER_TASK])
    engines = ["engine"] if not args.per_task else [f"engine, up to {n} a task" for n in per_task]
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    ray.init(address="local", **local_ray_options(args.cpus), include_dashboard=False, log_to_driver=False)
    pool = synthetic_sentences(20_000)
    data = {"block": args.block, "actors": args.actors, "tasks_per_actor": labeling_pool.TASKS_PER_ACTOR,
            "per_task": per_task, "runs": []}
    load = [load_average()]
    sizes = [int(s) for s in args.sizes.split(",")]
    try:
        for pairs in [10 * args.block] + sizes:  # the first: a warm-up (imports, Ray Data's start), not reported
            warm_up = not data["runs"] and pairs == 10 * args.block and not load[1:]
            results = {}
            with tempfile.TemporaryDirectory(prefix="control-plane-commit-", dir=args.work) as tmp:
                path, parts, made = cp.write_inputs(pool, pairs, args.block, tmp, peer="plain Ray Data" in ways)
                log(f"{pairs:,} pairs written in {made:.1f} s")
                if "engine" in ways:
                    for name, n in zip(engines, per_task):
                        labeling_pool.MAX_SHARDS_PER_TASK = n
                        t = cp.measure(pool, pairs, args.block, args.actors, args.cpus, log,
                                       inputs=(path, parts, made))
                        results[name] = {"wall": t.wall - t.input, "driver_cpu": t.driver_cpu_queued + t.driver_cpu_pool,
                                         "shards": t.shards, "rss_growth_mib": max(0, t.peak_rss - t.rss_before) / 2**20,
                                         "peak_private_mib": t.peak_private / 2**20,
                                         "steady_pairs_per_s": t.steady_pairs_per_s, "max_shards_per_task": n,
                                         "steady_driver_cpu_rate": t.steady_driver_cpu_rate,
                                         "steady_shards_per_s": t.steady_shards_per_s}
                if "plain Ray Data" in ways:
                    peer = cp.measure_peer(parts, pairs, args.block, args.actors, log)
                    results["plain Ray Data"] = {"wall": peer.wall, "driver_cpu": peer.driver_cpu,
                                                 "shards": peer.blocks,
                                                 "rss_growth_mib": max(0, peer.peak_rss - peer.rss_before) / 2**20}
                if "driver commits" in ways:
                    results["driver commits"] = driver_commits(path, pairs, args.block, args.actors, args.cpus, log)
            load.append(load_average())
            if warm_up:
                continue
            for way, r in results.items():
                r.update(way=way, pairs=pairs, pairs_per_s=pairs / r["wall"],
                         driver_ms_per_shard=1000 * r["driver_cpu"] / r["shards"])
                data["runs"].append(r)
                log(f"{pairs:>11,} {way:<24} {r['pairs_per_s']:>10,.0f} pairs/s  {r['driver_ms_per_shard']:6.2f} ms "
                    f"driver CPU per shard  growth {r['rss_growth_mib']:.0f} MiB")
        if args.waiting_shards and "engine" in ways:  # the driver while shards come slowly
            labeling_pool.MAX_SHARDS_PER_TASK = per_task[-1]
            with tempfile.TemporaryDirectory(prefix="control-plane-commit-", dir=args.work) as tmp:
                pairs = args.waiting_shards * args.block
                t = cp.measure(pool, pairs, args.block, args.actors, args.cpus, log,
                               inputs=cp.write_inputs(pool, pairs, args.block, tmp, peer=False),
                               delay_s=args.waiting_delay)
            data["waiting"] = {"shards": t.shards, "delay_s": args.waiting_delay,
                               "steady_driver_cpu_rate": t.steady_driver_cpu_rate,
                               "steady_shards_per_s": t.steady_shards_per_s}
            load.append(load_average())
    finally:
        ray.shutdown()
    data["load_average"] = load
    grouping = (f"a reading task takes up to {', '.join(map(str, per_task))} consecutive shards where every actor "
                f"has {labeling_pool.TASKS_PER_ACTOR} x that many pending")
    lines = ["# The control plane with shards committed by the actors, beside plain Ray Data and the driver "
             "committing", "",
             f"Null actor(s): {args.actors}; shards (blocks) of {args.block:,} pairs; {grouping}; one local Ray of "
             f"{args.cpus} CPUs; every way run one after the other in one process, for each size. End to end: the "
             "labelling call (or the plain pipeline) from start to last shard written, the pool's start included, the "
             "input's writing not. Driver CPU: the driver process's user + system CPU over that call, per shard "
             "(plain Ray Data: per block, one block per input file of one shard).", "",
             "| pairs | way | shards | end to end, pairs/s | vs plain | driver CPU per shard, ms | vs plain | "
             "driver memory growth, MiB |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for pairs in sorted({r["pairs"] for r in data["runs"]}):
        runs = {r["way"]: r for r in data["runs"] if r["pairs"] == pairs}
        ref = runs.get("plain Ray Data")
        for way, r in runs.items():
            vs = (f"{r['pairs_per_s'] / ref['pairs_per_s']:.2f}x", f"{r['driver_ms_per_shard'] / ref['driver_ms_per_shard']:.2f}x") \
                if ref else ("-", "-")
            lines.append(f"| {pairs:,} | {way} | {r['shards']:,} | {r['pairs_per_s']:,.0f} | {vs[0]} | "
                         f"{r['driver_ms_per_shard']:.2f} | {vs[1]} | {r['rss_growth_mib']:.0f} |")
    largest = max(r["pairs"] for r in data["runs"])
    for engine in [r for r in data["runs"] if r["pairs"] == largest and r["way"].startswith("engine")]:
        fed = {rate: cp.gpus_fed(engine["driver_ms_per_shard"], args.block, rate) for rate in cp.GPU_RATES}
        engine["gpus_fed"] = {str(k): v for k, v in fed.items()}
        lines += ["", f"GPUs one driver feeds ({engine['way']}), from its CPU per shard at {largest:,} pairs "
                      f"({engine['driver_ms_per_shard']:.2f} ms per {args.block:,} pairs, i.e. "
                      f"{args.block / engine['driver_ms_per_shard'] * 1000:,.0f} pairs/s per driver core): "
                  + ", ".join(f"{v:,.0f} at {k:,} pairs/s per GPU" for k, v in fed.items()) + "."]
    waiting = data.get("waiting")
    if waiting and waiting["steady_driver_cpu_rate"] is not None:
        lines += ["", f"The driver while shards come slowly ({waiting['shards']} shards, the null actor waiting "
                      f"{waiting['delay_s']:g} s a shard): {waiting['steady_driver_cpu_rate'] * 100:.1f}% of a core at "
                      f"{waiting['steady_shards_per_s']:.2f} shards/s, steady. Its CPU is a part per second (Ray "
                      "Data's polling while it waits) and a part per shard; from the two steady rates, for each "
                      "engine run at the largest size:", "",
                      "| way | steady shards/s | driver CPU, % of a core | per shard, ms | waiting, % of a core | "
                      "shards/s one core sustains | GPUs at 100,000 pairs/s | GPUs at 250,000 pairs/s |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for engine in [r for r in data["runs"] if r["pairs"] == largest and r["way"].startswith("engine")]:
            fit = cp.driver_capacity(engine["steady_driver_cpu_rate"], engine["steady_shards_per_s"],
                                     waiting["steady_driver_cpu_rate"], waiting["steady_shards_per_s"])
            if fit is None:
                continue
            engine["capacity"] = fit
            fed = [fit["shards_per_s"] * args.block / rate for rate in cp.GPU_RATES]
            lines.append(f"| {engine['way']} | {engine['steady_shards_per_s']:.1f} | "
                         f"{engine['steady_driver_cpu_rate'] * 100:.1f} | {fit['ms_per_shard']:.3f} | "
                         f"{fit['waiting_rate'] * 100:.1f} | {fit['shards_per_s']:,.0f} | {fed[0]:,.0f} | {fed[1]:,.0f} |")
    lines += ["", "Load average (1, 5, 15 min) before the warm-up and after it and each size: "
              + "; ".join(", ".join(f"{x:.2f}" for x in xs) for xs in load) + ".", ""]
    lines += provenance("benchmarks/control_plane_commit.py", None)
    write_result(args.out, lines, data)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
