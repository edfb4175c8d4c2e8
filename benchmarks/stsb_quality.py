"""Quality of AugSBERT-BM25 on the STS benchmark: zero-shot, gold-only, cross-encoder, AugSBERT.

Runs each job (stages already completed in its run directory are reused, so re-running
only rebuilds the table) and writes a Markdown table with the machine, versions and the
command to ``benchmarks/results/stsb_bm25.md`` (and the raw metrics beside it as JSON).

    python benchmarks/stsb_quality.py                      # full STSb job + 1,000-pair job
    python benchmarks/stsb_quality.py --jobs jobs/smoke.yaml --out /tmp/smoke.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from augsbert_ray.config import load_job
from augsbert_ray.pipeline import run_job
from provenance import cpu_description

ROWS = [("zero_shot", "Zero-shot bi-encoder"), ("gold_only", "Bi-encoder, gold only (SBERT)"),
        ("cross_encoder", "Cross-encoder (teacher)"), ("augsbert", "AugSBERT-BM25 bi-encoder")]


def table(results: list[tuple[str, dict]]) -> list[str]:
    lines = ["| model | " + " | ".join(f"{name} dev | {name} test" for name, _ in results) + " |",
             "|---|" + "---:|---:|" * len(results)]
    for key, title in ROWS:
        cells = []
        for _, m in results:
            s = m["scores"].get(key)
            cells += [f"{s['dev']['spearman']:.2f}", f"{s['test']['spearman']:.2f}"] if s else ["-", "-"]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", nargs="+", default=["jobs/stsb-bm25.yaml", "jobs/stsb-1k-bm25.yaml"])
    p.add_argument("--out", default="benchmarks/results/stsb_bm25.md")
    args = p.parse_args(argv)

    results = []
    for job in args.jobs:
        cfg = load_job(job)
        results.append((cfg.name, run_job(cfg).to_dict()))
    v = results[0][1]["versions"]
    lines = [
        "# AugSBERT-BM25 on the STS benchmark",
        "",
        "Spearman x100 between cosine similarity (cross-encoder: its score) and the gold scores.",
        "",
        *table(results),
        "",
        "| | " + " | ".join(name for name, _ in results) + " |",
        "|---|" + "---|" * len(results),
        "| gold train pairs | " + " | ".join(str(m["data"]["train"]) for _, m in results) + " |",
        "| BM25 candidates = silver pairs | " + " | ".join(str(m["sampling"]["silver"]) for _, m in results) + " |",
        "| mean silver label | " + " | ".join(f"{m['sampling']['silver_label_mean']:.3f}" for _, m in results) + " |",
        "| teacher - gold-only on dev | " + " | ".join(f"{m['teacher_check']['gap']:+.2f}" for _, m in results) + " |",
        "| AugSBERT - gold-only on test | " + " | ".join(
            f"{m['scores']['augsbert']['test']['spearman'] - m['scores']['gold_only']['test']['spearman']:+.2f}"
            for _, m in results) + " |",
        "| labelling pairs/s | " + " | ".join(f"{m['sampling']['labeling_pairs_per_s']:.0f}" for _, m in results) + " |",
        "| wall time of all stages, s | " + " | ".join(f"{sum(m['stage_seconds'].values()):.0f}" for _, m in results) + " |",
        "",
        f"Command: `python benchmarks/stsb_quality.py --jobs {' '.join(args.jobs)}`",
        "(each job is also `augsbert run JOB`; completed stages are reused).",
        "",
        f"Machine: {cpu_description()}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}; no GPU."
        if not results[0][1]["cluster"]["gpus"] else f"Machine: {cpu_description()}, GPUs: {results[0][1]['cluster']['gpus']:g}",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "machine") + ".",
        f"Written: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({name: m for name, m in results}, indent=2), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
