"""A committing labelling actor that checks and commits a shard beside the next one's labelling,
against the same actor doing one after the other, in one run.

A null labeller that holds each shard ``--labeller-ms`` (a GPU's time per shard: 33 ms is 8,192
pairs at about 250,000 pairs/s), with its lock, as a model would, through the engine's path
(``labeling.label_file``, each actor checking and committing its own shards): with
``labeling.commit.COMMITTING_CALLS`` 1 the actor commits between shards and the labeller waits;
with 2 (the engine's) one call labels while the other commits. Reported: pairs/s end to end
(the pool's start included) and that rate as a share of the labeller's own ceiling.

    python benchmarks/commit_overlap.py --shards 240 --labeller-ms 33 --out benchmarks/results/commit_overlap
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=240)
    parser.add_argument("--block", type=int, default=8192, help="pairs per shard")
    parser.add_argument("--labeller-ms", type=float, default=33.0, help="the null labeller's time per shard")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way, alternating")
    parser.add_argument("--cpus", type=int, default=2, help="the local Ray's CPUs")
    parser.add_argument("--work", default=None, help="a folder for the inputs (default: a temporary one)")
    parser.add_argument("--out", default="benchmarks/results/commit_overlap")
    args = parser.parse_args()

    import ray

    from augsbert_ray.bench import control_plane as cp
    from augsbert_ray.bench.data import synthetic_sentences
    from augsbert_ray.bench.hardware import load_average
    from augsbert_ray.labeling import commit
    from augsbert_ray.runtime import local_ray_options
    from provenance import provenance, write_result

    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    ray.init(address="local", **local_ray_options(args.cpus), include_dashboard=False, log_to_driver=False)
    pool = synthetic_sentences(20_000)
    delay, pairs = args.labeller_ms / 1000, args.shards * args.block
    runs, load = [], [load_average()]
    engine_calls = commit.COMMITTING_CALLS
    try:
        with tempfile.TemporaryDirectory(prefix="commit-overlap-", dir=args.work) as tmp:
            inputs = cp.write_inputs(pool, pairs, args.block, tmp, peer=False)
            for _ in range(args.repeats):
                for calls in (1, engine_calls):
                    commit.COMMITTING_CALLS = calls
                    t = cp.measure(pool, pairs, args.block, 1, args.cpus, lambda line: None, inputs=inputs,
                                   delay_s=delay)
                    runs.append({"calls": calls, "steady_pairs_per_s": t.steady_pairs_per_s,
                                 "end_to_end_pairs_per_s": t.pairs / (t.wall - t.input)})
                    print(f"calls {calls}: {runs[-1]['end_to_end_pairs_per_s']:,.0f} pairs/s end to end", flush=True)
                    load.append(load_average())
    finally:
        commit.COMMITTING_CALLS = engine_calls
        ray.shutdown()
    ceiling = args.block / delay
    lines = ["# A committing actor: commits beside the next shard's labelling, or between shards", "",
             f"One null labeller holding each {args.block:,}-pair shard {args.labeller_ms:g} ms under its lock "
             f"(at most {ceiling:,.0f} pairs/s); {args.shards} shards; each actor checks and commits its own "
             f"shards; one local Ray of {args.cpus} CPUs; the ways alternate, {args.repeats} runs each, in one "
             "process. End to end: the labelling call from start to last shard committed, the pool's start "
             "included. (Shards come back a reading task's worth at a time, so a rate between the first and "
             "the last commit says little here.)", "",
             "| calls at once | run | end to end pairs/s | of the labeller's ceiling | vs one call, same run |",
             "|---:|---:|---:|---:|---:|"]
    for k, r in enumerate(runs):
        one = runs[k - k % 2]["end_to_end_pairs_per_s"]
        lines.append(f"| {r['calls']} | {k // 2 + 1} | {r['end_to_end_pairs_per_s']:,.0f} | "
                     f"{r['end_to_end_pairs_per_s'] / ceiling * 100:.0f}% | {r['end_to_end_pairs_per_s'] / one:.2f}x |")
    lines += ["", "Load average (1, 5, 15 min) before and after each run: "
              + "; ".join(", ".join(f"{x:.2f}" for x in xs) for xs in load) + ".", ""]
    lines += provenance("benchmarks/commit_overlap.py", None)
    write_result(args.out, lines, {"block": args.block, "shards": args.shards, "labeller_ms": args.labeller_ms,
                                   "runs": runs, "load_average": load})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
