"""The labelled inputs: gold pairs (train, dev, test) and, for domain adaptation, the target sets.

Both stages run every time (reading a few thousand pairs takes a second) and before Ray
starts, so a bad input fails the job at once. Their outputs are fingerprinted by content,
not by the settings that found them: the same pairs read through another path (a
different ``AUGSBERT_DATA_DIR``, a copied file) leave every later stage as it was, and a
changed test file re-scores the models without retraining any (nothing trains on it).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel

from augsbert_ray import schema
from augsbert_ray.config import DataConfig, TargetConfig
from augsbert_ray.loaders.job_inputs import SPLITS
from augsbert_ray.rundir import table_fingerprint
from augsbert_ray.stages.base import Declaration, ScoreRow, Stage, StageParams, StageResult, SummaryContext

log = logging.getLogger(__name__)

Scores = dict[str, dict[str, Any]]  # split -> metric -> value


def content_fp(path) -> str:
    """A pair table's content fingerprint, without where its rows were read from."""
    table = pq.read_table(path)
    return table_fingerprint(table.drop_columns([c for c in (schema.SOURCE,) if c in table.column_names]))


def baselines(task: str, train: pa.Table, evals: dict[str, pa.Table], target_task: str | None = None) -> dict:
    """The paper's baselines on the evaluation sets: Jaccard word overlap, and for a binary task
    the majority label of the training pairs (``train``; None: no majority baseline)."""
    from augsbert_ray.evaluation import jaccard_predictions, majority_metrics, target_metrics, task_metrics

    evals = {s: t.select([schema.SENTENCE1, schema.SENTENCE2, schema.LABEL]) for s, t in evals.items()}
    if target_task is not None:
        return {"jaccard": target_metrics(target_task, jaccard_predictions(evals), evals)} if evals else {}
    out = {"jaccard": task_metrics(task, jaccard_predictions(evals), evals)}
    if task == "binary" and train is not None:
        out["majority"] = majority_metrics(train, evals)
    return out


class GoldParams(StageParams):
    data: DataConfig
    task: str
    kde_labels: bool  # the job's KDE sampling needs two different training labels


class GoldResult(StageResult):
    """The gold pairs loaded: counts per split, what was read, skipped and carved, and the
    baselines on dev and test."""

    train: int
    dev: int
    test: int
    rows_read: dict[str, int] = {}
    skipped_rows: int = 0
    subsample: dict[str, int] = {}
    dev_carved: str | None = None
    other_genres_left_out: dict[str, int] | None = None
    baselines: dict[str, Scores] = {}

    def rows(self, ctx: SummaryContext) -> list[ScoreRow]:
        titles = {"majority": (0, "Majority label"), "jaccard": (1, "Jaccard word overlap")}
        return [ScoreRow(*titles[k], v) for k, v in self.baselines.items() if k in titles]

    def section(self, ctx: SummaryContext) -> list[str]:
        lines = [f"Dev split carved from train: {self.dev_carved}."] if self.dev_carved else []
        return lines + [f"Gold pairs: train {self.train}, dev {self.dev}, test {self.test}; skipped malformed rows: "
                        f"{self.skipped_rows}."]

    def view(self, stage: str) -> dict:
        left_out = {"other_genres_left_out"} if self.other_genres_left_out is None else set()
        return {"data": self.model_dump(mode="json", exclude={"baselines"} | left_out)}

    def baseline_scores(self) -> dict:
        return self.baselines


class Gold(Stage):
    """The gold pairs, loaded, checked, scaled to [0, 1], with dev carved and splits subsampled."""

    name = "gold"
    kind = "load"
    needs_ray = False
    always = True
    loads = True
    unit = "splits"
    result_type = GoldResult
    publishes = {f"{s}.parquet": f"gold/{s}.parquet" for s in SPLITS} | {"skipped_rows.jsonl": "gold/skipped_rows.jsonl"}

    def declare(self, cfg) -> Declaration:
        from augsbert_ray.loaders.job_inputs import kde_needs_labels

        return Declaration(GoldParams(data=cfg.data, task=cfg.task, kde_labels=kde_needs_labels(cfg)),
                           outputs=("train.parquet", "dev.parquet", "test.parquet", "skipped_rows.jsonl"))

    def run(self, inputs, params: GoldParams, env) -> GoldResult:
        from augsbert_ray.loaders.job_inputs import read_gold

        # read by the job's pre-flight checks, when they read it under these settings
        handed = env.ctx.inputs.gold_for(params.data, params.task, params.kde_labels) if env.ctx.inputs else None
        read = handed or read_gold(params.data, params.task, params.kde_labels)
        gold, info, skipped = read.tables, read.info, read.skipped
        for line in read.notes:
            log.info(line)
        for split in SPLITS:
            pq.write_table(gold[split], env.out / f"{split}.parquet")
        (env.out / "skipped_rows.jsonl").write_text("".join(json.dumps(s) + "\n" for s in skipped), encoding="utf-8")
        if skipped:
            log.info(f"[gold] skipped {len(skipped)} malformed rows (listed in gold/skipped_rows.jsonl)")
        log.info("[gold] pairs: " + ", ".join(f"{s} {gold[s].num_rows}" for s in SPLITS))
        return GoldResult(**info, baselines=baselines(params.task, gold["train"],
                                                      {s: gold[s] for s in ("dev", "test")}))

    def content_fingerprints(self, out) -> dict[str, str]:
        return {f"{s}.parquet": content_fp(out / f"{s}.parquet") for s in SPLITS}


TARGET_SETS = ("pairs", "test", "dev")


def has_upper_bound(cfg) -> bool:
    """Domain adaptation with labelled target pairs: a bi-encoder trained on them is the upper bound."""
    t = cfg.target
    return t is not None and t.upper_bound and t.pairs is not None and t.pairs.labelled


class TargetParams(StageParams):
    target: TargetConfig
    task: str  # how the target sets are scored (``target.task``, else the job's task)
    on_bad_rows: str
    upper_bound: bool  # the job trains the upper bound on the target pairs' own labels


class TargetSetCount(BaseModel):
    pairs: int
    rows_read: int | None = None
    skipped_rows: int = 0
    labelled: bool | None = None  # target pairs only: whether every pair has a label


class TargetResult(StageResult):
    """The target sets loaded: counts per set, how they are scored, the Jaccard baseline."""

    sets: dict[str, TargetSetCount]
    task: str
    upper_bound: bool = False
    baselines: dict[str, Scores] = {}

    def count(self, name: str) -> int | None:
        """How many pairs the target set ``name`` (pairs, test, dev) holds; None without one."""
        return self.sets[name].pairs if name in self.sets else None

    @property
    def metric(self) -> str:
        from augsbert_ray.evaluation import TARGET_METRIC

        return TARGET_METRIC[self.task]

    def target_rows(self, ctx: SummaryContext) -> list[ScoreRow]:
        jaccard = self.baselines.get("jaccard", {})
        return [ScoreRow(100, "Jaccard word overlap", jaccard, self.metric)] if "target_test" in jaccard else []

    def section(self, ctx: SummaryContext) -> list[str]:
        name = "AUC(0.05)" if self.metric == "auc_0.05" else self.metric
        lines = [f"Target task: {self.task}; {name} x100 on {self.count('test')} target test pairs"
                 + (f", target pairs: {self.count('pairs')}." if "pairs" in self.sets else ".")]
        if not self.upper_bound:
            lines.append("No upper bound: the target pairs have no labels (or target.upper_bound is off)."
                         if "pairs" in self.sets else "No upper bound: a target corpus has no labels.")
        return lines

    def view(self, stage: str) -> dict:
        return {"target": {"task": self.task, "metric": self.metric,
                           "data": {k: v.model_dump(exclude_none=True) for k, v in self.sets.items()}}}

    def baseline_scores(self) -> dict:
        return self.baselines


class TargetSets(Stage):
    """Domain adaptation: the target pairs (labels optional) and the labelled target test/dev sets.

    In corpus mode there are no target pairs here: the candidates stage reads the corpus.
    """

    name = "target"
    kind = "load"
    needs_ray = False
    always = True
    loads = True
    unit = "sets"
    result_type = TargetResult
    publishes = {f"{n}.parquet": f"gold/target_{n}.parquet" for n in TARGET_SETS}

    def declare(self, cfg) -> Declaration:
        t = cfg.target
        names = [n for n in TARGET_SETS if getattr(t, n) is not None]
        return Declaration(TargetParams(target=t, task=t.task or cfg.task, on_bad_rows=cfg.data.on_bad_rows,
                                        upper_bound=has_upper_bound(cfg)),
                           outputs=tuple(f"{n}.parquet" for n in names))

    def run(self, inputs, params: TargetParams, env) -> TargetResult:
        from augsbert_ray.loaders.job_inputs import read_target

        t, mode, target_task = params.target, params.on_bad_rows, params.task
        handed = env.ctx.inputs.target_for(t, target_task, mode) if env.ctx.inputs else None
        loaded = handed or read_target(t, target_task, mode)
        counts = {}
        for name, res in loaded.items():
            if res.skipped:
                (env.out / f"{name}_skipped_rows.jsonl").write_text(
                    "".join(json.dumps(vars(r)) + "\n" for r in res.skipped), encoding="utf-8")
                log.info(f"[target] {name}: skipped {len(res.skipped)} malformed rows")
            counts[name] = {"pairs": res.table.num_rows, "rows_read": res.rows_read, "skipped_rows": len(res.skipped)}
            if name == "pairs":
                labels = res.table.column(schema.LABEL).to_numpy()
                counts[name]["labelled"] = bool(len(labels) and np.isfinite(labels).all())
            pq.write_table(res.table, env.out / f"{name}.parquet")
        log.info("[target] pairs: " + ", ".join(f"{n} {c['pairs']}" for n, c in counts.items())
                 + ("" if counts.get("pairs", {}).get("labelled", True) else " (target pairs unlabelled)"))
        evals = {f"target_{n}": loaded[n].table for n in ("test", "dev") if n in loaded}
        return TargetResult(sets=counts, task=target_task, upper_bound=params.upper_bound,
                            baselines=baselines(target_task, None, evals, target_task=target_task))

    def content_fingerprints(self, out) -> dict[str, str]:
        return {f"{n}.parquet": content_fp(out / f"{n}.parquet") for n in TARGET_SETS
                if (out / f"{n}.parquet").exists()}
