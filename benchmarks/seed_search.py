"""Seed search on STSb: best-of-N seeds vs a single seed, and what pruning at 20% costs and saves.

Runs the bi-encoder seed search of a job in audit mode (every seed trained to the end,
so the pruned seeds' final scores are known), then scores every seed's final model on
test. Prints and saves: the chosen model's test score against single seeds (mean, best,
worst), the Spearman rank correlation between the dev ranking at the pruning point and
at the end (the paper's Appendix D), whether the early pick was the final best, and the
training steps and seconds of the search against training every seed.

    python benchmarks/seed_search.py                                    # STSb 1,000 gold pairs, 5 seeds
    python benchmarks/seed_search.py --job jobs/stsb-bm25.yaml --set bi_encoder.num_layers=2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from augsbert_ray.config import load_job
from augsbert_ray.evaluation import PRIMARY_METRIC, bi_encoder_predictions, task_metrics
from augsbert_ray.models import load_bi_encoder, resolve_model
from augsbert_ray.versions import versions
from augsbert_ray.runtime import per_worker_cpus, start_ray
from augsbert_ray.schema import PAIR_COLUMNS
from augsbert_ray.loaders.job_inputs import load_gold
from augsbert_ray.training.fit import hparams
from augsbert_ray.training.ray_trainer import MODEL_DIR
from augsbert_ray.training.seed_search import SearchPlan, seed_search


def run(job_path: str, extra: list[str], seeds: int, keep: int, prune_at: float, root: Path) -> dict:
    cfg = load_job(job_path, extra)
    gold = load_gold(cfg)
    cluster = start_ray(cfg.ray.address, cfg.ray.num_cpus)
    metric = PRIMARY_METRIC[cfg.task]
    b = cfg.bi_encoder
    hp = hparams(b, cfg.seed, cfg.training)
    seed_list = [hp["seed"] + i for i in range(seeds)]
    plan = SearchPlan(seeds=seed_list, keep=keep, prune_at=prune_at, audit=True,
                      cpus_per_trial=per_worker_cpus(None, cluster.cpus, seeds))
    rec = seed_search("bi_encoder", gold["train"].select(PAIR_COLUMNS), gold["dev"], task=cfg.task, metric=metric,
                      recipe={"model": resolve_model(b.model), "max_length": b.max_length, "num_layers": b.num_layers,
                              "objective": b.resolved_objective(cfg.task)},
                      hparams=hp, plan=plan, storage_dir=(root / cfg.name / "ray_tune").absolute(), out_dir=root / cfg.name / "chosen",
                      name="seed-search", eval_batch_size=cfg.evaluation.batch_size)
    splits = {s: gold[s].select(PAIR_COLUMNS) for s in ("dev", "test")}
    for t in rec["trials"]:
        st = load_bi_encoder(os.path.join(t["checkpoint"], MODEL_DIR), b.max_length)
        t["scores"] = task_metrics(cfg.task, bi_encoder_predictions(st, splits, cfg.evaluation.batch_size), splits)
    rec["job"], rec["overrides"], rec["metric"] = cfg.name, extra, metric
    return rec


def summarise(rec: dict) -> list[str]:
    m = rec["metric"]
    test = {t["seed"]: t["scores"]["test"][m] for t in rec["trials"]}
    dev = {t["seed"]: t["scores"]["dev"][m] for t in rec["trials"]}
    values = np.array(list(test.values()))
    chosen = rec["chosen_seed"]
    a, c = rec["audit_result"], rec["cost"]
    prune = rec["prune_step"]
    rows = [f"### {rec['job']} {' '.join(rec['overrides'])}".rstrip(), "",
            f"| seed | dev {m} at step {prune} | dev {m} at the end ({rec['total_steps']} steps) | test {m} | |",
            "|---:|---:|---:|---:|---|"]
    for t in rec["trials"]:
        early = next(score for step, score in t["curve"] if step == prune)
        mark = "chosen" if t["seed"] == chosen else ("kept" if t["status"] == "continued" else "pruned")
        rows.append(f"| {t['seed']} | {early:.2f} | {dev[t['seed']]:.2f} | {test[t['seed']]:.2f} | {mark} |")
    rows += [
        "",
        f"- Seed search (keep {rec['keep']} of {len(rec['seeds'])} at {prune}/{rec['total_steps']} steps): test {test[chosen]:.2f}; "
        f"a single seed: mean {values.mean():.2f} +- {values.std():.2f}, best {values.max():.2f}, worst {values.min():.2f} "
        f"(spread {values.max() - values.min():.2f}).",
        f"- Rank correlation (Spearman) of the dev ranking at step {prune} and at the end: "
        + ("n/a" if a["rank_correlation"] is None else f"{a['rank_correlation']:.2f}")
        + f"; the early pick (seed {a['pick_at_prune']}) " + ("was" if a["pick_is_best"] else f"was not (seed {a['best_at_end']} was)")
        + " the best on dev at the end.",
        f"- Cost: the search trains {c['search_steps']} steps against {c['all_seeds_steps']} for every seed "
        f"({c['search_fraction']:.0%}); measured {c['seconds_per_step']:.2f} s per step, so about "
        f"{c['search_steps'] * c['seconds_per_step']:.0f} s against {c['all_seeds_seconds_estimate']:.0f} s of training "
        f"(this audit ran all {c['steps_run']} steps in {c['wall_seconds']:.0f} s wall, evaluations included).",
        "",
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", action="append", dest="jobs", help="job file (repeatable); default jobs/stsb-1k-bm25.yaml")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--keep", type=int, default=1)
    p.add_argument("--prune-at", type=float, default=0.2)
    p.add_argument("--root", type=Path, default=Path("runs/seed-search"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/seed_search.md"))
    args = p.parse_args(argv)
    jobs = args.jobs or ["jobs/stsb-1k-bm25.yaml"]
    records = [run(j, args.extra, args.seeds, args.keep, args.prune_at, args.root) for j in jobs]
    lines = ["# Seed search: best of N seeds, pruned at 20% of the steps", ""]
    for rec in records:
        lines += summarise(rec)
    v = versions()
    cmd = " ".join(["python benchmarks/seed_search.py", *[f"--job {j}" for j in jobs], *[f"--set {e}" for e in args.extra],
                    f"--seeds {args.seeds} --keep {args.keep} --prune-at {args.prune_at}"])
    lines += [f"Command: `{cmd}`", "",
              f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, no GPU. Versions: "
              + ", ".join(f"{k} {v[k]}" for k in v) + f". Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(records, indent=2, default=str), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
