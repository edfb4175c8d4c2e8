"""Training in bf16 mixed precision against fp32: training speed and the trained models' scores.

Trains a job's cross-encoder and gold-only bi-encoder on its gold pairs with the engine's
training loop, once per precision and seed, in one process with every core. Seeds run one
after another, and within a seed each precision in turn, so both see the same machine. Prints
and saves, per encoder and precision: training pairs/s (the loop alone, not loading or
scoring) and the dev and test scores of every seed, with their mean.

    python benchmarks/training_precision.py                       # STSb, 1,000 gold pairs, seeds 42-44
    python benchmarks/training_precision.py --seeds 1 2 --encoders bi_encoder
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np

from augsbert_ray.config import load_job
from augsbert_ray.evaluation import task_metrics
from augsbert_ray.models import resolve_model
from augsbert_ray.evaluation import PRIMARY_METRIC
from provenance import provenance, write_result
from augsbert_ray.schema import PAIR_COLUMNS, pair_lists
from augsbert_ray.loaders.job_inputs import load_gold
from augsbert_ray.training.fit import hparams
from augsbert_ray.training.loop import HParams, PairTrainer, resolve_training_precision
from augsbert_ray.training.recipes import make_recipe


def train_once(cfg, gold: dict, kind: str, precision: str, seed: int) -> dict:
    c = cfg.cross_encoder if kind == "cross_encoder" else cfg.bi_encoder
    recipe_args = {"model": resolve_model(c.model), "max_length": c.max_length}
    if kind == "bi_encoder":
        recipe_args |= {"num_layers": c.num_layers, "objective": c.resolved_objective(cfg.task)}
    hp = HParams(**{**hparams(c, cfg.seed, cfg.training, precision), "seed": seed})
    recipe = make_recipe(kind, **recipe_args)
    s1, s2, labels = pair_lists(gold["train"])
    trainer = PairTrainer(recipe, s1, s2, labels, hp, name=f"{kind} {precision} seed {seed}")
    trainer.run()
    splits = {s: gold[s].select(PAIR_COLUMNS) for s in ("dev", "test")}
    preds = {s: recipe.predict(trainer.module, *pair_lists(splits[s])[:2], cfg.evaluation.batch_size) for s in splits}
    scores = task_metrics(cfg.task, preds, splits)
    stats = trainer.stats()
    return {"encoder": kind, "precision": stats["precision"], "seed": seed, "pairs_per_s": stats["pairs_per_s"],
            "train_seconds": stats["seconds"], "steps": stats["steps"], "final_loss": stats["final_loss"],
            "dev": scores["dev"][PRIMARY_METRIC[cfg.task]], "test": scores["test"][PRIMARY_METRIC[cfg.task]]}


def table(runs: list[dict], metric: str) -> list[str]:
    lines = [f"| encoder | precision | training pairs/s | vs fp32 | dev {metric} per seed | mean | "
             f"test {metric} per seed | mean |", "|---|---|---:|---:|---|---:|---|---:|"]
    base = {}
    for kind in dict.fromkeys(r["encoder"] for r in runs):
        for precision in dict.fromkeys(r["precision"] for r in runs if r["encoder"] == kind):
            rs = [r for r in runs if r["encoder"] == kind and r["precision"] == precision]
            rate = sum(r["pairs_per_s"] * r["train_seconds"] for r in rs) / sum(r["train_seconds"] for r in rs)
            base.setdefault(kind, rate)
            dev, test = [r["dev"] for r in rs], [r["test"] for r in rs]
            lines.append(f"| {kind} | {precision} | {rate:,.1f} | {rate / base[kind]:.2f}x | "
                         f"{' / '.join(f'{v:.2f}' for v in dev)} | {np.mean(dev):.2f} | "
                         f"{' / '.join(f'{v:.2f}' for v in test)} | {np.mean(test):.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="jobs/stsb-1k-bm25.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a job override (repeatable)")
    p.add_argument("--encoders", nargs="+", default=["cross_encoder", "bi_encoder"],
                   choices=["cross_encoder", "bi_encoder"])
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    p.add_argument("--out", default="benchmarks/results/training_precision")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    cfg = load_job(args.job, args.set)
    gold = load_gold(cfg)
    auto = resolve_training_precision("auto", "cpu")
    runs = []
    for seed in args.seeds:
        for kind in args.encoders:
            for precision in args.precisions:
                r = train_once(cfg, gold, kind, precision, seed)
                print(f"[benchmark] {kind} {precision} seed {seed}: {r['pairs_per_s']:.1f} pairs/s, "
                      f"dev {r['dev']:.2f}, test {r['test']:.2f}", flush=True)
                runs.append(r)

    lines = [
        "# Training precision: bf16 mixed precision against fp32",
        "",
        f"Job `{' '.join([args.job, *args.set])}`: {gold['train'].num_rows:,} gold training pairs, the job's "
        f"hyperparameters; each encoder trained by the engine's loop in one process on the CPU "
        f"({torch.get_num_threads()} threads), then scored on dev ({gold['dev'].num_rows:,} pairs) and test "
        f"({gold['test'].num_rows:,}). Seeds {', '.join(map(str, args.seeds))}. `training.precision: auto` "
        f"resolves to {auto} on this machine.",
        "",
        *table(runs, PRIMARY_METRIC[cfg.task]),
        "",
        "Training pairs/s: the loop's pairs over its seconds, summed over the seeds (loading and "
        "scoring excluded).",
        "",
        *provenance("benchmarks/training_precision.py", argv if argv is not None else sys.argv[1:]),
    ]
    print("\n".join(lines))
    write_result(args.out, lines, {"job": args.job, "overrides": args.set, "auto": auto, "runs": runs})
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # the training loop's lines
    sys.exit(main())
