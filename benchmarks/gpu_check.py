"""The GPU host check: labelling throughput against CrossEncoder.predict, the main job's stage
times, and the GPU tests, each written as soon as it is measured.

Made for a GPU host without a package index or a model hub: the models are random ones of
the embedded all-MiniLM-L6-v2's shape (speed does not depend on the weights), built from a
folder holding its ``config.json`` and tokenizer files (``--shape``; by default the embedded
model's own folder when its package is installed). Three parts, in order, each writing its
files under ``--out`` the moment it ends, so a run stopped part-way keeps what it measured:

1. ``labelling``: ``CrossEncoder.predict`` (its defaults) on ``--peer-pairs`` pairs, then the
   engine's Ray pipeline (a CPU tokenising stage ahead of GPU actors, shards committed to
   disk) on ``--pairs`` pairs: pairs/s with the pipeline's start included, and steady (from
   the first shard labelled to the last).
2. ``job``: ``jobs/stsb-bm25.yaml`` on the GPU (``labeling.num_gpus=1 training.use_gpu=true``)
   with both encoders MiniLM-shaped: every stage's seconds and fixed cost, the training
   loops' pairs/s; needs the STS benchmark (``--data-dir``).
3. ``tests``: ``pytest -m gpu``.

    python benchmarks/gpu_check.py --out /tmp/gpu-check                       # on a GPU host
    python benchmarks/gpu_check.py --device cpu --pairs 2000 --peer-pairs 500 --parts labelling --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from augsbert_ray.bench.data import sentence_pairs
from augsbert_ray.bench.model_dirs import random_model, shape_dir

REPO = Path(__file__).resolve().parents[1]


def write(out: Path, name: str, data: dict, lines: list[str]) -> None:
    from augsbert_ray.versions import versions

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({**data, "versions": versions()}, indent=2, default=str))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def device_name(device: str) -> str:
    from augsbert_ray.bench.hardware import gpus
    from provenance import cpu_description

    return gpus()[0] if device.startswith("cuda") and gpus() else cpu_description()


def part_labelling(args, model: Path, out: Path) -> None:
    import torch
    from sentence_transformers import CrossEncoder

    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import LabelingReport, ShardStore, actor_cpus, label_candidates, pool_size
    from augsbert_ray.runtime import start_ray, stop_ray
    from augsbert_ray.bench.labelling import candidates

    gpu = args.device.startswith("cuda")
    s1, s2 = sentence_pairs(Path(args.data_dir), args.peer_pairs)
    peer = CrossEncoder(str(model), device=args.device, num_labels=1)
    peer.predict(list(zip(s1[:512], s2[:512])), show_progress_bar=False)  # warm-up
    if gpu:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    peer.predict(list(zip(s1, s2)), show_progress_bar=False)
    if gpu:
        torch.cuda.synchronize()
    peer_rate = len(s1) / (time.perf_counter() - t0)
    del peer
    cluster = start_ray(None, None)
    cfg = LabelingConfig(num_gpus=1 if gpu else 0)
    actors = pool_size(cfg, cluster.gpus)
    r1, r2 = sentence_pairs(Path(args.data_dir), args.pairs, seed=1)
    report, commits = LabelingReport(), []
    store = ShardStore(Path(tempfile.mkdtemp(prefix="gpu-check-shards-")))
    t0 = time.perf_counter()
    label_candidates(candidates(r1, r2), str(model), cfg, 128, actor_cpus(cfg, cluster.cpus, actors), store=store,
                     actors=actors, report=report, on_commit=lambda: commits.append(time.perf_counter()))
    total = time.perf_counter() - t0
    # Shards are committed as they finish, several at once at times: a steady rate needs many.
    steady = (args.pairs - cfg.block_size) / (commits[-1] - commits[0]) if len(commits) >= 8 else None
    rows = {"CrossEncoder.predict (defaults)": peer_rate, "engine: Ray pipeline, start included": args.pairs / total}
    if steady:
        rows["engine: Ray pipeline, steady (first shard to last)"] = steady
    lines = ["# Labelling on " + device_name(args.device), "",
             f"MiniLM-shaped random cross-encoder; the peer on {args.peer_pairs:,} pairs, the pipeline on "
             f"{args.pairs:,} ({actors} actor(s), shards of {cfg.block_size:,}, precision {cfg.precision}).", "",
             "| labeller | pairs/s | vs the peer |", "|---|---:|---:|"]
    lines += [f"| {name} | {rate:,.0f} | {rate / peer_rate:.1f}x |" for name, rate in rows.items()]
    if not steady:
        lines += ["", f"No steady rate: {len(commits)} shard(s) committed, 8 or more needed (raise --pairs)."]
    lines += ["", f"Time to the first labelled shard (the pipeline's fixed cost): {report.first_shard_seconds:.1f} s.",
              f"Command: `python benchmarks/gpu_check.py {' '.join(sys.argv[1:])}`"]
    stop_ray()  # the job and the tests start their own
    write(out, "labelling", {"pairs_per_s": rows, "first_shard_seconds": report.first_shard_seconds,
                             "pairs": args.pairs, "peer_pairs": args.peer_pairs, "device": device_name(args.device)},
          lines)


def part_job(args, model: Path, out: Path) -> None:
    from augsbert_ray.config import load_job
    from augsbert_ray.pipeline import run_job

    gpu = args.device.startswith("cuda")
    run_dir = Path(tempfile.mkdtemp(prefix="gpu-check-job-"))  # outside --out: only the summary is kept there
    overrides = [f"cross_encoder.model={model}", f"bi_encoder.model={model}", f"run_dir={run_dir}",
                 *(["labeling.num_gpus=1", "training.use_gpu=true"] if gpu else []), *args.job_set]
    cfg = load_job(REPO / "jobs" / "stsb-bm25.yaml", overrides)
    stages: list[dict] = []

    def on_stage(done) -> None:  # each stage's figures are written when it ends
        stages.append({"stage": done.name, "seconds": done.seconds, "reused": done.reused})
        write(out, "job", {"stages": stages, "overrides": overrides}, [
            f"# {cfg.name} on {device_name(args.device)} (stages so far)", "",
            *[f"- {s['stage']}: {s['seconds']:.1f} s" for s in stages]])

    m = run_job(cfg, fresh=True, on_stage=on_stage)
    rows = [(s.name, s.seconds, s.fixed_seconds, s.throughput) for s in m.stages]
    lines = [f"# {cfg.name} on {device_name(args.device)}", "",
             "Both encoders MiniLM-shaped with random weights (speed only; the scores mean nothing).", "",
             "| stage | seconds | fixed cost, s | throughput |", "|---|---:|---:|---|"]
    lines += [f"| {n} | {sec:.1f} | {'' if fx is None else f'{fx:.1f}'} | {tp} |" for n, sec, fx, tp in rows]
    lines += ["", f"Stages in all: {sum(s.seconds for s in m.stages):.1f} s.",
              f"Overrides: `{' '.join(overrides)}`."]
    write(out, "job", {"stages": [vars(s) for s in m.stages], "overrides": overrides}, lines)
    if (run_dir / "summary.md").exists():
        (out / "job_summary.md").write_text((run_dir / "summary.md").read_text())


def part_tests(args, out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the tests start their own Ray
    env["AUGSBERT_TEST_TOKENIZER"] = str(shape_dir(args.shape))
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_gpu.py", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts="], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_tests.txt").write_text(proc.stdout + proc.stderr)
    print(proc.stdout[-3000:], flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results/gpu_check")))
    p.add_argument("--shape", help="a folder with the model's config.json and tokenizer files")
    p.add_argument("--device", default="cuda")
    p.add_argument("--pairs", type=int, default=1_000_000, help="pairs the Ray pipeline labels")
    p.add_argument("--peer-pairs", type=int, default=40_000, help="pairs CrossEncoder.predict scores")
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--parts", nargs="+", default=["labelling", "job", "tests"], choices=["labelling", "job", "tests"])
    p.add_argument("--job-set", action="append", default=[], metavar="KEY=VALUE", help="an override for the job")
    args = p.parse_args(argv)
    model = random_model(shape_dir(args.shape), Path(tempfile.mkdtemp(prefix="minilm-shape-")) / "model")
    if "labelling" in args.parts:
        part_labelling(args, model, args.out)
    if "job" in args.parts:
        part_job(args, model, args.out)
    if "tests" in args.parts:
        part_tests(args, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
