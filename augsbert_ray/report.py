"""The run report: ``metrics.json`` for programs and ``summary.md`` for people.

``summary.md`` is assembled from the stages' typed results (``stages.base.StageResult``):
the scores tables from their rows, then each result's own section in stage order, then the
stage times. This module knows no stage's result keys.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

from augsbert_ray.metrics import ClusterInfo, RunMetrics, StageRecord
from augsbert_ray.versions import versions
from augsbert_ray.rundir import RunDir
from augsbert_ray.stages.base import ScoreRow, SummaryContext

log = logging.getLogger(__name__)


def summary_markdown(metrics: RunMetrics, live: str | None = None) -> str:
    """The run's summary for people: the scores tables, each stage's section and the stage times
    (``live``: the run still running, as ``run_lock.live_run`` names it, for a report read meanwhile)."""
    metric, binary = metrics.primary_metric, metrics.task == "binary"
    ctx = SummaryContext(task=metrics.task, metric=metric, complete=metrics.complete)
    results = [(s.name, s.result) for s in metrics.stages]
    headline = next((h for _, r in results if (h := r.headline())), "no candidates yet")
    lines = [
        f"# {metrics.job}: AugSBERT ({headline})" + ("" if metrics.complete else " (unfinished run)"),
        "",
        f"{metric} x100 of the model's similarity vs gold labels"
        + (" (binary: threshold chosen on dev, applied to test)." if binary else "."),
        "",
        "| model | dev | test |" + (" test AUC(0.05) |" if binary else ""),
        "|---|---:|---:|" + ("---:|" if binary else ""),
    ]
    for row in _sorted(r.rows(ctx) for _, r in results):
        cell = lambda split: f"{row.scores[split][metric]:.2f}" if split in row.scores else ""  # noqa: E731
        line = f"| {row.title} | {cell('dev')} | {cell('test')} |"
        if binary:
            auc = row.scores.get("test", {}).get("auc_0.05")
            line += f" {auc:.2f} |" if auc is not None else " |"
        lines.append(line)
    target = _sorted(r.target_rows(ctx) for _, r in results)
    if target:
        lines += ["", *target_table(target)]
    for name, result in results:
        section = result.section(dataclasses.replace(ctx, stage=name))
        if section:
            lines += ["", *section]
    lines += ["", *stage_table(metrics.stages), *unfinished_markdown(metrics, live), "", cluster_line(metrics, live)]
    if metrics.tracking:
        lines += ["", tracking_line(metrics.tracking)]
    return "\n".join(lines) + "\n"


def _sorted(groups) -> list[ScoreRow]:
    return sorted((row for rows in groups for row in rows), key=lambda row: row.order)


def target_table(rows: list[ScoreRow]) -> list[str]:
    """Domain adaptation in the form of the paper's Table 6: every model on the target test set."""
    metric = next(row.metric for row in rows if row.metric)
    name = "AUC(0.05)" if metric == "auc_0.05" else metric
    return ["## Domain adaptation (target test set)", "", f"| model | target test {name} |", "|---|---:|",
            *(f"| {row.title} | {row.scores['target_test'][metric]:.2f} |" for row in rows)]


def stage_table(stages: list[StageRecord]) -> list[str]:
    """Each stage's time, fixed cost and throughput."""
    lines = ["| stage | seconds | fixed cost, s | throughput |", "|---|---:|---:|---|"]
    lines += [f"| {s.name} | {s.seconds:.1f}{' (earlier run)' if s.reused else ''} | {_fixed_cell(s)} | "
              f"{s.throughput} |" for s in stages]
    return lines + ["", "Fixed cost: the part of a stage's time that does not grow with its work: for training, "
                    "everything outside the training loop (starting the training's process: a warm host "
                    "or Ray Train's workers; loading the model and the pairs, checkpoints, exporting the model); "
                    "for labelling, the time to the first labelled shard (starting the actors, loading the model). "
                    "A warm host starts once and serves every later stage: the first stage it serves pays for its "
                    "start (shown apart)."]


def _fixed_cell(s: StageRecord) -> str:
    if s.fixed_seconds is None:
        return ""
    if s.host_start_seconds is None:
        return f"{s.fixed_seconds:.1f}"
    return f"{s.fixed_seconds:.1f} ({s.host_start_seconds:.1f} starting the warm host)"


def cluster_line(metrics: RunMetrics, live: str | None = None) -> str:
    c = metrics.cluster
    if c is None:
        if not metrics.complete and live:
            why = f"The run is still running ({live}); its Ray had not started when this report was written"
        elif not metrics.complete:
            why = "Ray had not started when this report was written"
        elif all(s.reused for s in metrics.stages):
            why = "Ray was not started: every stage was done by an earlier run"
        else:
            why = "Ray was not started: no stage that ran needed it"
        return f"{why}. Run directory: {metrics.run_dir}."
    return (f"Ray cluster: {c.nodes} node(s), {c.cpus:g} CPUs, {c.gpus:g} GPUs"
            + (f", {c.memory_gb:.1f} GiB memory, {c.object_store_gb:.1f} GiB object store" if c.memory_gb else "")
            + f". Run directory: {metrics.run_dir}.")


def tracking_line(info: dict) -> str:
    """Where the job's tracking run is, and the command that shows it."""
    where = (f"MLflow, experiment `{info.get('experiment')}` at {info.get('uri')}" if info.get("backend") == "mlflow"
             else f"TensorBoard event files in {info.get('uri')}")
    return f"Tracking: {where}; view with `{info.get('command')}`."


def unfinished_markdown(metrics: RunMetrics, live: str | None = None) -> list[str]:
    """For a run that has not finished: the stages done and those not done (nothing otherwise)."""
    if metrics.complete:
        return []
    done = [s.name for s in metrics.stages]
    left = [name for name in metrics.stages_planned if name not in done]
    of = f" of {len(done) + len(left)}" if left else ""
    head = f"Unfinished run: {len(done)}{of} stages done" + (f"; not done: {', '.join(left)}" if left else "")
    if live:
        return ["", f"{head}. It is still running ({live}): `augsbert report` shows more as its stages finish."]
    return ["", head + ". It ran until a stage (`--until`), failed, was stopped, or is still running (its "
                       "logs/job.log says which); running the job again resumes it."]


def label_counts(labels, bins) -> tuple:
    """Labels' counts in ``bins`` and their number: ``labels`` an array, or a Parquet file whose
    label column is read a batch at a time (a silver set of any size)."""
    import numpy as np

    if not isinstance(labels, (str, os.PathLike)):
        labels = np.asarray(labels)
        return np.histogram(labels, bins=bins)[0], len(labels)
    import pyarrow.parquet as pq

    from augsbert_ray import schema

    counts, n = np.zeros(len(bins) - 1, np.int64), 0
    for batch in pq.ParquetFile(labels).iter_batches(batch_size=1 << 20, columns=[schema.LABEL]):
        values = batch.column(0).to_numpy(zero_copy_only=False)
        counts += np.histogram(values, bins=bins)[0]
        n += len(values)
    return counts, n


def write_density_plot(path, gold_labels, silver_labels, title: str) -> None:
    """Density of gold vs silver labels (the paper's Figure 4), as a PNG; labels as arrays or
    Parquet files (``label_counts``).

    The silver distribution explains most of a strategy's result: labels far from
    gold's distribution (random pairs are mostly dissimilar) teach the wrong prior.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    bins = np.linspace(0, 1, 21)
    gold, silver = label_counts(gold_labels, bins), label_counts(silver_labels, bins)
    ax.hist(bins[:-1], bins=bins, weights=gold[0], density=True, alpha=0.55, label=f"gold (n={gold[1]})")
    if silver[1]:
        ax.hist(bins[:-1], bins=bins, weights=silver[0], density=True, alpha=0.55, label=f"silver (n={silver[1]})")
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
    from augsbert_ray.run_lock import live_run

    metrics = RunMetrics.load(path)
    live = None if metrics.complete else live_run(root)
    try:
        text = summary_markdown(metrics, live)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # a field the checks do not cover
        raise DataError(str(path), None, None, f"not a run's metrics as this version writes them ({type(e).__name__}: "
                                               f"{e}); rerun the job to write it again") from None
    if not metrics.complete and not live:
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
    from dataclasses import asdict

    from augsbert_ray.evaluation import PRIMARY_METRIC
    from augsbert_ray.tracking import tracking_info

    cluster = runner.cluster
    m = RunMetrics(job=cfg.name, task=cfg.task, primary_metric=PRIMARY_METRIC[cfg.task], run_dir=runner.rd.location,
                   complete=complete, bi_encoder_objective=cfg.bi_encoder.resolved_objective(cfg.task),
                   stages_planned=[s.name for s in stages], versions=versions(),
                   tracking=tracking_info(cfg, runner.rd.root),
                   cluster=None if cluster is None else ClusterInfo(**asdict(cluster)))
    by_name = {s.name: s for s in stages}
    for name, d in runner.done.items():
        stage = by_name[name]
        m.stages.append(StageRecord(name=name, kind=stage.kind, fingerprint=d.fp, seconds=d.seconds, reused=d.reused,
                                    throughput=stage.throughput(d.result, d.seconds),
                                    fixed_seconds=stage.fixed_seconds(d.result, d.seconds),
                                    host_start_seconds=stage.host_start_seconds(d.result), result=d.result))
    rd = runner.rd
    done = runner.done
    if "silver" in done and plot:
        silver = done["calibrate"] if "calibrate" in done else done["silver"]
        headline = next((h for s in m.stages if (h := s.result.headline())), "")
        write_density_plot(rd.path("silver_density.png"), runner.artifacts["gold/train.parquet"].path,
                           silver.folder / "silver.parquet", f"{cfg.name}: {headline}")
    write_report(rd, m)
    from augsbert_ray.run_cards import publish_cards

    # The published models' cards, up to date with every score so far (a stage keeps its model's
    # card as trained; these are the run directory's own files, never part of a stage's digest).
    publish_cards(cfg, rd.root, m, {stage: out["model"] for stage, out in runner.published.items() if "model" in out})
    rd.push()
    if not quiet:
        log.info(f"[augsbert] wrote metrics.json and summary.md in {rd.location}")
    return m
