"""The run report: ``metrics.json`` for programs and ``summary.md`` for people."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

from augsbert_ray.metrics import RunMetrics, StageRecord
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


def summary_markdown(metrics: RunMetrics | dict) -> str:
    """The run's summary for people: the scores table, the teacher check, data and stage times."""
    if isinstance(metrics, RunMetrics):
        metrics = metrics.to_dict()
    scores = metrics["scores"]
    metric = metrics["primary_metric"]
    sampling = metrics.get("sampling") or {}
    lines = [
        f"# {metrics['job']}: AugSBERT ({sampling.get('strategy', 'no candidates yet')})"
        + ("" if metrics.get("complete", True) else " (unfinished run)"),
        "",
        f"{metric} x100 of the model's similarity vs gold labels"
        + (" (binary: threshold chosen on dev, applied to test)." if metrics.get("task") == "binary" else "."),
        "",
        "| model | dev | test |" + (" test AUC(0.05) |" if metrics.get("task") == "binary" else ""),
        "|---|---:|---:|" + ("---:|" if metrics.get("task") == "binary" else ""),
    ]

    def row(title: str, s: dict) -> str:
        cell = lambda split: f"{s[split][metric]:.2f}" if split in s else ""  # noqa: E731
        line = f"| {title} | {cell('dev')} | {cell('test')} |"
        if metrics.get("task") == "binary":
            auc = s.get("test", {}).get("auc_0.05")
            line += f" {auc:.2f} |" if auc is not None else " |"
        return line

    baselines = metrics.get("baselines", {})
    for key, title in BASELINE_ROWS:
        if key in baselines:
            lines.append(row(title, baselines[key]))
    for key, title in MODEL_ROWS:
        if key in scores and ("dev" in scores[key] or "test" in scores[key]):
            lines.append(row(title, scores[key]))
    if "augsbert" in scores and "gold_only" in scores and "test" in scores["augsbert"]:
        gain = scores["augsbert"]["test"][metric] - scores["gold_only"]["test"][metric]
        lines += ["", f"AugSBERT vs gold-only on test: {gain:+.2f} points."]
    if metrics.get("target") and "test" in metrics["target"]["data"]:  # once the target sets are loaded
        lines += ["", *target_markdown(metrics)]
    tc = metrics.get("teacher_check")
    if tc:
        lines.append(
            f"Teacher check (dev): cross-encoder {tc['cross_encoder_dev']:.2f} vs gold-only bi-encoder "
            f"{tc['gold_only_dev']:.2f} ({tc['gap']:+.2f})."
        )
    pilot = metrics.get("pilot")
    if pilot:
        verdict = pilot.get("verdict") or {True: "the silver labels help", False: "the silver labels do not help",
                                           None: "no prediction"}[pilot["predicts_silver_helps"]]
        arms = pilot.get("scores") or {k: v["dev"] for k, v in pilot["pilots"].items()}
        scores = ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a" for k, v in arms.items())
        lines.append(f"Pilot (the student after {pilot['fraction']:.0%} of its steps, {metric} on "
                     f"{pilot.get('scored_on', 'dev')}): {scores}: {verdict}.")
    shipped = metrics.get("shipped")
    if shipped:
        which = "AugSBERT" if shipped["shipped"] == "augsbert" else "gold-only"
        lines.append(f"Shipped as models/bi-encoder: the {which} bi-encoder ({shipped['why']}).")
    if metrics.get("calibration"):
        lines += ["", *calibration_markdown(metrics["calibration"])]
    if metrics.get("auto"):
        lines += ["", *auto_markdown(metrics["auto"])]
    for stage, rec in metrics.get("seed_search", {}).items():
        lines += ["", *seed_search_markdown(stage, rec, metric)]
    d = metrics["data"]
    if d.get("dev_carved"):
        lines.append(f"Dev split carved from train: {d['dev_carved']}.")
    lines += ["", f"Gold pairs: train {d['train']}, dev {d['dev']}, test {d['test']}; skipped malformed rows: "
              f"{d.get('skipped_rows', 0)}."]
    if "silver" in sampling:
        lines.append(f"Candidates: {sampling['candidates']}; labelled: {sampling.get('labelled', sampling['silver'])}; "
                     f"silver pairs used: {sampling['silver']} (density plot: silver_density.png).")
    lines += ["", "| stage | seconds | fixed cost, s | throughput |", "|---|---:|---:|---|"]
    reused = set(metrics.get("stages_reused", []))
    rates = metrics.get("stage_throughput", {})
    fixed = {s["name"]: s.get("fixed_seconds") for s in metrics.get("stages", [])}
    lines += [
        f"| {name} | {sec:.1f}{' (earlier run)' if name in reused else ''} | "
        f"{'' if fixed.get(name) is None else format(fixed[name], '.1f')} | {rates.get(name, '')} |"
        for name, sec in metrics["stage_seconds"].items()
    ]
    lines += ["", "Fixed cost: the part of a stage's time that does not grow with its work: for training, "
              "everything outside the training loop (starting Ray Train's workers, loading the model and the "
              "pairs, checkpoints, exporting the model); for labelling, the time to the first labelled shard "
              "(starting the actors, loading the model)."]
    lines += unfinished_markdown(metrics)
    c = metrics.get("cluster")
    if not c:
        if not metrics.get("complete", True):
            why = "Ray had not started when this report was written"
        elif all(s.get("reused") for s in metrics.get("stages", [])):
            why = "Ray was not started: every stage was done by an earlier run"
        else:
            why = "Ray was not started: no stage that ran needed it"
        lines += ["", f"{why}. Run directory: {metrics.get('run_dir', '')}."]
    else:
        lines += ["", f"Ray cluster: {c.get('nodes', 1)} node(s), {c['cpus']:g} CPUs, {c['gpus']:g} GPUs"
                  + (f", {c['memory_gb']:.1f} GiB memory, {c['object_store_gb']:.1f} GiB object store" if "memory_gb" in c else "")
                  + f". Run directory: {metrics.get('run_dir', '')}."]
    return "\n".join(lines) + "\n"


def unfinished_markdown(metrics: dict) -> list[str]:
    """For a run that has not finished: the stages done and those not done (nothing otherwise)."""
    if metrics.get("complete", True):
        return []
    done = [s["name"] for s in metrics.get("stages", [])]
    left = [name for name in metrics.get("stages_planned", []) if name not in done]
    of = f" of {len(done) + len(left)}" if left else ""
    return ["", f"Unfinished run: {len(done)}{of} stages done" + (f"; not done: {', '.join(left)}" if left else "")
            + ". It failed, was stopped, or is still running (its logs/job.log says which); running the job again "
              "resumes it."]


def calibration_markdown(c: dict) -> list[str]:
    """The silver labels before and after their map to the gold scale, beside gold dev's."""
    bins = [f"{i / 10:.1f}-{(i + 1) / 10:.1f}" for i in range(10)]
    row = lambda name, d: (f"| {name} | {d['mean']:.3f} | {d['std']:.3f} | "  # noqa: E731
                           + " | ".join(f"{100 * n / max(1, sum(d['hist'])):.0f}%" for n in d["hist"]) + " |")
    return [f"Silver labels calibrated ({c['method']}, fitted on {c['dev_pairs']} dev pairs' teacher scores and gold "
            "labels); label distribution:", "",
            "| labels | mean | std | " + " | ".join(bins) + " |", "|---|---:|---:|" + "---:|" * len(bins),
            row("silver as the teacher scored them", c["before"]), row("silver calibrated", c["after"]),
            row("gold (dev)", c["gold_dev"])]


def auto_markdown(a: dict) -> list[str]:
    """The autopilot's settings: each one's teacher, labels, pilot score, cost and fate."""
    m = a["metric"]
    lines = [f"Autopilot: {len(a['settings'])} settings, pilots of {a['pilot_fraction']:.0%} of the student's steps "
             f"scored on dev ({m}); gold only: "
             + (f"{a['gold_only_pilot_dev']:.2f}" if a["gold_only_pilot_dev"] is not None else "n/a")
             + f". Chose {a['chosen']}" + (f": {a['why']}" if a.get("why") else "")
             + f"; {a['seconds']:.0f} s of the {a['budget_minutes']:g}-minute budget."
             + (f" Best silver pilot against gold only: {a['pilot_verdict']}." if a.get("pilot_verdict") else ""), "",
             f"| setting | teacher dev {m} | silver pairs | pilot dev {m} | cost, s | fate |",
             "|---|---:|---:|---:|---:|---|"]
    for r in a["settings"]:
        teacher = r.get("teacher_dev", {}).get(m)
        own = " (the job's own)" if r.get("job_setting") else ""
        lines.append(f"| {r['setting']}{own} | {'' if teacher is None else f'{teacher:.2f}'} | {r.get('silver', '')} | "
                     f"{'' if r.get('pilot_dev') is None else format(r['pilot_dev'], '.2f')} | {r['seconds']:.0f} | "
                     f"{r['fate']} |")
    return lines


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
    # Temporary name, then rename: `augsbert report` on a running job never lists a half-written plot.
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)


def show_run(run_dir) -> str:
    """What ``augsbert report RUN_DIR`` prints: the run's summary (finished or not) and its plots.

    Raises:
        AugSBERTError: the folder holds no run's metrics.
        DataError: its ``metrics.json`` is damaged (naming the file and what is wrong).
    """
    from pathlib import Path

    from augsbert_ray.errors import AugSBERTError, DataError
    from augsbert_ray.rundir import local_root

    root = local_root(run_dir)
    path = root / "metrics.json"
    if not path.exists():
        raise AugSBERTError(f"{root}: no metrics.json, so no run to report (a job writes it after its first stage)")
    metrics = RunMetrics.load(path)
    try:
        text = summary_markdown(metrics)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # a field the checks do not cover
        raise DataError(str(path), None, None, f"not a run's metrics as this version writes them ({type(e).__name__}: "
                                               f"{e}); rerun the job to write it again") from None
    if not metrics.complete:
        last = last_failure(root / "logs" / "job.log")
        if last:
            text += f"\nThe job log's last failure: {last}\n"
    plots = sorted(Path(root).glob("*.png"))
    if plots:
        text += "\nPlots: " + ", ".join(str(p) for p in plots) + "\n"
    return text


def last_failure(log) -> str | None:
    """The last line of a job log that says a stage failed or the job was interrupted, if any."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return next((line.strip() for line in reversed(lines) if " failed after " in line or "interrupted" in line), None)


def write_report(rd: RunDir, metrics: RunMetrics) -> None:
    rd.write_text("metrics.json", json.dumps(metrics.to_dict(), indent=2, default=str))
    rd.write_text("summary.md", summary_markdown(metrics))


def finish(cfg, runner, stages: list, complete: bool = True, plot: bool = True, quiet: bool = False) -> RunMetrics:
    """Gathers the stages' results into the run's metrics, writes ``metrics.json``,
    ``summary.md``, (with ``plot``) the silver density plot and the published models' cards,
    and uploads a remote run directory. The job calls it after every stage, so an unfinished
    run has its report too."""
    from augsbert_ray import schema
    from augsbert_ray.evaluation import PRIMARY_METRIC, TARGET_METRIC, jaccard_predictions, majority_metrics
    from augsbert_ray.evaluation import target_metrics, task_metrics

    done = runner.done
    result = {name: d.result for name, d in done.items()}
    m = RunMetrics(job=cfg.name, task=cfg.task, primary_metric=PRIMARY_METRIC[cfg.task], run_dir=runner.rd.location,
                   complete=complete, bi_encoder_objective=cfg.bi_encoder.resolved_objective(cfg.task),
                   stages_planned=[s.name for s in stages],
                   versions=versions(), cluster=asdict(runner.cluster) if runner.cluster is not None else None)
    by_name = {s.name: s for s in stages}
    for name, d in done.items():
        stage = by_name[name]
        m.stages.append(StageRecord(name=name, kind=stage.kind, fingerprint=d.fp, seconds=d.seconds, reused=d.reused,
                                    throughput=stage.throughput(d.result, d.seconds),
                                    fixed_seconds=stage.fixed_seconds(d.result, d.seconds), result=d.result))
        if stage.kind == "evaluate":
            m.scores[name.removeprefix("eval_")] = d.result["scores"]
        if stage.kind == "train" and "seed_search" in d.result.get("train", {}):
            m.seed_search[name] = d.result["train"]["seed_search"]
    m.data = dict(result.get("gold", {}))
    m.teacher_check = result.get("teacher_check")
    m.calibration, m.pilot, m.shipped = result.get("calibrate"), result.get("pilot"), result.get("ship")
    m.auto = result.get("auto")
    gold = {s: runner.artifacts[f"gold/{s}.parquet"].path for s in ("train", "dev", "test")}
    import pyarrow.parquet as pq

    splits = {s: pq.read_table(gold[s]).select([schema.SENTENCE1, schema.SENTENCE2, schema.LABEL])
              for s in ("dev", "test")}
    m.baselines = {"jaccard": task_metrics(cfg.task, jaccard_predictions(splits), splits)}
    target_eval = {}
    if cfg.target is not None:
        for s in ("test", "dev"):
            art = runner.artifacts.get(f"target/{s}.parquet")
            if art is not None:
                target_eval[f"target_{s}"] = pq.read_table(art.path).select(
                    [schema.SENTENCE1, schema.SENTENCE2, schema.LABEL])
        m.baselines["jaccard"].update(target_metrics(cfg.target_task, jaccard_predictions(target_eval), target_eval))
    if cfg.task == "binary":
        m.baselines["majority"] = majority_metrics(pq.read_table(gold["train"]), splits)
    if "candidates" in result:
        c = result["candidates"]
        m.sampling = {
            "strategy": "target pairs" if c.get("source") == "target pairs" else cfg.sampling.strategy,
            "source": c.get("source"),
            "top_k": cfg.sampling.top_k,
            "sentences": c["sentences"],
            "candidates": c["candidates"],
        }
    if "silver" in result:
        s = result["silver"]
        m.sampling.update({"labelled": s["labelled"], "silver": s["silver"], "silver_label_mean": s["label_mean"],
                           "silver_label_hist": s["label_hist"], "labeling_pairs_per_s": s["pairs_per_s"]})
    if cfg.target is not None:
        c = result.get("candidates", {})
        m.target = {
            "task": cfg.target_task,
            "metric": TARGET_METRIC[cfg.target_task],
            "data": result.get("target", {}),
            "mix_source_gold": cfg.target.mix_source_gold,
            "candidates": {k: v for k, v in c.items()
                           if k.endswith(("_left_out", "target_pairs")) or k.startswith("corpus")},
        }
    rd = runner.rd
    if "silver" in done and plot:
        write_density_plot(
            rd.path("silver_density.png"),
            pq.read_table(gold["train"], columns=[schema.LABEL]).column(0).to_numpy(),
            pq.read_table((done["calibrate"] if "calibrate" in done else done["silver"]).folder / "silver.parquet",
                          columns=[schema.LABEL]).column(0).to_numpy(),
            f"{cfg.name}: {m.sampling['strategy']}",
        )
    write_report(rd, m)
    from augsbert_ray.run_cards import publish_cards

    # The published models' cards, up to date with every score so far (a stage keeps its model's
    # card as trained; these are the run directory's own files, never part of a stage's digest).
    publish_cards(cfg, rd.root, m, {stage: out["model"] for stage, out in runner.published.items() if "model" in out})
    rd.push()
    if not quiet:
        runner.log(f"[augsbert] wrote metrics.json and summary.md in {rd.location}")
    return m


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
    data, sampling = t["data"], metrics.get("sampling", {})
    if "pairs" in data:
        silver = f"{data['pairs']['pairs']} target pairs labelled by the cross-encoder"
    elif "silver" in sampling:
        silver = (f"{sampling['silver']} {sampling['strategy']} pairs of {sampling['sentences']} target corpus "
                  "sentences labelled by the cross-encoder")
    else:  # an unfinished run, before the corpus pairs are labelled
        silver = "target corpus pairs, not labelled yet"
    lines = [
        "## Domain adaptation (target test set)",
        "",
        f"Target task: {t['task']}; {name} x100 on {data['test']['pairs']} target test pairs. Silver: {silver}"
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
