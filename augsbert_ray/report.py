"""The run report: ``metrics.json`` for programs and ``summary.md`` for people."""

from __future__ import annotations

import json
import platform

from augsbert_ray.rundir import RunDir

MODEL_ROWS = [
    ("zero_shot", "Zero-shot bi-encoder"),
    ("gold_only", "Bi-encoder, gold only"),
    ("cross_encoder", "Cross-encoder (teacher)"),
    ("augsbert", "AugSBERT bi-encoder (gold + silver)"),
]


def versions() -> dict:
    import pyarrow
    import ray
    import sentence_transformers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "pyarrow": pyarrow.__version__,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }


def summary_markdown(metrics: dict) -> str:
    scores = metrics["scores"]
    metric = metrics["primary_metric"]
    lines = [
        f"# {metrics['job']}: AugSBERT ({metrics['sampling']['strategy']})",
        "",
        f"{metric} x100 of the model's similarity vs gold labels.",
        "",
        "| model | dev | test |",
        "|---|---:|---:|",
    ]
    for key, title in MODEL_ROWS:
        if key in scores:
            s = scores[key]
            lines.append(f"| {title} | {s['dev'][metric]:.2f} | {s['test'][metric]:.2f} |")
    if "augsbert" in scores and "gold_only" in scores:
        gain = scores["augsbert"]["test"][metric] - scores["gold_only"]["test"][metric]
        lines += ["", f"AugSBERT vs gold-only on test: {gain:+.2f} points."]
    tc = metrics.get("teacher_check")
    if tc:
        lines.append(
            f"Teacher check (dev): cross-encoder {tc['cross_encoder_dev']:.2f} vs gold-only bi-encoder "
            f"{tc['gold_only_dev']:.2f} ({tc['gap']:+.2f})."
        )
    d = metrics["data"]
    lines += [
        "",
        f"Gold pairs: train {d['train']}, dev {d['dev']}, test {d['test']}; skipped malformed rows: {d['skipped_rows']}.",
        f"Candidates: {metrics['sampling']['candidates']}; silver pairs: {metrics['sampling']['silver']}.",
        "",
        "| stage | seconds |",
        "|---|---:|",
    ]
    reused = set(metrics.get("stages_reused", []))
    lines += [
        f"| {name} | {sec:.1f}{' (earlier run)' if name in reused else ''} |"
        for name, sec in metrics["stage_seconds"].items()
    ]
    return "\n".join(lines) + "\n"


def write_report(rd: RunDir, metrics: dict) -> None:
    rd.write_text("metrics.json", json.dumps(metrics, indent=2))
    rd.write_text("summary.md", summary_markdown(metrics))
