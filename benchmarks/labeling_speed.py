"""Labelling throughput: the engine's cross-encoder labelling vs sentence-transformers'
``CrossEncoder.predict`` with its defaults, side by side in one run.

Same pairs (sentence pairs of the STS benchmark's dev and test files, so real lengths),
same model (a one-logit cross-encoder on the embedded MiniLM, saved once and loaded by
both), same device and threads. Reports pairs/s for

- ``CrossEncoder.predict`` (batch_size 32, its default),
- ``score_pairs``: the engine's single-process core (length-sorted micro-batches),
- ``label_candidates``: the engine's Ray actor pool, end to end (actor start included),

and the largest difference between the engine's scores and the peer's.

    python benchmarks/labeling_speed.py                       # 3,000 pairs on CPU
    python benchmarks/labeling_speed.py --pairs 100000 --device cuda --actors 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa


def stsb_pairs(data_dir: Path, n: int) -> tuple[list[str], list[str]]:
    from augsbert_ray.loaders import load_pairs
    from augsbert_ray.sources import DataSource

    tables = [load_pairs(DataSource(format="stsb", path=str(data_dir / "stsb" / f"sts-{s}.csv")), s).table
              for s in ("dev", "test")]
    t = pa.concat_tables(tables)
    s1, s2 = t.column("sentence1").to_pylist(), t.column("sentence2").to_pylist()
    reps = -(-n // len(s1))
    return (s1 * reps)[:n], (s2 * reps)[:n]


def candidates(s1: list[str], s2: list[str]) -> pa.Table:
    from augsbert_ray import schema

    n = len(s1)
    return pa.table({schema.ID1: np.arange(n, dtype=np.int64) * 2, schema.ID2: np.arange(n, dtype=np.int64) * 2 + 1,
                     schema.SENTENCE1: s1, schema.SENTENCE2: s2, schema.ORIGIN: ["bench"] * n,
                     schema.RETRIEVAL_SCORE: np.zeros(n, np.float32)}, schema=schema.CANDIDATE_SCHEMA)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3000)
    p.add_argument("--model", default="embedded", help="initial model of the cross-encoder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--actors", type=int, default=1, help="labelling actors of the Ray pool")
    p.add_argument("--micro-batch-size", type=int, default=64)
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--out", default="benchmarks/results/labeling_speed")
    args = p.parse_args(argv)

    import torch
    from sentence_transformers import CrossEncoder

    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import label_candidates, score_pairs
    from augsbert_ray.models import load_cross_encoder
    from augsbert_ray.report import versions
    from augsbert_ray.runtime import start_ray

    torch.set_num_threads(args.threads)
    s1, s2 = stsb_pairs(Path(args.data_dir), args.pairs)
    torch.manual_seed(0)
    model, tok = load_cross_encoder(args.model)
    model_dir = Path(tempfile.mkdtemp(prefix="labeling-speed-")) / "cross-encoder"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    results = {}

    peer = CrossEncoder(str(model_dir), device=args.device)
    peer.predict(list(zip(s1[:64], s2[:64])))  # warm-up
    t0 = time.perf_counter()
    peer_scores = np.asarray(peer.predict(list(zip(s1, s2)), show_progress_bar=False), dtype=np.float32)
    results["CrossEncoder.predict (defaults)"] = args.pairs / (time.perf_counter() - t0)
    del peer

    model, tok = load_cross_encoder(str(model_dir), device=args.device)
    model.eval()
    score_pairs(model, tok, s1[:64], s2[:64], device=args.device)  # warm-up
    t0 = time.perf_counter()
    ours = score_pairs(model, tok, s1, s2, micro_batch_size=args.micro_batch_size, device=args.device)
    results["engine: score_pairs (one process)"] = args.pairs / (time.perf_counter() - t0)

    start_ray(None, args.threads)
    cfg = LabelingConfig(actors=args.actors, micro_batch_size=args.micro_batch_size,
                         num_gpus=1 if args.device.startswith("cuda") else 0)
    t0 = time.perf_counter()
    pooled = label_candidates(candidates(s1, s2), str(model_dir), cfg, 128, max(1, args.threads // args.actors))
    results[f"engine: Ray actor pool ({args.actors} actor(s), start included)"] = args.pairs / (time.perf_counter() - t0)
    pooled = pooled.column("label").to_numpy()

    diff = {"score_pairs": float(np.abs(ours - peer_scores).max()), "actor pool": float(np.abs(pooled - peer_scores).max())}
    base = results["CrossEncoder.predict (defaults)"]
    v = versions()
    lines = ["# Labelling throughput vs CrossEncoder.predict", "",
             f"{args.pairs} STSb sentence pairs (dev + test, cycled), cross-encoder on `{args.model}`, "
             f"device {args.device}, {args.threads} threads.", "",
             "| labeller | pairs/s | vs CrossEncoder.predict |", "|---|---:|---:|"]
    lines += [f"| {name} | {rate:.1f} | {rate / base:.2f}x |" for name, rate in results.items()]
    lines += ["", "Largest |engine - CrossEncoder.predict| score difference: "
              + ", ".join(f"{k} {d:.2e}" for k, d in diff.items()) + ".", "",
              f"Command: `python benchmarks/labeling_speed.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
              f"Machine: {platform.machine()}, {os.cpu_count()} cores. Versions: "
              + ", ".join(f"{k} {v[k]}" for k in v) + ".",
              f"Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({"pairs_per_s": results, "max_abs_diff": diff, "args": vars(args)},
                                                   indent=2), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
