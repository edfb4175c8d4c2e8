"""The MPNet teacher's cost on CPU: cross-encoder training and scoring speed against the embedded
MiniLM's, on the same pairs in one run, and what they make of the Table 5 job's wall time.

Both teachers run through the engine's own cores: training in ``training.loop.PairTrainer``
(the job's defaults: batch 16, fp32 unless the CPU has bf16 instructions, length-grouped
batches) on STSb training pairs, scoring in ``scoring.score_pairs`` with the labelling stage's
CPU token budget. The MPNet folder comes from ``benchmarks/mpnet_teacher.py`` (assembled once,
its weights' sha256 checked here).

    python benchmarks/mpnet_teacher_speed.py                          # 64 training, 192 scored pairs
    python benchmarks/mpnet_teacher_speed.py --train-pairs 512 --score-pairs 1024
    python benchmarks/mpnet_teacher_speed.py --rates benchmarks/results/mpnet_teacher_speed.json  # re-render

The projection for ``jobs/stsb-bm25-mpnet.yaml`` scales the stage times of the MiniLM job
measured on an idle 2-core CPU (``benchmarks/results/stsb_bm25_idle.md``) by the MPNet/MiniLM
speed ratios measured here: a projection, not a measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from mpnet_teacher import ensure_model  # noqa: E402

# The MiniLM job on an idle 2-core AMD EPYC (AVX2, fp32), from benchmarks/results/stsb_bm25_idle.md:
# per-stage seconds, fixed costs and rates; the stages a teacher does not touch are taken as they are.
IDLE_MINILM = {
    "cross_encoder": {"seconds": 205.6, "fixed": 30.2, "rate": 32.8, "pairs_per_epoch": 5749, "epochs": 1},
    "eval_cross_encoder": {"seconds": 25.1, "rate": 114.8},
    "silver": {"seconds": 147.7, "fixed": 21.3, "rate": 126.0, "pairs": 24363 - 5749},
    "unchanged": {"gold": 0.1, "eval_zero_shot": 30.4, "gold_only": 206.0, "eval_gold_only": 28.4,
                  "candidates": 10.4, "augsbert": 858.7, "eval_augsbert": 31.6},
}
TABLE5_EPOCHS = 4


def train_pairs(data_dir: Path, n: int, seed: int) -> tuple[list[str], list[str], np.ndarray]:
    from augsbert_ray.loaders import load_pairs
    from augsbert_ray.sources import DataSource

    t = load_pairs(DataSource(format="stsb", path=str(data_dir / "stsb" / "sts-train.csv")), "train").table
    rows = random.Random(seed).sample(range(t.num_rows), n)
    s1, s2 = t.column("sentence1").to_pylist(), t.column("sentence2").to_pylist()
    labels = np.asarray(t.column("label").to_pylist(), np.float32)
    return [s1[i] for i in rows], [s2[i] for i in rows], labels[rows]


def measure_training(model: str, s1, s2, labels, batch_size: int) -> dict:
    """Pairs/s of the engine's training loop after its first step (which is timed apart)."""
    from augsbert_ray.training.loop import HParams, PairTrainer
    from augsbert_ray.training.recipes import make_recipe

    t0 = time.perf_counter()
    trainer = PairTrainer(make_recipe("cross_encoder", model=model, max_length=128), s1, s2, labels,
                          HParams(epochs=1, lr=2e-5, batch_size=batch_size, warmup_ratio=0.1, seed=42,
                                  precision="auto", length_grouping=50), name="teacher")
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    trainer.run(until=1)
    first = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.run()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    pairs = (trainer.step - 1) * batch_size
    out = {"build_s": built, "first_step_s": first, "pairs": pairs, "seconds": seconds, "cpu_seconds": cpu,
           "pairs_per_s": pairs / seconds, "pairs_per_cpu_s": pairs / cpu, "precision": trainer.precision}
    del trainer
    gc.collect()
    return out


def measure_scoring(model: str, s1, s2) -> dict:
    """Pairs/s of the labelling core (``score_pairs``, CPU token budget) after a warm-up batch."""
    from augsbert_ray.models import load_cross_encoder
    from augsbert_ray.scoring import CPU_TOKEN_BUDGET, prepare_model, resolve_precision, score_pairs

    t0 = time.perf_counter()
    module, tok = load_cross_encoder(model)
    module = prepare_model(module, "auto", "cpu")
    loaded = time.perf_counter() - t0
    score_pairs(module, tok, s1[:16], s2[:16], micro_batch_size=1024, token_budget=CPU_TOKEN_BUDGET)
    t0, c0 = time.perf_counter(), time.process_time()
    scores = score_pairs(module, tok, s1, s2, micro_batch_size=1024, token_budget=CPU_TOKEN_BUDGET)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert np.isfinite(scores).all()
    return {"load_s": loaded, "pairs": len(s1), "seconds": seconds, "cpu_seconds": cpu,
            "pairs_per_s": len(s1) / seconds, "pairs_per_cpu_s": len(s1) / cpu,
            "precision": resolve_precision("auto", "cpu")}


def project(rates: dict) -> dict:
    """Table 5 wall time on an idle 2-core CPU: the idle MiniLM job's teacher stages scaled by
    the measured MPNet/MiniLM speed ratios; the other stages as measured there.

    The ratios are of pairs per CPU second (the process's time on the cores): on a CPU shared
    with other work, wall-clock rates follow the other work's load, which changes between the
    two models' measurements; the CPU time each pair costs does much less."""
    train_ratio = rates["mpnet"]["train"]["pairs_per_cpu_s"] / rates["embedded"]["train"]["pairs_per_cpu_s"]
    score_ratio = rates["mpnet"]["score"]["pairs_per_cpu_s"] / rates["embedded"]["score"]["pairs_per_cpu_s"]
    ce = IDLE_MINILM["cross_encoder"]
    train_rate = ce["rate"] * train_ratio
    silver = IDLE_MINILM["silver"]
    stages = {
        "cross_encoder": ce["fixed"] + TABLE5_EPOCHS * ce["pairs_per_epoch"] / train_rate,
        "eval_cross_encoder": IDLE_MINILM["eval_cross_encoder"]["seconds"] / score_ratio,
        "silver": silver["fixed"] + silver["pairs"] / (silver["rate"] * score_ratio),
        **IDLE_MINILM["unchanged"],
    }
    # Training measured much closer to MiniLM than scoring did, though both do the same matrix
    # products per token; with training scaled like scoring instead, the teacher's stage grows:
    # the two totals bracket the projection.
    at_score_ratio = ce["fixed"] + TABLE5_EPOCHS * ce["pairs_per_epoch"] / (ce["rate"] * score_ratio)
    return {"train_ratio": train_ratio, "score_ratio": score_ratio, "idle_train_rate": train_rate,
            "idle_score_rate": silver["rate"] * score_ratio, "stages": stages, "total_s": sum(stages.values()),
            "cross_encoder_at_score_ratio_s": at_score_ratio,
            # CPU time per MiniLM pair here against the idle run's (both cores busy there).
            "train_inflation": (1 / rates["embedded"]["train"]["pairs_per_cpu_s"]) / (2 / ce["rate"]),
            "score_inflation": (1 / rates["embedded"]["score"]["pairs_per_cpu_s"]) / (2 / silver["rate"]),
            "total_at_score_ratio_s": sum(stages.values()) - stages["cross_encoder"] + at_score_ratio}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-pairs", type=int, default=64)
    p.add_argument("--score-pairs", type=int, default=192)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--data-dir", default=None, help="default: $AUGSBERT_DATA_DIR or ../shared/data")
    p.add_argument("--models-dir", type=Path, help="where benchmarks/mpnet_teacher.py keeps the MPNet folder")
    p.add_argument("--out", default="benchmarks/results/mpnet_teacher_speed")
    p.add_argument("--rates", type=Path, help="an earlier run's .json: render its measured rates again, measure nothing")
    args = p.parse_args(argv)

    import os

    import torch

    from provenance import provenance, write_result

    if args.rates is not None:
        earlier = json.loads(args.rates.read_text(encoding="utf-8"))
        run = argparse.Namespace(**earlier["args"])
        proj = project(earlier["rates"])
        lines = render(run, earlier["rates"], proj, earlier.get("threads", 2))
        lines += [f"Measured by: `{earlier['command']}`, {earlier['written']}; rendered again from its figures.", ""]
        lines += provenance("benchmarks/mpnet_teacher_speed.py", argv, machine=f"torch threads {torch.get_num_threads()}")
        write_result(args.out, lines, {**earlier, "projection": proj})
        print("\n".join(lines))
        return 0
    data_dir = Path(args.data_dir or os.environ.get("AUGSBERT_DATA_DIR") or "../shared/data")
    mpnet = str(ensure_model(args.models_dir, log=lambda m: print(m, file=sys.stderr)))
    s1, s2, labels = train_pairs(data_dir, args.train_pairs + args.score_pairs, seed=0)
    t1, t2, tl = s1[:args.train_pairs], s2[:args.train_pairs], labels[:args.train_pairs]
    q1, q2 = s1[args.train_pairs:], s2[args.train_pairs:]
    rates: dict = {"embedded": {}, "mpnet": {}}
    # Alternating the two models, so that a change in the machine's load falls on both.
    for what, fn in (("train", lambda m: measure_training(m, t1, t2, tl, args.batch_size)),
                     ("score", lambda m: measure_scoring(m, q1, q2))):
        for name, model in (("embedded", "embedded"), ("mpnet", mpnet)):
            rates[name][what] = r = fn(model)
            print(f"{name} {what}: {r['pairs_per_s']:.2f} pairs/s, {r['pairs_per_cpu_s']:.2f} pairs/CPU s "
                  f"({r['pairs']} pairs, {r['seconds']:.1f} s)",
                  file=sys.stderr)
    proj = project(rates)
    lines = render(args, rates, proj, torch.get_num_threads())
    lines += provenance("benchmarks/mpnet_teacher_speed.py", argv, machine=f"torch threads {torch.get_num_threads()}")
    from datetime import datetime, timezone

    write_result(args.out, lines, {"rates": rates, "projection": proj, "args": vars(args) | {"models_dir": str(mpnet)},
                                   "idle_minilm": IDLE_MINILM, "table5_epochs": TABLE5_EPOCHS,
                                   "threads": torch.get_num_threads(),
                                   "command": "python benchmarks/mpnet_teacher_speed.py " + " ".join(
                                       sys.argv[1:] if argv is None else argv),
                                   "written": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"})
    print("\n".join(lines))
    return 0


def render(args, rates: dict, proj: dict, threads: int) -> list[str]:
    m = rates["mpnet"]
    lines = ["# The MPNet teacher on CPU: training and scoring speed against MiniLM", "",
             f"The same STSb training pairs for both cross-encoders (seed 0): {args.train_pairs} trained "
             f"(batch {args.batch_size}, the engine's training loop, {m['train']['precision']}; the first step "
             f"timed apart), {args.score_pairs} others scored (the labelling core, CPU token budget, "
             f"{m['score']['precision']}). Measured niced on a CPU shared with other work: wall-clock rates are far "
             "lower than on an idle one and follow the others' load; pairs per CPU second (this process's time on "
             "the cores, all threads) are steadier, and their ratios are what the projection uses.", "",
             "| teacher | training pairs/s (wall) | training pairs/CPU s | scoring pairs/s (wall) | scoring pairs/CPU s "
             "| first step, s | load, s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, label in (("embedded", "all-MiniLM-L6-v2 (embedded; 6 layers, 384 wide)"),
                        ("mpnet", "all-mpnet-base-v2 (12 layers, 768 wide)")):
        r = rates[name]
        lines.append(f"| {label} | {r['train']['pairs_per_s']:.2f} | {r['train']['pairs_per_cpu_s']:.2f} | "
                     f"{r['score']['pairs_per_s']:.2f} | {r['score']['pairs_per_cpu_s']:.2f} | "
                     f"{r['train']['first_step_s']:.1f} | {r['score']['load_s']:.1f} |")
    lines += ["", f"MPNet / MiniLM, pairs per CPU second: training {proj['train_ratio']:.3f}x, scoring "
              f"{proj['score_ratio']:.3f}x.",
              "", "## Projection: `jobs/stsb-bm25-mpnet.yaml` on an idle 2-core CPU", "",
              "**A projection from measured rates, not a measured run.** The MiniLM job's stage times on an idle "
              "2-core CPU (`stsb_bm25_idle.md`) with the teacher's stages scaled by the ratios above: "
              f"{TABLE5_EPOCHS} epochs x 5,749 gold pairs at {proj['idle_train_rate']:.1f} pairs/s (plus that run's "
              f"fixed cost), {IDLE_MINILM['silver']['pairs']:,} silver pairs labelled at {proj['idle_score_rate']:.1f} "
              "pairs/s, dev + test scored by the teacher; every other stage (6-layer MiniLM student, gold only and "
              "AugSBERT, candidates, evaluations) as measured there.", "",
              "| stage | projected s |", "|---|---:|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in proj["stages"].items()]
    lines += [f"| **total** | **{proj['total_s']:.0f} ({proj['total_s'] / 60:.0f} min)** |", "",
              f"Training measured {proj['train_ratio'] / proj['score_ratio']:.1f}x closer to MiniLM than scoring did, "
              "though per token both run the same matrix products; if training slows down by the scoring ratio "
              f"instead, the teacher's training takes {proj['cross_encoder_at_score_ratio_s']:.0f} s and the job "
              f"**{proj['total_at_score_ratio_s']:.0f} s ({proj['total_at_score_ratio_s'] / 60:.0f} min)**. Read the "
              f"projection as {proj['total_s'] / 60:.0f} to {proj['total_at_score_ratio_s'] / 60:.0f} minutes. On a "
              f"CPU this busy, CPU time per pair is itself inflated: MiniLM's took {proj['score_inflation']:.1f}x (scoring) "
              f"and {proj['train_inflation']:.1f}x (training) the CPU time per pair of the idle run (taking that run as "
              "keeping both cores busy); the projection assumes both models are inflated alike.", "",
              f"Directly from this run's (busy CPU) MPNet rates instead, the teacher's stages alone would take "
              f"{TABLE5_EPOCHS * 5749 / m['train']['pairs_per_s'] / 60:.0f} min of training and "
              f"{IDLE_MINILM['silver']['pairs'] / m['score']['pairs_per_s'] / 60:.0f} min of labelling.", ""]
    return lines


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # the training loop's lines
    sys.exit(main())
