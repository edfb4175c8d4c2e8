"""The run report: ``metrics.json`` for programs and ``summary.md`` for people."""

from __future__ import annotations

import json
import platform

from augsbert_ray.rundir import RunDir

BASELINE_ROWS = [("majority", "Majority label"), ("jaccard", "Jaccard word overlap")]
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
        f"{metric} x100 of the model's similarity vs gold labels"
        + (" (binary: threshold chosen on dev, applied to test)." if metrics.get("task") == "binary" else "."),
        "",
        "| model | dev | test |",
        "|---|---:|---:|",
    ]
    baselines = metrics.get("baselines", {})
    for key, title in BASELINE_ROWS:
        if key in baselines:
            s = baselines[key]
            lines.append(f"| {title} | {s['dev'][metric]:.2f} | {s['test'][metric]:.2f} |")
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
    if d.get("dev_carved"):
        lines.append(f"Dev split carved from train: {d['dev_carved']}.")
    lines += [
        "",
        f"Gold pairs: train {d['train']}, dev {d['dev']}, test {d['test']}; skipped malformed rows: {d['skipped_rows']}.",
        f"Candidates: {metrics['sampling']['candidates']}; labelled: {metrics['sampling'].get('labelled', metrics['sampling']['silver'])}; "
        f"silver pairs used: {metrics['sampling']['silver']} (density plot: silver_density.png).",
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


def write_density_plot(path, gold_labels, silver_labels, title: str) -> None:
    """Density of gold vs silver labels (the paper's Figure 4), as a PNG.

    The silver distribution explains most of a strategy's result: labels far from
    gold's distribution (random pairs are mostly dissimilar) teach the wrong prior.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    bins = np.linspace(0, 1, 21)
    ax.hist(gold_labels, bins=bins, density=True, alpha=0.55, label=f"gold (n={len(gold_labels)})")
    if len(silver_labels):
        ax.hist(silver_labels, bins=bins, density=True, alpha=0.55, label=f"silver (n={len(silver_labels)})")
    ax.set_xlabel("label (scaled to [0, 1])")
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(rd: RunDir, metrics: dict) -> None:
    rd.write_text("metrics.json", json.dumps(metrics, indent=2))
    rd.write_text("summary.md", summary_markdown(metrics))
