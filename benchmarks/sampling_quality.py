"""Sampling strategies side by side, in the form of the paper's Table 5.

For each dataset job and each strategy (None = gold only, RS, KDE, BM25, SS, BM25+SS) and
each bi-encoder seed, runs the job (the cross-encoder and other finished stages are
reused between runs) and writes mean +- std of the primary test metric, the silver set
sizes, the teacher check, and each run's silver density plot.

    python benchmarks/sampling_quality.py                                  # STSb-1k and MRPC, 3 seeds
    python benchmarks/sampling_quality.py --jobs jobs/stsb-1k-bm25.yaml --seeds 1 2 \\
        --set bi_encoder.num_layers=2                                      # a 2-layer student
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
from augsbert_ray.pipeline import run_job

STRATEGIES = {"None": None, "RS": "rs", "KDE": "kde", "BM25": "bm25", "SS": "ss", "BM25+SS": "bm25+ss"}


def run_grid(job: str, seeds: list[int], strategies: list[str], extra: list[str], root: Path) -> dict:
    """Runs every (strategy, seed) of one job; returns metrics per strategy per seed."""
    out: dict[str, dict[int, dict]] = {}
    base = load_job(job, extra)
    for label in strategies:
        # "None" is the gold-only bi-encoder every run reports, so BM25 runs supply it.
        strategy = STRATEGIES[label] or "bm25"
        for seed in seeds:
            cfg = load_job(job, extra + [
                f"sampling.strategy={strategy}", f"bi_encoder.seed={seed}",
                # one directory per strategy: the teacher is reused through identical fingerprints
                f"run_dir={root / base.name / strategy.replace('+', '-')}",
            ])
            out.setdefault(label, {})[seed] = run_job(cfg)
    return out


def summarise(grid: dict) -> list[str]:
    first = next(iter(next(iter(grid.values())).values()))
    metric = first["primary_metric"]
    lines = [f"| strategy | test {metric} (mean +- std) | dev {metric} | silver pairs | teacher - gold-only (dev) |",
             "|---|---:|---:|---:|---:|"]
    for label, runs in grid.items():
        key = "gold_only" if label == "None" else "augsbert"
        test = np.array([m["scores"][key]["test"][metric] for m in runs.values()])
        dev = np.array([m["scores"][key]["dev"][metric] for m in runs.values()])
        silver = "0" if label == "None" else " / ".join(sorted({str(m["sampling"]["silver"]) for m in runs.values()}))
        gap = np.mean([m["teacher_check"]["gap"] for m in runs.values()])
        lines.append(f"| {label} | {test.mean():.2f} +- {test.std():.2f} | {dev.mean():.2f} | {silver} | {gap:+.2f} |")
    ce = first["scores"]["cross_encoder"]["test"][metric]
    zs = first["scores"]["zero_shot"]["test"][metric]
    lines += ["", f"Cross-encoder (teacher) test {metric}: {ce:.2f}; zero-shot bi-encoder: {zs:.2f}."]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", nargs="+", default=["jobs/stsb-1k-bm25.yaml", "jobs/mrpc-bm25.yaml"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--root", default="runs/sampling-quality")
    p.add_argument("--out", default="benchmarks/results/sampling_quality.md")
    args = p.parse_args(argv)

    lines = ["# Sampling strategies side by side (Table 5 form)", ""]
    raw = {}
    for job in args.jobs:
        grid = run_grid(job, args.seeds, args.strategies, args.extra, Path(args.root))
        raw[job] = {label: {str(s): m for s, m in runs.items()} for label, runs in grid.items()}
        lines += [f"## {job}", "", *summarise(grid), ""]
    cmd = " ".join(["python benchmarks/sampling_quality.py", "--jobs", *args.jobs, "--seeds", *map(str, args.seeds),
                    *[f"--set {e}" for e in args.extra]])
    lines += [f"Command: `{cmd}`", "",
              f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
              f"written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(raw, indent=2), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
