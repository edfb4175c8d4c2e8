"""The labelling driver's memory against the number of candidate pairs: shards put in the object
store by the driver, against shards read from the candidates file by the pool's own tasks.

The silver stage labels ``candidates.parquet`` through ``labeling.label_candidates_file``. Two
ways for the shards to reach the actor pool are measured side by side, each size and way in a
fresh process with its own local Ray:

- ``put``: the driver reads every shard and puts it in Ray's object store before the pool
  starts (the engine's only way before; still the way with Ray Client, whose driver is on no
  node of the cluster);
- ``tasks``: Ray Data tasks on the driver's node read the pending shards from the file as the
  actors are ready for them; the driver keeps each pending shard's pair ids only.

The actors' scorer is the bench's ``NullScorer`` (no model work), so a run takes seconds and
measures the pipeline, not a model. The candidates are written as the candidates stage writes
them (row groups of 65,536 rows), from STS benchmark sentences when ``--data-dir`` has them,
else synthetic ones, each pair made distinct (``bench.control_plane.shards``).

Memory is sampled four times a second (``bench.memory.MemorySampler``): the driver's RSS, and
PSS summed over the driver and every process it started (the object store counted once).

    python benchmarks/labeling_memory.py --work /tmp/labelling-memory
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MIB = 2 ** 20
WAYS = ("put", "tasks")


def write_candidates(path: Path, pairs: int, data_dir: str) -> None:
    """``pairs`` distinct candidate pairs, written in the candidates stage's row groups."""
    import pyarrow.parquet as pq

    from augsbert_ray import schema
    from augsbert_ray.bench.control_plane import shards
    from augsbert_ray.bench.data import has_stsb, synthetic_sentences, unique_sentences

    where = Path(data_dir)
    pool = unique_sentences(where) if has_stsb(where) else synthetic_sentences(20_000)
    tmp = path.with_name(f".{path.name}.tmp")
    with pq.ParquetWriter(tmp, schema.CANDIDATE_SCHEMA) as writer:
        for table in shards(pool, pairs, 65_536, [0.0]):
            writer.write_table(table)
    os.replace(tmp, path)


def one_run(args) -> dict:
    """One null-scorer labelling of ``args.candidates`` the ``args.way`` way, in this process."""
    import tempfile

    import psutil

    from augsbert_ray.bench.control_plane import NullScorer
    from augsbert_ray.bench.memory import MemorySampler, _rss_parts
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import LabelingReport, ScorerSpec, ShardStore, actor_cpus, driver, label_candidates_file
    from augsbert_ray.runtime import start_ray

    if args.way == "put":  # the path taken where the pool's tasks cannot reach the file
        driver.file_source = lambda path, cfg: None
    cluster = start_ray(None, args.cpus, verbose=False, log_dir=Path(args.result).parent)
    cfg = LabelingConfig(actors=1, block_size=args.block, tokenize_stage="actor")
    report = LabelingReport()
    me = psutil.Process()
    with tempfile.TemporaryDirectory(prefix="labelling-memory-") as tmp, MemorySampler() as mem:
        rss0, private0, t0 = me.memory_info().rss, _rss_parts()[0], time.perf_counter()
        n = label_candidates_file(args.candidates, Path(tmp) / "silver.parquet", "embedded", cfg, 128,
                                  actor_cpus(cfg, cluster.cpus, 1), ShardStore(Path(tmp) / "shards"),
                                  report=report, actors=1, scorer=ScorerSpec(NullScorer))
        wall = time.perf_counter() - t0
    return {"labelled": n, "shards": report.shards, "wall_s": wall, "first_shard_s": report.first_shard_seconds,
            "rss_before": rss0, "private_before": private0, "peak_driver_rss": mem.peak_rss,
            "peak_private": mem.peak_private, "peak_shared": mem.peak_shared, "peak_total_pss": mem.peak_total}


def _markdown(runs: list[dict], args, argv) -> list[str]:
    from provenance import provenance

    lines = ["# The labelling driver's memory against the candidate pairs", "",
             f"`labeling.label_candidates_file` (the silver stage's path) with a scorer that does no model work, one "
             f"actor, shards of {args.block:,} pairs, {args.cpus} CPUs; each row a fresh process and local Ray. "
             "`put`: the driver puts every pending shard in the object store before the pool starts (Ray Client's "
             "path, and the only one before). `tasks`: Ray Data tasks on the driver's node read the shards from the "
             "candidates file. Memory sampled every 0.25 s: the driver's RSS, split into its private memory and the "
             "shared memory it maps (pages of Ray's object store it has read: the store's, not the driver's own, "
             "and bounded by the store's size); growth is a peak less the value when labelling began; and PSS "
             "summed over the driver and every Ray process it started, the object store counted once.", "",
             "| pairs | way | shards | wall (s) | first shard (s) | driver private before (MiB) "
             "| peak driver private (MiB) | driver private growth (MiB) | peak driver shared (MiB) "
             "| peak driver RSS (MiB) | peak total PSS (MiB) | load average (1 min) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        lines.append(f"| {r['pairs']:,} | {r['way']} | {r['shards']:,} | {r['wall_s']:.1f} | "
                     f"{r['first_shard_s'] or 0:.1f} | {r['private_before'] / MIB:,.0f} | "
                     f"{r['peak_private'] / MIB:,.0f} | {(r['peak_private'] - r['private_before']) / MIB:,.0f} | "
                     f"{r['peak_shared'] / MIB:,.0f} | {r['peak_driver_rss'] / MIB:,.0f} | "
                     f"{r['peak_total_pss'] / MIB:,.0f} | {r['load_start'][0]:.1f} |")
    lines += ["", "The load average says how busy the machine was: with other work running, the wall times are "
                  "not throughput figures; the memory figures do not depend on it.", "",
              *provenance("benchmarks/labeling_memory.py", argv)]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000, 3_000_000],
                   help="candidate pairs")
    p.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    p.add_argument("--block", type=int, default=1024, help="pairs per shard (the CPU default)")
    p.add_argument("--cpus", type=int, default=os.cpu_count())
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--work", required=True, help="where the candidate files go (not the repository)")
    p.add_argument("--out", default="benchmarks/results/labelling_memory_cpu")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--way", help=argparse.SUPPRESS)
    p.add_argument("--candidates", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        Path(args.result).write_text(json.dumps(one_run(args)))
        return 0

    from provenance import write_result

    argv = sys.argv[1:] if argv is None else argv
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    runs = []
    for size in sorted(args.sizes):
        path = root / f"candidates-{size}.parquet"
        if not path.exists():
            print(f"[labelling-memory] writing {size:,} candidate pairs to {path}", flush=True)
            write_candidates(path, size, args.data_dir)
        for way in args.ways:
            result = root / f"result-{size}-{way}.json"
            cmd = [sys.executable, __file__, "--one", "--way", way, "--candidates", str(path), "--result",
                   str(result), "--block", str(args.block), "--cpus", str(args.cpus), "--work", str(root)]
            load_start = os.getloadavg()
            subprocess.run(cmd, check=True)
            r = {**json.loads(result.read_text()), "pairs": size, "way": way, "load_start": load_start}
            runs.append(r)
            print(f"[labelling-memory] {size:,} pairs, {way}: {r['wall_s']:.1f} s, driver private growth "
                  f"{(r['peak_private'] - r['private_before']) / MIB:,.0f} MiB, shared peak "
                  f"{r['peak_shared'] / MIB:,.0f} MiB, total peak "
                  f"{r['peak_total_pss'] / MIB:,.0f} MiB", flush=True)
            write_result(args.out, _markdown(runs, args, argv), {"runs": runs, "args": vars(args)})
    print("\n".join(_markdown(runs, args, argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
