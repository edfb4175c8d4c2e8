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
    """Versions of the libraries a result depends on ("absent" for one not installed)."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("ray", "torch", "transformers", "sentence-transformers", "pyarrow"):
        try:
            out[name.replace("-", "_")] = md.version(name)
        except md.PackageNotFoundError:
            out[name.replace("-", "_")] = "absent"
    out["machine"] = f"{platform.machine()} {platform.processor() or ''}".strip()
    return out


def cpu_description() -> str:
    """The CPU's model and the matrix instructions torch uses on it, e.g. "AMD EPYC (AVX512, bf16
    instructions)": the same job runs at very different speeds with and without them."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        import torch

        from augsbert_ray.scoring import cpu_has_bf16

        isa = torch.backends.cpu.get_cpu_capability()
        return f"{model} ({isa}, {'bf16 instructions' if cpu_has_bf16() else 'no bf16 instructions'})"
    except Exception:  # torch absent or without the probe
        return model


def provenance(script: str, argv: list[str] | None, machine: str = "", extra: str = "") -> list[str]:
    """A benchmark result's closing lines: the command, the machine, the versions and the time.

    Args:
        script: the program, e.g. ``benchmarks/bm25_speed.py``.
        argv: its arguments (None: ``sys.argv[1:]``).
        machine: what to add to the machine's description (a GPU's name).
        extra: versions of other libraries, e.g. ``", faiss 1.9"``.
    """
    import os
    import sys
    from datetime import datetime, timezone

    v = versions()
    return [f"Command: `python {script} {' '.join(sys.argv[1:] if argv is None else argv)}`".rstrip("` ") + "`",
            f"Machine: {platform.machine()}, {cpu_description()}, {os.cpu_count()} cores"
            f"{', ' + machine if machine else ''}. Versions: "
            + ", ".join(f"{k} {v[k]}" for k in v) + f"{extra}.",
            f"Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", ""]


def write_result(out, lines: list[str], data: dict) -> None:
    """Writes a benchmark's table (``out``.md) and its figures with the versions (``out``.json)."""
    from pathlib import Path

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({**data, "versions": versions()}, indent=2, default=str))


def summary_markdown(metrics: dict) -> str:
    scores = metrics["scores"]
    metric = metrics["primary_metric"]
    lines = [
        f"# {metrics['job']}: AugSBERT ({metrics['sampling']['strategy']})",
        "",
        f"{metric} x100 of the model's similarity vs gold labels"
        + (" (binary: threshold chosen on dev, applied to test)." if metrics.get("task") == "binary" else "."),
        "",
        "| model | dev | test |" + (" test AUC(0.05) |" if metrics.get("task") == "binary" else ""),
        "|---|---:|---:|" + ("---:|" if metrics.get("task") == "binary" else ""),
    ]

    def row(title: str, s: dict) -> str:
        line = f"| {title} | {s['dev'][metric]:.2f} | {s['test'][metric]:.2f} |"
        if metrics.get("task") == "binary":
            auc = s["test"].get("auc_0.05")
            line += f" {auc:.2f} |" if auc is not None else " |"
        return line

    baselines = metrics.get("baselines", {})
    for key, title in BASELINE_ROWS:
        if key in baselines:
            lines.append(row(title, baselines[key]))
    for key, title in MODEL_ROWS:
        if key in scores:
            lines.append(row(title, scores[key]))
    if "augsbert" in scores and "gold_only" in scores:
        gain = scores["augsbert"]["test"][metric] - scores["gold_only"]["test"][metric]
        lines += ["", f"AugSBERT vs gold-only on test: {gain:+.2f} points."]
    if metrics.get("target"):
        lines += ["", *target_markdown(metrics)]
    tc = metrics.get("teacher_check")
    if tc:
        lines.append(
            f"Teacher check (dev): cross-encoder {tc['cross_encoder_dev']:.2f} vs gold-only bi-encoder "
            f"{tc['gold_only_dev']:.2f} ({tc['gap']:+.2f})."
        )
    for stage, rec in metrics.get("seed_search", {}).items():
        lines += ["", *seed_search_markdown(stage, rec, metric)]
    d = metrics["data"]
    if d.get("dev_carved"):
        lines.append(f"Dev split carved from train: {d['dev_carved']}.")
    lines += [
        "",
        f"Gold pairs: train {d['train']}, dev {d['dev']}, test {d['test']}; skipped malformed rows: {d['skipped_rows']}.",
        f"Candidates: {metrics['sampling']['candidates']}; labelled: {metrics['sampling'].get('labelled', metrics['sampling']['silver'])}; "
        f"silver pairs used: {metrics['sampling']['silver']} (density plot: silver_density.png).",
        "",
        "| stage | seconds | throughput |",
        "|---|---:|---|",
    ]
    reused = set(metrics.get("stages_reused", []))
    rates = metrics.get("stage_throughput", {})
    lines += [
        f"| {name} | {sec:.1f}{' (earlier run)' if name in reused else ''} | {rates.get(name, '')} |"
        for name, sec in metrics["stage_seconds"].items()
    ]
    c = metrics.get("cluster")
    if c:
        lines += ["", f"Ray cluster: {c.get('nodes', 1)} node(s), {c['cpus']:g} CPUs, {c['gpus']:g} GPUs"
                  + (f", {c['memory_gb']:.1f} GiB memory, {c['object_store_gb']:.1f} GiB object store" if "memory_gb" in c else "")
                  + f". Run directory: {metrics.get('run_dir', '')}."]
    return "\n".join(lines) + "\n"


def seed_search_markdown(stage: str, rec: dict, metric: str) -> list[str]:
    """A seed search's trials, its choice, its cost, and (audit mode) how well the early ranking held."""
    prune, total = rec["prune_step"], rec["total_steps"]
    lines = [
        f"Seed search for {stage.replace('_', ' ')}: {len(rec['seeds'])} seeds scored on dev at step {prune} of "
        f"{total}, best {rec['keep']} continued ({rec['scheduler']}{', audit' if rec['audit'] else ''}); "
        f"chose seed {rec['chosen_seed']}.",
        "",
        f"| seed | dev {metric} at step {prune} | dev {metric} at the end | steps | status |",
        "|---:|---:|---:|---:|---|",
    ]
    for t in rec["trials"]:
        early = next(score for step, score in t["curve"] if step == prune)
        end = f"{t['curve'][-1][1]:.2f}" if t["steps"] == total else ""
        lines.append(f"| {t['seed']} | {early:.2f} | {end} | {t['steps']} | {t['status']} |")
    c = rec["cost"]
    lines += ["", f"Cost: {c['search_steps']} training steps against {c['all_seeds_steps']} for training every "
              f"seed to the end ({c['search_fraction']:.0%}); {c['train_seconds']:.0f} s of training ran "
              f"({c['wall_seconds']:.0f} s wall), about {c['all_seeds_seconds_estimate']:.0f} s for every seed."]
    audit = rec.get("audit_result")
    if audit:
        rho = "n/a" if audit["rank_correlation"] is None else f"{audit['rank_correlation']:.2f}"
        lines.append(f"Audit: Spearman rank correlation of the step-{prune} and final dev rankings {rho}; the "
                     f"step-{prune} pick (seed {audit['pick_at_prune']}) "
                     + ("is" if audit["pick_is_best"] else f"is not (seed {audit['best_at_end']} is)")
                     + " the best at the end.")
    return lines


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


TARGET_ROWS = [
    ("target_gold", "Upper bound: bi-encoder on target gold"),
    ("augsbert", "AugSBERT: bi-encoder on target silver"),
    ("gold_only", "Lower bound: bi-encoder on source gold"),
    ("zero_shot", "Zero-shot bi-encoder"),
    ("cross_encoder", "Cross-encoder (teacher, source gold)"),
]


def target_markdown(metrics: dict) -> list[str]:
    """Domain adaptation in the form of the paper's Table 6: every reference on the target test set."""
    t = metrics["target"]
    m = t["metric"]
    name = "AUC(0.05)" if m == "auc_0.05" else m
    data = t["data"]
    lines = [
        "## Domain adaptation (target test set)",
        "",
        f"Target task: {t['task']}; {name} x100 on {data['test']['pairs']} target test pairs. Silver: "
        + (f"{data['pairs']['pairs']} target pairs" if "pairs" in data else
           f"{metrics['sampling']['silver']} {metrics['sampling']['strategy']} pairs of "
           f"{metrics['sampling']['sentences']} target corpus sentences")
        + " labelled by the cross-encoder"
        + (" and mixed with the source gold." if t["mix_source_gold"] else " (target silver only)."),
        "",
        f"| model | target test {name} |",
        "|---|---:|",
    ]
    scores = metrics["scores"]
    for key, title in TARGET_ROWS:
        if key in scores and "target_test" in scores[key]:
            title = title.replace("target silver", "source gold + target silver") if (
                key == "augsbert" and t["mix_source_gold"]) else title
            lines.append(f"| {title} | {scores[key]['target_test'][m]:.2f} |")
    jac = metrics.get("baselines", {}).get("jaccard", {}).get("target_test")
    if jac:
        lines.append(f"| Jaccard word overlap | {jac[m]:.2f} |")
    if "target_gold" not in scores:
        lines += ["", "No upper bound: the target pairs have no labels (or target.upper_bound is off)."
                  if "pairs" in data else "No upper bound: a target corpus has no labels."]
    corpus = t.get("candidates", {}).get("corpus_lines")
    if corpus:
        lines += ["", f"Target corpus: {corpus['lines']:,} lines read; {corpus['empty']:,} empty, "
                  f"{corpus['too_long']:,} too long and {corpus['bad']:,} bad left out, {corpus['truncated']:,} "
                  f"truncated, {corpus['duplicates']:,} repeats; {corpus['sentences']:,} sentences"
                  + (f" (a seeded sample of {corpus['distinct']:,})." if corpus["sampled_out"] else ".")]
    return lines
