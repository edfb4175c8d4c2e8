"""The GPU host check: the engine against its targets on one GPU, each part's result written
the moment it ends.

Made for a GPU host without a package index or a model hub (benchmarks/README.md, "On a GPU
host", has the one command): both encoders are random models of the embedded
all-MiniLM-L6-v2's shape (speed does not depend on the weights), built from a folder with its
``config.json`` and tokenizer files (``--shape``; by default the embedded model's own folder,
where its package is installed). The parts, in order:

1. ``end_to_end``: ``jobs/stsb-bm25.yaml`` by the plain sentence-transformers script and by the
   engine (``benchmarks/end_to_end.py --device cuda``: each side a fresh process, the engine's
   wall time with Ray's start). Targets: the engine in 60 s or less, and ahead of the script.
2. ``main_job``: the README's main job, ``jobs/stsb-1k-student2.yaml``, as ``augsbert run`` in a
   fresh process. Target: 45 s or less, Ray's start included.
3. ``labelling``: 1,000,000 pairs by the engine's Ray pipeline (pairs/s with its start, and
   steady from the first shard to the last), beside ``CrossEncoder.predict`` with its defaults
   and tuned (bf16 weights, large batches). Targets: 80,000 pairs/s with the start, 250,000
   steady.
4. ``training``: the engine's training loop (``PairTrainer``, a bi-encoder, the job's
   precision) at batch 16, 64 and 256. Target: 2,000 pairs/s at batch 16.
5. ``tests`` (only when asked for): ``pytest -m gpu``.

Each part appends its figures to ``OUT/results.jsonl`` and ``OUT/results.md`` (flushed to disk)
when it ends, and prints each target with its measured value and PASS or FAIL, so a run
stopped part-way keeps what it measured. A part that fails is recorded with its error and the
next one runs; the exit status is 1 if any failed. ``--device cpu --small`` (a tiny model,
small sizes) runs every part end to end in minutes on a CPU (the slow tier's test), so that no
GPU time goes to a bug here.

    python benchmarks/gpu_check.py --shape MINILM_FILES --out OUT          # one H100/H200, ~8 min
    python benchmarks/gpu_check.py --device cpu --small --out /tmp/gpu-check
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = ("end_to_end", "main_job", "labelling", "training", "tests")
DEFAULT_PARTS = PARTS[:-1]
# The modules each part needs beyond the engine's own, checked before anything runs.
NEEDS = {"end_to_end": ("rank_bm25", "accelerate", "datasets"), "labelling": ("sentence_transformers",),
         "tests": ("pytest",)}


@dataclass(frozen=True)
class Target:
    """One figure against its bound: ``at_most`` (seconds) or at least (rates)."""

    name: str
    value: float | None
    bound: float
    unit: str
    at_most: bool = False

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        return self.value <= self.bound if self.at_most else self.value >= self.bound

    def line(self) -> str:
        digits = 2 if self.unit == "x" else 1
        got = "not measured" if self.value is None else f"{self.value:,.{digits}f} {self.unit}"
        return (f"TARGET {self.name}: {got} (target {'<=' if self.at_most else '>='} {self.bound:,g} {self.unit}) "
                f"{'PASS' if self.passed else 'FAIL'}")


class Results:
    """``OUT/results.jsonl`` and ``OUT/results.md``, one entry appended per part as it ends."""

    def __init__(self, out: Path, device: str, argv: list[str]):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.device, self.argv = device, argv
        self._append("results.md", [f"# GPU check on {device_name(device)}", "",
                                    f"`python benchmarks/gpu_check.py {' '.join(argv)}`, started "
                                    f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.", ""])

    def _append(self, name: str, lines: list[str]) -> None:
        with open(self.out / name, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def add(self, part: str, seconds: float, data: dict, lines: list[str], targets: list[Target],
            error: str | None = None) -> None:
        from augsbert_ray.versions import versions

        record = {"part": part, "seconds": seconds, "device": device_name(self.device), "error": error,
                  "targets": [{"name": t.name, "value": t.value, "bound": t.bound, "unit": t.unit,
                               "at_most": t.at_most, "passed": t.passed} for t in targets],
                  "data": data, "versions": versions()}
        self._append("results.jsonl", [json.dumps(record, default=str)])
        body = [f"## {part} ({seconds:.0f} s)", "", *lines]
        if error:
            body += ["", f"FAILED: {error}"]
        body += ["", *[f"- {t.line()}" for t in targets], ""]
        self._append("results.md", body)
        print("\n".join(body), flush=True)


def device_name(device: str) -> str:
    from augsbert_ray.bench.hardware import cpu_description, gpus

    return gpus()[0] if device.startswith("cuda") and gpus() else cpu_description()


def _timed(cmd: list[str], log: Path, env: dict | None = None, timeout: float | None = None) -> float:
    """Runs ``cmd`` to its end, its output to ``log``; its wall time, process start to exit.
    Past ``timeout`` seconds its whole process group (the processes it started too) is ended."""
    import signal

    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=grace)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            raise RuntimeError(f"{' '.join(map(str, cmd[:6]))} ... stopped after {timeout:.0f} s (--part-timeout); "
                               f"its output: {log}") from None
    if rc != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise RuntimeError(f"{' '.join(map(str, cmd[:6]))} ... exited {rc}; the end of {log}:\n" + "\n".join(tail))
    return time.perf_counter() - t0


def _engine_env(args) -> dict:
    """The environment of the engine's own processes: the faiss stand-in where faiss is missing."""
    env = dict(os.environ)
    env["AUGSBERT_DATA_DIR"] = str(Path(args.data_dir).resolve())
    env.pop("RAY_ADDRESS", None)  # a local Ray of the run's own
    if args.faiss == "standin" or (args.faiss == "auto" and importlib.util.find_spec("faiss") is None):
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "benchmarks" / "faiss_standin"),
                                             *filter(None, [env.get("PYTHONPATH")])])
    return env


def _gpu_sets(args) -> list[str]:
    return ["training.use_gpu=true", "labeling.num_gpus=1"] if args.device.startswith("cuda") else []


def part_end_to_end(args, model: Path, work: Path) -> tuple[dict, list[str], list[Target]]:
    sets = [f"cross_encoder.model={model}", f"bi_encoder.model={model}", *args.e2e_set]
    out = work / "end_to_end"
    cmd = [sys.executable, str(REPO / "benchmarks" / "end_to_end.py"), "--job", "jobs/stsb-bm25.yaml",
           "--device", args.device, "--root", str(work / "e2e-runs"), "--out", str(out),
           *[a for s in sets for a in ("--set", s)]]
    _timed(cmd, work / "end_to_end.log", env=_engine_env(args), timeout=args.part_timeout)
    data = json.loads(out.with_suffix(".json").read_text())
    run = data["runs"][-1]
    engine, script = run["engine"]["wall_s"], run["script"]["wall_s"]
    lines = out.with_suffix(".md").read_text().splitlines()
    return ({"engine_wall_s": engine, "script_wall_s": script, "stage_seconds": run["engine"]["stage_seconds"],
             "script_seconds": run["script"]["seconds"], "sets": sets}, lines,
            [Target("jobs/stsb-bm25.yaml by the engine, Ray's start included", engine, 60, "s", at_most=True),
             Target("the engine's wall time over the plain script's", engine / script, 1.0, "x", at_most=True)])


def part_main_job(args, model: Path, work: Path) -> tuple[dict, list[str], list[Target]]:
    run_dir = work / "main-job"
    sets = [f"cross_encoder.model={model}", f"bi_encoder.model={model}", f"run_dir={run_dir}", *_gpu_sets(args),
            *args.main_set]
    augsbert = Path(sys.executable).with_name("augsbert")
    cli = [str(augsbert)] if augsbert.exists() else [sys.executable, "-m", "augsbert_ray.cli"]
    wall = _timed([*cli, "run", "jobs/stsb-1k-student2.yaml", *sets, "--fresh"], work / "main_job.log",
                  env=_engine_env(args), timeout=args.part_timeout)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    seconds = metrics.get("stage_seconds", {})
    lines = [f"`augsbert run jobs/stsb-1k-student2.yaml {' '.join(sets)}`: {wall:.1f} s from the process's start "
             "to its exit.", "", "| stage | seconds |", "|---|---:|"]
    lines += [f"| {name} | {s:.1f} |" for name, s in seconds.items()]
    return ({"wall_s": wall, "stage_seconds": seconds, "sets": sets}, lines,
            [Target("jobs/stsb-1k-student2.yaml (the README's main job), Ray's start included", wall, 45, "s",
                    at_most=True)])


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _peer_rate(model: Path, s1: list[str], s2: list[str], device: str, tuned: bool) -> float:
    """``CrossEncoder.predict`` on the pairs: with its defaults, or tuned (bf16 weights on a GPU,
    batches of 512): the best a user of sentence-transformers alone would do without code."""
    import torch
    from sentence_transformers import CrossEncoder

    kwargs = {"model_kwargs": {"dtype": torch.bfloat16}} if tuned and device.startswith("cuda") else {}
    peer = CrossEncoder(str(model), device=device, num_labels=1, **kwargs)
    batch = {"batch_size": 512} if tuned else {}
    pairs = list(zip(s1, s2))
    peer.predict(pairs[:1024], show_progress_bar=False, **batch)  # warm-up: kernels, allocator
    _synchronize(device)
    t0 = time.perf_counter()
    peer.predict(pairs, show_progress_bar=False, **batch)
    _synchronize(device)
    rate = len(pairs) / (time.perf_counter() - t0)
    del peer
    return rate


def part_labelling(args, model: Path, work: Path) -> tuple[dict, list[str], list[Target]]:
    from augsbert_ray.bench.data import sentence_pairs
    from augsbert_ray.bench.labeling import candidates
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import (
        LabelingReport,
        ShardStore,
        actor_cpus,
        label_candidates,
        pool_size,
    )
    from augsbert_ray.runtime import start_ray, stop_ray

    gpu = args.device.startswith("cuda")
    s1, s2 = sentence_pairs(Path(args.data_dir), args.peer_pairs)
    tuned = "bf16, batches of 512" if gpu else "batches of 512"
    peers = {"CrossEncoder.predict (defaults)": _peer_rate(model, s1, s2, args.device, tuned=False),
             f"CrossEncoder.predict (tuned: {tuned})": _peer_rate(model, s1, s2, args.device, tuned=True)}
    cluster = start_ray(None, None, verbose=False, log_dir=work / "labelling-logs")
    try:
        cfg = LabelingConfig(num_gpus=1 if gpu else 0, **({"block_size": args.block_size} if args.block_size else {}))
        actors = pool_size(cfg, cluster.gpus, cluster.cpus)
        r1, r2 = sentence_pairs(Path(args.data_dir), args.pairs, seed=1)
        report, commits = LabelingReport(), []
        store = ShardStore(Path(tempfile.mkdtemp(prefix="shards-", dir=work)))
        t0 = time.perf_counter()
        label_candidates(candidates(r1, r2), str(model), cfg, 128, actor_cpus(cfg, cluster.cpus, actors), store=store,
                         actors=actors, report=report, on_commit=lambda: commits.append(time.perf_counter()))
        total = time.perf_counter() - t0
    finally:
        stop_ray()
    # Shards are committed as they finish, several at once at times: a steady rate needs many.
    steady = (args.pairs - cfg.block_size) / (commits[-1] - commits[0]) if len(commits) >= 8 else None
    best_peer = max(peers.values())
    rows = {**peers, "engine: Ray pipeline, start included": args.pairs / total}
    if steady:
        rows["engine: Ray pipeline, steady (first shard to last)"] = steady
    lines = [f"{args.model_desc} as the cross-encoder; the peer on {args.peer_pairs:,} pairs, the pipeline on "
             f"{args.pairs:,} ({actors} actor(s), shards of {cfg.block_size:,}, precision {cfg.precision}).", "",
             "| labeller | pairs/s | vs the tuned peer |", "|---|---:|---:|"]
    lines += [f"| {name} | {rate:,.0f} | {rate / best_peer:.1f}x |" for name, rate in rows.items()]
    if not steady:
        lines += ["", f"No steady rate: {len(commits)} shard(s) committed, 8 or more needed (raise --pairs)."]
    lines += ["", f"Time to the first labelled shard (the pipeline's fixed cost): {report.first_shard_seconds:.1f} s."]
    return ({"pairs_per_s": rows, "first_shard_seconds": report.first_shard_seconds, "pairs": args.pairs,
             "peer_pairs": args.peer_pairs, "actors": actors, "block_size": cfg.block_size}, lines,
            [Target(f"labelling {args.pairs:,} pairs, the pipeline's start included", args.pairs / total, 80_000,
                    "pairs/s"),
             Target("labelling, steady", steady, 250_000, "pairs/s")])


def part_training(args, model: Path, work: Path) -> tuple[dict, list[str], list[Target]]:
    import numpy as np

    from augsbert_ray.bench.data import sentence_pairs
    from augsbert_ray.training.loop import HParams, PairTrainer
    from augsbert_ray.training.recipes import BiEncoderRecipe

    rates, precision = {}, None
    for batch in args.batches:
        n = batch * (args.train_steps + args.warmup_steps)
        s1, s2 = sentence_pairs(Path(args.data_dir), n, seed=2)
        labels = np.random.default_rng(0).random(n).astype(np.float32)
        trainer = PairTrainer(BiEncoderRecipe(model=str(model), max_length=128), s1, s2, labels,
                              HParams(epochs=1, lr=2e-5, batch_size=batch, warmup_ratio=0.1, seed=42,
                                      precision="auto"), device=args.device, name=f"batch {batch}")
        precision = trainer.precision
        trainer.run(until=args.warmup_steps)  # kernels, the allocator, the tokeniser's caches
        _synchronize(args.device)
        t0 = time.perf_counter()
        trainer.run(until=args.warmup_steps + args.train_steps)
        _synchronize(args.device)
        rates[batch] = args.train_steps * batch / (time.perf_counter() - t0)
        del trainer
    lines = [f"The engine's training loop (`PairTrainer`, {args.model_desc} as a bi-encoder, cosine loss, precision "
             f"{precision}): {args.train_steps} steps timed after {args.warmup_steps} of warm-up.", "",
             "| batch | training pairs/s |", "|---:|---:|"]
    lines += [f"| {b} | {r:,.0f} |" for b, r in rates.items()]
    return ({"pairs_per_s": rates, "precision": precision, "steps": args.train_steps}, lines,
            [Target("the training loop at batch 16", rates.get(16), 2_000, "pairs/s")])


def part_tests(args, model: Path, work: Path) -> tuple[dict, list[str], list[Target]]:
    from augsbert_ray.bench.model_dirs import shape_dir

    env = _engine_env(args)
    env["AUGSBERT_TEST_TOKENIZER"] = str(shape_dir(args.shape))
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_gpu.py", "-m", "gpu", "-q", "-p",
                           "no:cacheprovider", "-o", "addopts="], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False, timeout=900)
    (work / "gpu_tests.txt").write_text(proc.stdout + proc.stderr)
    summary = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    if proc.returncode != 0:
        raise RuntimeError(f"pytest -m gpu: {summary}")
    return {"summary": summary}, [f"`pytest tests/test_gpu.py -m gpu`: {summary}"], []


RUNNERS = {"end_to_end": part_end_to_end, "main_job": part_main_job, "labelling": part_labelling,
           "training": part_training, "tests": part_tests}


def missing_modules(parts: list[str]) -> dict[str, list[str]]:
    """The modules each part needs that this Python cannot import (checked before anything runs)."""
    found = {}
    for part in parts:
        lacking = [m for m in NEEDS.get(part, ()) if importlib.util.find_spec(m) is None]
        if lacking:
            found[part] = lacking
    return found


def tiny_model(shape: Path, out: Path) -> Path:
    """A 2-layer random BERT of hidden size 32 on ``shape``'s tokenizer (``--small``)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(shape))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def save_shape(out: Path) -> int:
    """Copies the embedded model's config and tokenizer files (``--shape`` for a host without its package)."""
    import shutil

    from augsbert_ray.bench.model_dirs import SHAPE_FILES, shape_dir

    out.mkdir(parents=True, exist_ok=True)
    src = shape_dir(None)
    for name in SHAPE_FILES:
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    print(f"gpu_check: {', '.join(sorted(p.name for p in out.iterdir()))} in {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results/gpu_check")))
    p.add_argument("--shape", help="a folder with the model's config.json and tokenizer files")
    p.add_argument("--device", default="cuda")
    p.add_argument("--parts", nargs="+", default=list(DEFAULT_PARTS), choices=PARTS)
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--small", action="store_true",
                   help="a tiny model and small sizes, so that every part runs in minutes on a CPU (a check of "
                        "this script: the targets are then not met)")
    p.add_argument("--pairs", type=int, help="pairs the Ray pipeline labels (default 1,000,000)")
    p.add_argument("--peer-pairs", type=int, help="pairs CrossEncoder.predict scores (default 40,000)")
    p.add_argument("--block-size", type=int, default=0, help="pairs per labelling shard (0: the engine's default)")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--train-steps", type=int, help="timed training steps per batch size (default 100)")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--e2e-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for jobs/stsb-bm25.yaml")
    p.add_argument("--main-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for jobs/stsb-1k-student2.yaml")
    p.add_argument("--faiss", choices=("auto", "standin"), default="auto",
                   help="auto: faiss where installed, else an exact numpy stand-in (faiss_standin/)")
    p.add_argument("--part-timeout", type=float, default=420,
                   help="seconds a part run as a process of its own (end_to_end, main_job) may take; then it "
                        "is stopped, recorded as failed, and the next part runs")
    p.add_argument("--save-shape", type=Path, metavar="DIR",
                   help="only copy the embedded model's config and tokenizer files to DIR (to carry to a GPU host)")
    args = p.parse_args(argv)
    if args.save_shape:
        return save_shape(args.save_shape)
    small = args.small
    args.pairs = args.pairs or (2_000 if small else 1_000_000)
    args.peer_pairs = args.peer_pairs or (256 if small else 40_000)
    args.block_size = args.block_size or (128 if small else 0)
    args.train_steps = args.train_steps or (2 if small else 100)
    if small:
        args.batches = [b for b in args.batches if b <= 64] or args.batches
        args.warmup_steps = min(args.warmup_steps, 1)
        tiny = ["data.subsample.train=48", "data.subsample.dev=24", "data.subsample.test=24", "sampling.top_k=1",
                "cross_encoder.max_length=32", "bi_encoder.max_length=32"]
        args.e2e_set = tiny + args.e2e_set
        args.main_set = [*tiny, "cross_encoder.epochs=1", "bi_encoder.gold_repeat=1"] + args.main_set

    problems = [f"part {part} needs {', '.join(modules)}, which this Python cannot import (benchmarks/README.md, "
                "'On a GPU host', builds the wheels)" for part, modules in missing_modules(args.parts).items()]
    from augsbert_ray.bench.data import has_stsb

    if {"end_to_end", "main_job"} & set(args.parts) and not has_stsb(Path(args.data_dir)):
        problems.append(f"the jobs need the STS benchmark under {args.data_dir}/stsb (--data-dir, AUGSBERT_DATA_DIR)")
    if problems:  # before any part spends the host's time
        for line in problems:
            print(f"gpu_check: error: {line}", file=sys.stderr)
        return 2
    from augsbert_ray.bench.model_dirs import random_model, shape_dir

    results = Results(args.out, args.device, argv)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if small:  # a script check, not a measurement: a tiny model on the shape's tokenizer
        model, args.model_desc = tiny_model(shape_dir(args.shape), work / "tiny"), "a tiny random BERT (--small)"
    else:
        model, args.model_desc = random_model(shape_dir(args.shape), work / "model"), "a random model of MiniLM's shape"
    failed = []
    for part in args.parts:
        t0 = time.perf_counter()
        print(f"gpu_check: {part} ...", flush=True)
        try:
            data, lines, targets = RUNNERS[part](args, model, work)
            results.add(part, time.perf_counter() - t0, data, lines, targets)
        except Exception as e:  # noqa: BLE001 - recorded, and the next part runs
            failed.append(part)
            results.add(part, time.perf_counter() - t0, {"traceback": traceback.format_exc()}, [], [],
                        error=f"{type(e).__name__}: {e}")
    print(f"gpu_check: results in {args.out / 'results.md'} and results.jsonl; logs in {work}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
