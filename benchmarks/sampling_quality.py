"""Sampling strategies side by side, in the form of the paper's Table 5.

For each dataset job, each bi-encoder seed and each strategy (None = gold only, RS, KDE,
BM25, SS, BM25+SS), runs the job and writes mean +- std of the primary test metric, the
silver set sizes, how far each silver label distribution is from gold's, the teacher
check, and each strategy's silver density plot.

All runs of one job share a run directory, so every stage whose declared inputs and settings
are the same is done once: the cross-encoder once per job, the gold-only bi-encoder once per
seed, and a strategy's candidates and silver labels once for all seeds where they do not
depend on the bi-encoder (SS embeds with the seed's own gold-only model).

    python benchmarks/sampling_quality.py                                  # STSb-1k and MRPC, 3 seeds
    python benchmarks/sampling_quality.py --jobs jobs/stsb-1k-bm25.yaml --seeds 1 2 \\
        --set bi_encoder.num_layers=2 --tag student2                       # a 2-layer student
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from scipy.stats import wasserstein_distance

from augsbert_ray.config import load_job
from augsbert_ray.pipeline import run_job
from augsbert_ray.versions import versions

STRATEGIES = {"None": None, "RS": "rs", "KDE": "kde", "BM25": "bm25", "SS": "ss", "BM25+SS": "bm25+ss"}


def silver_shape(run_dir: Path) -> dict:
    """How the silver label distribution compares with gold's (labels on [0, 1])."""
    gold = pq.read_table(run_dir / "gold" / "train.parquet", columns=["label"]).column(0).to_numpy()
    silver = pq.read_table(run_dir / "silver.parquet", columns=["label"]).column(0).to_numpy()
    return {
        "gold_mean": float(gold.mean()),
        "silver_mean": float(silver.mean()),
        "silver_high": float((silver >= 0.5).mean()),  # share of similar / positive silver pairs
        "wasserstein": float(wasserstein_distance(gold, silver)),
    }


def run_grid(job: str, seeds: list[int], strategies: list[str], extra: list[str], root: Path,
             plots: Path) -> dict:
    """Runs every (seed, strategy) of one job in one run directory; returns metrics per strategy per seed."""
    out: dict[str, dict[int, dict]] = {}
    base = load_job(job, extra)
    # "None" is the gold-only bi-encoder every run reports, so it needs no run of its own.
    sampled = [s for s in strategies if STRATEGIES[s]] or ["BM25"]
    run_dir = root / base.name
    for seed in seeds:
        for label in sampled:
            strategy = STRATEGIES[label]
            cfg = load_job(job, extra + [f"sampling.strategy={strategy}", f"bi_encoder.seed={seed}",
                                         f"run_dir={run_dir}"])
            metrics = run_job(cfg).to_dict()
            metrics["silver_shape"] = silver_shape(run_dir)  # the run's silver set, as just published
            out.setdefault(label, {})[seed] = metrics
            if "None" in strategies and label == sampled[0]:
                out.setdefault("None", {})[seed] = metrics
            plots.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run_dir / "silver_density.png", plots / f"{base.name}-{strategy.replace('+', '-')}.png")
    return {label: out[label] for label in strategies if label in out}


def summarise(grid: dict) -> list[str]:
    first = next(iter(next(iter(grid.values())).values()))
    metric = first["primary_metric"]
    lines = [f"| strategy | test {metric} (mean +- std) | dev {metric} | silver pairs | labelled | "
             "silver mean (gold) | silver >= 0.5 | W1(gold, silver) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, runs in grid.items():
        key = "gold_only" if label == "None" else "augsbert"
        test = np.array([m["scores"][key]["test"][metric] for m in runs.values()])
        dev = np.array([m["scores"][key]["dev"][metric] for m in runs.values()])
        if label == "None":
            lines.append(f"| None (gold only) | {test.mean():.2f} +- {test.std():.2f} | {dev.mean():.2f} | 0 | 0 | | | |")
            continue
        silver = " / ".join(sorted({str(m["sampling"]["silver"]) for m in runs.values()}))
        labelled = " / ".join(sorted({str(m["sampling"]["labelled"]) for m in runs.values()}))
        shape = {k: np.mean([m["silver_shape"][k] for m in runs.values()]) for k in first["silver_shape"]}
        lines.append(f"| {label} | {test.mean():.2f} +- {test.std():.2f} | {dev.mean():.2f} | {silver} | {labelled} | "
                     f"{shape['silver_mean']:.3f} ({shape['gold_mean']:.3f}) | {shape['silver_high']:.1%} | "
                     f"{shape['wasserstein']:.3f} |")
    ce = first["scores"]["cross_encoder"]
    zs = first["scores"]["zero_shot"]
    gap = first["teacher_check"]["gap"]
    seeds = len(next(iter(grid.values())))
    lines += ["", f"Cross-encoder (teacher): test {ce['test'][metric]:.2f}, dev {ce['dev'][metric]:.2f}. "
              f"Zero-shot bi-encoder: test {zs['test'][metric]:.2f}. Teacher - gold-only on dev "
              f"(seed {next(iter(next(iter(grid.values()))))}): {gap:+.2f}. Mean +- std over {seeds} bi-encoder seeds.",
              "W1 is the Wasserstein-1 distance between the gold and silver label distributions."]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", nargs="+", default=["jobs/stsb-1k-bm25.yaml", "jobs/mrpc-bm25.yaml"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--tag", default="", help="names this setting in the run and result paths")
    p.add_argument("--root", default="runs/sampling-quality")
    p.add_argument("--results", default="benchmarks/results")
    args = p.parse_args(argv)

    stem = "sampling_quality" + (f"_{args.tag}" if args.tag else "")
    results = Path(args.results)
    root = Path(args.root) / (args.tag or "default")
    lines = ["# Sampling strategies side by side (Table 5 form)", ""]
    raw = {}
    for job in args.jobs:
        grid = run_grid(job, args.seeds, args.strategies, args.extra, root, results / stem)
        raw[job] = {label: {str(s): m for s, m in runs.items()} for label, runs in grid.items()}
        lines += [f"## {job}", "", *summarise(grid), ""]
    cmd = " ".join(["python benchmarks/sampling_quality.py", "--jobs", *args.jobs, "--seeds", *map(str, args.seeds),
                    *[f"--set {e}" for e in args.extra], *(["--tag", args.tag] if args.tag else [])])
    v = versions()
    lines += [f"Command: `{cmd}`", "", f"Density plots: `{results / stem}/`.", "",
              f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, no GPU. "
              "Versions: " + ", ".join(f"{k} {v[k]}" for k in v) + ".",
              f"Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", ""]
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{stem}.md").write_text("\n".join(lines), encoding="utf-8")
    (results / f"{stem}.json").write_text(json.dumps(raw, indent=2, default=str), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
